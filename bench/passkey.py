"""Passkey and RULER-style multi-key needle accuracy against context length.

Systems, in one run: `plain` (the HF model with its own DynamicCache: full attention, any length),
`tiered-own` (TieredModel, keys at their own positions) and `tiered-fixed` (TieredModel,
retrieved pages re-rotated to sit before the local window, InfLLM-style). Each tiered system runs
its policy's defaults (top-16 per KV head under own, top-8 and the attended scoring frame under
fixed) unless --topk-pages / --score-frame say otherwise.

    python -m bench.passkey --contexts 4096,8192,16384 --json
    python -m bench.passkey --tasks passkey --contexts 131072 --depths 0.5 --systems tiered-fixed

The report (bench/results/passkey.json) holds one run per haystack and configuration: a run writes its `--run`
(default: the haystack's name, `filler` or `prose`) and leaves the others.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

from bench.corpora.tasks import HAYSTACKS, TASKS
from bench.lib.common import add_retrieval_args, retrieval_kwargs
from bench.lib.report import environment, read_run, recheck_block, recipe_argv, write_run
from index import PageIndex
from paging import PageStore, StoreConfig
from testkit.placement import ForcedPages
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_config import SCORE_FRAMES, TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain
from tieredkv.question.qa import qa_config

SYSTEMS = ("plain", "tiered-own", "tiered-fixed", "tiered-qa")
# "tiered-qa" answers as `tieredkv qa` does (tieredkv.question.qa.qa_config: own positions inside the window,
# fixed with question-time reading beyond it); the others take their config from the flags.
# Diagnostic systems (not in the default run): "tiered-fixed-oracle" / "tiered-own-oracle" add the
# answering needle's pages to every layer's retrieval while the question and answer run. Where the
# oracle answers and the same system without it does not, retrieval is what failed; where neither
# does, it is the model (or the position policy) that does not use the needle it is shown.


@torch.inference_mode()
def run_plain(lm, task, max_new: int) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    ids = task.doc_ids + task.question_ids
    prefill(lm, ids[:-1], cache, page_size=512)
    out = lm.model.generate(torch.tensor([ids]), past_key_values=cache, max_new_tokens=max_new, do_sample=False,
                            pad_token_id=lm.codec.eos_token_id)
    return out[0, len(ids):].tolist()


def run_tiered(lm, task, max_new: int, position: str, cfg_kw: dict,
               oracle: bool = False, ask_after: str = "ingest") -> tuple[list[int], dict]:
    """Output ids, and for the row: the fraction of the question's and answer's retrievals (per
    layer and forward) that brought in a page of the answering needle, the mean number of pages
    they retrieved (the union over KV heads; both None when nothing needed retrieving), and the
    top-k per head that the policy ran with.

    ask_after "ingest" asks as `tieredkv qa` does: the document is ingested as an artifact (its last,
    partial page sealed) and the question starts on a fresh page. "prefill" (how rows before
    2026-11-29 were made) continues the document's unsealed last page with the question."""
    with tempfile.TemporaryDirectory(prefix="tkv-passkey-") as d, PageStore(d, StoreConfig()) as store:
        cfg_kw = {**cfg_kw, "reencode_pages": cfg_kw.get("reencode_pages", 0) if position == "fixed" else 0}
        tm = TieredModel(lm, store, TieredConfig(position=position, **cfg_kw))
        try:
            tm.ingest(task.doc_ids) if ask_after == "ingest" else tm.prefill(task.doc_ids)
            tm.cache.retrieval_log.clear()
            needle_pages = task.needle_pages(tm.page_size)
            if oracle:  # retrieval plus the needle's pages
                tm.use_policy(ForcedPages(tm.policy, needle_pages))
            out = tm.generate(task.question_ids, max_new_tokens=max_new)
            log = list(tm.cache.retrieval_log)
            hit = sum(bool(needle_pages & set(sel)) for sel in log) / len(log) if log else None
            size = sum(len(sel) for sel in log) / len(log) if log else None
            return out, {"needle_retrieved": hit, "retrieved_pages_mean": size, "topk_pages": tm.config.topk_pages,
                         "reencoded_pages": sorted(tm.cache.reencoded)}
        finally:
            tm.close()


