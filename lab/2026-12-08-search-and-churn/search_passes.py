"""Candidate passes over the page rows of a 1M-token context: recall of the exact top-k and ms per search.

    taskset -c 1 env PYTHONPATH=. .venv/bin/python lab/2026-12-08-search-and-churn/search_passes.py \
        --out lab/2026-12-08-search-and-churn/search_passes.json

Captures the page searches of 40 greedy decode steps of tiny-llama at 1,048,576 tokens (8,192 pages, 2 layers,
2 KV heads, union retrieval), then replays each against faiss passes over the [max | min] rows: the float16 codes
the project uses (with its rigorous margin it is exact), 8-bit and 4-bit codes, float32 rows, and IVF lists.
Every pass returns `mult` x (k + excluded) rows, whose exact Quest bounds pick the top-k; recall is the share of the
flat scan's top-k found. Time per layer-search (both heads), median, in two cache states: after a simulated decode
step's page copies (29 random 32 KB pages of a 512 MB pool written into a working-set-sized buffer, what a 1M
step does to the cache) and warm (the same search repeated).
"""
import argparse
import hashlib
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import faiss
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-flat-decode"))
import flat_decode as fd  # noqa: E402
from index.scoring import quest_bound  # noqa: E402
from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402

PASSES = [("fp16", 2, None), ("sq8", 1, None), ("sq8", 2, None), ("sq4", 2, None), ("sq4", 4, None), ("flat32", 2, None),
          ("ivf64", 2, 8), ("ivf64", 2, 16), ("ivf64", 2, 32), ("ivf256", 2, 32), ("ivf256", 2, 64)]


def capture(tokens: int, steps: int):
    lm = load_model("tiny-llama")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    ids = fd.corpus_ids(lm, tokens)
    tm = TieredModel(lm, PageStore(tempfile.mkdtemp(prefix="passes-"), StoreConfig(
        device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")), cfg)
    log = []
    with torch.inference_mode():
        for pos in range(0, tokens, 8192):
            tm.prefill(ids[pos:pos + 8192], logits_to_keep=None)
        step, tok = fd.greedy_step(tm), 0
        for _ in range(3):
            tok = step(tok)
        index = tm.cache.index
        search = index.search

        def logged(layer, queries, k, exclude=()):
            log.append((layer, np.array(queries), k, sorted(exclude)))
            return search(layer, queries, k, exclude)

        index.search = logged
        for _ in range(steps):
            tok = step(tok)
        bounds = [index._layer_bounds(layer) for layer in range(lm.model.config.num_hidden_layers)]
    return ids, log, bounds


def build(kind: str, rows: np.ndarray) -> list:
    out = []
    for r in rows:  # per head: [N, 2D]
        r = np.ascontiguousarray(r, dtype=np.float32)
        codes = {"fp16": faiss.ScalarQuantizer.QT_fp16, "sq8": faiss.ScalarQuantizer.QT_8bit,
                 "sq4": faiss.ScalarQuantizer.QT_4bit}
        if kind in codes:
            ix = faiss.IndexScalarQuantizer(r.shape[1], codes[kind], faiss.METRIC_INNER_PRODUCT)
            ix.train(r)
        elif kind.startswith("ivf"):
            ix = faiss.IndexIVFFlat(faiss.IndexFlatIP(r.shape[1]), r.shape[1], int(kind[3:]), faiss.METRIC_INNER_PRODUCT)
            ix.train(r)
        else:
            ix = faiss.IndexFlatIP(r.shape[1])
        ix.add(r)
        out.append(ix)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1048576)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    ids, log, bounds = capture(args.tokens, args.steps)
    heads = bounds[0][1].shape[0]
    rows = [np.concatenate([b[1], b[2]], axis=2) for b in bounds]  # per layer [H, N, 2D]
    refs = []
    for layer, q, k, excl in log:
        pid, up, lo = bounds[layer]
        s = quest_bound(q, up, lo)
        keep = ~np.isin(pid, excl)
        refs.append([set(pid[keep][np.lexsort((pid[keep], -s[h][keep]))[:k]].tolist()) for h in range(heads)])
    rng = np.random.default_rng(0)
    pool = rng.random((16384, 8192), dtype=np.float32)  # 512 MB: 16,384 pages of 32 KB
    buf = np.zeros((2, 2, 9216, 16), np.float32)

    def pollute():
        for p in rng.choice(len(pool), 29, replace=False):
            d0 = int(rng.integers(0, 64)) * 128
            buf[:, :, d0:d0 + 128] = pool[p].reshape(2, 2, 128, 16)

    results = []
    for kind, mult, nprobe in PASSES:
        idx = [build(kind, r) for r in rows]
        found = wanted = 0
        after_copies, warm = [], []
        for (layer, q, k, excl), ref in zip(log, refs):
            pid = bounds[layer][0]
            q64 = q.astype(np.float64)
            x = np.concatenate([np.maximum(q64, 0).mean(1), np.minimum(q64, 0).mean(1)], axis=1).astype(np.float32)
            want = mult * (k + len(excl))
            for ix in idx[layer]:
                if nprobe:
                    ix.nprobe = nprobe
            for times in (after_copies, warm):
                if times is after_copies:
                    pollute()
                t0 = time.perf_counter()
                hits = [idx[layer][h].search(x[h:h + 1], want)[1][0] for h in range(heads)]
                times.append(time.perf_counter() - t0)
            for h, rr in enumerate(hits):
                cand = rr[rr >= 0]
                cand = cand[~np.isin(pid[cand], excl)]
                exact = quest_bound(q[h], bounds[layer][1][h, cand], bounds[layer][2][h, cand])
                got = set(pid[cand][np.lexsort((pid[cand], -exact))[:k]].tolist())
                found += len(got & ref[h])
                wanted += len(ref[h])
        row = {"pass": kind, "rows_returned": f"{mult}x", "nprobe": nprobe, "recall": round(found / wanted, 4),
               "ms_per_layer_search_after_copies": round(1000 * float(np.median(after_copies)), 4),
               "ms_per_layer_search_warm": round(1000 * float(np.median(warm)), 4)}
        print(json.dumps(row), flush=True)
        results.append(row)
    report = {"study": "search_passes", "config": vars(args), "pages": int(bounds[0][0].shape[0]), "searches": len(log),
              "input_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(), "rows": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
