"""Accuracy against device budget on a synthetic long-context suite (RULER-style), inside the window and beyond.

Seven task families generated from a seed over real prose (the Python language reference;
`bench/corpora/tasks.py`: passkey, multikey, multivalue, multiquery, vartrack, aggregate, extract). Per sample,
in one run:

    full        the plain model over the whole document (full attention; its KV cache is the document)
    qa          `tieredkv qa`'s configuration for this length (question-time reading of the passages the
                question's words point to)
    attend      the same ingest and working set with no reading: attention over the stored pages the keys
                choose (beyond the window: the fixed-distance policy alone)
    truncation  the plain model over the document's last tokens that fit its window (after the chat frame)
    bm25        BM25 over the document's pages, the top 6 in document order, then the plain model
    ws12 ws25 ws50 ws25-union stream25 oracle25
                working sets of a fraction of the document at own positions, no reading
                (`bench/longdoc/budget.py`); oracle25 forces the evidence pages in (skipped where they
                do not fit its top-k, as for `aggregate`, whose evidence is everywhere)

`full` and the working sets at own positions need the document inside the model's window, where keys at
their own positions are exact; `qa`, `attend`, `truncation` and `bm25` run at any length.

A sample is correct when the output holds every expected string; `recall` is the share it holds. Rows
record device bytes (the plain model's KV cache; a working set's device tier), decode ms/token (the
question and answer after the document, the same span for every system), input and output-id hashes.
This is a synthetic task: it says what the working set keeps of planted facts, not how a user's
questions fare (`bench/longdoc_qa.py` measures that on real questions).

    python -m bench.ruler --contexts 4000,8000 --seeds 3 --threads 2
    python -m bench.ruler --contexts 16000 --seeds 2 --systems qa,attend,truncation,bm25 --resume
    python -m bench.ruler --render bench/results/ruler.json      # table and plot of a report
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.corpora.tasks import SUITE
from bench.lib.common import bm25_pages, markdown_table
from bench.lib.report import environment, print_recheck, recheck_block, recipe_with_domain, write_report
from bench.longdoc.budget import BUDGET_SYSTEMS, LEADER, budget_config, label_heights, run_budget
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import kv_bytes_per_token, load_model
from tieredkv.provenance.domain import determinism_domain
from tieredkv.question.qa import frame_tokens, open_document, qa_config

ANY_LENGTH = ("qa", "attend", "truncation", "bm25")  # the systems that run beyond the model's window
SYSTEMS = ("full", *ANY_LENGTH, *BUDGET_SYSTEMS)
DEPTHS = (0.25, 0.5, 0.75)  # the first needle's depth, by seed


@torch.inference_mode()
def run_full(lm, task, doc_ids: list[int] | None = None) -> tuple[list[int], dict]:
    """The plain model: the document (or `doc_ids`, what a baseline hands it) prefilled into a DynamicCache,
    then the question and answer (timed)."""
    from transformers import DynamicCache

    doc_ids = task.doc_ids if doc_ids is None else doc_ids
    cache = DynamicCache(config=lm.model.config)
    prefill(lm, doc_ids, cache, page_size=512)
    ids = doc_ids + task.question_ids
    t0 = time.perf_counter()
    out = lm.model.generate(torch.tensor([ids]), past_key_values=cache, max_new_tokens=task.max_new_tokens,
                            do_sample=False, pad_token_id=lm.codec.eos_token_id)[0, len(ids):].tolist()
    t = time.perf_counter() - t0
    return out, {"device_bytes": kv_bytes_per_token(lm.model) * (len(ids) + len(out)),
                 "decode_ms_per_token": round(1000 * t / max(1, len(out)), 1), "share": 1.0}


def run_stored(lm, task, store_dir: Path, *, read: bool) -> tuple[list[int], dict]:
    """As `tieredkv qa` answers (`read`), or over the same stored pages and working set with no reading
    (`attend`): the document ingested once per sample under `qa_config` for its length, grafted after."""
    config = qa_config(lm, len(task.doc_ids) + len(task.question_ids) + task.max_new_tokens)
    if not read:
        config = dataclasses.replace(config, reading=None)  # not part of the regime: the same stored pages
    device = working_set_bytes(lm, config)
    evidence = task.needle_pages(lm.default_page_size)
    with PageStore(store_dir, StoreConfig(device_budget_bytes=device)) as store:
        tm = TieredModel(lm, store, config)
        try:
            open_document(tm, task.doc_ids, "ruler")
            tm.keep_in_memory()
            tm.cache.retrieval_log.clear()
            t0 = time.perf_counter()
            out = tm.generate(task.question_ids, max_new_tokens=task.max_new_tokens,
                              question=lm.codec.decode(task.question_ids))
            t = time.perf_counter() - t0
            log, reading = list(tm.cache.retrieval_log), tm.last_reading
        finally:
            tm.close()
    extra = {"position": config.position, "device_bytes": device,
             "decode_ms_per_token": round(1000 * t / max(1, len(out)), 1)}
    if read:
        pages = None if reading is None else reading.pages
        read_evidence = None if pages is None else bool(evidence & set(pages))
        return out, {**extra, "read_pages": pages, "evidence_read": read_evidence}
    hit = sum(bool(evidence & set(sel)) for sel in log) / len(log) if log else None
    return out, {**extra, "evidence_retrieved": hit}


def baseline_ids(lm, task, system: str) -> tuple[list[int], dict]:
    """What a plain-model baseline is handed (after the chat frame): the document's end that fits the window
    with the question and answer (`truncation`), or its BM25 top pages in document order (`bm25`)."""
    frame, ps = frame_tokens(lm), lm.default_page_size
    doc, evidence = task.doc_ids, task.needle_pages(ps)
    if system == "truncation":
        room = lm.model.config.max_position_embeddings - frame - len(task.question_ids) - task.max_new_tokens
        start = max(frame, len(doc) - room)
        kept = set(range(start // ps, -(-len(doc) // ps)))
        return doc[:frame] + doc[start:], {"evidence_read": bool(evidence & kept)}
    best = bm25_pages(lm.codec, doc, lm.codec.decode(task.question_ids), ps)
    ids = [t for i in best for t in doc[i * ps + (frame if i == 0 else 0):(i + 1) * ps]]
    return doc[:frame] + ids, {"pages": best, "evidence_read": bool(evidence & set(best))}


def run_system(lm, task, system: str, work: Path, page_size: int) -> tuple[list[int], dict] | None:
    """One sample under one system; None where the system does not apply (an oracle whose evidence
    does not fit its top-k)."""
    if system == "full":
        return run_full(lm, task)
    if system in ("qa", "attend"):
        return run_stored(lm, task, work.with_name(work.name + "-qa"), read=system == "qa")
    if system in ("truncation", "bm25"):
        ids, extra = baseline_ids(lm, task, system)
        out, timed = run_full(lm, task, ids)
        return out, {**extra, **timed, "share": None}
    evidence = sorted(task.needle_pages(page_size))
    if system == "oracle25":
        num_pages = -(-len(task.doc_ids) // page_size)
        if len(evidence) > budget_config(num_pages, 0.25, "per_head", page_size).topk_pages:
            return None
    out, extra = run_budget(lm, task.doc_ids, task.question_ids, evidence, system, work, page_size,
                            task.max_new_tokens)
    return out, {**extra, "device_bytes": extra["device_tier_budget_bytes"],
                 "share": extra["pages_per_head"] / extra["document_pages"]}


def samples(a):
    for n in [int(x) for x in a.contexts.split(",")]:
        for name in a.tasks.split(","):
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                yield n, name, seed


def answer(a, lm, n: int, name: str, seed: int, work: Path, done: set) -> list[dict]:
    """Every system's row for one sample (those not `done` already)."""
    task = SUITE[name](lm.codec, n, DEPTHS[seed % len(DEPTHS)], seed, haystack="prose")
    rows, store_dir = [], work / f"{name}-{n}-{seed}"  # the sample's stores: one per budget regime
    for system in a.systems.split(","):
        if (n, name, seed, system) in done:
            continue
        t0 = time.perf_counter()
        got = run_system(lm, task, system, store_dir, lm.default_page_size)
        if got is None:
            continue
        out, extra = got
        row = {"task": name, "target_tokens": n, "context_tokens": len(task.doc_ids) + len(task.question_ids),
               "seed": seed, "depth": task.depth, "system": system, **task.row(lm.codec, out),
               "evidence_pages": sorted(task.needle_pages(lm.default_page_size)), **extra,
               "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        print(f"{name:10s} {n:6d} s={seed} {system:10s} {'OK ' if row['correct'] else '-- '} "
              f"recall={row['recall']:.2f} {row['output']!r} ({row['seconds']}s)", file=sys.stderr)
    for d in (store_dir, store_dir.with_name(store_dir.name + "-qa")):
        shutil.rmtree(d, ignore_errors=True)  # an 8K document is ~370 MB per regime
    return rows


