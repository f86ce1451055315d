"""The `tieredkv recheck` recipe of a `bench/longdoc_qa.py` report: a few of its rows re-run.

A whole report takes up to hours on 2 cores; the recipe re-runs the plain-model systems (`ceiling`,
`bm25`: no store, deterministic) on the report's first RECHECK_QUESTIONS questions of its first length,
and hashes what went in (the corpus, the questions file, each question's token ids), which must be
equal on any machine, and what came out (each row's output ids), equal in the same determinism domain.

    python -m bench.longdoc_qa --lengths 8k --questions q01,q02,q03 --systems ceiling,bm25 --recheck-only
"""
from __future__ import annotations

from bench.lib.report import print_recheck, recheck_block
from tieredkv.provenance.domain import determinism_domain

RECHECK_SYSTEMS = ("ceiling", "bm25")
RECHECK_QUESTIONS = 3


def _name(row: dict) -> str:
    return f"{row['length']} {row['id']} {row['system']}"


def hashed(rows: list[dict], info: dict) -> tuple[dict[str, str], list[str]]:
    """Output-id hashes of the rows by name, with the input hashes; and the names that hash inputs."""
    outputs = {"corpus": info["corpus_sha256"], "questions": info["questions_sha256"]}
    for r in rows:
        outputs[f"{_name(r)} output_ids"] = r["output_ids_sha256"]
        outputs[f"{r['length']} {r['id']} question_ids"] = r["question_ids_sha256"]
    return outputs, sorted(n for n in outputs if n in ("corpus", "questions") or n.endswith("question_ids"))


def recipe_rows(rows: list[dict]) -> list[dict]:
    """The rows a recipe re-runs: RECHECK_SYSTEMS on the first questions of the first length."""
    if not rows:
        return []
    length = rows[0]["length"]
    ids = list(dict.fromkeys(r["id"] for r in rows if r["length"] == length))[:RECHECK_QUESTIONS]
    return [r for r in rows if r["length"] == length and r["id"] in ids and r["system"] in RECHECK_SYSTEMS]


def _args(chosen: list[dict], question_set: str) -> list[str]:
    return ["--set", question_set, "--lengths", chosen[0]["length"], "--questions",
            ",".join(dict.fromkeys(r["id"] for r in chosen)),
            "--systems", ",".join(s for s in RECHECK_SYSTEMS if any(r["system"] == s for r in chosen)),
            "--recheck-only"]


def block(rows: list[dict], info: dict, question_set: str) -> dict | None:
    """The report's recheck block (None while no row of RECHECK_SYSTEMS is in it)."""
    chosen = recipe_rows(rows)
    if not chosen:
        return None
    outputs, inputs = hashed(chosen, info)
    return recheck_block("bench.longdoc_qa", _args(chosen, question_set), outputs, inputs=inputs)


# `python -m bench.tools.add_recipe` on a report made before longdoc_qa wrote a recipe
def recipe_for_report(report: dict, threads: int) -> list[str]:
    chosen = recipe_rows(report["rows"])
    if not chosen:
        raise SystemExit("the report has no ceiling or bm25 row to re-run")
    return [*_args(chosen, report["inputs"].get("question_set", "longdoc")), "--threads", str(threads)]


def report_hashes(report: dict) -> dict[str, str]:
    return hashed(recipe_rows(report["rows"]), report["inputs"])[0]


def domain(lm, page_size: int) -> dict:
    return determinism_domain(lm.model, lm.fingerprint, page_size)


def print_rerun(lm, rows: list[dict], info: dict, page_size: int) -> None:
    """What `--recheck-only` prints: the re-run's hashes and its determinism domain."""
    outputs, inputs = hashed(rows, info)
    print_recheck(outputs, domain(lm, page_size), inputs)
