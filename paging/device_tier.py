"""Device working-set tier: a byte-budgeted map from any hashable key to tensors."""

from __future__ import annotations

from typing import Hashable, Iterator

import torch

from .errors import PagingError


def tensors_nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.nbytes for t in tensors)


class DeviceTier:
    """Tensors on `device`, keyed by the caller (the store uses (page_key, layer)).

    Invariant: `nbytes <= budget_bytes` at all times. `put` moves the tensors to `device`
    and returns False (storing nothing) when they do not fit; it never evicts — a policy
    object picks victims and the caller calls `remove`.
    """

    name = "device"

    def __init__(self, budget_bytes: int, device: str | torch.device = "cpu") -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) \
                or budget_bytes < 0:
            raise PagingError(f"DeviceTier budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.device = torch.device(device)
        self._entries: dict[Hashable, tuple[torch.Tensor, ...]] = {}
        self._sizes: dict[Hashable, int] = {}
        self._nbytes = 0

    def can_fit(self, nbytes: int) -> bool:
        return self._nbytes + nbytes <= self.budget_bytes

    def put(self, key: Hashable, tensors: tuple[torch.Tensor, ...]) -> bool:
        """Store `tensors` under `key` (replacing an old entry); False if it does not fit."""
        tensors = tuple(tensors)
        size = tensors_nbytes(tensors)
        old = self._sizes.get(key, 0)
        if self._nbytes - old + size > self.budget_bytes:
            return False
        moved = tuple(t.to(self.device, non_blocking=True) for t in tensors)
        self._entries[key] = moved
        self._sizes[key] = size
        self._nbytes += size - old
        return True

    def get(self, key: Hashable) -> tuple[torch.Tensor, ...] | None:
        return self._entries.get(key)

    def size_of(self, key: Hashable) -> int:
        return self._sizes[key]

    def contains(self, key: Hashable) -> bool:
        return key in self._entries

    def remove(self, key: Hashable) -> bool:
        if key not in self._entries:
            return False
        del self._entries[key]
        self._nbytes -= self._sizes.pop(key)
        return True

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._entries))

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._sizes.clear()
        self._nbytes = 0

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
