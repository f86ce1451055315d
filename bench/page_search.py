"""Page search against the number of pages: the flat scan, the candidate pass, and why not groups of pages.

One tiny-llama context is ingested to `--context` tokens and decoded for a few steps; every page search of
those steps (layer, queries, k, excluded pages) is recorded. Then, on that index's real minmax summaries:

1. group bounds: for groups of G consecutive pages, the share of groups whose Quest bound (elementwise max
   of the pages' maxima, min of their minima) reaches the k-th best page's bound -- the groups an exact
   best-first search over groups would have to open (1.0: it prunes nothing);
2. speed: best-of ms per search of `PageIndex.search_flat` and `PageIndex.search` (the candidate pass
   above FLAT_SCAN_BELOW pages) on the index, and on the index's pages repeated `--tile` times (page ids
   renumbered) to reach millions of tokens' worth of pages; both answers compared byte for byte.

    python -m bench.page_search --context 131072 --tile 1,8,22

The report's `tieredkv recheck` recipe (`--recheck-only`) re-runs the same searches, nothing timed: the
context's token ids must hash equal on any machine, the decoded ids, the pages every search returned and the
groups opened hash-equal in the same determinism domain, and at every page count the search must return what
the flat scan returns (page ids and score bytes) anywhere.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.lib.common import markdown_table
from bench.lib.report import environment, print_recheck, recheck_block, recipe_argv, sha256_json, write_report
from bench.memory_vs_context import corpus_ids, decode_ms, greedy_step
from index import PageIndex, quest_bound
from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, sha256_ids

PAGE_SIZE = 128


class Recorder:
    """Stands in for the cache's index during decode: records every search, answers with the index."""

    def __init__(self, index: PageIndex) -> None:
        self.index, self.calls = index, []

    def __getattr__(self, name):
        return getattr(self.index, name)

    def search(self, layer, queries, k, exclude=()):
        self.calls.append((layer, np.array(queries), k, set(exclude)))
        return self.index.search(layer, queries, k, exclude)


def record_searches(lm, ids: list[int], n: int, steps: int, store_dir: str):
    """Ingest `n` tokens, decode `steps` tokens: (the index, its bounds per layer, the recorded searches)."""
    cfg = TieredConfig(page_size=PAGE_SIZE)
    with PageStore(store_dir, StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")) as store:
        tm = TieredModel(lm, store, cfg)
        tm.prefill(ids[:n], logits_to_keep=None)
        rec = tm.cache.index = Recorder(tm.cache.index)
        _, out, _ = decode_ms(greedy_step(tm), steps)
        tm.cache.index = index = rec.index
        tm.close()
    return index, [index._layer_bounds(layer) for layer in range(index.num_layers)], rec.calls, out


def group_opened(bounds, calls, sizes: list[int]) -> dict[int, dict]:
    """For each group size G: the share of groups an exact best-first search over groups must open."""
    out = {}
    for g in sizes:
        shares = []
        for layer, q, k, exclude in calls:
            page_ids, upper, lower = bounds[layer]
            heads, n, d = upper.shape
            scores = quest_bound(q, upper, lower)  # [H, N]
            eligible = ~np.isin(page_ids, list(exclude))
            groups = -(-n // g)
            pad = groups * g - n
            g_up = np.concatenate([upper, np.full((heads, pad, d), -np.inf)], 1).reshape(heads, groups, g, d).max(2)
            g_low = np.concatenate([lower, np.full((heads, pad, d), np.inf)], 1).reshape(heads, groups, g, d).min(2)
            g_scores = quest_bound(q, g_up, g_low)  # [H, groups]
            for h in range(heads):
                kth = np.sort(scores[h][eligible])[-k]
                shares.append(float((g_scores[h] >= kth).mean()))
        out[g] = {"opened_mean": float(np.mean(shares)), "opened_min": float(np.min(shares))}
    return out


def tiled(index: PageIndex, bounds, times: int) -> PageIndex:
    """A minmax index holding `index`'s pages `times` over (ids renumbered): [N * times] pages."""
    rows = np.stack([np.stack([up, low], axis=2) for _, up, low in bounds], axis=0)  # [L, H, N, 2, D]
    rows = np.tile(rows.transpose(2, 0, 1, 3, 4), (times, 1, 1, 1, 1)).astype(np.float32)  # [N*t, L, H, 2, D]
    big = PageIndex(index.num_layers, index.num_heads, index.dim, method="minmax")
    big.add_many(range(len(rows)), rows)
    return big


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1000 * best


def speed(index: PageIndex, bounds, calls, tiles: list[int], repeats: int) -> list[dict]:
    """Per tile: both searches' answers compared (and hashed) and, when `repeats`, their best-of ms."""
    rows = []
    for t in tiles:
        big = tiled(index, bounds, t) if t > 1 else index
        n = len(big)
        flat, fast, same, answers = [], [], 0, hashlib.sha256()
        for layer, q, k, exclude in calls:
            ex = set(exclude) | set(range(n - 16, n)) if t > 1 else exclude  # the local window moves with n
            a, b = big.search(layer, q, k, ex), big.search_flat(layer, q, k, ex)
            same += int(np.array_equal(a[0], b[0]) and a[1].tobytes() == b[1].tobytes())
            answers.update(np.asarray(a[0], dtype=np.int64).tobytes() + a[1].tobytes())
            if repeats:
                fast.append(best_ms(lambda: big.search(layer, q, k, ex), repeats))
                flat.append(best_ms(lambda: big.search_flat(layer, q, k, ex), repeats))
        rows.append({"tile": t, "pages": n, "tokens_equivalent": n * PAGE_SIZE, "identical": f"{same}/{len(calls)}",
                     "answers_sha256": answers.hexdigest(),
                     "scan": "flat" if n < big.flat_scan_below else "candidate pass"})
        if repeats:
            rows[-1] |= {"search_ms_median": float(np.median(fast)), "flat_scan_ms_median": float(np.median(flat))}
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


# ----------------------------------------------------------------------------- the recheck recipe
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=6, help="decode steps whose searches are recorded")
    ap.add_argument("--groups", default="4,8,16,32,64")
    ap.add_argument("--tile", default="1,8,22")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="bench/results/page_search.json")
    ap.add_argument("--threads", type=int, help="torch threads (default 1; recorded in the environment and recipe)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="the same searches, untimed: print {outputs, inputs, relations, domain} without writing "
                         "(`tieredkv recheck`)")
    return ap


