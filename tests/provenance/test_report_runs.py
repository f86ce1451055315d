"""Reports of named runs (tieredkv/provenance/report_runs.py): `tieredkv recheck` replays every run's recipe, or
the one `--run` names; each run holds or fails by itself; an unknown run name is one typed line."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tieredkv.provenance.recheck import RecheckError, UnknownRunError, recheck, recheck_runs
from tieredkv.provenance.report_runs import runs_of, select_runs

DOMAIN = {"cpu": "a test CPU", "fingerprint": "f" * 16, "torch": "0.0"}


def _run(answer: str, *, relation: bool = True) -> dict:
    """A run's report whose recipe is a `python -c` that prints what a benchmark's --recheck-only prints."""
    printed = {"outputs": {"answer": answer, "question": "q" * 64}, "domain": DOMAIN, "inputs": ["question"],
               "relations": {"graft equals fresh": relation}}
    return {"domain": DOMAIN, "rows": [{"answer": answer}],
            "recheck": {"argv": ["python", "-c", f"print({json.dumps(printed)!r})"],
                        "outputs": {"answer": "a" * 64, "question": "q" * 64}, "inputs": ["question"]}}


def _report_of_runs(tmp_path, **runs) -> str:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"bench": "bench", "runs": runs}, indent=1))
    return str(path)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tieredkv.cli", "recheck", *args], capture_output=True, text=True,
                          timeout=120)


def test_every_run_is_rechecked_by_its_own_recipe(tmp_path):
    path = _report_of_runs(tmp_path, short=_run("a" * 64), long=_run("a" * 64))
    results = recheck_runs(path)
    assert list(results) == ["short", "long"] and all(r.ok and r.mode == "hash" for r in results.values())
    assert [r.run for r in results.values()] == ["short", "long"]
    assert results["long"].count("hash") == (2, 2) and results["long"].count("relation") == (1, 1)
    assert recheck(path, run="long").ok and recheck(path, run="long").to_dict()["run"] == "long"


def test_a_tampered_run_fails_and_the_others_still_hold(tmp_path):
    tampered = _run("a" * 64)
    tampered["recheck"]["outputs"]["answer"] = "0" * 64
    path = _report_of_runs(tmp_path, held=_run("a" * 64), tampered=tampered, broken=_run("a" * 64, relation=False))
    results = recheck_runs(path)
    assert {name: r.ok for name, r in results.items()} == {"held": True, "tampered": False, "broken": False}
    assert [i["name"] for i in results["tampered"].items if i["ok"] is False] == ["answer"]
    assert [i["name"] for i in results["broken"].items if i["ok"] is False] == ["graft equals fresh"]
    proc = _cli(path)
    assert proc.returncode == 1 and "## run held:" in proc.stdout and "## run tampered:" in proc.stdout
    assert "RUNS: 1/3 hold (not: tampered, broken)" in proc.stdout
    assert _cli(path, "--run", "held").returncode == 0
    proc = _cli(path, "--run", "tampered", "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and not data["ok"] and list(data["runs"]) == ["tampered"]
    assert data["runs"]["tampered"]["run"] == "tampered"


def test_an_unknown_run_is_one_typed_line_that_lists_the_runs(tmp_path):
    path = _report_of_runs(tmp_path, window=_run("a" * 64), news=_run("a" * 64))
    with pytest.raises(UnknownRunError, match="no run '64k'; its runs: window, news"):
        recheck_runs(path, runs=["64k"])
    with pytest.raises(UnknownRunError):
        recheck(path, run="64k")
    with pytest.raises(RecheckError, match="holds 2 runs"):
        recheck(path)  # one Result asked of several runs
    proc = _cli(path, "--run", "64k")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"tieredkv: error: UnknownRunError: {path} has no run '64k'; its runs: window, news"]
    single = tmp_path / "single.json"
    single.write_text(json.dumps(_run("a" * 64)))
    with pytest.raises(UnknownRunError, match="report of one run"):
        recheck_runs(single, runs=["window"])
    assert recheck(single).ok and recheck(single).run == "" and "run" not in recheck(single).to_dict()


def test_a_failing_recipe_names_its_run(tmp_path):
    failing = _run("a" * 64)
    failing["recheck"]["argv"] = ["python", "-c", "raise SystemExit('no such benchmark')"]
    path = _report_of_runs(tmp_path, good=_run("a" * 64), failing=failing)
    with pytest.raises(RecheckError, match=r"^run 'failing' of .*bench.json: the re-run .* exited 1"):
        recheck_runs(path)


def test_runs_of_reads_a_report_of_one_run_as_one_run():
    one = _run("a" * 64)
    assert runs_of(one) == {"": one}
    assert select_runs({"bench": "b", "runs": {"x": one, "y": one}}, ["y", "x"]) == {"y": one, "x": one}
    with pytest.raises(RecheckError, match='"runs" must map'):
        runs_of({"bench": "b", "runs": {"x": [1]}})
    with pytest.raises(RecheckError, match="none given"):
        runs_of({"bench": "b", "runs": {}})
    report_with_a_runs_field = copy.deepcopy(one)
    report_with_a_runs_field["runs"] = {"x": {}}  # a report's own field named "runs": still one run
    assert runs_of(report_with_a_runs_field) == {"": report_with_a_runs_field}