# ----------------------------------------------------------------------------- summary, table, plot
def summary(rows: list[dict]) -> list[dict]:
    """Per context and system: correct samples, mean recall, per-family correct, share attended, device
    bytes and median decode ms/token."""
    out = []
    for n in sorted({r["target_tokens"] for r in rows}):
        for s in SYSTEMS:
            mine = [r for r in rows if r["target_tokens"] == n and r["system"] == s]
            if not mine:
                continue
            d = {"context": n, "system": s, "correct": f"{sum(r['correct'] for r in mine)}/{len(mine)}",
                 "accuracy": sum(r["correct"] for r in mine) / len(mine),
                 "recall": sum(r["recall"] for r in mine) / len(mine)}
            for fam in dict.fromkeys(r["task"] for r in mine):
                f = [r for r in mine if r["task"] == fam]
                d[fam] = f"{sum(r['correct'] for r in f)}/{len(f)}"
            for key in ("share", "device_bytes", "decode_ms_per_token"):
                vals = sorted(r[key] for r in mine if r.get(key) is not None)
                d[key] = vals[len(vals) // 2] if vals else None
            d["device_mib"] = None if d["device_bytes"] is None else d["device_bytes"] / 2**20
            out.append(d)
    return out


def table(rows: list[dict]) -> str:
    s = summary(rows)
    families = list(dict.fromkeys(r["task"] for r in rows))
    return markdown_table(s, [("context", "context", ","), ("system", "system", ""), ("correct", "correct", ""),
                              ("recall", "recall", ".2f"), *[(f, f, "") for f in families],
                              ("share attended", "share", ".0%"), ("device MiB", "device_mib", ".1f"),
                              ("decode ms/token", "decode_ms_per_token", "")])


MARKED = {"ws25-lex": "*", "ws12-lex": "P", "ws25-q": "s", "ws12-q": "^", "ws25-hyb": "h", "ws12-d2": "<",
          "ws12-lex-d2": ">", "oracle25": "x", "stream25": "v", "ws25-union": "+", "ws25-exact": "1"}


def plot(rows: list[dict], path) -> None:
    """Mean recall against the share of the document attended per KV head, one line per context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7, 4.6))
    s = summary(rows)
    labels = []  # (share, recall, text, colour) of every marked point: placed together so none overlap
    for n in sorted({d["context"] for d in s if d["system"] in ("ws12", "ws25", "ws50", "full")}):
        pts = sorted((d["share"], d["recall"]) for d in s if d["context"] == n and d["system"] in
                     ("ws12", "ws25", "ws50", "full"))
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{n:,} tokens: per-head top-k")
        colour = line[0].get_color()
        for d in (d for d in s if d["context"] == n and d["system"] in MARKED):
            ax.scatter([d["share"]], [d["recall"]], marker=MARKED[d["system"]], color=colour)
            labels.append((d["share"], d["recall"], f"{d['system']} ({n // 1000}K)", colour))
        for d in s:
            if d["context"] == n and d["system"] == "qa":
                ax.axhline(d["recall"], ls=":", color=colour, lw=1)
    heights = label_heights([(x, y) for x, y, _, _ in labels], gap=0.017, span=0.7)
    for (x, y, text, colour), h in zip(labels, heights):
        ax.annotate(text, (x, y), xytext=(x * 1.05, h), textcoords="data", fontsize=7, color=colour, va="center",
                    arrowprops=LEADER if h - y > 0.025 else None)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0%}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks([0.125, 0.25, 0.5, 1.0])
    ax.set_ylim(-0.02, max([d["recall"] for d in s] + heights) + 0.05)
    ax.set_xlabel("share of the document's pages attended per KV head (log)")
    ax.set_ylabel("mean recall of expected strings")
    ax.set_title("Synthetic suite: recall against working set (dotted: tieredkv qa)", fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # a run beyond the window only has no budget lines
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- recipe and main
def hashed(rows: list[dict]) -> tuple[dict[str, str], list[str]]:
    outputs, inputs = {}, []
    for r in rows:
        name = f"{r['task']} {r['target_tokens']} s={r['seed']} {r['system']}"
        outputs[f"{name} output_ids"], outputs[f"{name} input"] = r["output_ids_sha256"], r["input_sha256"]
        inputs.append(f"{name} input")
    return outputs, inputs


def recipe(a, rows: list[dict]) -> dict | None:
    """The plain model's rows of the shortest context and first seed that it ran: deterministic, about a
    minute (a resumed run of other systems or lengths keeps the same recipe)."""
    full = [r for r in rows if r["system"] == "full"]
    if not full:
        return None
    n, seed = min(r["target_tokens"] for r in full), min(r["seed"] for r in full)
    chosen = [r for r in full if r["target_tokens"] == n and r["seed"] == seed]
    args = ["--model", a.model, "--contexts", str(n), "--tasks", ",".join(r["task"] for r in chosen),
            "--seeds", "1", "--first-seed", str(seed), "--systems", "full", "--recheck-only"]
    outputs, inputs = hashed(chosen)
    return recheck_block("bench.ruler", args, outputs, inputs=inputs)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--contexts", default="4000,8000",
                    help="document tokens (beyond the model's window only for " + ", ".join(ANY_LENGTH) + ")")
    ap.add_argument("--tasks", default=",".join(SUITE))
    ap.add_argument("--seeds", type=int, default=3, help="samples per task and context")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default="bench/results/ruler.json")
    ap.add_argument("--resume", action="store_true", help="keep --out's rows and run only the samples it lacks")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="run the samples and print {outputs, inputs, domain} without writing (`tieredkv recheck`)")
    ap.add_argument("--render", metavar="REPORT", help="print the table of REPORT and write its plot; run nothing")
    return ap


def check_args(ap, a) -> None:
    bad = [s for s in a.systems.split(",") if s not in SYSTEMS] + [t for t in a.tasks.split(",") if t not in SUITE]
    if bad:
        ap.error(f"unknown system or task {bad}: systems are {', '.join(SYSTEMS)}; tasks {', '.join(SUITE)}")
    if a.seeds < 1 or a.first_seed < 0:
        ap.error("--seeds must be at least 1 and --first-seed at least 0")
    if any(int(n) < 512 for n in a.contexts.split(",")):
        ap.error("--contexts: each must be at least 512 tokens")


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.render:
        rows = json.loads(Path(a.render).read_text())["rows"]
        print(table(rows))
        plot(rows, Path(a.render).with_suffix(".png"))
        return 0
    check_args(ap, a)
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    window = lm.model.config.max_position_embeddings
    own = [s for s in a.systems.split(",") if s not in ANY_LENGTH]
    if own and any(int(n) + 64 > window for n in a.contexts.split(",")):  # the question and answer fit too
        ap.error(f"--systems {','.join(own)} attend at own positions: give --contexts under the model's "
                 f"{window:,}-token window less 64, or only {', '.join(ANY_LENGTH)} beyond it")
    domain = determinism_domain(lm.model, lm.fingerprint, lm.default_page_size)
    earlier = json.loads(Path(a.out).read_text()) if a.resume and Path(a.out).exists() else None
    rows = earlier["rows"] if earlier else []
    done = {(r["target_tokens"], r["task"], r["seed"], r["system"]) for r in rows}
    work, t0 = Path(tempfile.mkdtemp(prefix="tkv-ruler-")), time.perf_counter()
    try:
        for n, name, seed in samples(a):
            rows += answer(a, lm, n, name, seed, work, done)
            if not a.recheck_only:  # after every sample: a cut-short run keeps its rows
                write_report(a.out, {"bench": "ruler", "model": lm.name, "model_fingerprint": lm.fingerprint,
                                     "args": vars(a), "environment": environment(),
                                     "domain": domain, "rows": rows, "summary": summary(rows),
                                     "seconds": round(time.perf_counter() - t0, 1),
                                     "recheck": recipe_with_domain(recipe(a, rows), earlier, domain)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.recheck_only:
        outputs, inputs = hashed(rows)
        print_recheck(outputs, domain, inputs)
        return 0
    print(table(rows))
    plot(rows, Path(a.out).with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
