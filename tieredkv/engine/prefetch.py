"""Background reads of pages from LMDB into the host tier, overlapping compute.

A worker thread reads and SHA-256-verifies pages (LMDB reads and hashlib release the GIL);
the main thread admits finished pages into the host tier when it next touches the store, so
the store's bookkeeping is only ever mutated from one thread.

Prediction: while layer l computes, the pages layer l+1 selected for the previous query chunk
are loaded (consecutive chunks and decode steps retrieve largely the same pages).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from paging import CorruptPageError, PageStore


class Prefetcher:
    def __init__(self, store: PageStore, *, workers: int = 1):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tieredkv-prefetch")
        self._pending: dict[str, Future] = {}
        self.counts = {"submitted": 0, "admitted": 0, "failed": 0}

    def submit(self, keys) -> None:
        host = self.store.host_tier
        for key in keys:
            if key in self._pending or host.contains(key) or self.store.reads_layers(key):
                continue  # NOTE: a page whose layers are read alone costs a layer on demand, not a page here
            self._pending[key] = self._pool.submit(self.store.lmdb_tier.get, key)
            self.counts["submitted"] += 1

    def admit_ready(self) -> None:
        """Move finished reads into the host tier (main thread only)."""
        for key in [k for k, f in self._pending.items() if f.done()]:
            fut = self._pending.pop(key)
            try:
                page = fut.result()
            except CorruptPageError:  # quarantined by the tier; the foreground read will report it
                self.counts["failed"] += 1
                continue
            if page is not None:
                self.store.admit(page)
                self.counts["admitted"] += 1

    def wait(self, key: str) -> None:
        """If `key` is being read, wait for it instead of reading it twice."""
        fut = self._pending.get(key)
        if fut is not None:
            fut.exception()
            self.admit_ready()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
