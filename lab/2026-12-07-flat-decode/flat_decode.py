"""Decode ms/token at growing contexts against an 8K pair, with where the time goes (tiny-llama, union, 128-token pages).

    taskset -c 1 env PYTHONPATH=. .venv/bin/python lab/2026-12-07-flat-decode/flat_decode.py \
        --contexts 8192,131072,1048576 --steps 60 --out lab/2026-12-07-flat-decode/<name>.json

As bench/memory_vs_context.py --decode-pair 8192 does: one context grows through the checkpoints; at each, the
main context's greedy steps alternate with steps of a second context of 8,192 tokens (another store), so that a
neighbour's load slows both alike; the row's `ratio` is the median main step over the median pair step. Wall
time inside the main context's steps is summed per function (`--split`, a wrapper per call: about a
microsecond each), and every page search of `--check-steps` more steps is compared with the flat scan (recall
of its top-k, identical answers). The output ids' SHA-256 per checkpoint says whether two code versions decode
the same tokens. Self-contained (no bench/ imports: those modules are moving).
"""
from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import warnings

import numpy as np
import torch

from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.question.corpus import python_reference

SPENT: collections.Counter = collections.Counter()
# module:Class.method timed per call with --split (names that a code version lacks are skipped)
TIMED = ["index.page_index:PageIndex.search", "paging.store:PageStore.fetch_layers",
         "paging.store:PageStore.read_layers", "tieredkv.engine.kv_buffer:WorkingSetBuffer._write_slots",
         "tieredkv.engine.kv_buffer:WorkingSetBuffer.arrange", "tieredkv.engine.tiered_cache:TieredCache._slot_kv",
         "tieredkv.engine.tiered_cache:TieredCache.working_set",
         "tieredkv.engine.tiered_cache:TieredCache._plan_or_reuse",
         "torch.nn.functional:scaled_dot_product_attention"]


def wrap(spec: str) -> None:
    mod, _, attr = spec.partition(":")
    owner = importlib.import_module(mod)
    *path, name = attr.split(".")
    for p in path:
        owner = getattr(owner, p)
    f = getattr(owner, name, None)
    if f is None:
        return

    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            SPENT[name] += time.perf_counter() - t0

    setattr(owner, name, g)


