"""Add a `tieredkv recheck` recipe to a report made before its benchmark wrote one.

    python -m bench.tools.add_recipe bench/results/graft_vs_recompute.json
    python -m bench.tools.add_recipe bench/results/longdoc_qa.json --run 32k   # one run of a report of runs

Runs the benchmark's `--recheck-only` subset now, with the arguments the report records and one torch
thread, and writes what it printed into the report's "recheck" block: the argv, its hashes, its own
determinism domain, and "recipe_added" (the date and the machine: the report's other rows predate the
recipe). Where the report's own rows hold a hash of the same computation, the block lists which the
re-run reproduced ("report_hashes_reproduced") and which it did not ("report_hashes_differ": another
machine, thread count or code version made the rows). Nothing else in the report changes (in a report of
named runs, nothing but that run's block).

A benchmark supports this with `recipe_for_report(report, threads) -> args` and `report_hashes(report)
-> {output name: sha256}`; a full run writes its block itself.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from bench.lib.report import environment, recheck_block
from safefiles import AtomicFile
from tieredkv.provenance.recheck import repo_root, run_subprocess
from tieredkv.provenance.report_runs import RUNS, is_report_of_runs

BENCHMARKS = ("passkey", "memory_vs_context", "graft_vs_recompute", "restore_ceiling", "fault_suite", "remote_tier",
              "longdoc_qa", "ask_session", "digest", "model_load", "page_search", "store_lifecycle")
MODULES = {"longdoc_qa": "longdoc.recipe"}  # where a benchmark keeps its recipe, when not in its own module


def benchmark_of(path: Path) -> str:
    name = path.name.split(".")[0]
    if name not in BENCHMARKS:
        raise SystemExit(f"{path}: not a report of {', '.join(BENCHMARKS)}")
    return name


def add_recipe(path: Path, *, run: str | None = None, threads: int = 1, force: bool = False,
               runner=run_subprocess) -> dict:
    """Run the report's recipe (`runner(argv, cwd)`: a subprocess) and write its block into the report (into
    run `run` of a report of named runs; None: its only run)."""
    text = path.read_text()
    whole = json.loads(text)
    report = _run_of(path, whole, run)
    if "recheck" in report and not force:
        raise SystemExit(f"{path} already carries a recheck block (--force replaces it)")
    name = benchmark_of(path)
    module = importlib.import_module(f"bench.{MODULES.get(name, name)}")
    args = module.recipe_for_report(report, threads)
    argv = ["python", "-m", f"bench.{name}", *args]
    print(f"# {path}: {' '.join(argv)}", file=sys.stderr)
    t0 = time.perf_counter()
    rerun = runner(argv, repo_root(path))
    seconds = time.perf_counter() - t0
    outputs = rerun["outputs"]
    own = module.report_hashes(report)
    shared = sorted(n for n in outputs if n in own)
    env = environment()
    note = (f"{time.strftime('%Y-%m-%d')}, the subset re-run on {env['cpu']} ({env['cores']} cores, {threads} torch "
            f"thread{'s' if threads != 1 else ''}, load {env['load_avg_1_5_15']}) in {seconds:.0f} s; the report's "
            "other rows predate it")
    report["recheck"] = recheck_block(
        f"bench.{name}", args, outputs, inputs=rerun.get("inputs", []), relations=rerun.get("relations", {}),
        domain=rerun["domain"], recipe_added=note,
        report_hashes_reproduced=[n for n in shared if outputs[n] == own[n]],
        report_hashes_differ=[n for n in shared if outputs[n] != own[n]])
    # the rest of the report as it was, key order included (a report's nested keys need not be sorted): the block
    # goes where a sorted write puts it, when the report's own keys are sorted
    block = json.loads(json.dumps(report.pop("recheck"), sort_keys=True))
    report["recheck"] = block
    if list(report)[:-1] == sorted(list(report)[:-1]):
        report = dict(sorted(report.items()))
    if is_report_of_runs(whole):
        whole[RUNS][run or next(iter(whole[RUNS]))] = report
    else:
        whole = report
    with AtomicFile(path) as f:
        f.write((json.dumps(whole, indent=1) + ("\n" if text.endswith("\n") else "")).encode())
    return block


def _run_of(path: Path, whole: dict, run: str | None) -> dict:
    """The report the recipe goes into: the whole file, or one run of a report of named runs."""
    if not is_report_of_runs(whole):
        if run is not None:
            raise SystemExit(f"{path} is the report of one run, without named runs; drop --run")
        return whole
    runs = whole[RUNS]
    if run is None and len(runs) != 1:
        raise SystemExit(f"{path} holds the runs {', '.join(runs)}; name one with --run")
    if run is not None and run not in runs:
        raise SystemExit(f"{path} has no run {run!r}; its runs: {', '.join(runs)}")
    return runs[run or next(iter(runs))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--run", help="the run of a report of named runs that gets the recipe (default: its only run)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the recipe (recorded in its domain)")
    ap.add_argument("--force", action="store_true", help="replace a recheck block the report already carries")
    a = ap.parse_args(argv)
    for path in a.reports:
        block = add_recipe(path, run=a.run, threads=a.threads, force=a.force)
        same, differ = len(block["report_hashes_reproduced"]), len(block["report_hashes_differ"])
        print(f"{path}: {len(block['outputs'])} hashes; {block['recipe_added']}; the report's own hashes "
              f"reproduced: {same}/{same + differ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
