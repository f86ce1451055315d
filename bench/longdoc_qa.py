"""Real-document question answering, offline: the tiered path against what a user would otherwise do.

The document is real prose and reference text that ships with CPython and Debian (`corpora/longdoc.py`,
~151K SmolLM2 tokens); the questions are hand-written, with short accepted answers
(`corpora/longdoc_questions.json`, checked by `tools/longdoc_check.py`). For each context length the corpus
is cut into windows of that many tokens; each question is asked over the window that holds its
evidence, so the answer sits at some depth of a document of that length. Per question, in one run:

    tiered      the tiered path exactly as `tieredkv qa` runs it (tieredkv.question.qa: ingest once, graft,
                question-time reading with the library's defaults for this length)
    tiered-read     the same with the question-time reading at any length (inside the window too)
    tiered-read-page  one passage, its place found by the best single page (ReadingConfig.run_pages=1, no second)
    tiered-judge    the reading with the model judging 3 candidate places (the question's likelihood after each)
    ws12 ... oracle25   working sets of a fraction of the document at own positions (bench/longdoc/budget.py)
    tiered-attend   the same with no question-time step: attention over the stored pages
    tiered-attend-words  the same, the stored pages chosen by the question's words (TieredConfig.selection="lexical")
    ceiling     the plain model over only the 512 tokens around the evidence (what it can do when
                handed the right passage)
    bm25        BM25 over the document's 128-token pages, the top 6 in document order, then the plain
                model (text retrieval)
    truncation  the plain model over the last tokens of the document that fit its 8,192-token window
    full        the plain model over the whole document (full attention; where it fits the time budget)

An answer is correct when it contains an accepted string (case-insensitive, whitespace runs as one
space). Documents are ingested once into stores under --work and reused by later runs.

The report holds one run per question set and lengths (`--run`, default: "news" for the news set, "window"
inside the model's window, else the lengths), each a report of its own with its recheck recipe:

    python -m bench.longdoc_qa --lengths 32k --systems tiered,ceiling,bm25 --resume   # run "32k" of longdoc_qa.json
    python -m bench.longdoc_qa --render 16k,32k,128k                                  # their table and longdoc_qa.png
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import hashlib
import importlib
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.corpora import QUESTION_SETS
from bench.lib.common import BM25_PAGES, bm25_pages
from bench.lib.report import environment, read_run, recipe_with_domain, sha256_ids, write_run
from bench.longdoc.budget import BUDGET_SYSTEMS
from bench.longdoc.budget import answer as budget_answer
from bench.longdoc.recipe import block as recheck_block
from bench.longdoc.recipe import domain, print_rerun
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.question.ask import QUIET
from tieredkv.question.qa import DEFAULT_MAX_NEW_TOKENS, open_document, prompt_parts, qa_config

# 4k and 8k fit the model's 8,192-token window with the frame, a question and its answer
LENGTHS = {"4k": 4_000, "8k": 8_000, "16k": 16_384, "32k": 32_768, "128k": 131_072}
SYSTEMS = ("tiered", "tiered-read", "tiered-read-page", "tiered-judge", "tiered-attend", "tiered-attend-words",
           *BUDGET_SYSTEMS, "ceiling", "bm25", "truncation", "full", "signals")
# the tiered path with its question-time step chosen, whatever the length: the reading (QA_READING), the
# reading with one passage placed in the best single page (an earlier default), the reading with the model judging
# 3 candidate places, or none (attention over the stored pages)
FORCED = {"tiered-read": "read", "tiered-read-page": "read:run_pages=1,second_at=none",
          "tiered-judge": "read:candidates=3", "tiered-attend": "none", "tiered-attend-words": "none:lexical"}
# "signals" answers nothing: it ranks the document's pages for the question by each signal the reading
# could use, and records where the answer page lands (rank 1 = first).
CEILING_TOKENS = 512


def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).lower().strip()


def is_correct(answer: str, accepted: list[str]) -> bool:
    a = norm(answer)
    return any(norm(x) in a for x in accepted)


# ----------------------------------------------------------------------------- documents and questions
@dataclasses.dataclass
class Window:
    length: str
    index: int
    text: str
    question_set: str = "longdoc"
    doc_ids: list[int] = dataclasses.field(default_factory=list)  # the prompt's document part
    prefix_len: int = 0  # tokens of the prompt frame before the document text
    starts: list[int] = dataclasses.field(default_factory=list)  # char offset of each doc_ids token in `text`

    @property
    def name(self) -> str:
        prefix = "" if self.question_set == "longdoc" else self.question_set + "-"
        return f"{prefix}{self.length}-w{self.index}"


@dataclasses.dataclass
class Item:
    q: dict
    window: Window
    char_at: int  # evidence start, in window.text
    depth: float

    def evidence_tokens(self) -> tuple[int, int]:
        """Token range [a, b) of the evidence in window.doc_ids."""
        w, n = self.window, len(self.q["evidence"])
        a = w.prefix_len + bisect.bisect_right(w.starts, self.char_at) - 1
        b = w.prefix_len + bisect.bisect_left(w.starts, self.char_at + n)
        return a, max(b, a + 1)

    def answer_pages(self, page_size: int) -> list[int]:
        a, b = self.evidence_tokens()
        return list(range(a // page_size, (b - 1) // page_size + 1))


def token_offsets(lm, text: str) -> list[int]:
    tok = lm.codec.tokenizer
    return [s for s, _ in tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]


def windows_for(lm, corpus_text: str, starts: list[int], length: str, question_set: str = "longdoc") -> list[Window]:
    """Windows of LENGTHS[length] corpus tokens tiling the corpus, the last one aligned to its end."""
    n, total = LENGTHS[length], len(starts)
    firsts = list(range(0, max(1, total - n + 1), n))
    if firsts[-1] + n < total:
        firsts.append(total - n)
    out = []
    for i, a in enumerate(firsts):
        b = min(a + n, total)
        end = starts[b] if b < total else len(corpus_text)
        out.append(Window(length, i, corpus_text[starts[a]:end].strip("\n"), question_set))
    return out


def prepare(lm, lengths: list[str], only: set[str] | None, question_set: str = "longdoc") -> tuple[dict, list[Item]]:
    module, questions_path = QUESTION_SETS[question_set]
    corpus = importlib.import_module(module).build_corpus()
    questions = json.loads(questions_path.read_text())
    starts = token_offsets(lm, corpus.text)
    items: list[Item] = []
    for length in lengths:
        for w in windows_for(lm, corpus.text, starts, length, question_set):
            w.doc_ids, _ = prompt_parts(lm, w.text, "x")
            w.prefix_len = len(w.doc_ids) - len(lm.codec.encode(w.text))
            w.starts = token_offsets(lm, w.text)
            assert len(w.starts) == len(w.doc_ids) - w.prefix_len, "prompt frame tokenized across the boundary"
            for q in questions:
                if only and q["id"] not in only:
                    continue
                at = w.text.find(q["evidence"])
                taken = any(it.q["id"] == q["id"] and it.window.length == length for it in items)
                if at >= 0 and not taken:
                    items.append(Item(q, w, at, at / len(w.text)))
    info = {"corpus_sha256": corpus.sha256, "python": corpus.python_version,
            "question_set": question_set, "questions_sha256": hashlib.sha256(questions_path.read_bytes()).hexdigest(),
            "corpus_tokens": len(starts),
            "sources": [dataclasses.asdict(s) for s in corpus.sources]}
    return info, items


# ----------------------------------------------------------------------------- the plain model
class PlainPrefix:
    """The plain model with a DynamicCache over a shared prefix, cropped back after each question."""

    def __init__(self, lm, prefix: list[int]):
        from transformers import DynamicCache

        self.lm, self.prefix = lm, list(prefix)
        self.cache = DynamicCache(config=lm.model.config)
        if len(prefix) > 1:
            prefill(lm, self.prefix[:-1], self.cache, page_size=512)

    @torch.inference_mode()
    def answer(self, new_ids: list[int], max_new: int) -> list[int]:
        ids = self.prefix + list(new_ids)
        n = self.cache.get_seq_length()
        if len(ids) - 1 > n:
            prefill(self.lm, ids[n:-1], self.cache, start=n, page_size=512)
        out = self.lm.model.generate(torch.tensor([ids]), past_key_values=self.cache, max_new_tokens=max_new,
                                     do_sample=False, pad_token_id=self.lm.codec.eos_token_id)
        extra = self.cache.get_seq_length() - max(0, len(self.prefix) - 1)
        if extra:
            self.cache.crop(-extra)  # back to the shared prefix (transformers 5: a negative count removes)
        return out[0, len(ids):].tolist()


def plain_answer(lm, ids: list[int], max_new: int) -> list[int]:
    return PlainPrefix(lm, []).answer(ids, max_new)


def until_eos(lm, ids: list[int]) -> list[int]:
    eos = lm.codec.eos_token_id
    return ids[: ids.index(eos)] if eos in ids else ids


# ----------------------------------------------------------------------------- systems
def parse_variant(spec: str) -> dict:
    """TieredConfig fields of the tiered system: "default" (what `tieredkv qa` runs), "reencode=N",
    "none" (no question-time step: attention over the stored pages), "none:lexical" (the stored pages chosen
    by the question's words: TieredConfig.selection), or
    "read:passages=2,passage_tokens=384,signal=hybrid,second_at=none" (fields not given keep the QA defaults,
    the frame included); any of them with "+reuse=N" appended decodes with TieredConfig.reuse_steps=N (approximate)."""
    spec, plus, reuse = spec.partition("+reuse=")
    if plus:
        if not reuse.isdigit():
            raise ValueError(f"+reuse= takes a number of steps, got {reuse!r}")
        return {**parse_variant(spec), "reuse_steps": int(reuse)}
    if spec == "default":
        return {}
    if spec == "none":
        return {"reading": None}
    if spec.startswith("none:"):  # the stored pages chosen by TieredConfig.selection
        return {"reading": None, "selection": spec.partition(":")[2]}
    if spec.startswith("reencode="):
        return {"reading": None, "reencode_pages": int(spec.split("=")[1])}
    if spec.startswith("read"):
        kw = dict(part.split("=") for part in spec.partition(":")[2].split(",") if part)
        conv = {"passages": int, "passage_tokens": int, "signal": str, "frame_tokens": int, "candidates": int,
                "run_pages": int, "second_at": lambda v: None if v == "none" else float(v)}
        from tieredkv.question.qa import QA_READING

        return {"reading": dataclasses.replace(QA_READING, **{k: conv[k](v) for k, v in kw.items()})}
    raise ValueError(f"unknown tiered variant {spec!r}")


def open_window(tm, w: "Window", *, older_stores: bool) -> tuple:
    """Graft the window's document (ingested once per store), else ingest it. With `older_stores`, an
    artifact whose domain record only lacks fields that a newer tieredkv records (made on this machine
    by the previous version) is grafted too, without the byte-exact guarantee; the row says so.
    Returns (artifact, grafted, domain note or None)."""
    from tieredkv.artifacts.manifest import parse_manifest
    from tieredkv.provenance.domain import domain_differences

    name = "longdoc:" + sha256_ids(w.doc_ids)
    if older_stores:
        current = tm.domain()
        for art_id in tm.store.list_manifests():
            art = parse_manifest(tm.store.get_manifest(art_id), stored_as=art_id, where=tm.store.path)
            diffs = domain_differences(art.domain, current)
            if art.name == name and art.domain.get("regime") == current["regime"] and diffs \
                    and all("not recorded" in d for d in diffs):
                tm.graft(art, allow_domain_mismatch=True)
                return art, True, "older store: " + "; ".join(d.split(":")[0] for d in diffs) + " not recorded"
    art, grafted = open_document(tm, w.doc_ids, name)
    return art, grafted, None


class Runner:
    def __init__(self, lm, a):
        self.lm, self.a = lm, a
        self.work = Path(a.work)
        self._prefix_cache: dict[tuple[str, str], PlainPrefix] = {}
        self.variant = parse_variant(a.tiered)

    def prefix(self, system: str, w: Window) -> PlainPrefix:
        key = (system, w.name)
        if key not in self._prefix_cache:
            self._prefix_cache.clear()  # one window at a time: a 32K prefix is ~1.5 GB
            frame = w.doc_ids[:w.prefix_len]
            if system == "full":
                ids = w.doc_ids
            else:  # truncation: the document's end, so that frame + end + question + answer fit the window
                window = self.lm.model.config.max_position_embeddings
                room = window - len(frame) - 64 - self.a.max_new_tokens
                ids = frame + w.doc_ids[max(w.prefix_len, len(w.doc_ids) - room):]
            self._prefix_cache[key] = PlainPrefix(self.lm, ids)
        return self._prefix_cache[key]

    def run(self, system: str, item: Item, q_ids: list[int]) -> tuple[list[int], dict]:
        if system in FORCED:
            return self.tiered(item, q_ids, parse_variant(FORCED[system]))
        if system in BUDGET_SYSTEMS:
            return budget_answer(self, item, q_ids, system)
        lm, w, max_new = self.lm, item.window, self.a.max_new_tokens
        frame = w.doc_ids[:w.prefix_len]
        if system == "ceiling":
            a, b = item.evidence_tokens()
            mid = (a + b) // 2
            lo = max(w.prefix_len, mid - CEILING_TOKENS // 2)
            hi = min(len(w.doc_ids), lo + CEILING_TOKENS)
            return plain_answer(lm, frame + w.doc_ids[lo:hi] + q_ids, max_new), {"passage_tokens": [lo, hi]}
        if system == "bm25":
            ps = self.a.page_size
            pages = bm25_pages(lm.codec, w.doc_ids, item.q["question"], ps)
            ids = [t for p in pages for t in w.doc_ids[p * ps:(p + 1) * ps]]
            if pages and pages[0] == 0:
                ids = ids[w.prefix_len:]
            hit = bool(set(pages) & set(item.answer_pages(ps)))
            return plain_answer(lm, frame + ids + q_ids, max_new), {"pages": pages, "answer_page_selected": hit}
        if system in ("full", "truncation"):
            plain = self.prefix(system, w)  # the document prefilled once per window, not timed here
            t0 = time.perf_counter()
            out = plain.answer(q_ids, max_new)
            t_answer = time.perf_counter() - t0  # the question's forward and the decode, as the budget rows time
            return out, {"answer_s": round(t_answer, 2),
                         "decode_ms_per_token": round(1000 * t_answer / max(1, len(out)), 1)}
        if system == "tiered":
            return self.tiered(item, q_ids, self.variant)
        if system == "signals":
            return [], self.signals(item, q_ids)
        raise ValueError(system)

    def open(self, w: Window) -> None:
        """Ingest the window's document under the tiered system's configuration, unless stored."""
        config = qa_config(self.lm, len(w.doc_ids) + 64 + self.a.max_new_tokens, **self.variant)
        with PageStore(self.work / w.name, StoreConfig(device_budget_bytes=working_set_bytes(self.lm, config))) as st:
            tm = TieredModel(self.lm, st, config)
            try:
                open_window(tm, w, older_stores=self.a.older_stores)
            finally:
                tm.close()

    def signals(self, item: Item, q_ids: list[int]) -> dict:
        """Rank of the answer page among the document's pages under each signal (None: not ranked)."""
        from bench.longdoc.signals import signal_ranks

        w = item.window
        config = qa_config(self.lm, len(w.doc_ids) + len(q_ids) + self.a.max_new_tokens, **self.variant)
        with PageStore(self.work / w.name, StoreConfig(device_budget_bytes=working_set_bytes(self.lm, config))) as st:
            tm = TieredModel(self.lm, st, config)
            try:
                art, _, note = open_window(tm, w, older_stores=self.a.older_stores)
                _, null_ids = prompt_parts(self.lm, w.text, "")
                ranks = signal_ranks(tm, art, q_ids, null_ids, item.q["question"], item.answer_pages(tm.page_size),
                                     allow_domain_mismatch=note is not None)
            finally:
                tm.close()
        return {"answer_pages": item.answer_pages(tm.page_size), "ranks": ranks}

    def ask(self, tm, item: Item, q_ids: list[int], variant: dict) -> tuple:
        """What `tieredkv qa` runs (TieredModel.open, then .ask); a store of an older version (--older-stores)
        is grafted by hand, without the byte-exact guarantee. Returns (artifact, grafted, domain note,
        open seconds, answer seconds, answer ids)."""
        w, max_new = item.window, self.a.max_new_tokens
        if not self.a.older_stores:
            doc = tm.open(w.text, name="longdoc:" + sha256_ids(w.doc_ids), room=len(q_ids) + max_new,
                          progress=QUIET, **variant)
            ans = tm.ask(doc, item.q["question"], max_new_tokens=max_new)
            return doc.artifact, doc.context == "grafted", None, doc.open_s, ans.timings["answer_s"], ans.token_ids
        t0 = time.perf_counter()
        art, grafted, domain_note = open_window(tm, w, older_stores=True)
        t_open = time.perf_counter() - t0
        tm.keep_in_memory()
        tm.cache.retrieval_log.clear()
        t1 = time.perf_counter()
        out = tm.generate(q_ids, max_new_tokens=max_new, question=item.q["question"])
        return art, grafted, domain_note, t_open, time.perf_counter() - t1, out

    def tiered(self, item: Item, q_ids: list[int], variant: dict) -> tuple[list[int], dict]:
        lm, w, max_new = self.lm, item.window, self.a.max_new_tokens
        config = qa_config(lm, len(w.doc_ids) + len(q_ids) + max_new, **variant)
        store_cfg = StoreConfig(device_budget_bytes=working_set_bytes(lm, config))
        with PageStore(self.work / w.name, store_cfg) as store:
            tm = TieredModel(lm, store, config)
            try:
                art, grafted, domain_note, t_open, t_answer, out = self.ask(tm, item, q_ids, variant)
                read = tm.last_reading.to_dict() if tm.last_reading is not None else None
                # bytes on the model's device beside the device tier: the re-encoded frame and passages
                fresh = [t for kv in tm.cache.reencoded.values() for pair in kv if pair for t in pair]
                memory = {"device_tier_bytes": store.stats()["device"]["bytes"],
                          "device_tier_budget_bytes": store_cfg.device_budget_bytes,
                          "reencoded_bytes": sum(t.numel() * t.element_size() for t in fresh)}
            finally:
                tm.close()
        answer_pages = item.answer_pages(tm.page_size)
        selected = set(read["pages"]) if read else set()
        a, b = item.evidence_tokens()
        ev = {"config": {k: v for k, v in dataclasses.asdict(config).items() if v is not None},
              "artifact": art.artifact_id, "grafted": grafted, "domain_note": domain_note,
              "open_s": round(t_open, 2),
              "answer_s": round(t_answer, 2), "answer_pages": answer_pages, "evidence_tokens": [a, b],
              "reading": read, "memory": memory,
              "answer_page_selected": bool(selected & set(answer_pages)) if read else None,
              "evidence_read": any(x <= a and b <= y for x, y in read["passages"]) if read else None}
        return out, ev


# ----------------------------------------------------------------------------- report
def summarize(rows: list[dict]) -> dict:
    by: dict = {}
    for r in rows:
        if r["correct"] is None:
            continue
        for key in (("system", r["system"], "length", r["length"]),
                    ("system", r["system"], "length", r["length"], "depth", min(4, int(r["depth"] * 5)) / 5)):
            by.setdefault(key, []).append(r["correct"])
    acc = []
    for key, v in sorted(by.items(), key=lambda kv: str(kv[0])):
        d = dict(zip(key[::2], key[1::2]))
        acc.append({**d, "correct": sum(v), "questions": len(v), "accuracy": round(sum(v) / len(v), 4)})
    latency: dict = {}
    for r in rows:
        latency.setdefault((r["system"], r["length"]), []).append(r["seconds"])
    lat = [{"system": s, "length": n, "median_s": round(statistics.median(v), 2), "rows": len(v)}
           for (s, n), v in sorted(latency.items())]
    found = [r for r in rows if r.get("evidence_read") is not None]
    reading = {n: {"evidence_read": sum(r["evidence_read"] for r in found if r["length"] == n),
                   "questions": sum(r["length"] == n for r in found)} for n in sorted({r["length"] for r in found})}
    return {"accuracy": acc, "latency": lat, "reading": reading}


def table(rows: list[dict]) -> str:
    """Markdown: correct/questions per system and length, the ceiling's share, and median seconds."""
    summary = summarize(rows)
    acc = {(a["system"], a["length"]): a for a in summary["accuracy"] if "depth" not in a}
    lat = {(x["system"], x["length"]): x["median_s"] for x in summary["latency"]}
    lengths = [n for n in LENGTHS if any(k[1] == n for k in acc)]
    systems = [s for s in SYSTEMS if any(k[0] == s for k in acc)]
    out = ["| system | " + " | ".join(lengths) + " | median s/question |", "|---|" + "---:|" * (len(lengths) + 1)]
    for sy in systems:
        cells = []
        for n in lengths:
            a, c = acc.get((sy, n)), acc.get(("ceiling", n))
            share = (f" ({a['correct'] / c['correct']:.0%} of ceiling)"
                     if a and c and c["correct"] and sy != "ceiling" else "")
            cells.append(f"{a['correct']}/{a['questions']}{share}" if a else "—")
        secs = " / ".join(f"{lat[(sy, n)]:.0f}" for n in lengths if (sy, n) in lat)
        out.append(f"| {sy} | " + " | ".join(cells) + f" | {secs} |")
    return "\n".join(out)


def plot(rows: list[dict], model: str, path: Path) -> None:
    """Accuracy by system and length (bars), and by depth for each system (lines, all lengths pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(rows)
    acc = [a for a in summary["accuracy"] if "depth" not in a]
    lengths = [x for x in LENGTHS if any(a["length"] == x for a in acc)]
    systems = [s for s in SYSTEMS if any(a["system"] == s for a in acc)]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(1, len(systems))
    for j, sy in enumerate(systems):
        ys = [next((a["accuracy"] for a in acc if a["system"] == sy and a["length"] == x), 0) for x in lengths]
        ax.bar([i + j * width for i in range(len(lengths))], ys, width, label=sy)
        bins: dict = {}
        for r in rows:
            if r["system"] == sy and r["correct"] is not None:
                bins.setdefault(min(4, int(r["depth"] * 5)), []).append(r["correct"])
        xs = sorted(bins)
        ax2.plot([(x + 0.5) / 5 for x in xs], [sum(bins[x]) / len(bins[x]) for x in xs], marker="o", label=sy)
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(lengths))], lengths)
    ax.set_ylabel("accuracy (accepted answer in the output)")
    ax.set_ylim(0, 1)
    ax.set_title(f"Long-document QA, {model}: by context length")
    ax.legend(fontsize=8, ncol=3)
    ax2.set_xlabel("depth of the evidence in the document")
    ax2.set_ylim(0, 1)
    ax2.set_title("by depth (lengths pooled)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(report: Path, runs: list[str], out: Path) -> None:
    """Combine runs of the report (one per length, say): a table on stdout and a plot at `out`."""
    chosen = [read_run(report, "longdoc_qa", name) for name in runs]
    missing = [name for name, run in zip(runs, chosen) if run is None]
    if missing:
        raise SystemExit(f"{report} has no run {', '.join(missing)}")
    rows = [r for run in chosen for r in run["rows"]]
    plot(rows, chosen[0]["model"], out)
    print(table(rows))


def default_run(a: argparse.Namespace) -> str:
    """The run a run writes when --run is not given: the news set's, the window's (every length inside the
    model's window), or the lengths'."""
    if a.question_set != "longdoc":
        return a.question_set
    return "window" if set(a.length_list) <= {"4k", "8k"} else "-".join(a.length_list)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", default="16k,32k,128k")
    ap.add_argument("--set", default="longdoc", choices=sorted(QUESTION_SETS), dest="question_set",
                    help="the corpus and its questions (bench/corpora/): longdoc (CPython and Debian text, "
                         "longdoc_questions.json), news (300 news articles, news_questions.json, kept out of every "
                         "tuning step), moby (Moby-Dick chapters 1-61, moby_questions.json, a development set) or "
                         "sotu (State of the Union addresses 1790-1827, sotu_questions.json, held out)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--full-max", default="32k", help="run `full` only up to this length (quadratic attention)")
    ap.add_argument("--questions", help="comma list of question ids (default: all)")
    ap.add_argument("--tiered", default="default", help="the tiered system's variant (parse_variant)")
    ap.add_argument("--windows", help="comma list of window names to run (e.g. 128k-w0; default: all)")
    ap.add_argument("--ingest-only", action="store_true", help="ingest the windows' documents, answer nothing")
    ap.add_argument("--older-stores", action="store_true",
                    help="graft documents ingested by an older tieredkv on this machine (domain fields it did not "
                         "record), without the byte-exact guarantee; rows record it")
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--work", default="bench/.longdoc", help="stores of ingested windows (kept across runs)")
    ap.add_argument("--out", default="bench/results/longdoc_qa.json", help="the report; a run writes its --run")
    ap.add_argument("--run", help="the run of --out to write (default: news, window or the lengths: default_run)")
    ap.add_argument("--plot", help="also draw the run's figure here (png); with --render, the combined figure "
                    "(default: --out with a .png suffix)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in the run, run the rest")
    ap.add_argument("--recheck-only", action="store_true",
                    help="run the rows and print {outputs, inputs, domain}, writing nothing (`tieredkv recheck`)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--render", metavar="RUNS", help="only combine these runs of --out (comma list): a table, and "
                    "a plot at --plot")
    return ap


def checked_args(ap: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parse, and refuse unknown lengths, systems or tiered variants before a model is loaded."""
    a = ap.parse_args(argv)
    a.length_list, a.system_list = a.lengths.split(","), a.systems.split(",")
    bad = [x for x in a.length_list if x not in LENGTHS] + [s for s in a.system_list if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown lengths/systems {bad}; lengths {list(LENGTHS)}, systems {list(SYSTEMS)}")
    try:
        parse_variant(a.tiered)
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    a.run = a.run or default_run(a)
    return a


def ingest_only(runner: Runner, items: list) -> None:
    for w in {it.window.name: it.window for it in items}.values():
        t0 = time.perf_counter()
        runner.open(w)
        print(f"{w.name}: {len(w.doc_ids):,} tokens ready in {time.perf_counter() - t0:.0f}s", flush=True)


def new_report(lm, a: argparse.Namespace, info: dict, rows: list[dict]) -> dict:
    args = {k: v for k, v in vars(a).items() if k not in ("length_list", "system_list")}
    return {"bench": "longdoc_qa", "model": lm.name, "model_fingerprint": lm.fingerprint, "inputs": info,
            "config": {"max_new_tokens": a.max_new_tokens, "page_size": a.page_size, "ceiling_tokens": CEILING_TOKENS,
                       "bm25_pages": BM25_PAGES, "args": args},
            "windows": {}, "environment": environment(), "rows": rows}


def answer_row(lm, runner: Runner, it, system: str, q_ids: list[int]) -> dict:
    """Run one system on one question; the row the report keeps (and one progress line)."""
    w = it.window
    t0 = time.perf_counter()
    ids, ev = runner.run(system, it, q_ids)
    secs = time.perf_counter() - t0
    ids = until_eos(lm, ids)
    answer = lm.codec.decode(ids).strip()
    correct = is_correct(answer, it.q["answers"]) if system != "signals" else None
    row = {"length": w.length, "window": w.name, "id": it.q["id"], "system": system,
           "depth": round(it.depth, 4), "correct": correct, "answer": answer,
           "output_ids_sha256": sha256_ids(ids), "question_ids_sha256": sha256_ids(q_ids),
           "seconds": round(secs, 2), **ev}
    print(f"{w.name:9s} {it.q['id']} {system:10s} {'OK ' if row['correct'] else '-- '} {secs:6.1f}s "
          f"{answer[:70]!r}", file=sys.stderr, flush=True)
    return row


def run_items(lm, runner: Runner, a: argparse.Namespace, items: list, report: dict, out: Path | None) -> None:
    """Answer every (question, system) not already in the report, writing the report after each row (as
    run a.run of `out`; None: nothing written)."""
    rows = report["rows"]
    done = {(r["length"], r["id"], r["system"]) for r in rows}
    full_max = list(LENGTHS).index(a.full_max)
    items.sort(key=lambda it: (list(LENGTHS).index(it.window.length), it.window.index, it.q["id"]))
    for it in items:
        w = it.window
        report["windows"][w.name] = {"doc_tokens": len(w.doc_ids), "doc_ids_sha256": sha256_ids(w.doc_ids)}
        _, q_ids = prompt_parts(lm, w.text, it.q["question"])
        for system in a.system_list:
            if (w.length, it.q["id"], system) in done:
                continue
            if system == "full" and list(LENGTHS).index(w.length) > full_max:
                continue
            rows.append(answer_row(lm, runner, it, system, q_ids))
            report["summary"] = summarize(rows)
            if out is not None:
                write_run(out, "longdoc_qa", a.run, report)


def main(argv=None) -> int:
    ap = parser()
    a = checked_args(ap, argv)
    if a.render:
        render(Path(a.out), a.render.split(","), Path(a.plot or Path(a.out).with_suffix(".png")))
        return 0
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    info, items = prepare(lm, a.length_list, set(a.questions.split(",")) if a.questions else None, a.question_set)
    if a.windows:
        items = [it for it in items if it.window.name in a.windows.split(",")]
    runner = Runner(lm, a)
    if a.ingest_only:
        ingest_only(runner, items)
        return 0
    if a.recheck_only:
        report = new_report(lm, a, info, [])
        run_items(lm, runner, a, items, report, None)
        print_rerun(lm, report["rows"], info, a.page_size)
        return 0
    out = Path(a.out)
    done = read_run(out, "longdoc_qa", a.run) if a.resume else None
    rows = done["rows"] if done else []
    report = new_report(lm, a, info, rows)
    # NOTE: the run is written after every row; a resumed run keeps its recipe and domain meanwhile (the rows they
    # re-run are kept), so a run stopped part-way can still be re-checked
    report.update({k: done[k] for k in ("recheck", "domain") if done and k in done})
    run_items(lm, runner, a, items, report, out)
    report["summary"] = summarize(rows)
    report["domain"] = domain(lm, a.page_size)
    recipe = recipe_with_domain(recheck_block(rows, info, a.question_set), done, report["domain"])
    if recipe is not None:
        report["recheck"] = recipe
    write_run(out, "longdoc_qa", a.run, report)
    if a.plot:
        plot(rows, lm.name, Path(a.plot))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
