"""Restore: many pages' K/V straight into one preallocated tensor, verified on all cores.

    out  [L, 2, Hkv, N, D]   per layer K then V; the pages back to back along N (page i at
                             [sum of earlier pages' tokens, + its tokens))

    host tier hit  ── payload verified when it was admitted: copied, not hashed again ──┐
    LMDB           ── zero-copy view (one read transaction) ─── digest, then copied ────┼─> out[:, :, :, s:e]
    neither / bad  ── PageStore.get: remote read-through, quarantine, typed errors ─────┘

Worker threads take whole pages: parse and check the header, hash the page, then copy it into
place while it is still in cache. BLAKE3 and numpy's copy release the GIL on buffers this large,
so hashing runs on every core (and one page's header parse overlaps another's hashing). A worker
gets its page as soon as the value is looked up, and waits only to copy, for the plan of the
whole restore (every value's length gives its tokens, hence where each page goes), which is
made long before the first page is hashed. The threads are the store's own
(`PageStore.hash_pool`), started once. A page whose digest does not match is never copied and
never returned: its bytes are quarantined and the page is read again through `PageStore.get`,
which heals it from a remote or raises CorruptPageError.

NOTE: hashing and copying a piece at a time while it sits in a core's L2 measured no faster than
page by page (this VM's 260 MB L3 holds a page between the two): the copy is bound by memory
writes (docs/RESULTS.md).
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch

from .errors import CorruptPageError, LayoutMismatchError, PageNotFoundError
from .framing import body_len
from .host_tier import HostTier
from .layout import PageLayout
from .lmdb_tier import LMDBTier
from .page import Page, PageHeader, payload_digest


class PageSource(Protocol):
    """What a restore reads pages from and reports back to (`PageStore` is one)."""

    @property
    def host_tier(self) -> HostTier: ...  # copies served as they are (verified when admitted)

    @property
    def lmdb_tier(self) -> LMDBTier: ...  # zero-copy views, verified here

    def hash_pool(self) -> ThreadPoolExecutor: ...  # one thread per core, kept between restores

    def touch_host(self, key: str) -> None: ...  # a host copy was used (LRU order)

    def drop_corrupt(self, key: str, raw: bytes) -> None: ...  # quarantine failed bytes, drop copies

    def get(self, key: str) -> Page: ...  # the slow path: verified; a remote heals or fills in


@dataclass
class RestoreStats:
    """Where the pages of one restore came from."""

    host_pages: int = 0  # copied from the host tier, not hashed again
    verified_pages: int = 0  # read zero-copy from LMDB and digest-verified, then copied
    fallback_pages: int = 0  # through PageStore.get (a remote, or a re-read after a failure)
    nbytes: int = 0  # K/V bytes restored


@dataclass
class Restored:
    headers: list[PageHeader]  # per page, in order
    kv: torch.Tensor  # [L, 2, Hkv, N, D] in the pages' dtype, on the host
    stats: RestoreStats


def restore_nbytes(num_tokens: int, layout: PageLayout) -> int:
    """Bytes of the restored K/V of `num_tokens` tokens (every layer, K and V)."""
    return layout.payload_nbytes(num_tokens)


def kv_view(buffer: torch.Tensor, layout: PageLayout, num_tokens: int) -> torch.Tensor:
    """[L, 2, Hkv, N, D] view of the first bytes of a flat uint8 `buffer` (reusable restore memory)."""
    need = restore_nbytes(num_tokens, layout)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < need or buffer.device.type != "cpu":
        raise LayoutMismatchError(f"a restore buffer is a flat uint8 CPU tensor of >= {need} bytes; got "
                                  f"{buffer.dtype} {tuple(buffer.shape)} on {buffer.device}")
    return buffer[:need].view(layout.torch_dtype).view(
        layout.num_layers, 2, layout.num_kv_heads, num_tokens, layout.head_dim)


@dataclass
class _Job:
    """One page: where it comes from (a host copy, verified when admitted, or an LMDB value)."""

    index: int
    key: str
    header: PageHeader | None = None  # known (host tier); else parsed from `raw` by the worker
    payload: memoryview | None = None  # host payload (verified at admission)
    raw: memoryview | None = None  # LMDB value: parsed and hashed, then copied


class _Plan:
    """Where every page goes, known once every value was looked up (`make`). Workers verify their
    page meanwhile and wait for it (`ready`) only to copy; `dsts` None: nothing is copied."""

    def __init__(self):
        self.ready = threading.Event()
        self.layout: PageLayout | None = None
        self.counts: list[int] = []
        self.kv: torch.Tensor | None = None
        self.dsts: list[np.ndarray] | None = None  # per page: [L, 2, Hkv, T, itemsize * D] bytes of `kv`

    def make(self, jobs: list[_Job], buffer: torch.Tensor | None) -> None:
        counts = _plan(jobs)
        if counts is None:
            return
        self.layout, self.counts = counts
        lay, n = self.layout, sum(self.counts)
        self.kv = torch.empty((lay.num_layers, 2, lay.num_kv_heads, n, lay.head_dim), dtype=lay.torch_dtype) \
            if buffer is None else kv_view(buffer, lay, n)
        out = self.kv.view(torch.uint8).numpy()  # [L, 2, Hkv, N, D * itemsize]: bytes, whatever the dtype (bf16)
        at = np.cumsum([0, *self.counts])
        self.dsts = [out[:, :, :, a:a + t] for a, t in zip(at.tolist(), self.counts)]


def _run(job: _Job, plan: _Plan) -> PageHeader | CorruptPageError:
    """Verify one page if it came from LMDB (framing, header, payload digest), then, once the plan is made,
    copy it into place (worker thread). Never raises for bad bytes."""
    if job.raw is not None:
        try:
            header, payload = Page.open_bytes(job.raw, expected_key=job.key)
        except CorruptPageError as exc:
            return exc
        if payload_digest(payload) != header.payload_blake3:
            return CorruptPageError(job.key, "payload_blake3 mismatch: the payload was altered")
    else:
        header, payload = job.header, job.payload
    plan.ready.wait()
    if plan.dsts is None:
        return header
    dst, want = plan.dsts[job.index], plan.counts[job.index]
    if header.layout != plan.layout or header.num_tokens != want:
        return CorruptPageError(job.key, f"holds {header.num_tokens} tokens of {header.layout}; its value "
                                         f"length says {want} of {plan.layout}")
    dst[...] = np.frombuffer(payload, dtype=np.uint8).reshape(dst.shape)  # NOTE: after the hash: bad bytes never land
    return header


def restore_pages(source: PageSource, keys: Sequence[str], *, buffer: torch.Tensor | None = None,
                  workers: int | None = None) -> Restored:
    """The K/V of `keys` back to back (see module docstring). `buffer`: reusable flat uint8 memory to
    restore into (`kv_view`), else a fresh tensor. Pages read from LMDB are not admitted to the host
    tier: the caller holds their K/V now."""
    keys = list(keys)
    if not keys:
        raise ValueError("nothing to restore: no page keys")
    workers = max(1, min(workers or os.cpu_count() or 1, len(keys)))
    jobs = []
    for i, key in enumerate(keys):
        hit = source.host_tier.peek(key)
        if hit is not None:
            source.touch_host(key)
        jobs.append(_Job(i, key) if hit is None else _Job(i, key, hit[0], _host_view(hit[1])))
    with source.lmdb_tier.view_reader() as view:
        plan, results = _restore_into(source, jobs, view, buffer, workers)
        corrupt = {} if plan.dsts is None else {
            i: (bytes(jobs[i].raw), r) for i, r in enumerate(results) if isinstance(r, CorruptPageError)}
        # NOTE: drop every view of the map before the transaction ends
        for job in jobs:
            job.raw = None

    if plan.dsts is None:  # a page LMDB lacks (a remote may hold it) or whose framing is broken
        return _restore_slow(source, keys, buffer, workers, {})
    for i, (raw, _exc) in corrupt.items():
        source.drop_corrupt(keys[i], raw)
    if corrupt:
        return _restore_slow(source, keys, buffer, workers, corrupt)
    num_lmdb = sum(j.header is None for j in jobs)
    stats = RestoreStats(host_pages=len(keys) - num_lmdb, verified_pages=num_lmdb,
                         nbytes=plan.kv.numel() * plan.kv.element_size())
    source.lmdb_tier.note_verified(stats.verified_pages)
    return Restored(results, plan.kv, stats)


def _host_view(payload) -> memoryview:
    return memoryview(payload.numpy()) if isinstance(payload, torch.Tensor) else payload  # pinned


def _restore_into(source: PageSource, jobs: list[_Job], view, buffer, workers: int
                  ) -> tuple[_Plan, list[PageHeader | CorruptPageError]]:
    """Look up each job's LMDB value (`view`; None: every job is a host copy) and hand it to a worker at
    once, so hashing starts with the first value; make the plan meanwhile. Results in job order, or
    nothing useful when the plan could not be made (then nothing was copied)."""
    plan = _Plan()
    with _workers(source, workers) as pool:
        futures = []
        try:
            for job in jobs:
                if job.header is None and view is not None:
                    job.raw = view(job.key)
                if pool is not None and (job.header is not None or job.raw is not None):
                    futures.append(pool.submit(_run, job, plan))
            plan.make(jobs, buffer)
        finally:
            plan.ready.set()
            wait(futures)  # NOTE: every worker is done with the views before the caller's transaction ends
        if pool is not None:
            return plan, [f.result() for f in futures]
    return plan, ([] if plan.dsts is None else [_run(job, plan) for job in jobs])


@contextlib.contextmanager
def _workers(source: PageSource, workers: int) -> Iterator[ThreadPoolExecutor | None]:
    """The store's own threads when that is one per core, else a pool of `workers` (None: this thread)."""
    if workers == 1:
        yield None
    elif workers == (os.cpu_count() or 1):
        yield source.hash_pool()
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tieredkv-restore") as pool:
            yield pool


