"""What reusing a layer's selection for several decode steps (TieredConfig.reuse_steps, approximate)
does to answers and to decode time.

For each passkey task (seeded, retrieval active): the document is ingested once (exact selection),
then grafted and answered greedily under each `--reuse` setting. Reported per setting: passkey
accuracy, agreement of the output ids with the exact answer (0 = search at every step), the share
of (full-attention layer, decode step) plans that were reused, and decode ms/token. Answer and
exact-run decode steps alternate setting by setting in one process (same load for all).

    python bench/reuse_selection.py --tokens 8192 --depths 0.25,0.5,0.75 --reuse 0,4,16
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.longctx_tasks import passkey  # noqa: E402
from bench.report import environment, write_report  # noqa: E402

from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from tieredkv.engine.tiered_config import REUSE_MIN_COSINE, TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes  # noqa: E402


def reused_plan_share(cache, decode_steps: int) -> float:
    """Of the (full-attention layer, decode step) plans of `decode_steps` steps, the share reused."""
    full = sum(not layer.is_sliding for layer in cache.layers)
    return cache.fetch_counts.get("reused_plans", 0) / (full * max(1, decode_steps))


def answer(lm, store, art, cfg: TieredConfig, question: list[int], max_new: int) -> dict:
    tm = TieredModel(lm, store, cfg)
    try:
        tm.graft(art)
        tm.prefill(question[:-1])
        t0 = time.perf_counter()
        out = tm.generate(question[-1:], max_new_tokens=max_new)
        secs = time.perf_counter() - t0
        return {"out": out, "decode_ms_per_token": 1000 * secs / max(1, len(out)),
                "reused_share": reused_plan_share(tm.cache, len(out) - 1)}
    finally:
        tm.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--depths", default="0.25,0.5,0.75")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", default="0,4,16", help="reuse_steps settings; 0 (exact) first")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", default="bench/results/reuse_selection.json")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    settings = [int(x) for x in a.reuse.split(",")]
    assert settings[0] == 0, "the first setting is the exact reference (0)"
    base = TieredConfig(chunk_pages=4)
    rows, started, load_start = [], time.perf_counter(), os.getloadavg()
    for depth in (float(d) for d in a.depths.split(",")):
        task = passkey(lm.codec, a.tokens, depth, a.seed)
        with tempfile.TemporaryDirectory(prefix="tkv-reuse-") as d, PageStore(d, StoreConfig(
                device_budget_bytes=working_set_bytes(lm, base))) as store:
            tm = TieredModel(lm, store, base)
            art = tm.ingest(task.doc_ids)
            tm.close()
            exact = None
            for r in settings:
                res = answer(lm, store, art, dataclasses.replace(base, reuse_steps=r), task.question_ids, a.max_new)
                out = res.pop("out")
                exact = out if r == 0 else exact
                same = next((i for i, (x, y) in enumerate(zip(out, exact)) if x != y), min(len(out), len(exact)))
                row = {"depth": depth, "reuse_steps": r, **task.row(lm.codec, out), **res,
                       "same_as_exact": out == exact, "agreeing_prefix_tokens": same,
                       "context_tokens": len(task.doc_ids), "load_avg_1": round(os.getloadavg()[0], 2)}
                rows.append(row)
                print({k: v for k, v in row.items() if "sha" not in k}, file=sys.stderr, flush=True)
    summary = []
    for r in settings:
        rs = [x for x in rows if x["reuse_steps"] == r]
        summary.append({"reuse_steps": r, "accuracy": sum(x["correct"] for x in rs) / len(rs),
                        "same_as_exact": sum(x["same_as_exact"] for x in rs) / len(rs),
                        "reused_share": statistics.mean(x["reused_share"] for x in rs),
                        "decode_ms_per_token": statistics.median(x["decode_ms_per_token"] for x in rs),
                        "samples": len(rs)})
    report = {"bench": "reuse_selection", "model": lm.name, "model_fingerprint": lm.fingerprint,
              "config": {**base.regime(lm.default_page_size), "reuse_min_cosine": REUSE_MIN_COSINE,
                         "args": vars(a)}, "environment": environment(),
              "load_average_1_5_15": {"start": load_start, "end": os.getloadavg()},
              "seconds": round(time.perf_counter() - started, 1), "rows": rows, "summary": summary}
    write_report(a.out, report)
    print("| reuse_steps | accuracy | output = exact | plans reused | decode ms/token |\n|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['reuse_steps']} | {s['accuracy']:.2f} | {s['same_as_exact']:.2f} | {s['reused_share']:.2f} | "
              f"{s['decode_ms_per_token']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
