"""Eviction policy, apart from the mechanism that moves bytes (pure bookkeeping)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Container, Hashable, Iterator


class LRUPolicy:
    """Least-recently-used order over keys. Knows nothing about sizes until asked."""

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()  # oldest first

    def touch(self, key: Hashable) -> None:
        """Insert `key`, or mark it most recently used."""
        self._order[key] = None
        self._order.move_to_end(key)

    def forget(self, key: Hashable) -> None:
        """Stop tracking `key` (no error if unknown)."""
        self._order.pop(key, None)

    def victims(self, needed_bytes: int, size_of: Callable[[Hashable], int],
                pinned: Container = ()) -> list[Hashable]:
        """Keys to evict, oldest first, until their sizes sum to >= `needed_bytes`.

        Pinned keys are skipped. If everything unpinned is not enough, returns all the
        unpinned keys; the caller checks whether the result suffices. Nothing is removed
        here: call `forget` for each key actually evicted.
        """
        out: list[Hashable] = []
        freed = 0
        if needed_bytes <= 0:
            return out
        for key in self._order:
            if key in pinned:
                continue
            out.append(key)
            freed += size_of(key)
            if freed >= needed_bytes:
                break
        return out

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self) -> Iterator[Hashable]:
        """Keys from least to most recently used."""
        return iter(list(self._order))