def _check_stored(key: str, raw: memoryview | None) -> PageHeader | CorruptPageError | None:
    """One stored value checked in place (worker thread): framing, header, payload digest."""
    if raw is None:
        return None
    try:
        header, payload = Page.open_bytes(raw, expected_key=key)
    except CorruptPageError as exc:
        return exc
    if payload_digest(payload) != header.payload_blake3:
        return CorruptPageError(key, "payload_blake3 mismatch: the payload was altered")
    return header


def verify_stored(source: PageSource, keys: Sequence[str], *, workers: int | None = None
                  ) -> list[PageHeader | None]:
    """Headers of `keys` as LMDB holds them (None where absent), each value's payload digest verified in place:
    zero-copy views from one read transaction, hashed on all cores. What a reader of the disk gets,
    never the host copy. A value that fails is quarantined and CorruptPageError raised."""
    keys = list(keys)
    workers = max(1, min(workers or os.cpu_count() or 1, len(keys) or 1))
    with source.lmdb_tier.views(keys) as raws:
        results = _map(source, workers, _check_stored, keys, raws)
        bad = next(((k, bytes(r), res) for k, r, res in zip(keys, raws, results)
                    if isinstance(res, CorruptPageError)), None)
        del raws  # NOTE: drop every view of the map before the transaction ends
    if bad is not None:
        source.lmdb_tier.quarantine(bad[0], bad[1])
        raise bad[2]
    source.lmdb_tier.note_verified(len(keys) - results.count(None))
    return results


