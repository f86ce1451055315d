"""The storage-tier interface (LMCache-style): a tier stores pages, it never evicts.

"Does not fit" is a return value (`put` -> False); the caller (the store, with its
policy) decides what to evict. Batched variants default to loops and are overridden only
where a tier does better (LMDB: one transaction).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Iterator

from .page import Page


class Tier(ABC):
    """A keyed store of pages. Blocking; not thread-safe unless a subclass says so."""

    name: str = "tier"

    @abstractmethod
    def put(self, page: Page) -> bool:
        """Store `page`; False if it does not fit (nothing stored)."""

    @abstractmethod
    def get(self, key: str) -> Page | None:
        """The page under `key`, or None."""

    @abstractmethod
    def contains(self, key: str) -> bool: ...

    @abstractmethod
    def remove(self, key: str) -> bool:
        """Drop `key`; False if it was absent."""

    @abstractmethod
    def keys(self) -> Iterator[str]: ...

    @property
    @abstractmethod
    def num_pages(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Payload bytes held by this tier."""

    def close(self) -> None:  # noqa: B027  (a deliberate no-op default: tiers holding nothing need not override it)
        """Release resources; the default does nothing."""

    def put_many(self, pages: Iterable[Page]) -> list[bool]:
        return [self.put(p) for p in pages]

    def get_many(self, keys: Iterable[str]) -> list[Page | None]:
        return [self.get(k) for k in keys]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def __len__(self) -> int:
        return self.num_pages

    def __enter__(self) -> "Tier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
