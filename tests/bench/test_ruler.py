"""bench/ruler.py end to end on tiny-llama: rows for every system asked, budgets respected, and a recipe that
re-runs to the same hashes."""
from __future__ import annotations

import json

import pytest

from bench import ruler
from bench.lib.common import BM25_PAGES


@pytest.fixture(scope="module")
def report(tmp_path_factory, lm):  # noqa: ARG001  (lm: tiny-llama on one thread while these tests run)
    out = tmp_path_factory.mktemp("ruler") / "ruler.json"
    assert ruler.main(["--model", "tiny-llama", "--contexts", "1400", "--tasks", "passkey,multivalue", "--seeds", "1",
                       "--systems", "full,ws25,oracle25,ws25-lex,stream25", "--out", str(out)]) == 0
    return json.loads(out.read_text()), out


def test_rows_for_every_system_within_their_budgets(report):
    data, out = report
    systems = {(r["task"], r["system"]) for r in data["rows"]}
    assert {s for t, s in systems if t == "passkey"} == {"full", "ws25", "oracle25", "ws25-lex", "stream25"}
    full = {r["task"]: r for r in data["rows"] if r["system"] == "full"}
    for r in data["rows"]:
        assert r["input_sha256"] == full[r["task"]]["input_sha256"]
        if r["system"] != "full":
            assert r["pages_per_head"] < r["document_pages"] and r["device_bytes"] < full[r["task"]]["device_bytes"]
        if r["system"] == "oracle25":
            assert r["evidence_layers"] == r["layers"]  # the forced evidence is in every layer's working set
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| 1,400 | full |" in ruler.table(data["rows"])


def test_the_recipe_reruns_to_the_same_hashes(report, capsys):
    data, _ = report
    argv = data["recheck"]["argv"][3:]
    capsys.readouterr()
    assert ruler.main(argv) == 0
    rerun = json.loads(capsys.readouterr().out)
    assert rerun["outputs"] == data["recheck"]["outputs"] and len(rerun["outputs"]) == 4


@pytest.mark.parametrize("argv", [["--systems", "nope"], ["--tasks", "nope"], ["--seeds", "0"], ["--contexts", "100"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        ruler.main(["--out", "/dev/null", *argv])
    assert "error" in capsys.readouterr().err


def test_beyond_the_window_the_reading_the_stored_pages_and_the_baselines_answer(tmp_path, lm):  # noqa: ARG001
    out = tmp_path / "ruler.json"
    assert ruler.main(["--model", "tiny-llama", "--contexts", "16000", "--tasks", "passkey", "--seeds", "1",
                       "--systems", "qa,attend,truncation,bm25", "--out", str(out)]) == 0
    rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"qa", "attend", "truncation", "bm25"}
    assert rows["qa"]["position"] == rows["attend"]["position"] == "fixed"  # past tiny-llama's 8,192 tokens
    assert rows["qa"]["read_pages"] and rows["attend"]["evidence_retrieved"] is not None
    assert rows["qa"]["device_bytes"] == rows["attend"]["device_bytes"]  # one ingest, one working set
    assert len({r["input_sha256"] for r in rows.values()}) == 1
    evidence = set(rows["bm25"]["evidence_pages"])
    assert len(rows["bm25"]["pages"]) == BM25_PAGES
    assert rows["bm25"]["evidence_read"] == bool(evidence & set(rows["bm25"]["pages"]))
    # the needle sits at depth 0.25: the document's last 8K tokens (less the question) do not reach it
    assert rows["truncation"]["evidence_read"] is False
    assert "| 16,000 | qa |" in ruler.table(list(rows.values()))


def test_own_position_systems_are_refused_beyond_the_window(tmp_path, capsys, lm):  # noqa: ARG001
    with pytest.raises(SystemExit):
        ruler.main(["--model", "tiny-llama", "--contexts", "9000", "--tasks", "passkey", "--seeds", "1",
                    "--systems", "qa,ws25", "--out", str(tmp_path / "r.json")])
    assert "attend at own positions" in capsys.readouterr().err and not (tmp_path / "r.json").exists()
