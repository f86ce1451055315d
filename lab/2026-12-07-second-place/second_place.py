"""When should the reading read a second passage? The share of the best place's BM25 that the next place reaches.

    PYTHONPATH=. python lab/2026-12-07-second-place/second_place.py --out lab/2026-12-07-second-place/dev.json

For every question of the three development sets (moby, news, longdoc) at 8K and 32K, `reading.choose` places the
reading's passages with `ReadingConfig.second_at` at each share in SHARES (tokens only, no model): one passage
where the next place (the best run that does not overlap the first) scores below that share of the first's BM25,
else two. The answers are the ones lab/2026-12-07-reading-robustness already gave for one passage (`run`) and for
two (`two`): the places are the same (checked here, row by row), so the plain model's answer is too. The row
records the share the next place reached, and the summary each threshold's correct answers per set.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1] / "2026-12-07-reading-robustness"
sys.path.insert(0, str(STUDY))
from reading_study import BASE, fake_cache  # noqa: E402

from bench.lib.report import environment  # noqa: E402
from bench.longdoc_qa import prepare  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from tieredkv.question import reading  # noqa: E402
from tieredkv.question.qa import prompt_parts  # noqa: E402

SETS = ("moby", "news", "longdoc")
SHARES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    lm = load_model("smollm2")
    rows, inputs = [], {}
    for name in SETS:
        answers = {(r["length"], r["id"]): r for r in json.loads((STUDY / f"{name}_answers.json").read_text())["rows"]}
        info, items = prepare(lm, ["8k", "32k"], None, name)
        inputs[name] = info
        caches: dict = {}
        for it in items:
            w = it.window
            cache = caches.setdefault(w.name, fake_cache(lm, w.doc_ids))
            _, q_ids = prompt_parts(lm, w.text, it.q["question"])
            old = answers[(w.length, it.q["id"])]
            row = {"set": name, "length": w.length, "id": it.q["id"], "one": old["run"]["correct"],
                   "two": old["two"]["correct"], "read_two": {}}
            for share in SHARES:
                got = reading.choose(cache, q_ids, it.q["question"], dataclasses.replace(BASE, second_at=share),
                                     lm.codec, w.prefix_len).passages
                two = len(got) == 2 or (got != [tuple(p) for p in old["run"]["passages"]])
                expect = old["two" if two else "run"]["passages"]
                assert [list(p) for p in got] == expect, (name, it.q["id"], share, got, expect)
                row["read_two"][str(share)] = two
            rows.append(row)
    summary = {}
    for share in ["never", *map(str, SHARES)]:
        tally = collections.Counter()
        for r in rows:
            two = r["read_two"].get(share, False)
            tally[r["set"]] += r["two" if two else "one"]
            tally["all"] += r["two" if two else "one"]
            tally["read_two"] += two
        summary[share] = dict(tally)
    summary["always"] = {s: sum(r["two"] for r in rows if r["set"] == s) for s in SETS}
    summary["always"]["all"] = sum(r["two"] for r in rows)
    report = {"study": "second_place", "model_fingerprint": lm.fingerprint, "inputs": inputs,
              "environment": environment(), "questions": len(rows), "summary": summary, "rows": rows}
    Path(a.out).write_text(json.dumps(report, indent=1, sort_keys=True))
    for k, v in summary.items():
        print(k, v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
