"""Needle retrieval recall of the page summary methods (mean, repr, minmax).

Synthetic, no model: each trial draws pages of standard-normal keys [H, T, D], replaces one
key of one random page (per head, same page) by a needle ``scale * sqrt(D) * u_h`` aligned
with a random unit direction u_h, and queries with noisy copies of u_h. recall@k is the share
of (trial, head) pairs whose head top-k contains the needle page. The "exact" row scores each
page by its best key (what full attention would see) and bounds what a summary can reach.

    python bench/index_summary.py            # table
    python bench/index_summary.py --json     # JSON on stdout, table on stderr
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import faiss  # noqa: E402  (only for its version in the header)

from index import SUMMARY_METHODS, PageIndex, summarize  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--num-pages", type=int, default=128)
    p.add_argument("--page-size", type=int, default=64, help="T, keys per page")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--num-repr", type=int, default=4)
    p.add_argument("--queries", type=int, default=4, help="Q, queries per chunk")
    p.add_argument("--noise", type=float, default=0.5, help="query noise norm relative to |u|")
    p.add_argument("--scales", default="1,2", help="needle norm / typical key norm, comma list")
    p.add_argument("--ks", default="1,4,8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def run(args: argparse.Namespace, scale: float, ks: list[int]) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng([args.seed, int(scale * 1000)])
    n, h_, t, d, q_len = args.num_pages, args.heads, args.page_size, args.dim, args.queries
    hits = {m: {k: 0 for k in ks} for m in ("exact", *SUMMARY_METHODS)}
    for _ in range(args.trials):
        keys = rng.standard_normal((n, h_, t, d)).astype(np.float32)  # [N, H, T, D]
        u = rng.standard_normal((h_, d))
        u /= np.linalg.norm(u, axis=1, keepdims=True)  # [H, D]
        page, pos = int(rng.integers(n)), int(rng.integers(t))
        keys[page, :, pos] = scale * np.sqrt(d) * u
        noise = rng.standard_normal((h_, q_len, d)) * args.noise / np.sqrt(d)
        queries = (u[:, None, :] + noise).astype(np.float32)  # [H, Q, D]

        exact = np.einsum("hqd,nhtd->nhqt", queries, keys).mean(axis=2).max(axis=2)  # [N, H]
        for h in range(h_):
            order = np.lexsort((np.arange(n), -exact[:, h]))
            for k in ks:
                hits["exact"][k] += page in order[:k]
        for method in SUMMARY_METHODS:
            index = PageIndex(1, h_, d, method, args.num_repr)
            summaries = np.stack([summarize(keys[i], method, args.num_repr) for i in range(n)])
            index.add_many(range(n), summaries[:, None])  # [N, L=1, H, R, D]
            ids, _ = index.search(0, queries, max(ks))
            for k in ks:
                hits[method][k] += int((ids[:, :k] == page).any(axis=1).sum())
    total = args.trials * h_
    return {m: {f"recall@{k}": hits[m][k] / total for k in ks} for m in hits}


def main() -> None:
    args = parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    scales = [float(s) for s in args.scales.split(",")]
    header = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "numpy": np.__version__, "faiss": faiss.__version__,
    }
    config = {k: v for k, v in vars(args).items() if k != "json"}
    start = time.perf_counter()
    results = {str(s): run(args, s, ks) for s in scales}
    elapsed = time.perf_counter() - start

    out = sys.stderr if args.json else sys.stdout
    print(f"# {header}", file=out)
    print(f"# config {config}", file=out)
    print(f"{'scale':>5} {'method':>7} " + " ".join(f"{'recall@' + str(k):>9}" for k in ks),
          file=out)
    for s, rows in results.items():
        for method, row in rows.items():
            print(f"{s:>5} {method:>7} " + " ".join(f"{row[f'recall@{k}']:>9.3f}" for k in ks),
                  file=out)
    print(f"# {elapsed:.1f} s", file=out)
    if args.json:
        json.dump({"header": header, "config": config, "seconds": round(elapsed, 2),
                   "results": results}, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
