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
