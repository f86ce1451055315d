"""Verified restore of real-size smollm2 pages from LMDB, the ways of copying and hashing them, against one
memcpy of the same bytes (bench/graft_vs_recompute.py's reference), interleaved; wall and process CPU seconds.

    hash_then_copy       BLAKE3 of the whole page, then one numpy copy into place (restore.py before)
    fused_{1,2,4}L_dst   1, 2 or 4 layers' rows copied, then hashed from the destination, row by row
    fused_1L_src         a layer copied, then hashed from the source (one update)
    copy_then_hash_dst   the whole page copied, then hashed from the destination
    pread_{1,4}L         preadv() of 1 or 4 layers from data.mdb straight into the destination rows, then hashed
    populate_then_fused  madvise(MADV_POPULATE_READ) on the page's bytes first, then fused_1L_src
    copy_only, hash_only, touch_only (one byte a 4 KiB page: the map's page faults), populate_only: the parts
    restore              PageStore.restore as the branch has it

Pages: smollm2's layout, K/V from a seeded generator; a fresh store (a fresh map) per call, as the bench does.

    PYTHONPATH=. python lab/2026-12-06-fused-restore/fused_microbench.py --pages 48 --repeats 5 --workers 1
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import numpy as np
import torch

from paging import PageLayout, PageStore, StoreConfig
from paging.page import Page

LAYOUT = PageLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32", page_size=128)  # smollm2
STORE = dict(host_budget_bytes=8 << 30, lmdb_map_size=8 << 30)


def build(store_dir: Path, num_pages: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    keys, parent = [], "0" * 64
    with PageStore(store_dir, StoreConfig(**STORE)) as store:
        for i in range(num_pages):
            kv = [torch.randn(LAYOUT.num_kv_heads, 128, LAYOUT.head_dim, generator=g)
                  for _ in range(2 * LAYOUT.num_layers)]
            page = Page.seal(LAYOUT, "f" * 64, parent, i * 128, list(range(i * 128, i * 128 + 128)), kv[0::2], kv[1::2])
            store.put_many([page], admit=False)
            keys.append(page.key)
            parent = page.key
    return keys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--variants", default="")
    ap.add_argument("--out")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fused-"))
    keys = build(tmp / "store", args.pages)
    T = 128
    n = T * len(keys)
    nbytes = LAYOUT.payload_nbytes(n)
    buffer = torch.ones(nbytes, dtype=torch.uint8)
    out = buffer.view(torch.float32).view(LAYOUT.num_layers, 2, LAYOUT.num_kv_heads, n, LAYOUT.head_dim)
    out8 = out.view(torch.uint8).numpy()
    dsts = [out8[:, :, :, i * T:(i + 1) * T] for i in range(len(keys))]
    with PageStore(tmp / "store", StoreConfig(**STORE)) as store:
        payloads = np.frombuffer(b"".join(store.lmdb_tier.get(k).payload for k in keys), dtype=np.uint8)
        digests = [store.lmdb_tier.get(k).payload_blake3 for k in keys]
        ref_out = store.restore(keys).kv.clone()
    memdst = np.ones_like(payloads)
    pool = ThreadPoolExecutor(args.workers)
    rows = LAYOUT.num_layers * 2 * LAYOUT.num_kv_heads
    row_b = T * LAYOUT.head_dim * 4

    def hash_then_copy(src, dst):
        d = blake3.blake3(src).hexdigest()
        dst[...] = src.reshape(dst.shape)
        return d

    def fused(layers_per_chunk, hash_dst):
        def f(src, dst):
            h = blake3.blake3()
            s = src.reshape(dst.shape)
            for a in range(0, LAYOUT.num_layers, layers_per_chunk):
                b = min(a + layers_per_chunk, LAYOUT.num_layers)
                dst[a:b] = s[a:b]
                if hash_dst:
                    for row in dst[a:b].reshape(-1, T, row_b // T):  # each contiguous row of the destination
                        h.update(row)
                else:
                    h.update(s[a:b])
            return h.hexdigest()
        return f

    def copy_then_hash_dst(src, dst):
        dst[...] = src.reshape(dst.shape)
        h = blake3.blake3()
        for row in dst.reshape(rows, T, -1):
            h.update(row)
        return h.hexdigest()

    def copy_only(src, dst):
        dst[...] = src.reshape(dst.shape)
        return None

    def touch_only(src, dst):
        return int(src[::4096].sum())

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def populate(src):
        a = src.ctypes.data
        start = a & ~4095
        if libc.madvise(start, a + src.nbytes - start, 22) != 0:  # MADV_POPULATE_READ
            raise OSError(ctypes.get_errno(), "madvise")

    def populate_only(src, dst):
        populate(src)

    def populate_then_fused(src, dst):
        populate(src)
        return fused(1, False)(src, dst)

    def hash_only(src, dst):
        return blake3.blake3(src).hexdigest()

    fd = os.open(tmp / "store" / "data.mdb", os.O_RDONLY)
    ld = LAYOUT.layer_nbytes(T)

    def pread_fused(layers_per_chunk):
        def f(src, dst):
            off, = src  # the payload's offset in data.mdb
            h = blake3.blake3()
            for a in range(0, LAYOUT.num_layers, layers_per_chunk):
                b = min(a + layers_per_chunk, LAYOUT.num_layers)
                rows = list(dst[a:b].reshape(-1, T, row_b // T))
                got = os.preadv(fd, rows, off + a * ld)
                assert got == (b - a) * ld, (got, (b - a) * ld, off, os.fstat(fd).st_size)
                for row in rows:
                    h.update(row)
            return h.hexdigest()
        return f

    def run_pages(fn, by_offset=False):
        def go():
            with PageStore(tmp / "store", StoreConfig(**STORE)) as store:
                path = os.path.realpath(tmp / "store" / "data.mdb")
                base = None
                for line in open("/proc/self/maps"):
                    if line.rstrip().endswith(path):
                        lo, _ = line.split()[0].split("-")
                        if int(line.split()[2], 16) == 0:
                            base = int(lo, 16)
                with store.lmdb_tier.view_reader() as view:
                    t0, c0 = time.perf_counter(), time.process_time()
                    srcs = []
                    for k in keys:
                        raw = view(k)
                        hdr, payload = Page.open_bytes(raw, expected_key=k)
                        if by_offset:
                            srcs.append((np.frombuffer(payload, dtype=np.uint8).ctypes.data - base,))
                        else:
                            srcs.append(np.frombuffer(payload, dtype=np.uint8))
                    res = list(pool.map(fn, srcs, dsts))
                    s = (time.perf_counter() - t0, time.process_time() - c0)
                    del srcs, raw, payload
            if fn not in (copy_only, touch_only, populate_only) and res != digests:
                raise SystemExit(f"digest mismatch in {fn}")
            return s
        return go

    def restore_real():
        with PageStore(tmp / "store", StoreConfig(**STORE)) as store:
            t0, c0 = time.perf_counter(), time.process_time()
            store.restore(keys, buffer=buffer, workers=args.workers)
            return time.perf_counter() - t0, time.process_time() - c0

    def memcpy():
        t0, c0 = time.perf_counter(), time.process_time()
        np.copyto(memdst, payloads)
        return time.perf_counter() - t0, time.process_time() - c0

    methods = {"memcpy": memcpy, "restore": restore_real,
               "hash_then_copy": run_pages(hash_then_copy),
               "fused_1L_src": run_pages(fused(1, False)), "fused_1L_dst": run_pages(fused(1, True)),
               "fused_2L_dst": run_pages(fused(2, True)), "fused_4L_dst": run_pages(fused(4, True)),
               "copy_then_hash_dst": run_pages(copy_then_hash_dst),
               "copy_only": run_pages(copy_only), "hash_only": run_pages(hash_only),
               "pread_1L": run_pages(pread_fused(1), True), "pread_4L": run_pages(pread_fused(4), True),
               "touch_only": run_pages(touch_only), "populate_only": run_pages(populate_only),
               "populate_then_fused": run_pages(populate_then_fused)}
    if args.variants:
        methods = {k: v for k, v in methods.items() if k in args.variants.split(",") or k == "memcpy"}
    times = {k: [] for k in methods}
    names = list(methods)
    for r in range(args.repeats + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            s = methods[name]()
            if r:
                times[name].append(s)
        print(f"# repeat {r}", file=sys.stderr)
    assert torch.equal(out, ref_out)
    cpu = {k: [c for _, c in v] for k, v in times.items()}
    times = {k: [w for w, _ in v] for k, v in times.items()}
    mc = statistics.median(times["memcpy"])
    mcc = statistics.median(cpu["memcpy"])
    res = {"pages": len(keys), "nbytes": nbytes, "workers": args.workers, "cpus": sorted(os.sched_getaffinity(0)),
           "load_avg": os.getloadavg(), "rows": {}}
    for k, v in times.items():
        m = statistics.median(v)
        c = statistics.median(cpu[k])
        res["rows"][k] = {"median_s": m, "gb_per_s": nbytes / m / 1e9, "of_memcpy": mc / m, "all_s": v,
                          "cpu_s_median": c, "cpu_of_memcpy": mcc / c, "cpu_s_all": cpu[k]}
        print(f"{k:22s} {nbytes / m / 1e9:6.2f} GB/s  {mc / m:5.3f} of memcpy"
              f"   min {min(v)*1e3:.1f} max {max(v)*1e3:.1f} ms"
              f"   cpu {c*1e3:.1f} ms = {mcc / c:5.3f} of memcpy's cpu")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    os.close(fd)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
