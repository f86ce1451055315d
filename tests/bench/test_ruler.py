"""bench/ruler.py end to end on tiny-llama: rows for every system asked, budgets respected, and a recipe that
re-runs to the same hashes."""
from __future__ import annotations

import json

import pytest

from bench import ruler


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
