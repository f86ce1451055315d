"""Which way of choosing the reading's passage holds on prose it was not tuned on?

    PYTHONPATH=. python lab/2026-12-07-reading-robustness/reading_study.py --set moby --lengths 8k,32k \
        --choices run,stem,judge3,stem-judge3 --answer run,stem --out moby.json

For every question of a set at every length, each choice places the reading's passages over the window's
128-token pages with `tieredkv.question.reading.choose` (the function `tieredkv qa` reads with), and a choice
counts when a passage holds the whole evidence sentence; `ceiling` is the 512 tokens around the evidence. With `--answer`, the plain model answers from the
prompt's frame, the chosen passages (document order) and the question, greedy, 48 new tokens, scored as
bench/longdoc_qa.py scores (it is what `ceiling` does with the evidence's own 512 tokens; the reading's own
path re-encodes the same tokens at the same positions). The judge's choices need model forwards; the rest are
tokens only. Inputs are hashed as bench/longdoc_qa.py hashes them; output ids per answered row.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from types import SimpleNamespace

import torch

from bench.longdoc_qa import is_correct, plain_answer, prepare, until_eos
from bench.lib.report import environment, sha256_ids
from tieredkv.engine.tiered_config import ReadingConfig
from tieredkv.engine.working_set import Span
from tieredkv.models.loading import load_model
from tieredkv.question import reading
from tieredkv.question.qa import prompt_parts

PAGE = 128
BASE = ReadingConfig(passages=1, passage_tokens=512, signal="lexical")
CHOICES = {
    "run": BASE,  # tieredkv qa's reading
    "stem": dataclasses.replace(BASE, stemmed=True),
    "judge3": dataclasses.replace(BASE, candidates=3),
    "stem-judge3": dataclasses.replace(BASE, stemmed=True, candidates=3),
    "two": dataclasses.replace(BASE, passages=2),
    "stem-two": dataclasses.replace(BASE, stemmed=True, passages=2),
    "page": dataclasses.replace(BASE, run_pages=1),
    "two-384": dataclasses.replace(BASE, passages=2, passage_tokens=384),
    "three-256": dataclasses.replace(BASE, passages=3, passage_tokens=256),
}
CEILING = 512  # bench/longdoc_qa.py's ceiling: the plain model over the 512 tokens around the evidence


def ceiling_range(w, ea: int, eb: int) -> tuple[int, int]:
    mid = (ea + eb) // 2
    lo = max(w.prefix_len, mid - CEILING // 2)
    return lo, min(len(w.doc_ids), lo + CEILING)


def fake_cache(lm, doc_ids: list[int]) -> SimpleNamespace:
    spans = [Span(i, a, min(a + PAGE, len(doc_ids))) for i, a in enumerate(range(0, len(doc_ids), PAGE))]
    return SimpleNamespace(spans=spans, lexical_index=None, sealed_upto=len(doc_ids), page_size=PAGE,
                           model=lm.model, page_token_ids=lambda p: doc_ids[spans[p].start:spans[p].end])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="moby")
    ap.add_argument("--lengths", default="8k,32k")
    ap.add_argument("--choices", default="run,stem,judge3,stem-judge3")
    ap.add_argument("--answer", default="", help="choices whose passages the plain model answers from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    choices, answered = a.choices.split(","), [c for c in a.answer.split(",") if c]
    lm = load_model("smollm2")
    info, items = prepare(lm, a.lengths.split(","), None, a.set)
    rows, tally = [], collections.Counter()
    caches: dict[str, SimpleNamespace] = {}
    for it in items:
        w = it.window
        cache = caches.setdefault(w.name, fake_cache(lm, w.doc_ids))
        _, q_ids = prompt_parts(lm, w.text, it.q["question"])
        ea, eb = it.evidence_tokens()
        row = {"length": w.length, "id": it.q["id"], "window": w.name, "evidence": [ea, eb],
               "question_ids_sha256": sha256_ids(q_ids)}
        for name in choices:
            t0 = time.perf_counter()
            passages = ([ceiling_range(w, ea, eb)] if name == "ceiling" else
                        reading.choose(cache, q_ids, it.q["question"], CHOICES[name], lm.codec, w.prefix_len).passages)
            hit = any(pa <= ea and eb <= pb for pa, pb in passages)
            row[name] = {"passages": [list(p) for p in passages], "hit": hit,
                         "choose_s": round(time.perf_counter() - t0, 2)}
            key = (w.length, name)
            tally[key, "n"] += 1
            tally[key, "hit"] += hit
            if name in answered:
                ids = w.doc_ids[:w.prefix_len] + [t for pa, pb in passages for t in w.doc_ids[pa:pb]] + q_ids
                out = until_eos(lm, plain_answer(lm, ids, 48))
                answer = lm.codec.decode(out).strip()
                ok = is_correct(answer, it.q["answers"])
                row[name].update(answer=answer, correct=ok, output_ids_sha256=sha256_ids(out))
                tally[key, "correct"] += ok
        rows.append(row)
        print(w.name, it.q["id"], {c: ("H" if row[c]["hit"] else "-") + ("+" if row[c].get("correct") else "")
                                   for c in choices}, file=sys.stderr, flush=True)
    summary = {f"{length} {name}": {"evidence": f"{tally[(length, name), 'hit']}/{tally[(length, name), 'n']}",
                                    **({"correct": f"{tally[(length, name), 'correct']}/{tally[(length, name), 'n']}"}
                                       if name in answered else {})}
               for length in a.lengths.split(",") for name in choices}
    report = {"model": lm.name, "model_fingerprint": lm.fingerprint, "inputs": info, "args": vars(a),
              "choices": {c: dataclasses.asdict(CHOICES[c]) for c in choices if c in CHOICES}, "environment": environment(),
              "summary": summary, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
