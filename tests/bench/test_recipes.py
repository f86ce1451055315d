"""Benchmark reports carry a `tieredkv recheck` recipe that replays.

memory_vs_context on tiny-llama: the report is made by one process and its recipe re-run by another, as a
reader would; a tampered output, input or relation fails the recheck; a recipe added to a report made
without one (bench.tools.add_recipe) says so and reproduces the report's own hashes, in a report of one run
or in one run of a report of runs. Every run of the committed reports that back a number carries a recipe.
store_lifecycle and page_search on tiny-llama (small runs): a full run's recipe replays in another process;
digest's methods are checked against their references.
"""
from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bench import digest, memory_vs_context
from bench.lib.report import recipe_argv
from bench.tools.add_recipe import add_recipe
from tieredkv.provenance.recheck import load_report, plan_for, recheck, recheck_runs, run_subprocess
from tieredkv.provenance.report_runs import runs_of

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
# 6,144 tokens (48 pages): more than the working set holds (33 pages), so decode searches the page index
ARGS = ["--model", "tiny-llama", "--contexts", "8192,6144", "--decode-tokens", "3", "--no-plain", "--threads", "1",
        "--ref-contexts", "6144"]
AMD = "AuthenticAMD AMD EPYC 7B13 64-Core Processor"
RESULTS = REPO / "bench" / "results"
# reports whose recipe bench.tools.add_recipe added, by the benchmark that makes them
ADDED = ["model_load.json", "store_lifecycle.json"]
# the committed reports of named runs, and their runs
RUNS = {"longdoc_qa.json": ["window", "16k", "32k", "128k", "news", "sotu"],
        "memory_vs_context.json": ["tiny-llama", "smollm2-131k-fixed", "smollm2-131k-own"],
        "passkey.json": ["filler", "prose"]}
REPORTS = ["graft_vs_recompute.json", "restore_ceiling.json", "fault_suite.json", "remote_tier.json",
           "library_demo.json", "digest.json", "ruler.json", "page_search.json", "ask_session.json", *ADDED,
           *RUNS]
