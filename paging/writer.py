"""The one rule for batching page writes: one LMDB transaction per `max_pages` pages or
`max_nbytes` bytes, whichever comes first, and whatever is left on `flush`.

    with PageWriter(store) as w:      # deposit, TieredModel sealing, import all write through this
        w.add(page)                   # written once the batch is full
    # leaving the block flushes; an exception leaves unflushed pages unwritten (never half a batch)
"""
from __future__ import annotations

from .page import Page

DEFAULT_MAX_PAGES = 16
DEFAULT_MAX_NBYTES = 32 << 20


class PageWriter:
    """Buffers sealed pages for `store.put_many`. `pending` are sealed but not yet written: readers of
    a context that is still being written look them up here (`pending_page`)."""

    def __init__(self, store, *, max_pages: int = DEFAULT_MAX_PAGES, max_nbytes: int = DEFAULT_MAX_NBYTES,
                 persist: bool = True, admit: bool = True):
        if max_pages < 1 or max_nbytes < 1:
            raise ValueError(f"max_pages and max_nbytes must be >= 1, got {max_pages}, {max_nbytes}")
        self.store, self.max_pages, self.max_nbytes = store, max_pages, max_nbytes
        # NOTE: persist=False keeps every page in `pending` and never writes: question-time pages that
        # must not grow the store (the caller bounds how many it seals).
        self.persist = persist
        self.admit = admit  # False: written pages skip the host tier (PageStore.put_many)
        self.pending: list[Page] = []
        self._nbytes = 0
        self.num_written = 0

    def add(self, page: Page) -> None:
        self.pending.append(page)
        self._nbytes += page.nbytes
        if self.persist and (len(self.pending) >= self.max_pages or self._nbytes >= self.max_nbytes):
            self.flush()

    def flush(self) -> None:
        if self.persist and self.pending:
            self.store.put_many(self.pending, admit=self.admit)
            self.num_written += len(self.pending)
            self.pending, self._nbytes = [], 0

    def __enter__(self) -> "PageWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.flush()