def _plan(jobs: list[_Job]) -> tuple[PageLayout, list[int]] | None:
    """(layout, tokens per page), from host headers and LMDB value lengths; None when a page is
    missing or a value cannot be a page of that layout (the slow path reports why)."""
    layout = next((j.header.layout for j in jobs if j.header is not None), None)
    if layout is None:
        first = next((j.raw for j in jobs if j.raw is not None), None)
        if first is None:
            return None
        try:
            layout = Page.open_bytes(first)[0].layout
        except CorruptPageError:
            return None
    counts = []
    for job in jobs:
        if job.header is not None:
            if job.header.layout != layout:
                raise LayoutMismatchError(f"page {job.key} has layout {job.header.layout}, not {layout}: "
                                          "pages restored together must share one layout")
            counts.append(job.header.num_tokens)
            continue
        if job.raw is None:
            return None
        t, rest = divmod(body_len(job.raw), layout.token_nbytes)
        if rest or not 1 <= t <= layout.page_size:
            return None
        counts.append(t)
    return layout, counts


def _map(source: PageSource, workers: int, fn, *items) -> list:
    """`list(map(fn, *items))` on `workers` threads (`_workers`)."""
    with _workers(source, workers) as pool:
        return list(map(fn, *items) if pool is None else pool.map(fn, *items))


def _restore_slow(source: PageSource, keys: list[str], buffer, workers,
                  corrupt: dict[int, tuple[bytes, CorruptPageError]]) -> Restored:
    """Every page through PageStore.get (verified; a remote heals or fills in), then copied. One key at a
    time, as a graft always read them: `PageStore.prefetch` is what batches a remote's round trips."""
    try:
        pages = [source.get(key) for key in keys]
    except PageNotFoundError:
        if corrupt:  # as PageStore.get: corrupt with no verified copy elsewhere is CorruptPageError
            raise next(iter(corrupt.values()))[1] from None
        raise
    jobs = [_Job(i, key, p.header, memoryview(p.payload)) for i, (key, p) in enumerate(zip(keys, pages))]
    plan, headers = _restore_into(source, jobs, None, buffer, workers)
    return Restored(headers, plan.kv,
                    RestoreStats(fallback_pages=len(keys), nbytes=plan.kv.numel() * plan.kv.element_size()))