# (report, run): every run of every committed report ("": a report of one run)
COMMITTED = [(name, run) for name in REPORTS for run in RUNS.get(name, [""])]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(report path, report, `tieredkv recheck`'s result on it, what the recipe printed in its own process)."""
    out = tmp_path_factory.mktemp("mvc") / "memory_vs_context.json"
    proc = subprocess.run([sys.executable, "-m", "bench.memory_vs_context", *ARGS, "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = []

    def run(argv, cwd):  # the recipe in a process of its own, as `tieredkv recheck` runs it (from this repository:
        printed.append(run_subprocess(argv, REPO))  # the report's directory is not in one)
        return printed[-1]

    result = recheck(out, runner=run)  # the report's one run, "tiny-llama"
    return out, json.loads(out.read_text())["runs"]["tiny-llama"], result, printed[0]


def _write(tmp_path, report, name="report.json"):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return path


def _rerun_of(printed):
    return lambda argv, cwd: copy.deepcopy(printed)  # the process's output, as the first test got it


def test_a_full_run_writes_a_recipe_that_replays_in_another_process(made):
    _, report, result, _ = made
    block = report["recheck"]
    # the smallest context alone, without the timing reference, on the run's thread count
    assert block["argv"][:3] == ["python", "-m", "bench.memory_vs_context"]
    assert block["argv"][block["argv"].index("--contexts") + 1] == "6144" and "--ref-contexts" not in block["argv"]
    assert block["argv"][block["argv"].index("--threads") + 1] == "1" and block["argv"][-1] == "--recheck-only"
    row = next(r for r in report["rows"] if r["context_tokens"] == 6144)
    assert block["outputs"]["tiered 6144 output ids"] == row["output_ids_sha256"]
    assert block["outputs"]["tiered 6144 token ids"] == row["input_sha256"]
    assert block["inputs"] == ["tiered 6144 token ids"]
    assert block["relations"] == {"tiered 6144 page search = flat scan": True}
    assert result.ok and result.mode == "hash", result.to_dict()
    assert result.count("hash") == (3, 3) and result.count("relation") == (1, 1)


@pytest.mark.parametrize("name", ["tiered 6144 output ids", "tiered 6144 device bytes", "tiered 6144 token ids"])
def test_a_tampered_hash_fails(made, tmp_path, name):
    _, report, _, printed = made
    assert recheck(_write(tmp_path, report), runner=_rerun_of(printed)).ok
    tampered = copy.deepcopy(report)
    tampered["recheck"]["outputs"][name] = "0" * 64
    result = recheck(_write(tmp_path, tampered), runner=_rerun_of(printed))
    assert not result.ok and [i["name"] for i in result.items if i["ok"] is False] == [name]


def test_on_another_machine_inputs_and_relations_still_decide(made, tmp_path):
    _, report, _, printed = made
    moved = copy.deepcopy(report)
    moved["recheck"]["domain"] = dict(moved["recheck"]["domain"], cpu=AMD)
    moved["recheck"]["outputs"]["tiered 6144 output ids"] = "1" * 64  # another machine's floats: not evidence
    result = recheck(_write(tmp_path, moved), runner=_rerun_of(printed))
    assert result.ok and result.mode == "relation"
    assert {i["name"]: i["check"] for i in result.items}["tiered 6144 output ids"] == "domain-specific"
    moved["recheck"]["outputs"]["tiered 6144 token ids"] = "2" * 64  # an input must be equal anywhere
    assert not recheck(_write(tmp_path, moved), runner=_rerun_of(printed)).ok
    broken = copy.deepcopy(printed)
    broken["relations"]["tiered 6144 page search = flat scan"] = False
    assert not recheck(_write(tmp_path, report), runner=_rerun_of(broken)).ok


def test_a_recipe_added_later_says_so_and_names_the_rows_it_reproduced(made, tmp_path):
    _, report, _, printed = made
    older = {k: v for k, v in report.items() if k != "recheck"}
    older["rows"] = copy.deepcopy(older["rows"])
    path = _write(tmp_path, older, "memory_vs_context.older.json")
    block = add_recipe(path, runner=_rerun_of(printed))
    assert "the report's other rows predate it" in block["recipe_added"]
    assert block["report_hashes_reproduced"] == sorted(printed["outputs"]) and block["report_hashes_differ"] == []
    assert json.loads(path.read_text())["recheck"] == block
    assert recheck(path, runner=_rerun_of(printed)).ok
    with pytest.raises(SystemExit, match="already carries"):
        add_recipe(path, runner=_rerun_of(printed))
    next(r for r in older["rows"] if r["context_tokens"] == 6144)["output_ids_sha256"] = "3" * 64
    path = _write(tmp_path, older, "memory_vs_context.other.json")
    assert add_recipe(path, runner=_rerun_of(printed))["report_hashes_differ"] == ["tiered 6144 output ids"]


def test_adding_a_recipe_changes_nothing_else_in_the_report(made, tmp_path):
    _, report, _, printed = made
    older = {k: v for k, v in report.items() if k != "recheck"}
    older["groups"] = {"4": 0.8, "8": 0.99, "16": 1.0}  # nested keys in a written order, not sorted as strings
    text = json.dumps(dict(sorted(older.items())), indent=1) + "\n"
    path = tmp_path / "memory_vs_context.order.json"
    path.write_text(text)
    add_recipe(path, runner=_rerun_of(printed))
    now = json.loads(path.read_text())
    assert list(now) == sorted(now) and list(now["groups"]) == ["4", "8", "16"]
    del now["recheck"]
    assert json.dumps(now, indent=1) + "\n" == text


def test_recipe_argv_gives_back_the_run_s_arguments():
    ap = memory_vs_context.parser()
    values = vars(ap.parse_args([*ARGS, "--position", "fixed", "--rate-window", "256", "--out", "x.json"]))
    argv = recipe_argv(ap, values, drop=("out", "ref_contexts"), contexts="6144")
    again = vars(ap.parse_args(argv))
    assert again == {**values, "out": "bench/results/memory_vs_context.json", "ref_contexts": "", "contexts": "6144"}


def test_a_recipe_goes_into_one_run_of_a_report_of_runs(made, tmp_path):
    _, report, _, printed = made
    older = {k: v for k, v in report.items() if k != "recheck"}
    path = tmp_path / "memory_vs_context.json"
    path.write_text(json.dumps({"bench": "memory_vs_context", "runs": {"kept": report, "older": older}}, indent=1))
    kept = json.dumps(report, indent=1).replace("\n", "\n  ")
    with pytest.raises(SystemExit, match="holds the runs kept, older; name one with --run"):
        add_recipe(path, runner=_rerun_of(printed))
    with pytest.raises(SystemExit, match="no run 'gone'"):
        add_recipe(path, run="gone", runner=_rerun_of(printed))
    block = add_recipe(path, run="older", runner=_rerun_of(printed))
    assert block["report_hashes_reproduced"] == sorted(printed["outputs"])
    now = json.loads(path.read_text())
    assert list(now["runs"]) == ["kept", "older"] and now["runs"]["older"]["recheck"] == block
    assert kept in path.read_text()  # the other run, byte for byte
    assert all(r.ok for r in recheck_runs(path, runner=_rerun_of(printed)).values())


def test_every_report_in_bench_results_is_checked_for_a_recipe():
    """A report added to bench/results/ without a recipe fails here (verify.json is `tieredkv verify`'s own
    output: its spec fields are its recipe, which `tieredkv recheck` replays)."""
    on_disk = {p.name for p in RESULTS.glob("*.json")}
    assert on_disk - {"verify.json"} == set(REPORTS)
    assert plan_for(load_report(RESULTS / "verify.json")).kind != "recheck"
    for name, runs in RUNS.items():
        assert list(runs_of(load_report(RESULTS / name))) == runs, name


@pytest.mark.parametrize("name, run", COMMITTED)
def test_committed_reports_carry_a_recipe(name, run):
    """Every run of a committed report: a `--recheck-only` recipe that writes nothing (no --out, no path under
    bench/results), its hashes, and what an added recipe reproduced."""
    report = runs_of(load_report(RESULTS / name))[run]
    plan = plan_for(report)  # raises if there is none
    assert plan.kind == "recheck" and plan.argv[:2] == ["python", "-m"] and "--recheck-only" in plan.argv
    assert plan.argv[2] == f"bench.{name.split('.')[0]}"
    assert "--out" not in plan.argv and not [a for a in plan.argv if "bench/results" in a]
    assert plan.outputs and all(len(h) == 64 for h in plan.outputs.values())
    assert set(plan.inputs) <= set(plan.outputs)
    block = report["recheck"]
    if "recipe_added" in block:  # added after the report: its own domain, and what it reproduced of the rows
        assert isinstance(block["domain"], dict) and "report_hashes_reproduced" in block


@pytest.mark.parametrize("name", ADDED)
def test_an_added_recipe_is_the_benchmark_s_and_names_what_it_reproduced(name):
    """The block holds the argv recipe_for_report gives (one torch thread), and its reproduced / differ lists
    are exactly the report's own hashes (report_hashes) that the recipe's outputs equal / do not equal."""
    report = load_report(RESULTS / name)
    module = importlib.import_module(f"bench.{name.split('.')[0]}")
    block = report["recheck"]
    assert block["argv"] == ["python", "-m", f"bench.{name.split('.')[0]}", *module.recipe_for_report(report, 1)]
    own = module.report_hashes(report)
    shared = {n for n in own if n in block["outputs"]}
    assert shared and set(block["inputs"]) <= shared
    assert set(block["report_hashes_reproduced"]) == {n for n in shared if block["outputs"][n] == own[n]}
    assert set(block["report_hashes_differ"]) == shared - set(block["report_hashes_reproduced"])
    assert block["relations"] and all(block["relations"].values())


@pytest.mark.parametrize("module, args, relations", [
    ("store_lifecycle", ["--shared", "2", "--own", "2", "--page-size", "16"], 5),
    # 64 and 128 pages (tiled 2x): below FLAT_SCAN_BELOW, so this checks the recipe, not the candidate pass
    ("page_search", ["--context", "8192", "--steps", "2", "--groups", "4", "--tile", "1,2", "--repeats", "1"], 2),
])
def test_a_small_run_s_recipe_replays_in_another_process(tmp_path, module, args, relations):
    out = tmp_path / f"{module}.json"
    proc = subprocess.run([sys.executable, "-m", f"bench.{module}", *args, "--threads", "1", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    block = report["recheck"]
    assert block["argv"][:3] == ["python", "-m", f"bench.{module}"] and block["argv"][-1] == "--recheck-only"
    assert "--out" not in block["argv"] and "--repeats" not in block["argv"]
    result = recheck(out, runner=lambda argv, cwd: run_subprocess(argv, REPO))
    assert result.ok and result.mode == "hash", result.to_dict()
    assert result.count("relation") == (relations, relations)
    assert result.count("hash") == (len(block["outputs"]), len(block["outputs"]))


def test_digest_methods_give_their_references_output():
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, 1 << 16, dtype=np.uint8).tobytes() for _ in range(3)]
    inputs = {"token_ids_sha256": "t", "root_sha256": "r", "num_tokens": 3, "page_size": 1, "num_pages": 3,
              "page_nbytes": 1 << 16, "nbytes": 3 << 16,
              "payloads_sha256": hashlib.sha256(b"".join(payloads)).hexdigest()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = digest.method_outputs(digest.methods(payloads, pool))
    hashes, names, relations = digest.recipe_hashes(inputs, outputs)
    assert outputs["sha256"] == hashlib.sha256("".join(hashlib.sha256(p).hexdigest() for p in payloads)
                                               .encode()).hexdigest()
    assert len(relations) == len(outputs) - 2 and all(relations.values())  # all but sha256 and blake3 themselves
    assert names == ["page count and sizes", "root page key", "token ids"]
    assert hashes["page payloads"] == inputs["payloads_sha256"] == outputs["memcpy_pool"]
    outputs["blake3_pool"] = outputs["sha256"]  # a method that gave another digest
    assert [n for n, ok in digest.recipe_hashes(inputs, outputs)[2].items() if not ok] == ["blake3_pool = blake3"]
