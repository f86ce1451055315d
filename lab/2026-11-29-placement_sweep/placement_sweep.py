"""Diagnostic: one ingested document, many ways to answer its question (fixed policy, smollm2).

bench/passkey.py runs every system end to end, and a 32K sample costs minutes of ingest. Here each
(task, context, depth, seed) is ingested once under the fixed policy's defaults (or under
`--ingest`'s changes to them, e.g. `topk=0`: no retrieval while the document is read) into
`--work/[<ingest>/]<task>-<n>-s<seed>-d<depth>/` (kept: a second run reuses it), and then the
question is answered several ways over the grafted pages:

  topk=K        retrieve K pages per KV head instead of the policy's default
  union=N       at most N retrieved pages per layer (TieredConfig.union_pages), filled by rank
  per_head      each KV head attends to its own top-k only (TieredConfig.retrieval="per_head")
  local=L       a local window of L pages while the question and answer run
  needles-only  retrieval replaced by exactly the pages that hold a needle (no retrieved filler)
  stacked       every retrieved page at one distance (right before the local window, each page
                keeping its own token order) instead of packed one after another
  reencode=N    question-time re-encoding, as TieredConfig(reencode_pages=N) runs it: a probe forward
                of the question picks the N pages retrieved most; they and the sink are computed
                afresh together, packed before the local window, and join every layer's retrieval
  needles-only,reencode  the needle pages re-encoded so (an oracle), and retrieval replaced by them
  plain-compact the plain HF model, computing afresh, over the sink page, the pages holding a
                needle and the local window (needles adjacent): what the model makes of the
                content `fixed` shows it, without any tiered approximation. `plain-compact,local=L`
                takes the last L pages instead of fixed's 16. With only plain-compact variants,
                nothing is ingested.

Only the question-time regime changes: the pages were computed under the ingest config, so every
variant other than the ingest's own answers over pages from another regime (grafted with
allow_domain_mismatch). This measures what the question phase can recover, not a full config.

    python bench/placement_sweep.py --tasks multikey --contexts 32768 --depths 0.25,0.5,0.75 --seeds 3 \\
        --work /tmp/sweep --json
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from bench.longctx_tasks import TASKS, Task  # noqa: E402
from bench.passkey import run_plain  # noqa: E402
from bench.report import environment, sha256_ids, write_report  # noqa: E402

from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from testkit.placement import ForcedPages  # noqa: E402
from tieredkv.engine.placement import FixedDistance  # noqa: E402
from tieredkv.question.reencode import reencode  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel  # noqa: E402

FIXED = TieredConfig(position="fixed")
VARIANTS = ("fixed", "topk=4", "topk=16", "local=32", "stacked", "stacked,topk=12", "stacked,local=32",
            "needles-only", "plain-compact", "reencode=8", "needles-only,reencode")
NEEDLE_TEXT = {"passkey": "pass key", "multikey": "magic number"}


def parse_variant(name: str) -> tuple[TieredConfig, set[str]]:
    """'stacked,topk=12' -> (the question-time config, {"stacked"}); 'plain-compact,local=32' ->
    (the config whose local_pages the plain model's compact context takes, {"plain-compact"})."""
    kw, flags = {}, set()
    for part in name.split(","):
        if part in ("stacked", "needles-only", "plain-compact", "reencode"):
            flags.add(part)
        elif part.startswith(("topk=", "local=", "reencode=", "union=")):
            field, value = part.split("=")
            kw[{"topk": "topk_pages", "local": "local_pages", "reencode": "reencode_pages",
                "union": "union_pages"}[field]] = int(value)
        elif part == "per_head":
            kw["retrieval"] = "per_head"
        elif part != "fixed":
            raise ValueError(f"unknown variant part {part!r}")
    if "reencode" in flags and "needles-only" not in flags:
        raise ValueError("a bare 'reencode' re-encodes the needle pages: use it with needles-only, or reencode=N")
    return dataclasses.replace(FIXED, **kw), flags


class StackedDistance(FixedDistance):
    """Every retrieved page at one distance: each ends right before the local window (the sink page
    before them), instead of `fixed`'s packing."""

    name = "stacked"

    def place(self, ctx, page_ids):
        if not ctx.retrieving:
            return {}  # the whole context fits: own positions, as under `fixed`
        c, spans, first = ctx.config, ctx.spans, ctx.local_first
        local_start = spans[first].start
        out = {}
        for i in (i for i in page_ids if i < first):
            end = local_start - ctx.page_size if i < c.sink_pages else local_start
            out[i] = end - (spans[i].end - spans[i].start) - spans[i].start
        return out


def ingested(lm, task: Task, work: Path, ingest: str, config: TieredConfig) -> tuple[Path, str]:
    """The store holding `task`'s document, ingested under `config` (once; `ingest` is its spec), and
    its artifact id. Stores of the default ingest sit directly under `work`, others under `work/<ingest>`."""
    if ingest != "fixed":
        work = work / ingest.replace(",", "_").replace("=", "")
    d = work / f"{task.name}-{task.num_tokens}-s{task.seed}-d{task.depth}"
    marker = d / "artifact_id"
    if not marker.exists():
        with PageStore(d, StoreConfig()) as store:
            tm = TieredModel(lm, store, config)
            try:
                art = tm.ingest(task.doc_ids)
            finally:
                tm.close()
        marker.write_text(art.artifact_id)
    return d, marker.read_text()


def all_needle_pages(lm, task: Task, page_size: int) -> list[int]:
    """Pages (after the sink) holding any needle's text, or the start of one cut at the page boundary
    (`Task.needle_pages` gives the answering needle's only)."""
    ids, text = task.doc_ids, NEEDLE_TEXT[task.name]
    return [p for p in range(1, -(-len(ids) // page_size))
            if text in lm.codec.decode(ids[max(0, p * page_size - 24):(p + 1) * page_size])]


def answer_tiered(lm, task: Task, needles: list[int], store_dir: Path, artifact_id: str,
                  config: TieredConfig, flags: set[str], ingest: TieredConfig) -> tuple[list[int], dict]:
    """`config, flags`: the variant (`parse_variant`); `needles`: the pages holding any needle
    (`all_needle_pages`); `ingest`: the document's config."""
    with PageStore(store_dir, StoreConfig()) as store:
        tm = TieredModel(lm, store, config)
        try:
            tm.graft(artifact_id, allow_domain_mismatch=config != ingest)
            if "stacked" in flags:
                tm.use_policy(StackedDistance())
            if "needles-only" in flags:
                tm.use_policy(ForcedPages(tm.policy, needles, replace=True))
            if "reencode" in flags:
                reencode(tm.cache, needles)
            tm.keep_in_memory()  # the question's pages stay in memory: the store holds the document only
            out = tm.generate(task.question_ids, max_new_tokens=10)
            log = list(tm.cache.retrieval_log)
            reencoded = sorted(tm.cache.reencoded)
        finally:
            tm.close()
    target = task.needle_pages(tm.page_size)
    others = set(needles) - target
    if not log:
        raise ValueError(f"{task.num_tokens} tokens fit the working set: nothing was retrieved, use a longer context")
    return out, {"needle_retrieved": sum(bool(target & set(x)) for x in log) / len(log),
                 "other_needle_pages_retrieved_mean": sum(len(others & set(x)) for x in log) / len(log),
                 "other_needle_pages": len(others), "retrieved_pages_mean": sum(map(len, log)) / len(log),
                 "topk_pages": config.topk_pages, "local_pages": config.local_pages, "flags": sorted(flags),
                 "reencoded_pages": reencoded}


def answer_compact(lm, task: Task, needles: list[int], page_size: int, local_pages: int) -> tuple[list[int], dict]:
    ids = task.doc_ids
    pages = [ids[p:p + page_size] for p in range(0, len(ids), page_size)]
    far = [p for p in needles if p < len(pages) - local_pages]
    doc = pages[0] + [t for p in far for t in pages[p]] + [t for p in pages[-local_pages:] for t in p]
    compact = Task(task.name, len(doc), task.depth, task.seed, doc, task.question_ids, task.answer)
    return run_plain(lm, compact, 10), {"compact_tokens": len(doc), "compact_pages": [0, *far],
                                        "compact_input_sha256": sha256_ids(doc + task.question_ids)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", default="passkey,multikey")
    ap.add_argument("--contexts", default="32768")
    ap.add_argument("--depths", default="0.25,0.5,0.75")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--samples", help="explicit seed:depth list, instead of --depths x --seeds")
    ap.add_argument("--variants", default=";".join(VARIANTS),
                    help="';'-separated: " + "; ".join(VARIANTS))
    ap.add_argument("--ingest", default="fixed",
                    help="the config documents are ingested under: fixed, or its topk=/local=/union=/per_head changes (e.g. topk=0)")
    ap.add_argument("--work", default="bench/.sweep", help="ingested stores, reused across runs")
    ap.add_argument("--out", default="bench/results/placement_sweep.json")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        ingest_cfg, flags = parse_variant(a.ingest)
        if flags:
            raise ValueError(f"{', '.join(sorted(flags))} change answering, not reading")
    except ValueError as e:
        ap.error(f"--ingest takes topk=, local=, union= and per_head changes to fixed only ({a.ingest!r}: {e})")
    variants = {}
    for v in a.variants.split(";"):
        try:
            variants[v] = parse_variant(v)
        except ValueError as e:
            ap.error(f"--variants: {v!r}: {e}")
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    if a.samples:
        samples = [(int(s), float(d)) for s, d in (x.split(":") for x in a.samples.split(","))]
    else:
        samples = [(s, float(d)) for d in a.depths.split(",") for s in range(a.first_seed, a.first_seed + a.seeds)]
    all_plain = all("plain-compact" in flags for _, flags in variants.values())  # nothing to ingest
    rows, table = [], []
    for task_name in a.tasks.split(","):
        for n in (int(x) for x in a.contexts.split(",")):
            for seed, depth in samples:
                task = TASKS[task_name](lm.codec, n, depth, seed)
                store_dir, art_id = (None, None) if all_plain else ingested(lm, task, Path(a.work), a.ingest,
                                                                             ingest_cfg)
                needles = all_needle_pages(lm, task, lm.default_page_size)
                for variant, (config, flags) in variants.items():
                    t0 = time.perf_counter()
                    if "plain-compact" in flags:
                        out, extra = answer_compact(lm, task, needles, lm.default_page_size, config.local_pages)
                    else:
                        out, extra = answer_tiered(lm, task, needles, store_dir, art_id, config, flags, ingest_cfg)
                    rows.append({"task": task_name, "target_tokens": n, "depth": depth, "seed": seed,
                                 "variant": variant, "artifact_id": art_id, **task.row(lm.codec, out), **extra,
                                 "seconds": round(time.perf_counter() - t0, 2)})
                    print(f"{task_name:8s} {n:7d} d={depth} s={seed} {variant:18s} "
                          f"{'OK ' if rows[-1]['correct'] else 'BAD'} {rows[-1]['output']!r}", file=sys.stderr)
                    table = _write(a, lm, ingest_cfg, rows)  # after every row: a cut-short run keeps its rows
    if a.json:
        print(Path(a.out).read_text())
    print("\n| task | context | variant | correct |\n|---|---|---|---|")
    for r in table:
        print(f"| {r['task']} | {r['target_tokens']:,} | {r['variant']} | {r['correct']}/{r['samples']} |")
    return 0


def _write(a, lm, ingest_cfg: TieredConfig, rows) -> list[dict]:
    summary: dict = {}
    for r in rows:
        summary.setdefault((r["task"], r["target_tokens"], r["variant"]), []).append(r["correct"])
    table = [{"task": t, "target_tokens": n, "variant": v, "correct": sum(c), "samples": len(c)}
             for (t, n, v), c in summary.items()]
    write_report(a.out, {"bench": "placement_sweep", "model": lm.name, "model_fingerprint": lm.fingerprint,
                         "ingest": a.ingest,
                         "ingest_config": ingest_cfg.regime(lm.default_page_size), "args": vars(a),
                         "environment": environment(), "rows": rows, "accuracy": table})
    return table


if __name__ == "__main__":
    sys.exit(main())
