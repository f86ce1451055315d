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


def _layer_type(model, layer_idx: int | None) -> str | None:
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    return types[layer_idx] if types is not None and layer_idx is not None else None


@torch.inference_mode()
def rerotate(model, keys: torch.Tensor, delta: torch.Tensor | int, layer_idx: int | None = None) -> torch.Tensor:
    """Move post-rotary `keys` [..., T, D] by `delta` positions (an int, or a [T] tensor per token).

    Models with one rotary per layer type (Gemma3) need `layer_idx`. The rotary's attention
    scaling (YaRN, LongRoPE) is divided out: a rotation must not rescale the keys.
    """
    rope = rotary_module(model)
    t = keys.shape[-2]
    d = torch.full((t,), int(delta)) if isinstance(delta, int) else delta.to(torch.long)
    layer_type = _layer_type(model, layer_idx)
    kwargs = {"layer_type": layer_type} if layer_type is not None and _takes_layer_type(rope) else {}
    cos, sin = rope(keys, position_ids=d[None].to(keys.device), **kwargs)  # [1, T, D]
    scale = getattr(rope, f"{layer_type}_attention_scaling", None) if layer_type else None
    scale = scale if scale is not None else getattr(rope, "attention_scaling", 1.0)
    cos, sin = (cos[0] / scale).to(keys.dtype), (sin[0] / scale).to(keys.dtype)
    return keys * cos + _rotate_half(keys) * sin


def _takes_layer_type(rope) -> bool:
    import inspect

    return "layer_type" in inspect.signature(rope.forward).parameters