def run_qa(lm, task, max_new: int) -> tuple[list[int], dict]:
    """As `tieredkv qa` answers: the document ingested as an artifact under the QA configuration for
    its length, then the question (with question-time reading beyond the window)."""
    config = qa_config(lm, len(task.doc_ids) + len(task.question_ids) + max_new)
    question = lm.codec.decode(task.question_ids)
    with tempfile.TemporaryDirectory(prefix="tkv-passkey-") as d, PageStore(d, StoreConfig()) as store:
        tm = TieredModel(lm, store, config)
        try:
            tm.ingest(task.doc_ids)
            tm.keep_in_memory()
            out = tm.generate(task.question_ids, max_new_tokens=max_new, question=question)
            needle = task.needle_pages(tm.page_size)
            read = tm.last_reading
            return out, {"needle_retrieved": None if read is None else bool(needle & set(read.pages)),
                         "position": config.position, "read_pages": None if read is None else read.pages,
                         "needle_pages": sorted(needle)}
        finally:
            tm.close()


def _write(a, lm, cfg_kw, rows) -> list[dict]:
    summary: dict = {}
    for r in rows:
        k = (r["task"], r["system"], r.get("target_tokens", r["context_tokens"]))
        summary.setdefault(k, []).append(r["correct"])
    table = [{"task": t, "system": s, "context_tokens": c, "accuracy": sum(v) / len(v), "samples": len(v)}
             for (t, s, c), v in sorted(summary.items())]
    chosen = recipe_rows(rows)
    outputs, inputs = hashed(chosen)
    report = {"bench": "passkey", "model": lm.name, "model_fingerprint": lm.fingerprint,
              "config": {**cfg_kw, "sink_pages": 1, "page_size": lm.default_page_size, "args": vars(a)},
              "environment": environment(), "domain": domain(lm), "rows": rows, "accuracy": table,
              "recheck": recheck_block("bench.passkey", recipe_args(vars(a), chosen, torch.get_num_threads()),
                                       outputs, inputs=inputs)}
    write_run(a.out, "passkey", a.run or a.haystack, report)
    return table


def domain(lm) -> dict:
    return determinism_domain(lm.model, lm.fingerprint, lm.default_page_size)


def hashed(rows: list[dict]) -> tuple[dict[str, str], list[str]]:
    """Every row's input and output-id hashes by name, and the names that hash inputs (equal in any domain)."""
    outputs, inputs = {}, []
    for r in rows:
        name = f"{r['task']} {r['target_tokens']} d={r['depth']} s={r['seed']} {r['system']}"
        outputs[f"{name} output_ids"] = r["output_ids_sha256"]
        outputs[f"{name} input"] = r["input_sha256"]
        inputs.append(f"{name} input")
    return outputs, inputs


# the recipe re-runs the plain model only up to this context: beyond it its quadratic prefill takes minutes
RECHECK_PLAIN_MAX = 8192


def recipe_rows(rows: list[dict]) -> list[dict]:
    """The rows `tieredkv recheck` re-runs: the first sample (task, context, depth, seed) with every system the
    run answered it with; beyond RECHECK_PLAIN_MAX tokens the plain model only where no other system ran."""
    if not rows:
        return []
    key = lambda r: (r["task"], r["target_tokens"], r["depth"], r["seed"])  # noqa: E731
    first = [r for r in rows if key(r) == key(rows[0])]
    tiered = [r for r in first if r["system"] != "plain"]
    return tiered if tiered and first[0]["target_tokens"] > RECHECK_PLAIN_MAX else first


def recipe_args(values: dict, chosen: list[dict], threads: int) -> list[str]:
    """`--recheck-only` with a run's arguments (vars(), or its report's config.args) narrowed to the chosen rows."""
    r = chosen[0]
    return recipe_argv(parser(), values, drop=("out", "run", "json"), tasks=r["task"], contexts=str(r["target_tokens"]),
                       depths=str(r["depth"]), seeds=1, first_seed=r["seed"],
                       systems=",".join(c["system"] for c in chosen), threads=threads, recheck_only=True)


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(report["config"]["args"], recipe_rows(report["rows"]), threads)


