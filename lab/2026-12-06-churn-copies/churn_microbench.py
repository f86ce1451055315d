"""Micro-benchmark of a retrieving decode step's churn, per layer and step: one PageStore.fetch_layers of 25 pages
the host tier holds (tiny-llama's page layout, device tier sized as bench.memory_vs_context sizes it), the
working-set buffer's writes of 25 slots (tiny-llama float32; smollm2-like bfloat16), and an in-place arrange of
a 49-page working set of which ~12% stays from step to step. us per call, best of repeats. Run it in two trees
to compare them (the same script works on the branch start):

    taskset -c 1 env PYTHONPATH=. python lab/2026-12-06-churn-copies/churn_microbench.py --label after
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import tempfile
import time
import warnings

import numpy as np
import torch

from paging import ROOT_KEY, Page, PageLayout, PageStore, StoreConfig
from tieredkv.engine.kv_buffer import SlotKey, WorkingSetBuffer


def best(f, repeats: int, inner: int) -> float:
    f()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            f()
        out.append((time.perf_counter() - t0) / inner * 1e6)
    return round(min(out), 1)


def fetch_us(repeats: int) -> float:
    lay = PageLayout(2, 2, 16, "float32", 128)
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 128, 16, generator=gen) for _ in range(4)]
    pages, parent = [], ROOT_KEY
    for i in range(1500):
        kv = [b + i for b in base]
        pages.append(Page.seal(lay, "ab" * 32, parent, 128 * i, [i % 200] * 128, kv[::2], kv[1::2]))
        parent = pages[-1].key
    store = PageStore(tempfile.mkdtemp() + "/s", StoreConfig(device_budget_bytes=3211264, device="cpu"))
    store.put_many(pages)
    rng = random.Random(0)
    batches = [[pages[j].key for j in rng.sample(range(len(pages)), 25)] for _ in range(200)]
    it = iter(range(1 << 60))

    def one():
        i = next(it)
        store.fetch_layers(batches[i % len(batches)], i % 2)
    us = best(one, repeats, 200)
    store.close()
    return us


def write_us(H: int, D: int, dtype: torch.dtype, repeats: int, nslots: int = 25, T: int = 128) -> float:
    b = WorkingSetBuffer(H, D, dtype, "cpu")
    b._make_room(64 * T)
    rng = np.random.default_rng(0)
    starts = [b.lo + int(x) for x in sorted(rng.choice(62, nslots, replace=False) * T)]
    kvs = [tuple(torch.randn(2, H, T, D).to(dtype).unbind(0)) for _ in range(nslots)]
    keys = [SlotKey(1000 * i, 1000 * i + T, 0, 0, 0) for i in range(nslots)]
    return best(lambda: b._write_slots(keys, starts, kvs), repeats, 50)


def arrange_us(repeats: int, steps: int = 300, T: int = 128, H: int = 2, D: int = 16) -> tuple[float, str]:
    torch.manual_seed(0)
    pages = {i: torch.randn(2, H, T, D) for i in range(600)}
    rng = random.Random(0)
    local = list(range(580, 596))
    sel, seq = sorted(rng.sample(range(1, 580), 32)), []
    for _ in range(steps):
        keep = [p for p in sel if rng.random() < 0.12]
        sel = sorted(set(keep) | set(rng.sample(range(1, 580), 32 - len(keep))))
        seq.append([0] + sel + local)
    times, digest = [], None
    for _ in range(repeats):
        b = WorkingSetBuffer(H, D, torch.float32, "cpu")
        b.reset(600 * T)
        b.append(torch.ones(1, H, 5, D), torch.ones(1, H, 5, D))
        t0 = time.perf_counter()
        for i, ids in enumerate(seq):
            wanted = [SlotKey(p * T, p * T + T, 0, 0, 0) for p in ids]
            b.arrange(wanted, lambda idx, w=wanted: [tuple(pages[w[j].start // T].unbind(0)) for j in idx],
                      in_order=(i == 0))
        times.append((time.perf_counter() - t0) / steps * 1e6)
        h = hashlib.sha256()
        for t in b.views():
            h.update(t.contiguous().numpy().tobytes())
        digest = h.hexdigest()
    return round(min(times), 1), digest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    torch.set_num_threads(1)
    arr, digest = arrange_us(args.repeats)
    row = {"label": args.label, "fetch_layers_25_us": fetch_us(args.repeats),
           "write_slots_25_float32_2x16_us": write_us(2, 16, torch.float32, args.repeats),
           "write_slots_25_bfloat16_5x64_us": write_us(5, 64, torch.bfloat16, args.repeats),
           "arrange_in_place_us": arr, "arrange_views_sha256": digest}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
