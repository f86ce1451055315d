"""Geometry and dtype of the KV pages of one model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .errors import LayoutMismatchError

_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 4),
    "float16": (torch.float16, 2),
    "bfloat16": (torch.bfloat16, 2),
}
_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "dtype", "page_size")


@dataclass(frozen=True)
class PageLayout:
    """Geometry of a page: `num_layers` x (K, V) x [num_kv_heads, T, head_dim] of `dtype`.

    `page_size` is the number of tokens of a full page; a last partial page holds fewer.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise LayoutMismatchError(
                    f"PageLayout.{name} must be a positive int, got {value!r}"
                )
        if self.dtype not in _DTYPES:
            raise LayoutMismatchError(
                f"PageLayout.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype][1]

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype][0]

    def head_nbytes(self, num_tokens: int) -> int:
        """Bytes of one K (or V) tensor of one layer: [Hkv, T, D]."""
        return self.num_kv_heads * num_tokens * self.head_dim * self.itemsize

    def layer_nbytes(self, num_tokens: int) -> int:
        """Bytes of K and V of one layer for `num_tokens` tokens."""
        return 2 * self.head_nbytes(num_tokens)

    @property
    def token_nbytes(self) -> int:
        """Bytes of one token across all layers, K and V."""
        return self.num_layers * self.layer_nbytes(1)

    def payload_nbytes(self, num_tokens: int) -> int:
        """Bytes of a page payload holding `num_tokens` tokens."""
        return self.num_layers * self.layer_nbytes(num_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PageLayout":
        """Build and validate a layout from untrusted data (raises LayoutMismatchError)."""
        if not isinstance(d, Mapping):
            raise LayoutMismatchError(f"layout must be a JSON object, got {type(d).__name__}")
        if set(d) != set(_FIELDS):
            raise LayoutMismatchError(
                f"layout fields must be exactly {sorted(_FIELDS)}, got {sorted(map(str, d))}"
            )
        return cls(**{name: d[name] for name in _FIELDS})
