"""bench/longdoc_qa.py's report of runs: the run a run writes by default, `--render` combining runs into one table
and figure, and the budget table read from the run that holds its rows (no model loaded)."""
from __future__ import annotations

import pytest

from bench import longdoc_qa
from bench.lib.report import write_run
from bench.longdoc import budget


def _args(*argv: str):
    return longdoc_qa.checked_args(longdoc_qa.parser(), list(argv))


@pytest.mark.parametrize("argv, run", [
    (["--lengths", "32k"], "32k"),
    (["--lengths", "4k,8k"], "window"),
    (["--lengths", "8k"], "window"),
    (["--lengths", "16k,32k"], "16k-32k"),
    (["--set", "news", "--lengths", "8k,32k"], "news"),
    (["--lengths", "32k", "--run", "mine"], "mine"),
])
def test_the_run_a_run_writes(argv, run):
    assert _args(*argv).run == run


def _row(length: str, qid: str, system: str, correct: bool) -> dict:
    return {"length": length, "window": f"{length}-w0", "id": qid, "system": system, "depth": 0.5,
            "correct": correct, "seconds": 1.0}


def test_render_combines_the_runs_named(tmp_path, capsys):
    out = tmp_path / "longdoc_qa.json"
    for length in ("16k", "32k"):
        rows = [_row(length, "q01", "tiered", True), _row(length, "q01", "bm25", length == "16k")]
        write_run(out, "longdoc_qa", length, {"model": "smollm2", "rows": rows})
    write_run(out, "longdoc_qa", "news", {"model": "smollm2", "rows": [_row("8k", "n01", "tiered", False)]})
    assert longdoc_qa.main(["--out", str(out), "--render", "16k,32k"]) == 0
    text = capsys.readouterr().out
    assert "| system | 16k | 32k |" in text and "| tiered | 1/1 | 1/1 |" in text and "| bm25 | 1/1 | 0/1 |" in text
    assert out.with_suffix(".png").stat().st_size > 0
    assert longdoc_qa.main(["--out", str(out), "--render", "news", "--plot", str(tmp_path / "news.png")]) == 0
    assert (tmp_path / "news.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="has no run 64k"):
        longdoc_qa.main(["--out", str(out), "--render", "16k,64k"])


def test_the_budget_table_reads_the_window_run(tmp_path, capsys):
    out = tmp_path / "longdoc_qa.json"
    write_run(out, "longdoc_qa", "window", {"config": {"page_size": 128}, "rows": []})
    assert budget.main([str(out)]) == 0
    with pytest.raises(SystemExit, match="has no run 'news'"):
        budget.main([str(out), "--run", "news"])


def test_the_budget_table_over_every_question_keeps_only_the_systems_that_answered_them_all(tmp_path, capsys):
    def row(system, qid, correct, **extra):
        return {"length": "8k", "system": system, "id": qid, "correct": correct, **extra}
    budget_row = {"pages_per_head": 16, "document_pages": 64, "evidence_layers": 30, "layers": 30,
                  "decode_ms_per_token": 50.0}
    rows = [row("full", "q1", True), row("full", "q2", False),
            row("ws25-lex", "q1", True, **budget_row), row("ws25-lex", "q2", True, **budget_row),
            row("ws12", "q1", False, **{**budget_row, "pages_per_head": 8})]  # one question only
    chosen, ids = budget.budget_rows(rows, "8k")
    assert ids == {"q1"} and {r["system"] for r in chosen} == {"full", "ws25-lex", "ws12"}
    chosen, ids = budget.budget_rows(rows, "8k", whole=True)
    assert ids == {"q1", "q2"} and {r["system"] for r in chosen} == {"full", "ws25-lex"}
    out = tmp_path / "longdoc_qa.json"
    write_run(out, "longdoc_qa", "window", {"config": {"page_size": 128}, "rows": rows})
    assert budget.main([str(out), "--whole", "--plot", str(tmp_path / "b.png"), "--plot-lengths", "8k"]) == 0
    text = capsys.readouterr().out
    assert "| ws25-lex | 2/2 | 25% |" in text and "ws12" not in text and "| full | 1/2 | 100% |" in text
    assert (tmp_path / "b.png").stat().st_size > 0


def test_labels_of_points_at_about_one_share_do_not_overlap():
    points = [(0.25, 0.0), (0.26, 0.01), (0.25, 0.2), (0.125, 0.01), (0.25, 0.0)]
    assert budget.label_heights(points, gap=0.02) == [0.0, 0.04, 0.2, 0.01, 0.02]


def test_the_plain_models_decode_time_stands_beside_the_budgets_only_where_every_row_was_timed():
    def row(system, qid, **extra):
        return {"length": "8k", "system": system, "id": qid, "correct": False, **extra}
    budget_row = {"pages_per_head": 16, "document_pages": 64, "evidence_layers": 3, "layers": 30}
    rows = [row("full", "q1", decode_ms_per_token=40.0), row("full", "q2", decode_ms_per_token=60.0),
            row("ws25", "q1", **budget_row, decode_ms_per_token=30.0),
            row("ws25", "q2", **budget_row, decode_ms_per_token=50.0)]
    _, summary = budget.summaries(rows, "8k", 128)
    assert {d["system"]: d.get("decode_ms") for d in summary} == {"full": 60.0, "ws25": 50.0}
    del rows[1]["decode_ms_per_token"]  # a row of an earlier run, untimed: no median of the others
    _, summary = budget.summaries(rows, "8k", 128)
    assert {d["system"]: d.get("decode_ms") for d in summary} == {"full": None, "ws25": 50.0}


def test_a_label_is_raised_where_its_text_would_run_into_a_neighbours_to_its_right():
    # 19% and 25% are 0.4 octaves apart: within a label's run, so the second is raised; 6% and 100% are not
    assert budget.label_heights([(0.19, 0.08), (0.25, 0.08)], gap=0.02, span=1.2) == [0.08, 0.1]
    assert budget.label_heights([(0.19, 0.08), (0.25, 0.08)], gap=0.02, span=0.3) == [0.08, 0.08]
    assert budget.label_heights([(0.0625, 0.3), (1.0, 0.3)], gap=0.02, span=1.2) == [0.3, 0.3]
