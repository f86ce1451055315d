"""A DynamicCache that also hands over every K/V the model writes, so pages can be sealed.

Keys arrive after rotary (at their absolute positions), exactly as attention used them.
Sliding-window layers drop old tokens from their cache; the capture keeps what each chunk wrote.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


class CaptureCache(DynamicCache):
    """`DynamicCache` plus a per-layer record of the K/V written since the last `take()`."""

    def __init__(self, config):
        super().__init__(config=config)
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
