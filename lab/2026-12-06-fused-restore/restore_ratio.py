"""The README's restore ratio, two ways side by side: `PageStore.restore` from LMDB (verified, into a
preallocated buffer, a fresh store per restore) against `np.copyto` of the same bytes, exactly as
bench/graft_vs_recompute.py's `restore_vs_memcpy` times it, with paging/restore.py's own `_run` (`restore_before`:
hash the whole page, then copy it) and with `_run_fused` below (`restore_after`: copy about 256 KiB of the page,
hash it from the destination, and so on; fused_restore.patch is the same change to paging/restore.py), interleaved
in one process. Every restore's bytes are checked against the first restore's.

Pages: smollm2's layout (30 layers, 3 KV heads, head_dim 64, float32, 128-token pages: 5.9 MB each), K/V drawn
from a seeded generator (hashing and copying speed does not depend on the values); 256 pages = the 1.5 GB of
smollm2's 32K context that bench/results/graft_vs_recompute.json restores.

    PYTHONPATH=. python lab/2026-12-06-fused-restore/restore_ratio.py --pages 256 --repeats 7 --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import blake3
import numpy as np
import torch

import paging.restore as restore_mod
from bench.report import environment
from paging import PageLayout, PageStore, StoreConfig
from paging.errors import CorruptPageError
from paging.page import Page

LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32", page_size=128)  # smollm2
STORE = dict(host_budget_bytes=8 << 30, lmdb_map_size=8 << 30)  # as bench/graft_vs_recompute.py


_run_before = restore_mod._run  # paging/restore.py's, as of f0b0dcb
_PIECE_NBYTES = 256 << 10


def _run_fused(job, plan):
    """fused_restore.patch's `_run`: the page's rows copied about `_PIECE_NBYTES` at a time, each piece hashed
    from the destination right after it was copied; a page that fails is overwritten with 0xFF."""
    header, payload = job.header, job.payload
    if job.raw is not None:
        try:
            header, payload = Page.open_bytes(job.raw, expected_key=job.key)
        except CorruptPageError as exc:
            return exc
    plan.ready.wait()
    if plan.dsts is None:
        return header
    dst, want = plan.dsts[job.index], plan.counts[job.index]
    if header.layout != plan.layout or header.num_tokens != want:
        return CorruptPageError(job.key, "layout or length")
    rows = dst.view()
    rows.shape = (-1, dst.shape[-2] * dst.shape[-1])  # [L * 2 * Hkv, T * row]: raises rather than copy
    src = np.frombuffer(payload, dtype=np.uint8).reshape(rows.shape)
    if job.raw is None:
        rows[...] = src
    elif _copy_and_digest(src, rows) != header.payload_blake3:
        rows[...] = 0xFF
        return CorruptPageError(job.key, "payload_blake3 mismatch: the payload was altered")
    return header


def _copy_and_digest(src: np.ndarray, dst: np.ndarray) -> str:
    hasher = blake3.blake3()
    step = max(1, _PIECE_NBYTES // dst.shape[1])
    for a in range(0, dst.shape[0], step):
        piece = dst[a:a + step]
        piece[...] = src[a:a + step]
        for row in piece:
            hasher.update(row)
    return hasher.hexdigest()


def build(store_dir: Path, num_pages: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    keys, parent, t = [], "0" * 64, LAYOUT.page_size
    with PageStore(store_dir, StoreConfig(**STORE)) as store:
        for i in range(num_pages):
            kv = [torch.randn(LAYOUT.num_kv_heads, t, LAYOUT.head_dim, generator=g)
                  for _ in range(2 * LAYOUT.num_layers)]
            page = Page.seal(LAYOUT, "f" * 64, parent, i * t, list(range(i * t, (i + 1) * t)), kv[0::2], kv[1::2])
            store.put_many([page], admit=False)
            keys.append(page.key)
            parent = page.key
    return keys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--kept-store", action="store_true",
                    help="also time restore_before from one store kept open (no fresh map per restore)")
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="restore-ratio-"))
    try:
        t0 = time.perf_counter()
        keys = build(tmp / "store", args.pages)
        print(f"# built {len(keys)} pages in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        with PageStore(tmp / "store", StoreConfig(**STORE)) as store:
            payloads = np.frombuffer(b"".join(store.lmdb_tier.get(k).payload for k in keys), dtype=np.uint8)
            ref = store.restore(keys).kv.contiguous().view(-1).view(torch.uint8).clone()  # [L, 2, Hkv, N, D] bytes
        dst = np.ones_like(payloads)
        buffer = torch.ones(len(payloads), dtype=torch.uint8)
        load_start = os.getloadavg()

        def restore(run):
            def go():
                restore_mod._run = run
                try:
                    with PageStore(tmp / "store", StoreConfig(**STORE)) as store:
                        w, c = time.perf_counter(), time.process_time()  # the store's open is not the restore's
                        got = store.restore(keys, buffer=buffer)
                        w, c = time.perf_counter() - w, time.process_time() - c
                        assert got.stats.verified_pages == len(keys)
                finally:
                    restore_mod._run = _run_before
                return w, c, torch.equal(buffer[:len(payloads)], ref)
            return go

        kept = None
        if args.kept_store:  # a copy of the store (LMDB: one path is opened once per process)
            shutil.copytree(tmp / "store", tmp / "kept")
            kept = PageStore(tmp / "kept", StoreConfig(**STORE))

        def restore_kept():  # one store kept open: its map's pages were faulted in by the repeats before
            w, c = time.perf_counter(), time.process_time()
            kept.restore(keys, buffer=buffer)
            return time.perf_counter() - w, time.process_time() - c, torch.equal(buffer[:len(payloads)], ref)

        def memcpy():
            w, c = time.perf_counter(), time.process_time()
            np.copyto(dst, payloads)
            return time.perf_counter() - w, time.process_time() - c, True

        fns = {"memcpy": memcpy, "restore_before": restore(_run_before), "restore_after": restore(_run_fused)}
        if kept is not None:
            fns["restore_before_kept_store"] = restore_kept
        names, runs = list(fns), {k: [] for k in fns}
        for r in range(args.repeats + 1):  # the first is a warm-up
            for name in names[r % len(names):] + names[:r % len(names)]:
                w, c, ok = fns[name]()
                buffer.fill_(1)
                assert ok, f"{name}: restored bytes differ"
                if r:
                    runs[name].append((w, c))
            print(f"# repeat {r}", file=sys.stderr)
        nbytes = len(payloads)
        med = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        medc = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        # per repeat: memcpy over each restore of the same repeat
        per = {k: [m[0] / x[0] for m, x in zip(runs["memcpy"], runs[k])] for k in ("restore_before", "restore_after")}
        rows = {k: {"median_s": med[k], "gb_per_s": nbytes / med[k] / 1e9, "vs_memcpy": med["memcpy"] / med[k],
                    "vs_memcpy_per_repeat": per.get(k), "cpu_s_median": medc[k],
                    "wall_s_all": [w for w, _ in runs[k]], "cpu_s_all": [c for _, c in runs[k]]} for k in names}
        report = {"lab": "2026-12-06-fused-restore/restore_ratio.py", "argv": sys.argv, "pages": len(keys),
                  "nbytes": nbytes, "repeats": args.repeats, "affinity": sorted(os.sched_getaffinity(0)),
                  "torch_threads": torch.get_num_threads(), "restore_workers": os.cpu_count(),
                  "load_avg_1_5_15": {"start": load_start, "end": os.getloadavg()},
                  "environment": environment(), "rows": rows,
                  "after_over_before": med["restore_before"] / med["restore_after"]}
        for k in names:
            r = rows[k]
            print(f"{k:15s} {r['gb_per_s']:6.2f} GB/s  {r['vs_memcpy']:.3f} of memcpy   cpu {r['cpu_s_median']:.3f} s"
                  + (f"   per repeat {min(per[k]):.3f}..{max(per[k]):.3f}" if k in per else ""))
        print(f"after over before: {report['after_over_before']:.3f}x")
        if kept is not None:
            kept.close()
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
