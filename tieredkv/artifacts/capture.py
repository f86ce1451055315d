"""A DynamicCache that also hands over every K/V the model writes, so pages can be sealed.

Keys arrive after rotary (at their absolute positions), exactly as attention used them.
Sliding-window layers drop old tokens from their cache; the capture keeps what each chunk wrote.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose K/V live in a buffer with spare capacity: a chunk is written in place
    instead of concatenating a copy of everything before it (O(N) per chunk, O(N^2) per document).

    Attention reads views `buf[..., :n, :]`: the same values in the same order as the concatenated
    tensors, and the kernels give the same bytes for them (tests/engine/test_kv_buffer.py)."""

    _GROW = 2
    capacity = 0  # tokens the first buffer holds at least (CaptureCache(capacity=)): no regrowth below it

    def update(self, key_states, value_states, *args, **kwargs):
        # k, v: [B, H, q, D]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, q = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
        buf_k = getattr(self, "_buf_k", None)
        if buf_k is None or n + q > buf_k.shape[-2] or buf_k.data_ptr() != self.keys.data_ptr() or not n:
            cap = max(n + q, self._GROW * n, self.capacity)
            shape = (*key_states.shape[:-2], cap, key_states.shape[-1])
            buf_k = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
            buf_v = torch.empty(shape, dtype=value_states.dtype, device=value_states.device)
            if n:
                buf_k[..., :n, :], buf_v[..., :n, :] = self.keys, self.values
            self._buf_k, self._buf_v = buf_k, buf_v
        self._buf_k[..., n:n + q, :] = key_states
        self._buf_v[..., n:n + q, :] = value_states
        self.keys, self.values = self._buf_k[..., :n + q, :], self._buf_v[..., :n + q, :]
        return self.keys, self.values


class CaptureCache(DynamicCache):
    """`DynamicCache` plus a per-layer record of the K/V written since the last `take()`. Full-attention
    layers grow in place (`GrowingLayer`); sliding-window layers stay as transformers makes them."""

    def __init__(self, config, *, capacity: int = 0):
        """`capacity`: the tokens the cache will hold, if known (a deposit knows them): each full-attention
        layer then allocates its buffers once instead of doubling them as it grows."""
        super().__init__(config=config)
        self.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in self.layers]
        for layer in self.layers:
            if isinstance(layer, GrowingLayer):
                layer.capacity = max(0, int(capacity))
        if self.layer_class_to_replicate is DynamicLayer:
            self.layer_class_to_replicate = GrowingLayer
        self._captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # k, v: [B=1, Hkv, T, D]; a layer may be called once per forward
        assert key_states.shape[0] == 1, "tieredkv pages hold one sequence (batch size 1)"
        assert layer_idx not in self._captured, "take() the captured K/V after every forward"
        self._captured[layer_idx] = (key_states[0], value_states[0])
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """K/V per layer ([Hkv, T, D] each) written by the last forward; clears the record."""
        layers = sorted(self._captured)
        assert layers == list(range(len(layers))), f"layers {layers} did not all write K/V"
        keys = [self._captured[i][0] for i in layers]
        values = [self._captured[i][1] for i in layers]
        self._captured.clear()
        return keys, values
