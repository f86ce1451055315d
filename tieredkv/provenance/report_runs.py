"""Reports of named runs: one file per benchmark, each run a whole report of its own.

    {"bench": "longdoc_qa",
     "runs": {"window": {<a report: its rows, environment, domain and "recheck" block>},
              "news":   {...},
              "32k":    {...}}}

A run is exactly the report its run of the benchmark wrote: its rows, hashes and recipe are that report's,
and `tieredkv recheck` replays each run's recipe as it would that report's (`--run NAME`: one of them). The
file adds only the benchmark's name. A report without "runs" is a report of one run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from tieredkv.provenance.recheck_plan import RecheckError

RUNS = "runs"


class UnknownRunError(RecheckError):
    """The report holds no run of the name asked for."""


def is_report_of_runs(report: dict[str, Any]) -> bool:
    """A report of named runs (see the module docstring), rather than the report of one run."""
    return isinstance(report.get(RUNS), dict) and "recheck" not in report and "rows" not in report


def runs_of(report: dict[str, Any], path: str | Path = "the report") -> dict[str, dict[str, Any]]:
    """The runs by name, in the file's order; a report of one run is that run, named ""."""
    if not is_report_of_runs(report):
        return {"": report}
    runs = report[RUNS]
    bad = [str(name) for name, run in runs.items() if not name or not isinstance(run, dict)]
    if not runs or bad:
        raise RecheckError(f'{path}: "runs" must map each run name to its report ({", ".join(bad) or "none given"})'
                           "; see tieredkv/provenance/report_runs.py for the format")
    return dict(runs)


def select_runs(report: dict[str, Any], names: Iterable[str] | None,
                path: str | Path = "the report") -> dict[str, dict[str, Any]]:
    """The runs named (None: every run), in the order asked; an unknown name is an UnknownRunError."""
    runs = runs_of(report, path)
    if names is None:
        return runs
    names = list(names)
    if "" in runs:
        raise UnknownRunError(f"{path} is the report of one run, without named runs; re-check it without --run")
    unknown = [n for n in names if n not in runs]
    if unknown:
        raise UnknownRunError(f"{path} has no run {', '.join(map(repr, unknown))}; its runs: {', '.join(runs)}")
    return {n: runs[n] for n in names}
