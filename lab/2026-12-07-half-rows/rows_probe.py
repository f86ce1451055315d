"""Which rows can the candidate pass read: the page searches of a 1M-token tiny-llama context, replayed cold.

    taskset -c 1 env PYTHONPATH=. python lab/2026-12-07-half-rows/rows_probe.py --out lab/2026-12-07-half-rows/rows.json

Ingests 1,048,576 tokens (union, 128-token pages, own positions), records every page search of 30 greedy decode
steps, then replays each search per head against the layer's real [max | min] rows stored four ways, with a
64 MiB array touched between searches so that the rows come from memory as they do in decode:
float32 and float16 rows (what bound_scan.py reads), and 8-bit rows (per dimension, over the range, and as
residuals from the midrange, faiss QT_8bit_direct). Each keeps every row within its rigorous rounding margin
of the `want`-th best; the row reports the mean and max candidates (want = k + excluded = 33) and ms per
head-search, and checks that the exact top-want rows are always among the candidates.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import faiss
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-flat-decode"))
from flat_decode import corpus_ids, greedy_step  # noqa: E402

from index.page_index import PageIndex  # noqa: E402
from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402


def capture(n: int):
    lm = load_model("tiny-llama")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    ids = corpus_ids(lm, n)
    tm = TieredModel(lm, PageStore(tempfile.mkdtemp(), StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                                                    device="cpu")), cfg)
    calls, orig = [], PageIndex.search

    def record(self, layer, queries, k, exclude=()):
        calls.append((layer, np.array(queries), k, set(exclude)))
        return orig(self, layer, queries, k, exclude)

    with torch.inference_mode():
        pos = 0
        while tm.num_tokens < n:
            k = min(8192, n - tm.num_tokens)
            tm.prefill(ids[pos:pos + k], logits_to_keep=None)
            pos += k
        step, a = greedy_step(tm), 0
        PageIndex.search = record
        for _ in range(30):
            a = step(a)
        PageIndex.search = orig
    index = tm.cache.index
    return [index._layer_bounds(layer) for layer in range(index.num_layers)], calls, ids


def formats(rows: np.ndarray):
    """rows [N, 2D] float64 -> {name: (faiss index, query transform, margin(x) of the rounding, the largest value
    faiss decodes per dimension)}."""
    n, d2 = rows.shape
    absmax = np.abs(rows).max(0)
    out = {}
    f32 = faiss.IndexFlatIP(d2)
    f32.add(rows.astype(np.float32))
    out["float32"] = (f32, lambda x: x, lambda x: 0.0, absmax)
    f16 = faiss.IndexScalarQuantizer(d2, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    f16.add_sa_codes(rows.astype(np.float16).view(np.uint8))
    out["float16"] = (f16, lambda x: x, lambda x: float(np.abs(x) @ (absmax * 2.0 ** -11 + 2.0 ** -25)), absmax)
    for name, centre in (("int8 range", np.zeros(d2)), ("int8 residual", (rows.max(0) + rows.min(0)) / 2)):
        half = np.maximum(np.abs(rows - centre).max(0), 1e-30)
        scale = half / 127
        q8 = faiss.IndexScalarQuantizer(d2, faiss.ScalarQuantizer.QT_8bit_direct, faiss.METRIC_INNER_PRODUCT)
        q8.add_sa_codes((np.rint((rows - centre) / scale) + 128).astype(np.uint8))
        out[name] = (q8, lambda x, s=scale: x * s, lambda x, s=scale: 0.5 * float(np.abs(x * s).sum()),
                     np.full(d2, 255.0))
    return out, absmax


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1048576)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    t0 = time.perf_counter()
    bounds, calls, ids = capture(args.tokens)
    heads = bounds[0][1].shape[0]
    per_layer = []
    for _pid, up, lo in bounds:
        per_layer.append([formats(np.concatenate([up[h], lo[h]], axis=1)) + (np.concatenate([up[h], lo[h]], axis=1),)
                          for h in range(heads)])
    junk = np.ones(64 * 2 ** 20 // 8)
    names = list(per_layer[0][0][0])
    stats = {name: {"ms": 0.0, "candidates": [], "missed_top": 0} for name in names}
    for layer, q, k, exclude in calls:
        q64 = q.astype(np.float64)
        pos, neg = np.maximum(q64, 0).mean(1), np.minimum(q64, 0).mean(1)
        want = k + len(exclude)
        for h in range(heads):
            fmts, absmax, rows = per_layer[layer][h]
            x = np.concatenate([pos[h], neg[h]])
            exact = rows @ x
            top = set(np.argsort(-exact)[:want].tolist())
            for name, (index, transform, margin_of, largest) in fmts.items():
                xq = transform(x)
                acc = 2 * (rows.shape[1] + 2) * 2.0 ** -24 * float(np.abs(xq) @ largest)  # faiss's float32 sums
                margin = margin_of(x) + acc
                junk += 1.0
                t = time.perf_counter()
                kk = 2 * want
                while True:
                    s, found = index.search(xq.astype(np.float32)[None], kk)
                    cut = float(s[0, want - 1]) - 2 * margin
                    if kk >= len(rows) or float(s[0, kk - 1]) < cut:
                        break
                    kk = min(len(rows), 2 * kk)
                stats[name]["ms"] += time.perf_counter() - t
                chosen = set(found[0][s[0] >= cut].tolist())
                stats[name]["candidates"].append(len(chosen))
                stats[name]["missed_top"] += len(top - chosen)
    searches = len(calls) * heads
    rows_out = [{"rows": name, "bytes_per_value": {"float32": 4, "float16": 2}.get(name, 1),
                 "ms_per_head_search": round(1000 * st["ms"] / searches, 4),
                 "candidates_mean": round(float(np.mean(st["candidates"])), 2),
                 "candidates_max": int(max(st["candidates"])), "pages": int(len(bounds[0][0])),
                 "exact_top_missed": st["missed_top"]} for name, st in stats.items()]
    for row in rows_out:
        print(json.dumps(row))
    report = {"study": "half_rows", "tokens": args.tokens, "searches": searches,
              "input_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
              "environment": {"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"),
                              "torch": torch.__version__, "faiss": faiss.__version__, "torch_threads": 1,
                              "load_avg_end": os.getloadavg()},
              "seconds": round(time.perf_counter() - t0, 1), "rows": rows_out}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
