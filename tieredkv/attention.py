"""The attention function registered with transformers: attend over the active cache's working set.

transformers does not pass the cache to attention functions, so the active `TieredCache` is
reached through a ContextVar (the one global the design allows). Without an active cache the
function is the model's own attention, unchanged.
"""
from __future__ import annotations

import contextlib
import sys
from contextvars import ContextVar
from typing import Iterator

import torch

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

ACTIVE_CACHE: ContextVar = ContextVar("tieredkv_active_cache", default=None)
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
    tests/test_attention_gqa.py), so tiered and plain runs stay torch.equal. transformers keeps
    `repeat_kv` for masked chunks because CUDA's fused kernels refuse a mask with `enable_gqa`; on
    CUDA this path is not taken. Decode steps (q == 1) stay with transformers (`pack_gqa`)."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _make(kind: str):
    def tiered_attention(module, query, key, value, attention_mask, **kwargs):
        cache = ACTIVE_CACHE.get()
        base = _base(kind, module)
        if cache is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        # query: [1, Hq, q, D]; key/value as written this chunk (ignored: the working set holds them)
        k, v, mask = cache.working_set(module.layer_idx, query, kind)
        if kind == "sdpa" and _grouped_on_cpu(module, query, mask, kwargs):
            return _sdpa_grouped(query, k, v, mask, **kwargs)
        return base(module, query, k, v, mask, **kwargs)

    tiered_attention.__name__ = f"tiered_{kind}_attention"
    return tiered_attention


def register() -> None:
    """Register `tiered` (sdpa inside) and `tiered_eager` (the model's eager inside). Idempotent."""
    for kind, name in NAMES.items():
        AttentionInterface.register(name, _make(kind))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[kind])


def name_for(base_implementation: str) -> str:
    return NAMES["eager" if base_implementation == "eager" else "sdpa"]


@contextlib.contextmanager
def activate(cache) -> Iterator[None]:
    token = ACTIVE_CACHE.set(cache)
    try:
        yield
    finally:
        ACTIVE_CACHE.reset(token)