def recipe_args(values: dict, threads: int) -> list[str]:
    """`--recheck-only` with a run's arguments (its report's args)."""
    return recipe_argv(parser(), values, drop=("out", "repeats"), threads=threads, recheck_only=True)


def recipe_hashes(report: dict) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from a report (its rows without their times), the names that hash inputs, relations."""
    outputs = {"token ids": report["input_sha256"], "output ids": report["output_ids_sha256"],
               "groups opened": sha256_json({str(g): v for g, v in report["group_bounds"].items()}),
               "pages and searches": sha256_json({"searches": report["searches"],
                                                  "pages": [r["pages"] for r in report["speed"]]})}
    relations = {}
    for r in report["speed"]:
        if "answers_sha256" in r:  # a report made before the field has no hash of the pages returned
            outputs[f"{r['pages']} pages: the pages searches returned"] = r["answers_sha256"]
        same, _, searches = r["identical"].partition("/")
        relations[f"{r['pages']} pages: search = flat scan"] = same == searches != "0"
    return outputs, ["token ids"], relations


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(report["args"], threads)


def report_hashes(report: dict) -> dict[str, str]:
    return recipe_hashes(report)[0]


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    torch.set_num_threads(a.threads or 1)
    lm = load_model("tiny-llama")
    ids = corpus_ids(lm, a.context)
    with tempfile.TemporaryDirectory(prefix="tkv-search-") as tmp:
        index, bounds, calls, out = record_searches(lm, ids, a.context, a.steps, tmp)
    groups = group_opened(bounds, calls, [int(x) for x in a.groups.split(",")])
    rows = speed(index, bounds, calls, [int(x) for x in a.tile.split(",")], 0 if a.recheck_only else a.repeats)
    report = {"bench": "page_search", "model": lm.name, "model_fingerprint": lm.fingerprint, "args": vars(a),
              "environment": environment(), "input_sha256": sha256_ids(ids), "output_ids_sha256": sha256_ids(out),
              "searches": len(calls), "group_bounds": groups, "speed": rows}
    outputs, inputs, relations = recipe_hashes(report)
    domain = determinism_domain(lm.model, lm.fingerprint, PAGE_SIZE)
    if a.recheck_only:
        print_recheck(outputs, domain, inputs, relations)
        return 0
    report["recheck"] = recheck_block("bench.page_search", recipe_args(vars(a), torch.get_num_threads()), outputs,
                                      inputs=inputs, relations=relations, domain=domain)
    write_report(Path(a.out), report)
    print("\n" + markdown_table([{"g": g, **r} for g, r in groups.items()],
                                [("G (pages per group)", "g", ""), ("groups opened (mean)", "opened_mean", ".3f")]))
    print("\n" + markdown_table(rows, [("pages", "pages", ","), ("scan", "scan", ""),
                                       ("search ms", "search_ms_median", ".3f"),
                                       ("flat scan ms", "flat_scan_ms_median", ".3f"), ("identical", "identical", "")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