def report_hashes(report: dict) -> dict[str, str]:
    return hashed(recipe_rows(report["rows"]))[0]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", default="passkey,multikey")
    ap.add_argument("--contexts", default="4096,8192,16384,32768")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--depths", default="0.2,0.5,0.8")
    ap.add_argument("--seeds", type=int, default=1, help="samples per (task, context, depth)")
    ap.add_argument("--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--local-pages", type=int, default=16)
    ap.add_argument("--topk-pages", type=int, help="per KV head (default: TieredConfig's for each policy)")
    ap.add_argument("--summary", default="minmax")
    add_retrieval_args(ap)
    ap.add_argument("--out", default="bench/results/passkey.json", help="the report; a run writes its --run")
    ap.add_argument("--run", help="the run of --out to write (default: the haystack's name)")
    ap.add_argument("--multikey-max", type=int, help="run multikey only up to this context")
    ap.add_argument("--plain-max", type=int,
                    help="run the plain model only up to this context (its attention is quadratic)")
    ap.add_argument("--chunk-pages", type=int, default=1, help="TieredConfig.chunk_pages (prefill chunk)")
    ap.add_argument("--score-frame", default="attended", choices=SCORE_FRAMES,
                    help="TieredConfig.score_frame: where the fixed policy scores a page at retrieval")
    ap.add_argument("--ask-after", default="ingest", choices=("ingest", "prefill"),
                    help="tiered systems: ask after ingesting the document as an artifact, as `tieredkv qa` does "
                         "(default), or continue its unsealed last page (rows made before 2026-11-29)")
    ap.add_argument("--reencode-pages", type=int, default=0,
                    help="tiered-fixed: TieredConfig.reencode_pages (re-encode the question's most-retrieved pages)")
    ap.add_argument("--haystack", default="filler", choices=HAYSTACKS,
                    help="filler: the repeated filler sentences (the needle is the only distinct text); prose: the "
                         "Python language reference")
    ap.add_argument("--flat-scan-below", type=int,
                    help="PageIndex.flat_scan_below: 1 runs every page search as the candidate pass, a huge value "
                         "as the flat scan (the two are exact: the answers must not change)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--recheck-only", action="store_true",
                    help="run the samples and print {outputs, inputs, domain} without writing (`tieredkv recheck`)")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment)")
    return ap


def samples(a: argparse.Namespace, lm):
    """(task name, target tokens, depth, seed, task, system) for every sample the arguments ask for."""
    plan = [(t, int(n)) for n in a.contexts.split(",") for t in a.tasks.split(",")]
    if a.multikey_max:
        plan = [(t, n) for t, n in plan if t != "multikey" or n <= a.multikey_max]
    for task_name, n in plan:
        for depth in [float(x) for x in a.depths.split(",")]:
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                task = TASKS[task_name](lm.codec, n, depth, seed, haystack=a.haystack)
                for system in a.systems.split(","):
                    if system == "plain" and a.plain_max and n > a.plain_max:
                        continue
                    yield task_name, n, depth, seed, task, system


def run_sample(a: argparse.Namespace, lm, cfg_kw: dict, sample) -> dict:
    """Answer one sample with one system; the report's row (and one progress line on stderr)."""
    task_name, n, depth, seed, task, system = sample
    t0 = time.perf_counter()
    if system == "plain":
        out, extra = run_plain(lm, task, a.max_new_tokens), {"needle_retrieved": None}
    elif system == "tiered-qa":
        out, extra = run_qa(lm, task, a.max_new_tokens)
    else:
        out, extra = run_tiered(lm, task, a.max_new_tokens, system.split("-")[1], cfg_kw,
                                oracle=system.endswith("-oracle"), ask_after=a.ask_after)
    row = {"task": task_name, "target_tokens": n, "context_tokens": len(task.doc_ids) + len(task.question_ids),
           "depth": depth, "seed": seed, "system": system, **task.row(lm.codec, out), **extra,
           "seconds": round(time.perf_counter() - t0, 2)}
    print(f"{task_name:8s} {n:7d} d={depth:.1f} s={seed} {system:13s} "
          f"{'OK ' if row['correct'] else 'BAD'} {row['output']!r} needle_retrieved={extra['needle_retrieved']} "
          f"({row['seconds']}s)", file=sys.stderr)
    return row


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    retrieval = retrieval_kwargs(ap, a)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.flat_scan_below is not None:
        PageIndex.flat_scan_below = a.flat_scan_below
    lm = load_model(a.model)
    cfg_kw = dict(local_pages=a.local_pages, topk_pages=a.topk_pages, summary=a.summary, chunk_pages=a.chunk_pages,
                  score_frame=a.score_frame, reencode_pages=a.reencode_pages, **retrieval)
    rows, table = [], []
    for sample in samples(a, lm):
        rows.append(run_sample(a, lm, cfg_kw, sample))
        if not a.recheck_only:
            table = _write(a, lm, cfg_kw, rows)  # after every row: a cut-short run keeps its rows
    if a.recheck_only:
        outputs, inputs = hashed(rows)
        print(json.dumps({"outputs": outputs, "inputs": inputs, "domain": domain(lm)}, sort_keys=True))
        return 0
    if a.json:
        print(json.dumps(read_run(a.out, "passkey", a.run or a.haystack), indent=1))
    print("\n| task | system | context | accuracy | samples |\n|---|---|---|---|---|")
    for r in table:
        print(f"| {r['task']} | {r['system']} | {r['context_tokens']:,} | {r['accuracy']:.2f} | {r['samples']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
