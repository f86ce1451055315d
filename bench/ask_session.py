"""Several questions about one document in one session (`TieredModel.open` once, `.ask` per question):
what re-attaching the document's sealed state costs before each question, against the open that grafted
it, and whether a question asked after others gets the answer it gets alone.

    PYTHONPATH=. python -m bench.ask_session --store DIR [--questions N] [--max-new-tokens K]

The document is the bundled default (the statements chapter of the Python language reference, beyond
the embedded model's window: fixed distances and question-time reading). A store that already holds it
is grafted; else it is ingested first. Writes bench/results/ask_session.json.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.report import environment, sha256_ids, write_report
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.question.ask import QUIET
from tieredkv.question.corpus import default_document

QUESTIONS = ["What does the assert statement do?", "What does the pass statement do?",
             "What does the del statement do?", "What does the return statement do?",
             "What does the global statement do?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ask_session.json"))
    a = ap.parse_args()
    questions = QUESTIONS[:a.questions]
    t0 = time.perf_counter()
    with TieredModel.from_pretrained("smollm2", store=a.store) as tm:
        load_s = time.perf_counter() - t0
        doc = tm.open(default_document(), name="default", progress=QUIET)
        answers = [tm.ask(doc, q, max_new_tokens=a.max_new_tokens) for q in questions]
        alone = tm.ask(tm.open(default_document(), name="default", progress=QUIET), questions[-1],
                       max_new_tokens=a.max_new_tokens)  # right after an open: no question before it
    attach = [x.timings["attach_s"] for x in answers[1:]]
    report = {
        "benchmark": "ask_session", "environment": environment(), "model": "smollm2",
        "input": {"document_tokens": doc.num_tokens, "artifact": doc.artifact.artifact_id,
                  "token_ids_sha256": doc.artifact.token_ids_sha256, "questions": questions,
                  "max_new_tokens": a.max_new_tokens, "position": doc.config.position},
        "load_s": round(load_s, 3), "open": {"context": doc.context, "open_s": round(doc.open_s, 4)},
        "answers": [{"question": x.question, "attach_s": x.timings["attach_s"], "answer_s": x.timings["answer_s"],
                     "attended": x.attended, "passages": [p["tokens"] for p in x.passages],
                     "output_ids_sha256": sha256_ids(x.token_ids), "text": x.text} for x in answers],
        "attach_s_median": statistics.median(attach) if attach else None,
        "attach_over_open": round(statistics.median(attach) / doc.open_s, 4) if attach else None,
        "last_question_alone_equal": alone.token_ids == answers[-1].token_ids,
    }
    write_report(a.out, report)
    print(f"{doc.num_tokens:,} tokens {doc.context} in {doc.open_s:.2f}s; re-attach before each later question: "
          f"median {report['attach_s_median']:.4f}s ({report['attach_over_open']:.1%} of the open); "
          f"answers {[x.timings['answer_s'] for x in answers]} s; last question alone equal: "
          f"{report['last_question_alone_equal']} -> {a.out}")


if __name__ == "__main__":
    main()
