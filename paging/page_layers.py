"""One layer of several pages, as the bytes of each page's K then V, not yet joined.

    PageStore.layer_parts(keys, l) -> PageLayers(heads, tokens, dim, dtype, parts: [n] byte buffers)
          .stacked()        one fresh tensor [n, 2, Hkv, T, D]: the parts joined (`PageStore.read_layers`)
          .arrays(np_dtype) numpy views [2, Hkv, T, D] of each part, no copy: a caller that copies them into its
                            own buffer (a CPU working set) pays one copy instead of two

A host page's part is a view of the host tier's own payload: read-only by contract, and it keeps that payload
alive while it lives (`HostTier.layer_bytes`). Every part was served as `fetch_layer` serves it: LMDB bytes
verified, a page that fails verification raised before any part was returned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class PageLayers:
    """One layer of `len(parts)` pages of `tokens` tokens each: part i holds page i's K then V, `dtype`
    values of shape [2, heads, tokens, dim]."""

    heads: int
    tokens: int
    dim: int
    dtype: torch.dtype
    parts: Sequence[Any]  # buffers (memoryview, numpy uint8), each 2 * heads * tokens * dim values

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, which: slice) -> "PageLayers":
        return PageLayers(self.heads, self.tokens, self.dim, self.dtype, self.parts[which])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(K, V) [Hkv, T, D] of each page: fresh tensors."""
        return iter([(kv[0], kv[1]) for kv in self.stacked()] if self.parts else [])

    def stacked(self) -> torch.Tensor:
        """[n, 2, Hkv, T, D]: every part copied into one fresh tensor (empty when there are none)."""
        if not self.parts:
            return torch.empty(0)
        joined = bytearray().join(self.parts)
        return torch.frombuffer(joined, dtype=self.dtype).view(len(self.parts), 2, self.heads, self.tokens, self.dim)

    def arrays(self, np_dtype: np.dtype) -> list[np.ndarray]:
        """Each part as a numpy view [2, Hkv, T, D] of `np_dtype`, which must be as wide as `dtype` (bfloat16 is
        viewed as int16): read-only views, no copy."""
        width = torch.empty(0, dtype=self.dtype).element_size()
        if np.dtype(np_dtype).itemsize != width:
            raise ValueError(f"pages of {self.dtype} cannot be viewed as {np.dtype(np_dtype)}")
        shape = (2, self.heads, self.tokens, self.dim)
        return [np.frombuffer(part, dtype=np_dtype).reshape(shape) for part in self.parts]
