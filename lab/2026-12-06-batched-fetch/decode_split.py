"""Where a retrieving decode step's time goes as the context grows (tiny-llama, union retrieval, 128-token pages).

    PYTHONPATH=. python lab/2026-12-06-batched-fetch/decode_split.py --contexts 8192,131072,1048576 --out after.json

lab/2026-12-06-decode-growth/decode_growth.py, timing PageStore.fetch_layers (the batched fetch) as well as
fetch_layer; nothing else changed, so its `before` JSON and this script's `after` JSON compare row for row.

One context grows through the checkpoints; at each, 60 greedy steps alternate with steps of a second context
of 8,192 tokens (as bench/memory_vs_context.py --decode-pair does). Wall time inside the main context's
steps is summed per function (page search, page fetches into the device tier, slot writes, the whole
arrangement of the working set); the retrieval log gives how many of a layer's retrieved pages the step
before had retrieved too. Writes JSON (timings are this machine's; the output ids' hash is not).
"""
from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import shutil
import tempfile
import time
import warnings

import torch

from bench.memory_vs_context import corpus_ids, greedy_step
from bench.report import environment
from index.page_index import PageIndex
from paging import PageStore, StoreConfig
from tieredkv.engine import kv_buffer, tiered_cache
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model

SPENT: collections.Counter = collections.Counter()
TIMED = [(PageIndex, "search"), (PageStore, "fetch_layer"), (PageStore, "fetch_layers"), (kv_buffer.WorkingSetBuffer, "_write_slots"),
         (kv_buffer.WorkingSetBuffer, "arrange"), (tiered_cache.TieredCache, "_slot_kv")]


def timed(cls, name):
    f = getattr(cls, name)

    @functools.wraps(f)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            SPENT[name] += time.perf_counter() - t0

    setattr(cls, name, g)


def overlap(log, num_layers: int) -> float:
    """Mean share of a layer's retrieved pages that the same layer retrieved at the step before."""
    shares = []
    for layer in range(num_layers):
        seq = [set(x) for x in log[layer::num_layers]]
        shares += [len(a & b) / max(1, len(b)) for a, b in zip(seq, seq[1:])]
    return sum(shares) / max(1, len(shares))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="8192,131072,1048576")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default="lab/2026-12-06-batched-fetch/after.json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="own positions reach")
    torch.set_num_threads(1)
    for cls, name in TIMED:
        timed(cls, name)
    lm = load_model("tiny-llama")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    contexts = [int(x) for x in args.contexts.split(",")]
    ids = corpus_ids(lm, contexts[-1] + 8192)
    tmp = tempfile.mkdtemp(prefix="decode-growth-")
    models = [TieredModel(lm, PageStore(f"{tmp}/{name}", StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                                                      device="cpu")), cfg) for name in ("main", "pair")]
    main_tm, pair = models
    rows, out_ids = [], []
    with torch.inference_mode():
        pair.prefill(ids[-8192:], logits_to_keep=None)
        step, pair_step = greedy_step(main_tm), greedy_step(pair)
        pos = 0
        for n in contexts:
            while main_tm.num_tokens < n:
                k = min(8192, n - main_tm.num_tokens)
                main_tm.prefill(ids[pos:pos + k], logits_to_keep=None)
                pos += k
            a = b = 0
            for _ in range(3):
                a, b = step(a), pair_step(b)
            SPENT.clear()
            main_tm.cache.retrieval_log.clear()
            ta, tb = [], []
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
            med = lambda xs: 1000 * sorted(xs)[len(xs) // 2]  # noqa: E731
            row = {"context_tokens": n, "decode_ms": med(ta), "pair_8k_decode_ms": med(tb),
                   "ratio": med(ta) / med(tb), "retrieved_kept_from_step_before":
                   overlap(list(main_tm.cache.retrieval_log), lm.model.config.num_hidden_layers),
                   "ms_per_step": {name: 1000 * s / args.steps for name, s in SPENT.items()}}
            print(row, flush=True)
            rows.append(row)
    for tm in models:
        tm.store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    report = {"study": "decode_growth", "environment": environment(), "config": vars(args),
              "input_ids_sha256": hashlib.sha256(json.dumps(ids[:contexts[-1]]).encode()).hexdigest(),
              "output_ids_sha256": hashlib.sha256(json.dumps(out_ids).encode()).hexdigest(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
