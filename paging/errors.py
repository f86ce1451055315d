"""Typed errors of the page store. Each message says what to do next."""

from __future__ import annotations

# what to do with a store whose structures or bookkeeping were damaged on disk
REBUILD_HINT = "restore the store from a backup, or re-import or re-deposit its artifacts into a new store"


class PagingError(Exception):
    """Base class of every error raised by `paging`."""


class CorruptPageError(PagingError):
    """Bytes of a page (or manifest) failed verification; they are never served.

    `key` is the page key (or artifact id) the bytes were stored under, `reason` says
    which check failed. Recompute the page, or re-import it from a verified artifact.
    """

    def __init__(self, key: str | None, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(
            f"corrupt page {key!r}: {reason}; the bytes were not used — recompute the "
            f"page or re-import it from a verified artifact"
        )

    def __reduce__(self):  # keep pickling (multiprocessing) working with two args
        return (type(self), (self.key, self.reason))


class PageNotFoundError(PagingError, KeyError):
    """No tier holds the page."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "page not found"


class PageConflictError(PagingError):
    """The same key was written with different bytes: an integrity alarm."""


class LayoutMismatchError(PagingError):
    """A layout (geometry / dtype) is invalid or does not match the expected one."""


class StoreFullError(PagingError):
    """The disk is full or the LMDB map reached `max_map_size`; nothing was written."""


class ManifestNotFoundError(PagingError, KeyError):
    """No manifest is stored under that artifact id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "manifest not found"


class StoreIntegrityError(PagingError):
    """The store on disk is not the store that was committed: data.mdb truncated, or LMDB opened
    an older snapshot than its commit record says was written (a damaged meta page, a file
    restored from an older copy). Nothing is served from it and nothing is written to it."""


class StoreCorruptedError(StoreIntegrityError):
    """LMDB found its own structures in data.mdb damaged (a B-tree or meta page, a key): LMDB checksums
    nothing, so it can only say so when it trips over one. Nothing more is read from that spot."""


class StoreLockError(PagingError):
    """data.mdb or lock.mdb was deleted or replaced while the store was open: LMDB's own locking
    can no longer keep writers apart, so this process stops using the store."""


class StoreReadOnlyError(PagingError):
    """The store's files cannot be opened for writing (a read-only file system, or a directory this user
    may not write): nothing can be written there. Read commands open such a store read-only."""


class StoreClosedError(PagingError):
    """The store (or its LMDB tier) was used after close(); open it again."""
