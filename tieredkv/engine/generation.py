"""What `TieredModel.generate` accepts, the HF way: prompt inputs as HF users pass them, generation options
checked against what one tiered context can honour, and HF's output shapes back.

    prompt_ids(x)          a list of ids, a [n] or [1, n] tensor, a BatchEncoding/dict with input_ids,
                           or chat messages (the tokenizer's chat template, generation prompt added)
    generation_options(..) a GenerationConfig for the model's own generate(): greedy unless asked,
                           sampling and logits processors pass through; beams, several sequences and
                           options that need another cache are refused with a GenerationOptionError
    seeded(seed)           a seed that reproduces a sampled answer without touching the caller's RNG
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch

from tieredkv.errors import TieredKVError, TokenIdsError


class GenerationOptionError(TieredKVError, ValueError):
    """A generation option the tiered context cannot honour (beams, batches, another cache); never ignored."""


# option -> why it is refused (what to do instead); each would need several sequences or another cache
REFUSED = {
    "past_key_values": "the tiered context is the cache: open or graft a context on the TieredModel instead",
    "attention_mask": "the mask is built from absolute positions over the whole context; drop attention_mask",
    "max_length": "a length counts the whole context; give max_new_tokens instead",
    "use_cache": "the tiered context is a cache; drop use_cache",
    "cache_implementation": "the tiered context is the cache; drop cache_implementation",
    "assistant_model": "assisted decoding crops the cache; use the model's own generate() without tieredkv",
    "prompt_lookup_num_tokens": "prompt-lookup decoding crops the cache; drop prompt_lookup_num_tokens",
    "output_attentions": "the tiered attention returns no weights; drop output_attentions",
}
HARMLESS = {"use_cache": True, "output_attentions": False}  # refused options given at the value the path has
# fields of a GenerationConfig that only act when sampling (passed without do_sample=True they did nothing)
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def prompt_ids(inputs: Any, tokenizer: Any = None) -> Any:
    """`inputs` as a flat sequence of ids (not yet range-checked); chat messages go through `tokenizer`'s
    chat template with the generation prompt added. A batch of several prompts is refused."""
    if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], dict):
        return chat_ids(inputs, tokenizer)
    if hasattr(inputs, "keys") and not isinstance(inputs, torch.Tensor):  # BatchEncoding or dict
        if "input_ids" not in inputs:
            raise TokenIdsError("a dict prompt needs an 'input_ids' entry (what a tokenizer returns)")
        inputs = inputs["input_ids"]
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 2:
            _one_row(inputs.shape[0])
            inputs = inputs[0]
        if inputs.dim() != 1 or inputs.dtype.is_floating_point or inputs.dtype == torch.bool:
            raise TokenIdsError(f"a tensor prompt must be integer ids of shape [n] or [1, n], got {inputs.dtype} "
                                f"{tuple(inputs.shape)}")
        return inputs.tolist()
    if isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], (list, tuple)):
        _one_row(len(inputs))
        return inputs[0]
    return inputs


def _one_row(num_rows: int) -> None:
    if num_rows != 1:
        raise GenerationOptionError(f"a TieredModel holds one context, got a batch of {num_rows} prompts; "
                                    "generate them one at a time")


def chat_ids(messages: list[dict], tokenizer: Any) -> list[int]:
    """Token ids of chat `messages` with the generation prompt added (the tokenizer's chat template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise TokenIdsError("this model's tokenizer has no chat template: pass token ids (tm.encode(text)) "
                            "instead of chat messages")
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def generation_options(model, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(GenerationConfig, model kwargs) for the model's own generate(): the model's generation config,
    greedy unless `do_sample` is given, updated with `kwargs` (a `generation_config` among them first).
    Refuses what one tiered context cannot honour, and sampling options given without sampling."""
    for name, why in REFUSED.items():
        if name in kwargs and kwargs[name] is not HARMLESS.get(name, ...):
            raise GenerationOptionError(f"TieredModel.generate cannot take {name}: {why}")
    given = dict(kwargs)
    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    user_config = given.pop("generation_config", None)
    explicit = set(given)
    user = {} if user_config is None else user_config.to_diff_dict()
    explicit |= set(user)
    _check(_Merged(user, given, config), explicit)  # NOTE: before update(), which raises its own ValueErrors
    try:
        config.update(**user)
        model_kwargs = config.update(**given)
    except ValueError as exc:
        raise GenerationOptionError(f"transformers refuses these generation options: {exc}") from None
    return config, model_kwargs


class _Merged:
    """Attribute view of generation options: the call's kwargs, then a given GenerationConfig's, then the base."""

    def __init__(self, user: dict, given: dict, base):
        self._layers = (given, user)
        self._base = base

    def __getattr__(self, name: str):
        for layer in self._layers:
            if name in layer:
                return layer[name]
        return getattr(self._base, name, None)


def _check(config, explicit: set[str]) -> None:
    if (config.num_beams or 1) != 1 or (getattr(config, "num_beam_groups", 1) or 1) != 1:
        raise GenerationOptionError(f"beam search (num_beams={config.num_beams}) keeps several sequences; a "
                                    "TieredModel holds one context: use num_beams=1 (greedy or do_sample=True)")
    if (config.num_return_sequences or 1) != 1:
        raise GenerationOptionError(f"num_return_sequences={config.num_return_sequences} needs a batch; a "
                                    "TieredModel holds one context: call generate once per sequence (with seed=)")
    if getattr(config, "penalty_alpha", None):
        raise GenerationOptionError("contrastive search (penalty_alpha) re-runs candidates over the cache; "
                                    "drop penalty_alpha")
    if not config.do_sample:
        idle = [k for k in SAMPLING_ONLY if k in explicit]
        if idle:
            raise GenerationOptionError(f"{', '.join(idle)}: used only when sampling; pass do_sample=True, or drop "
                                        "it for greedy decoding")


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for one generation (the caller's RNG state is restored after)."""
    if seed is None:
        yield
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise GenerationOptionError(f"seed must be an int, got {seed!r}")
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def with_prompt(out, prompt: list[int]):
    """HF's output object with `sequences` = prompt + new tokens (the model saw only the prompt's last id)."""
    head = torch.tensor([prompt[:-1]], dtype=out.sequences.dtype, device=out.sequences.device)
    out.sequences = torch.cat([head, out.sequences], dim=1)
    return out
