"""The attention function registered with transformers: attend over the active cache's working set.

transformers does not pass the cache to attention functions, so the active `TieredCache` is
reached through a ContextVar (the one global the design allows). Without an active cache the
function is the model's own attention, unchanged.
"""
from __future__ import annotations

import contextlib
import sys
import weakref
from contextvars import ContextVar
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

ACTIVE_CACHE: ContextVar = ContextVar("tieredkv_active_cache", default=None)
_GROUPED: ContextVar[bool] = ContextVar("tieredkv_grouped_prefill", default=False)  # grouped_prefill()
NAMES = {"sdpa": "tiered", "eager": "tiered_eager"}


def _base(kind: str, module):
    if kind == "sdpa":
        return sdpa_attention_forward
    # The model's own eager function (Gemma2's applies attention-logit soft-capping).
    return sys.modules[type(module).__module__].eager_attention_forward


def _grouped_on_cpu(module, query, mask, kwargs) -> bool:
    """A prefill chunk (q > 1) on CPU whose K/V heads serve groups of query heads, with nothing
    transformers' sdpa path would add (position bias, soft-capping, attention weights)."""
    return (query.shape[2] > 1 and query.device.type == "cpu" and mask is not None
            and getattr(module, "num_key_value_groups", 1) > 1
            and not any(kwargs.get(name) for name in ("position_bias", "softcap", "output_attentions")))


def _sdpa_grouped(query, key, value, mask, dropout: float = 0.0, scaling: float | None = None, **_kwargs):
    """transformers' `sdpa_attention_forward` for a masked prefill chunk, with `enable_gqa` instead of
    `repeat_kv`: the working set is not copied once per query group in every layer.

    NOTE: torch's CPU kernels give the same bytes either way (fp32, bf16, fp16; 1 and 2 threads:
    tests/engine/test_attention_gqa.py), so tiered and plain runs stay torch.equal. transformers keeps
    `repeat_kv` for masked chunks because CUDA's fused kernels refuse a mask with `enable_gqa`; on
    CUDA this path is not taken. Decode steps (q == 1) stay with transformers (`pack_gqa`)."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's own first step for a bool mask: True (attend) -> 0, False -> -inf.

    NOTE: the float mask SDPA would build, so the same bytes (tests/engine/test_attention_gqa.py). Given it,
    SDPA's CPU kernel skips that conversion (~5% of a 128-query chunk's attention); a mask used by
    one layer only (TieredCache builds one per layer) gains nothing from converting it here."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _additive_sdpa_mask(*args, dtype: torch.dtype = torch.float32, **kwargs):
    """transformers' sdpa mask in SDPA's additive form: built once per forward, where SDPA would
    convert the bool mask again in every layer."""
    mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)
    return _additive(mask, dtype) if mask is not None and mask.dtype == torch.bool else mask


def _make(kind: str):
    def tiered_attention(module, query, key, value, attention_mask, **kwargs):
        cache = ACTIVE_CACHE.get()
        if cache is not None:
            # query: [1, Hq, q, D]; key/value as written this chunk (ignored: the working set holds them)
            key, value, attention_mask = cache.working_set(module.layer_idx, query, kind)
        elif not _GROUPED.get():
            return _base(kind, module)(module, query, key, value, attention_mask, **kwargs)
        if kind == "sdpa" and _grouped_on_cpu(module, query, attention_mask, kwargs):
            return _sdpa_grouped(query, key, value, attention_mask, **kwargs)
        return _base(kind, module)(module, query, key, value, attention_mask, **kwargs)

    tiered_attention.__name__ = f"tiered_{kind}_attention"
    return tiered_attention


def register() -> None:
    """Register `tiered` (sdpa inside) and `tiered_eager` (the model's eager inside). Idempotent."""
    for kind, name in NAMES.items():
        AttentionInterface.register(name, _make(kind))
        AttentionMaskInterface.register(name, _additive_sdpa_mask if kind == "sdpa"
                                        else ALL_MASK_ATTENTION_FUNCTIONS[kind])


def name_for(base_implementation: str) -> str:
    return NAMES["eager" if base_implementation == "eager" else "sdpa"]


# model -> [its own attention implementation, how many TieredModels wrap it]
_WRAPPED: "weakref.WeakKeyDictionary[torch.nn.Module, list]" = weakref.WeakKeyDictionary()


def wrap(model) -> str:
    """Switch `model` to the tiered attention for one more TieredModel; returns the model's own
    implementation. NOTE: counted, so that closing one of two TieredModels on a model does not switch
    the other back to plain attention mid-context (its pages would be sealed over the whole context,
    other bytes under its regime's keys)."""
    entry = _WRAPPED.get(model)
    if entry is None:
        base = model.config._attn_implementation
        if base in NAMES.values():  # switched by hand, or by a TieredModel never closed
            base = "eager" if base == NAMES["eager"] else "sdpa"
        register()
        model.set_attn_implementation(name_for(base))
        entry = _WRAPPED[model] = [base, 0]
    entry[1] += 1
    return entry[0]


def unwrap(model) -> None:
    """One TieredModel less on `model`: the last one switches it back to its own attention."""
    entry = _WRAPPED.get(model)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _WRAPPED[model]
        model.set_attn_implementation(entry[0])


@contextlib.contextmanager
def grouped_prefill(model) -> Iterator[None]:
    """Inside the block the model runs its own sdpa attention over its own cache, except that a masked
    prefill chunk on CPU takes `_sdpa_grouped` (no `repeat_kv` copy of the whole prefix per chunk and
    layer): the same bytes, for deposit's canonical 128-token chunks. Models on eager attention, and
    a model a TieredModel has switched already, are left as they are."""
    base = model.config._attn_implementation
    switch = base == "sdpa"
    if switch:
        register()
        model.set_attn_implementation(NAMES["sdpa"])
    token = _GROUPED.set(base in ("sdpa", NAMES["sdpa"]))
    try:
        yield
    finally:
        _GROUPED.reset(token)
        if switch:
            model.set_attn_implementation(base)


@contextlib.contextmanager
def activate(cache) -> Iterator[None]:
    token = ACTIVE_CACHE.set(cache)
    try:
        yield
    finally:
        ACTIVE_CACHE.reset(token)
