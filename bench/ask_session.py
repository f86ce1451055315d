"""Several questions about one document in one session (`TieredModel.open` once, `.ask` per question):
what re-attaching the document's sealed state costs before each question, against the open that grafted
it, and whether a question asked after others gets the answer it gets alone.

    PYTHONPATH=. python -m bench.ask_session [--store DIR] [--questions N] [--max-new-tokens K]

The document is the bundled default (the statements chapter of the Python language reference, beyond
the embedded model's window: fixed distances and question-time reading). A store that already holds it
is grafted; else it is ingested first (without --store: a temporary store, so it is ingested). Writes
bench/results/ask_session.json.

The report's `tieredkv recheck` recipe (`--recheck-only`, a temporary store) asks the same questions again,
nothing timed: the document's token ids and the questions must hash equal on any machine, each answer's
token ids and the passages it read hash-equal in the same determinism domain, and the last question asked
after the others must give the ids it gives alone anywhere.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.lib.report import environment, print_recheck, recheck_block, sha256_ids, sha256_json, write_report
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.question.ask import QUIET
from tieredkv.question.corpus import default_document

QUESTIONS = ["What does the assert statement do?", "What does the pass statement do?",
             "What does the del statement do?", "What does the return statement do?",
             "What does the global statement do?"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="store directory (default: a temporary one, the document ingested)")
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment and the recipe)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ask_session.json"))
    ap.add_argument("--recheck-only", action="store_true",
                    help="ask the questions in a temporary store, nothing timed, and print {outputs, inputs, "
                         "relations, domain} without writing (`tieredkv recheck`)")
    return ap


def session(store: str, questions: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Open the document, ask every question in a row, then the last one again right after an open."""
    t0 = time.perf_counter()
    with TieredModel.from_pretrained("smollm2", store=store) as tm:
        load_s = time.perf_counter() - t0
        doc = tm.open(default_document(), name="default", progress=QUIET)
        answers = [tm.ask(doc, q, max_new_tokens=max_new_tokens) for q in questions]
        alone = tm.ask(tm.open(default_document(), name="default", progress=QUIET), questions[-1],
                       max_new_tokens=max_new_tokens)  # right after an open: no question before it
        domain = tm.domain()
    return {"load_s": load_s, "doc": doc, "answers": answers, "alone": alone, "domain": domain}


# ----------------------------------------------------------------------------- the recheck recipe
def recipe_args(questions: int, max_new_tokens: int, threads: int) -> list[str]:
    return ["--questions", str(questions), "--max-new-tokens", str(max_new_tokens), "--threads", str(threads),
            "--recheck-only"]


def recipe_hashes(report: dict[str, Any]) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from a report's `input` and `answers`, the names that hash inputs, and relations."""
    outputs = {"document token ids": report["input"]["token_ids_sha256"],
               "questions": sha256_json(report["input"]["questions"])}
    inputs = sorted(outputs)
    for i, x in enumerate(report["answers"], 1):
        outputs[f"q{i} answer ids"] = x["output_ids_sha256"]
        outputs[f"q{i} passages read"] = sha256_json({"attended": x["attended"], "passages": x["passages"]})
    relations = {f"q{len(report['answers'])} after the others = asked alone": report["last_question_alone_equal"]}
    return outputs, inputs, relations


def recipe_for_report(report: dict[str, Any], threads: int) -> list[str]:
    return recipe_args(len(report["input"]["questions"]), report["input"]["max_new_tokens"], threads)


def report_hashes(report: dict[str, Any]) -> dict[str, str]:
    return recipe_hashes(report)[0]


def report_of(a: argparse.Namespace, questions: list[str], s: dict[str, Any]) -> dict[str, Any]:
    doc, answers = s["doc"], s["answers"]
    attach = [x.timings["attach_s"] for x in answers[1:]]
    return {
        "benchmark": "ask_session", "environment": environment(), "model": "smollm2",
        "input": {"document_tokens": doc.num_tokens, "artifact": doc.artifact.artifact_id,
                  "token_ids_sha256": doc.artifact.token_ids_sha256, "questions": questions,
                  "max_new_tokens": a.max_new_tokens, "position": doc.config.position},
        "load_s": round(s["load_s"], 3), "open": {"context": doc.context, "open_s": round(doc.open_s, 4)},
        "answers": [{"question": x.question, "attach_s": x.timings["attach_s"], "answer_s": x.timings["answer_s"],
                     "attended": x.attended, "passages": [p["tokens"] for p in x.passages],
                     "output_ids_sha256": sha256_ids(x.token_ids), "text": x.text} for x in answers],
        "attach_s_median": statistics.median(attach) if attach else None,
        "attach_over_open": round(statistics.median(attach) / doc.open_s, 4) if attach else None,
        "last_question_alone_equal": s["alone"].token_ids == answers[-1].token_ids,
    }


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    questions = QUESTIONS[:a.questions]
    with tempfile.TemporaryDirectory(prefix="tkv-ask-") as tmp:
        s = session(tmp if a.recheck_only or not a.store else a.store, questions, a.max_new_tokens)
    report = report_of(a, questions, s)
    outputs, inputs, relations = recipe_hashes(report)
    if a.recheck_only:
        print_recheck(outputs, s["domain"], inputs, relations)
        return 0
    report["recheck"] = recheck_block("bench.ask_session", recipe_args(a.questions, a.max_new_tokens,
                                                                       torch.get_num_threads()),
                                      outputs, inputs=inputs, relations=relations, domain=s["domain"])
    write_report(a.out, report)
    doc = s["doc"]
    print(f"{doc.num_tokens:,} tokens {doc.context} in {doc.open_s:.2f}s; re-attach before each later question: "
          f"median {report['attach_s_median']:.4f}s ({report['attach_over_open']:.1%} of the open); "
          f"answers {[x['answer_s'] for x in report['answers']]} s; last question alone equal: "
          f"{report['last_question_alone_equal']} -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
