"""Re-rotating stored post-rotary keys to other positions (the only inexact placement).

RoPE turns a key at position p into R(p)·k. Rotating once more by R(Δ) places it at p+Δ in exact
arithmetic, but not in floating point: the products round differently than R(p+Δ)·k computed
fresh. `--shift` and the fixed-distance position policy measure that drift.
"""
from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Sequence

import torch

from tieredkv.errors import UnsupportedModelError


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
def rerotate(model, keys: torch.Tensor, delta: torch.Tensor | int | Sequence[int], layer_idx: int | None = None, *,
             sizes: Sequence[int] | None = None) -> torch.Tensor:
    """Move post-rotary `keys` [..., T, D] by `delta` positions: an int, a [T] tensor per token, or
    with `sizes` (consecutive runs of tokens summing to T) one distance per run (a tensor or ints).

    Models with one rotary per layer type (Gemma3) need `layer_idx`. The rotary's attention
    scaling (YaRN, LongRoPE) is divided out: a rotation must not rescale the keys.
    """
    rope = rotary_module(model)
    if isinstance(delta, int):
        delta = [delta]  # one row, broadcast over the tokens
    elif isinstance(delta, torch.Tensor) and sizes is not None:
        delta = delta.tolist()  # one distance per run: a few dozen
    cos, sin = _cos_sin(rope, _layer_type(model, layer_idx), delta, keys)
    cos, sin = cos.to(keys.dtype), sin.to(keys.dtype)
    if sizes is not None and len(set(sizes)) == 1:
        # runs of one length (whole pages): one row per run, broadcast over its tokens (the same products)
        runs = keys.reshape(*keys.shape[:-2], len(sizes), sizes[0], keys.shape[-1])
        return _rotated(runs, cos[:, None], sin[:, None]).flatten(-3, -2)
    if sizes is not None:  # one row per run: expand to one per token (the same rows, the same bytes)
        counts = torch.tensor(list(sizes), device=keys.device)
        cos, sin = cos.repeat_interleave(counts, dim=0), sin.repeat_interleave(counts, dim=0)
    return _rotated(keys, cos, sin)


def _rotated(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`keys * cos + rotate_half(keys) * sin` (transformers' apply_rotary_pos_emb) without materialising
    rotate_half: per element the same two products and one addition (a + (-b)*s is a - b*s exactly),
    so the same bytes in fewer passes (tests/engine/test_tiered_model.py pins them)."""
    h = keys.shape[-1] // 2
    out = keys * cos
    out[..., :h] -= keys[..., h:] * sin[..., :h]
    out[..., h:] += keys[..., :h] * sin[..., h:]
    return out


# Rotaries whose frequencies never change with the sequence length: their cos/sin of a distance can
# be kept. Dynamic NTK and LongRoPE pick frequencies per call (transformers' dynamic_rope_update).
_STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
_MEMO_ROWS = 4096  # distances kept per (rotary, layer type); a row is 2 x head_dim floats
_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cos_sin(rope, layer_type: str | None, d: torch.Tensor | list[int], like: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, D] of the distances `d` ([T] tensor, or ints), the rotary's attention scaling
    divided out.

    Per-distance rows are elementwise, so computing each distinct distance once (and keeping it, for
    static rotaries) gives the same bytes as the rotary's own call over all T positions; the fixed
    policy moves ~10-30 pages per layer and step by a handful of distances that recur step after step.
    """
    rope_type = rope.rope_type.get(layer_type) if isinstance(rope.rope_type, dict) else rope.rope_type
    memo = _memo.setdefault(rope, {}).setdefault((layer_type, like.device, like.dtype), OrderedDict()) \
        if rope_type in _STATIC_ROPE_TYPES else OrderedDict()
    if isinstance(d, torch.Tensor):  # per token: each distinct distance once, then indexed
        uniq, inverse = torch.unique(d.to(device=like.device, dtype=torch.long), return_inverse=True)
        distances = uniq.tolist()
    else:  # a few ints (one per page): their rows stacked directly
        distances, inverse = list(dict.fromkeys(d)), None
    missing = [x for x in distances if x not in memo]
    if missing:
        kwargs = {"layer_type": layer_type} if layer_type is not None and _takes_layer_type(type(rope)) else {}
        cos, sin = rope(like, position_ids=torch.tensor([missing], device=like.device), **kwargs)  # [1, M, D]
        scale = getattr(rope, f"{layer_type}_attention_scaling", None) if layer_type else None
        scale = scale if scale is not None else getattr(rope, "attention_scaling", 1.0)
        for x, c, s in zip(missing, cos[0] / scale, sin[0] / scale):
            memo[x] = (c, s)
    rows = distances if inverse is not None else d
    cos = torch.stack([memo[x][0] for x in rows])
    sin = torch.stack([memo[x][1] for x in rows])
    for x in distances:
        memo.move_to_end(x)
    while len(memo) > _MEMO_ROWS:
        memo.popitem(last=False)
    return (cos[inverse], sin[inverse]) if inverse is not None else (cos, sin)


@functools.cache
def _takes_layer_type(rope_class) -> bool:
    import inspect

    return "layer_type" in inspect.signature(rope_class.forward).parameters
