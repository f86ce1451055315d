"""Re-rotating stored post-rotary keys to other positions (the only inexact placement).

RoPE turns a key at position p into R(p)·k. Rotating once more by R(Δ) places it at p+Δ in exact
arithmetic, but not in floating point: the products round differently than R(p+Δ)·k computed
fresh. `--shift` and the fixed-distance position policy measure that drift.
"""
from __future__ import annotations

import torch

from tieredkv.errors import UnsupportedModelError


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary_module(model):
    """The model's (single, default-type) rotary embedding, or a clear error."""
    base = getattr(model, "model", model)
    rope = getattr(base, "rotary_emb", None)
    if rope is None:
        raise UnsupportedModelError(
            f"{model.config.model_type} has no single rotary embedding (learned or per-layer-type positions): "
            "keys cannot be moved to other positions; use the own-position policy"
        )
    return rope


@torch.inference_mode()
def rerotate(model, keys: torch.Tensor, delta: torch.Tensor | int) -> torch.Tensor:
    """Move post-rotary `keys` [..., T, D] by `delta` positions (an int, or a [T] tensor per token)."""
    rope = rotary_module(model)
    t = keys.shape[-2]
    d = torch.full((t,), int(delta)) if isinstance(delta, int) else delta.to(torch.long)
    cos, sin = rope(keys, position_ids=d[None].to(keys.device))  # [1, T, D]
    cos, sin = cos[0].to(keys.dtype), sin[0].to(keys.dtype)
    return keys * cos + _rotate_half(keys) * sin
