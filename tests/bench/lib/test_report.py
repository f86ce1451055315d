"""bench/lib/report.py: a run written into a report of runs leaves the other runs byte for byte, resumes from
what it wrote, and two processes writing two runs at once both keep theirs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lib.report import read_run, recheck_block, recipe_with_domain, write_report, write_run
from tieredkv.provenance.report_runs import runs_of

REPO = Path(__file__).resolve().parents[3]


def test_a_run_is_written_sorted_and_the_other_runs_stay_byte_for_byte(tmp_path):
    path = tmp_path / "bench.json"
    older = {"rows": [1, 2], "groups": {"4": 0.8, "16": 1.0, "8": 0.9}, "a": 0.1}  # keys in a written order
    path.write_text(json.dumps({"bench": "b", "runs": {"old": older}}, indent=1) + "\n")
    before = json.dumps(older, indent=1)
    write_run(path, "b", "new", {"z": 1, "a": [3.25, None]})
    text = path.read_text()
    assert text.endswith("\n") and before.replace("\n", "\n  ") in text  # nested two levels deeper, unchanged
    report = json.loads(text)
    assert list(report) == ["bench", "runs"] and list(runs_of(report)) == ["old", "new"]
    assert list(report["runs"]["old"]["groups"]) == ["4", "16", "8"] and list(report["runs"]["new"]) == ["a", "z"]
    write_run(path, "b", "old", {"rows": [9]})  # replaced in place: the order of the runs stays
    assert list(runs_of(json.loads(path.read_text()))) == ["old", "new"]
    assert read_run(path, "b", "old") == {"rows": [9]} and read_run(path, "b", "gone") is None
    assert read_run(tmp_path / "none.json", "b", "old") is None
    assert not [p.name for p in tmp_path.iterdir() if p.name != "bench.json"]  # no temp or lock file left


def test_a_file_that_is_not_this_benchmark_s_report_of_runs_is_refused(tmp_path):
    single = tmp_path / "single.json"
    write_report(single, {"rows": []})
    with pytest.raises(SystemExit, match="not a report of b's runs"):
        write_run(single, "b", "x", {"rows": []})
    other = tmp_path / "other.json"
    write_run(other, "c", "x", {"rows": []})
    with pytest.raises(SystemExit, match="not a report of b's runs"):
        read_run(other, "b", "x")
    assert json.loads(single.read_text()) == {"rows": []}


def test_two_processes_writing_two_runs_at_once_keep_both(tmp_path):
    path = tmp_path / "bench.json"
    child = ("import sys; from bench.lib.report import write_run\n"
             "for i in range(40): write_run(sys.argv[1], 'b', sys.argv[2], {'i': i})")
    procs = [subprocess.Popen([sys.executable, "-c", child, str(path), name], cwd=REPO) for name in ("x", "y")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert json.loads(path.read_text())["runs"] == {"x": {"i": 39}, "y": {"i": 39}}  # in either order


def test_a_recipe_keeps_the_domain_its_rows_were_made_in_across_a_resumed_run():
    amd, intel = {"cpu": "AMD EPYC", "num_threads": 2}, {"cpu": "Intel Xeon", "num_threads": 1}
    block = recheck_block("bench.x", ["--recheck-only"], {"a output": "11"})
    # the rows were made in an earlier run: its recipe's domain, else its report's, not the last writer's
    earlier = {"domain": intel, "recheck": {**block, "domain": amd}}
    assert recipe_with_domain(block, earlier, intel)["domain"] == amd
    assert recipe_with_domain(block, {"domain": amd, "recheck": block}, intel)["domain"] == amd
    # this run made them (other outputs), or there is no earlier report: this run's domain
    assert recipe_with_domain({**block, "outputs": {"a output": "22"}}, earlier, intel)["domain"] == intel
    assert recipe_with_domain(block, None, intel)["domain"] == intel
    assert recipe_with_domain(None, earlier, intel) is None
