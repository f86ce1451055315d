"""Restore: many pages' K/V straight into one preallocated tensor, verified on all cores.

    out  [L, 2, Hkv, N, D]   per layer K then V; the pages back to back along N (page i at
                             [sum of earlier pages' tokens, + its tokens))

    host tier hit  ── payload verified when it was admitted: copied, not hashed again ──┐
    LMDB           ── zero-copy view (one read transaction) ── SHA-256 while copied ────┼─> out[:, :, :, s:e]
    neither / bad  ── PageStore.get: remote read-through, quarantine, typed errors ─────┘

Worker threads take whole pages: parse and check the header, then hash the page and copy it
into place while it is still in cache. hashlib and numpy's copy release the GIL on buffers this
large, so hashing runs on every core (and one page's header parse overlaps another's hashing).
The threads are the store's own (`PageStore.hash_pool`), started once. A page whose SHA-256 does
not match is never copied and never returned: its bytes are quarantined and the page is read
again through `PageStore.get`, which heals it from a remote or raises CorruptPageError.

NOTE: hashing and copying a piece at a time while it sits in a core's L2 measured no faster than
page by page (this VM's 260 MB L3 holds a page between the two): the copy is bound by memory
writes, which is why restore stays near 0.75 of hashing alone (docs/PERFORMANCE.md).
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from .errors import CorruptPageError, LayoutMismatchError, PageNotFoundError
from .framing import body_len
from .layout import PageLayout
from .page import Page, PageHeader

if TYPE_CHECKING:  # pragma: no cover
    from .store import PageStore


@dataclass
class RestoreStats:
    """Where the pages of one restore came from."""

    host_pages: int = 0  # copied from the host tier, not hashed again
    verified_pages: int = 0  # read zero-copy from LMDB and SHA-256-verified while copied
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
    """One page: where it goes (`dst`: [L, 2, Hkv, T, itemsize * D] bytes of `out`) and where it comes from."""

    index: int
    key: str
    num_tokens: int
    dst: np.ndarray
    header: PageHeader | None = None  # known (host tier); else parsed from `raw` by the worker
    payload: memoryview | None = None  # host payload (verified at admission)
    raw: memoryview | None = None  # LMDB value: parsed, then hashed while copied


def _run(job: _Job, layout: PageLayout) -> PageHeader | CorruptPageError:
    """Copy one page into place (worker thread); hash it if it came from LMDB. Never raises for bad bytes."""
    verify = job.raw is not None
    if verify:
        try:
            header, payload = Page.open_bytes(job.raw, expected_key=job.key)
        except CorruptPageError as exc:
            return exc
        if header.layout != layout or header.num_tokens != job.num_tokens:
            return CorruptPageError(job.key, f"holds {header.num_tokens} tokens of {header.layout}; its value "
                                             f"length says {job.num_tokens} of {layout}")
    else:
        header, payload = job.header, job.payload
    src = np.frombuffer(payload, dtype=np.uint8).reshape(job.dst.shape)
    if verify and hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        return CorruptPageError(job.key, "payload_sha256 mismatch: the payload was altered")
    job.dst[...] = src  # NOTE: after the hash, which left the page in cache; bad bytes are never copied
    return header


def restore_pages(store: "PageStore", keys: Sequence[str], *, buffer: torch.Tensor | None = None,
                  workers: int | None = None) -> Restored:
    """The K/V of `keys` back to back (see module docstring). `buffer`: reusable flat uint8 memory to
    restore into (`kv_view`), else a fresh tensor. Pages read from LMDB are not admitted to the host
    tier: the caller holds their K/V now."""
    keys = list(keys)
    if not keys:
        raise ValueError("nothing to restore: no page keys")
    workers = max(1, min(workers or os.cpu_count() or 1, len(keys)))
    host_hits = [store.host_tier.peek(key) for key in keys]
    for key, hit in zip(keys, host_hits):
        if hit is not None:
            store.touch_host(key)
    lmdb_idx = [i for i, hit in enumerate(host_hits) if hit is None]
    with store.lmdb_tier.views([keys[i] for i in lmdb_idx]) as raw_views:
        raws: list[memoryview | None] = [None] * len(keys)
        for i, raw in zip(lmdb_idx, raw_views):
            raws[i] = raw
        counts = _plan(keys, host_hits, raws)
        if counts is not None:
            layout, num_tokens = counts[0], sum(counts[1])
            kv = torch.empty((layout.num_layers, 2, layout.num_kv_heads, num_tokens, layout.head_dim),
                             dtype=layout.torch_dtype) if buffer is None else kv_view(buffer, layout, num_tokens)
            results = _copy_all(store, keys, host_hits, raws, counts[1], kv, layout, workers)
            corrupt = {i: (bytes(raws[i]), r) for i, r in enumerate(results) if isinstance(r, CorruptPageError)}
        # NOTE: drop every view of the map before the transaction ends
        del raw_views, raws

    if counts is None:  # a page LMDB lacks (a remote may hold it) or whose framing is broken
        return _restore_slow(store, keys, buffer, workers, {})
    for i, (raw, _exc) in corrupt.items():
        store.drop_corrupt(keys[i], raw)
    if corrupt:
        return _restore_slow(store, keys, buffer, workers, corrupt)
    stats = RestoreStats(host_pages=len(keys) - len(lmdb_idx), verified_pages=len(lmdb_idx),
                         nbytes=kv.numel() * kv.element_size())
    store.lmdb_tier.note_verified(stats.verified_pages)
    return Restored(results, kv, stats)


def _check_stored(key: str, raw: memoryview | None) -> PageHeader | CorruptPageError | None:
    """One stored value checked in place (worker thread): framing, header, SHA-256 of the payload."""
    if raw is None:
        return None
    try:
        header, payload = Page.open_bytes(raw, expected_key=key)
    except CorruptPageError as exc:
        return exc
    if hashlib.sha256(payload).hexdigest() != header.payload_sha256:
        return CorruptPageError(key, "payload_sha256 mismatch: the payload was altered")
    return header


def verify_stored(store: "PageStore", keys: Sequence[str], *, workers: int | None = None
                  ) -> list[PageHeader | None]:
    """Headers of `keys` as LMDB holds them (None where absent), each value SHA-256-verified in place:
    zero-copy views from one read transaction, hashed on all cores. What a reader of the disk gets,
    never the host copy. A value that fails is quarantined and CorruptPageError raised."""
    keys = list(keys)
    workers = max(1, min(workers or os.cpu_count() or 1, len(keys) or 1))
    with store.lmdb_tier.views(keys) as raws:
        results = _map(store, workers, _check_stored, keys, raws)
        bad = next(((k, bytes(r), res) for k, r, res in zip(keys, raws, results)
                    if isinstance(res, CorruptPageError)), None)
        del raws  # NOTE: drop every view of the map before the transaction ends
    if bad is not None:
        store.lmdb_tier.quarantine(bad[0], bad[1])
        raise bad[2]
    store.lmdb_tier.note_verified(len(keys) - results.count(None))
    return results


def _plan(keys, host_hits, raws) -> tuple[PageLayout, list[int]] | None:
    """(layout, tokens per page), from host headers and LMDB value lengths; None when a page is
    missing or a value cannot be a page of that layout (the slow path reports why)."""
    layout = next((hit[0].layout for hit in host_hits if hit is not None), None)
    if layout is None:
        first = next((r for r in raws if r is not None), None)
        if first is None:
            return None
        try:
            layout = Page.open_bytes(first)[0].layout
        except CorruptPageError:
            return None
    counts = []
    for hit, raw in zip(host_hits, raws):
        if hit is not None:
            if hit[0].layout != layout:
                raise LayoutMismatchError(f"page {hit[0].key} has layout {hit[0].layout}, not {layout}: "
                                          "pages restored together must share one layout")
            counts.append(hit[0].num_tokens)
            continue
        if raw is None:
            return None
        t, rest = divmod(body_len(raw), layout.token_nbytes)
        if rest or not 1 <= t <= layout.page_size:
            return None
        counts.append(t)
    return layout, counts


def _copy_all(store: "PageStore", keys, host_hits, raws, counts, kv: torch.Tensor, layout: PageLayout,
              workers: int) -> list[PageHeader | CorruptPageError]:
    out = kv.view(torch.uint8).numpy()  # [L, 2, Hkv, N, D * itemsize]: bytes, whatever the dtype (bf16)
    jobs, at = [], 0
    for i, (key, hit, raw, t) in enumerate(zip(keys, host_hits, raws, counts)):
        job = _Job(i, key, t, out[:, :, :, at:at + t])
        if hit is not None:
            payload = hit[1]
            job.header = hit[0]
            job.payload = memoryview(payload.numpy()) if isinstance(payload, torch.Tensor) else payload  # pinned
        else:
            job.raw = raw
        jobs.append(job)
        at += t
    return _map(store, workers, lambda j: _run(j, layout), jobs)


def _map(store: "PageStore", workers: int, fn, *items) -> list:
    """`list(map(fn, *items))` on `workers` threads: the store's own pool when that is one per core."""
    if workers == 1:
        return list(map(fn, *items))
    if workers == (os.cpu_count() or 1):
        return list(store.hash_pool().map(fn, *items))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tieredkv-restore") as pool:
        return list(pool.map(fn, *items))


def _restore_slow(store: "PageStore", keys: list[str], buffer, workers,
                  corrupt: dict[int, tuple[bytes, CorruptPageError]]) -> Restored:
    """Every page through PageStore.get (verified; a remote heals or fills in), then copied. One key at a
    time, as a graft always read them: `PageStore.prefetch` is what batches a remote's round trips."""
    try:
        pages = [store.get(key) for key in keys]
    except PageNotFoundError:
        if corrupt:  # as PageStore.get: corrupt with no verified copy elsewhere is CorruptPageError
            raise next(iter(corrupt.values()))[1] from None
        raise
    layout = pages[0].layout
    hits = [(p.header, memoryview(p.payload)) for p in pages]
    counts = _plan(keys, hits, [None] * len(keys))[1]
    num_tokens = sum(counts)
    kv = torch.empty((layout.num_layers, 2, layout.num_kv_heads, num_tokens, layout.head_dim),
                     dtype=layout.torch_dtype) if buffer is None else kv_view(buffer, layout, num_tokens)
    headers = _copy_all(store, keys, hits, [None] * len(keys), counts, kv, layout, workers)
    return Restored(headers, kv, RestoreStats(fallback_pages=len(keys), nbytes=kv.numel() * kv.element_size()))
