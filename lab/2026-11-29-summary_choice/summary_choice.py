"""Which page summary finds the needle? Measured on real SmolLM2 keys, not synthetic ones.

A passkey document is ingested once by TieredModel. For each summary method (mean, repr,
minmax) an index is built from the same stored pages; the question's real query vectors, per
layer, are searched and we record whether the page holding the needle is in the top-k.

    python bench/summary_choice.py --tokens 12288 --json
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.longctx_tasks import passkey  # noqa: E402
from bench.report import environment, sha256_ids, write_report  # noqa: E402

from index import SUMMARY_METHODS, PageIndex, summarize  # noqa: E402
from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from tieredkv.engine.placement import PlacementPolicy, grouped_queries  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel  # noqa: E402


def needle_page(doc: list[int], needle: list[int], page_size: int) -> int:
    for i in range(len(doc) - len(needle)):
        if doc[i:i + len(needle)] == needle:
            return (i + len(needle) // 2) // page_size
    raise ValueError("needle not found in document")


class QueryRecorder(PlacementPolicy):
    """`base`'s selection and placement; records each layer's first grouped queries [Hkv, G*q, D]."""

    def __init__(self, base: PlacementPolicy):
        self.base, self.seen = base, {}

    def select(self, ctx, layer_idx, query):
        self.seen.setdefault(layer_idx, grouped_queries(query, ctx.layout.num_kv_heads).float().cpu().numpy())
        return self.base.select(ctx, layer_idx, query)

    def place(self, ctx, page_ids):
        return self.base.place(ctx, page_ids)


def capture_queries(tm: TieredModel, question: list[int]) -> dict[int, np.ndarray]:
    """Grouped query vectors [Hkv, G*q, D] per layer for the question chunk."""
    base = tm.policy
    recorder = QueryRecorder(base)
    tm.use_policy(recorder)
    tm.prefill(question)
    tm.use_policy(base)
    return recorder.seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=12288)
    ap.add_argument("--depths", default="0.25,0.5,0.75")
    ap.add_argument("--ks", default="1,4,16")
    ap.add_argument("--out", default="bench/results/summary_choice.json")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    lm = load_model(a.model)
    ks = [int(k) for k in a.ks.split(",")]
    rows = []
    for seed, depth in enumerate(float(d) for d in a.depths.split(",")):
        task = passkey(lm.codec, a.tokens, depth, seed)
        needle = lm.codec.encode(f" The pass key is {task.answer}. Remember it. {task.answer} is the pass key. ")
        with tempfile.TemporaryDirectory() as d, PageStore(d, StoreConfig()) as store:
            tm = TieredModel(lm, store, TieredConfig(chunk_pages=4))
            art = tm.ingest(task.doc_ids)
            target = needle_page(task.doc_ids, needle[2:-2], tm.page_size)
            queries = capture_queries(tm, task.question_ids)
            pages = [store.get(k) for k in art.page_keys]
            layout = pages[0].layout
            for method in SUMMARY_METHODS:
                index = PageIndex(layout.num_layers, layout.num_kv_heads, layout.head_dim, method=method)
                for i, p in enumerate(pages):
                    index.add(i, np.stack([summarize(p.layer_kv(l)[0].float().numpy(), method)
                                           for l in range(layout.num_layers)]))
                for k in ks:
                    hits = [target in index.union_topk(l, q, k) for l, q in sorted(queries.items())]
                    rows.append({"depth": depth, "seed": seed, "method": method, "k": k, "needle_page": target,
                                 "pages": len(pages), "layer_recall": sum(hits) / len(hits),
                                 "layers_hit": sum(hits), "layers": len(hits),
                                 "input_sha256": sha256_ids(task.doc_ids + task.question_ids)})
                    print(rows[-1], file=sys.stderr)
            tm.close()
    table = {}
    for r in rows:
        table.setdefault((r["method"], r["k"]), []).append(r["layer_recall"])
    summary = [{"method": m, "k": k, "mean_layer_recall": float(np.mean(v))} for (m, k), v in sorted(table.items())]
    write_report(a.out, {"bench": "summary_choice", "model": lm.name, "model_fingerprint": lm.fingerprint,
                         "environment": environment(), "config": vars(a), "rows": rows, "summary": summary},
                 print_json=a.json)
    print("\n| summary | k | needle page in top-k (fraction of layers) |\n|---|---|---|")
    for s in summary:
        print(f"| {s['method']} | {s['k']} | {s['mean_layer_recall']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