def corpus_ids(lm, n: int) -> list[int]:
    base = lm.codec.encode(python_reference())
    return (base * (n // len(base) + 1))[:n]


def greedy_step(tm):
    def step(tok):
        logits = tm.forward(torch.tensor([[int(tok) % 200 + 32]]), logits_to_keep=1).logits
        return int(logits[0, -1].argmax())

    return step


class Recall:
    """Stands in for the cache's index: every search also runs the flat scan and is compared."""

    def __init__(self, index) -> None:
        self.index, self.searches, self.identical, self.found, self.wanted = index, 0, 0, 0, 0

    def __getattr__(self, name):
        return getattr(self.index, name)

    def search(self, layer, queries, k, exclude=()):
        ids, scores = self.index.search(layer, queries, k, exclude)
        ref_ids, ref_scores = self.index.search_flat(layer, queries, k, exclude)
        self.searches += 1
        self.identical += int(np.array_equal(ids, ref_ids) and scores.tobytes() == ref_scores.tobytes())
        for got, ref in zip(ids, ref_ids):
            self.found += len(set(got[got >= 0].tolist()) & set(ref[ref >= 0].tolist()))
            self.wanted += int((ref >= 0).sum())
        return ids, scores


def overlap(log, num_layers: int) -> float:
    """Mean share of a layer's retrieved pages that the same layer retrieved at the step before."""
    shares = []
    for layer in range(num_layers):
        seq = [set(x) for x in log[layer::num_layers]]
        shares += [len(a & b) / max(1, len(b)) for a, b in zip(seq, seq[1:])]
    return sum(shares) / max(1, len(shares))


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="8192,131072,1048576")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--check-steps", type=int, default=4)
    ap.add_argument("--split", action="store_true", help="time the functions in TIMED inside the main steps")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="own positions reach")
    torch.set_num_threads(1)
    if args.split:
        for spec in TIMED:
            wrap(spec)
    lm = load_model("tiny-llama")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    contexts = [int(x) for x in args.contexts.split(",")]
    ids = corpus_ids(lm, contexts[-1] + 8192)
    tmp = tempfile.mkdtemp(prefix="flat-decode-")
    models = [TieredModel(lm, PageStore(f"{tmp}/{name}", StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                                                      device="cpu")), cfg) for name in ("main", "pair")]
    main_tm, pair = models
    rows = []
    started = time.perf_counter()
    with torch.inference_mode():
        pair.prefill(ids[1:8193], logits_to_keep=None)  # other text (the corpus shifted by one token)
        step, pair_step = greedy_step(main_tm), greedy_step(pair)
        pos = 0
        for n in contexts:
            t0 = time.perf_counter()
            while main_tm.num_tokens < n:
                k = min(8192, n - main_tm.num_tokens)
                main_tm.prefill(ids[pos:pos + k], logits_to_keep=None)
                pos += k
            ingest_s = time.perf_counter() - t0
            a = b = 0
            for _ in range(3):
                a, b = step(a), pair_step(b)
            SPENT.clear()
            main_tm.cache.retrieval_log.clear()
            counts0 = dict(main_tm.cache.fetch_counts)
            ta, tb, out_ids = [], [], []
            load0 = os.getloadavg()[0]
            for _ in range(args.steps):
                t0 = time.perf_counter()
                a = step(a)
                ta.append(time.perf_counter() - t0)
                out_ids.append(a)
                kept = dict(SPENT)
                t0 = time.perf_counter()
                b = pair_step(b)
                tb.append(time.perf_counter() - t0)
                SPENT.clear()
                SPENT.update(kept)
            kept_share = overlap(list(main_tm.cache.retrieval_log), lm.model.config.num_hidden_layers)
            counts = {k: v - counts0.get(k, 0) for k, v in main_tm.cache.fetch_counts.items()}
            probe = main_tm.cache.index = Recall(main_tm.cache.index)
            for _ in range(args.check_steps):
                a = step(a)
                out_ids.append(a)
            main_tm.cache.index = probe.index
            med = lambda xs: 1000 * sorted(xs)[len(xs) // 2]  # noqa: E731
            st = main_tm.store.stats()
            buffers = sum(layer.buffer.nbytes for layer in main_tm.cache.layers if layer.buffer is not None)
            row = {"context_tokens": n, "decode_ms": med(ta), "pair_8k_decode_ms": med(tb),
                   "ratio": med(ta) / med(tb), "ingest_s": round(ingest_s, 1), "load_avg_1": round(load0, 2),
                   "retrieved_kept_from_step_before": round(kept_share, 3),
                   "fetch_counts_per_step": {k: v / args.steps for k, v in counts.items()},
                   "device_bytes": st["device"]["bytes"] + buffers, "device_tier_bytes": st["device"]["bytes"],
                   "search_recall": probe.found / max(1, probe.wanted),
                   "search_identical": f"{probe.identical}/{probe.searches}",
                   "output_ids_sha256": hashlib.sha256(json.dumps(out_ids).encode()).hexdigest()[:16],
                   "ms_per_step": {name: round(1000 * s / args.steps, 4) for name, s in SPENT.items()}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    for tm in models:
        tm.close()
        tm.store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    report = {"study": "flat_decode", "git_head": git_head(), "config": vars(args),
              "environment": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                              "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                              "affinity": sorted(os.sched_getaffinity(0)), "load_avg_end": os.getloadavg()},
              "seconds": round(time.perf_counter() - started, 1),
              "input_ids_sha256": hashlib.sha256(json.dumps(ids[:contexts[-1]]).encode()).hexdigest()[:16],
              "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
