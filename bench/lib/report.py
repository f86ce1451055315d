"""What every benchmark report carries: environment, hashes, a recheck recipe, and an atomic JSON write.

A benchmark with one current report writes it whole (`write_report`); one whose report holds named runs
(tieredkv/provenance/report_runs.py: `{"bench": ..., "runs": {name: report}}`) writes one run of it
(`write_run`) and resumes from one (`read_run`).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import psutil
import torch
import transformers

from safefiles import AtomicFile
from tieredkv.provenance.domain import sha256_ids  # noqa: F401  (re-exported for the benchmarks)
from tieredkv.provenance.report_runs import RUNS, is_report_of_runs


def environment() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    env = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "ram_bytes": psutil.virtual_memory().total, "python": sys.version.split()[0],
           "torch": torch.__version__, "transformers": transformers.__version__, "machine": platform.machine(),
           "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           # the machine is shared: the load when the report was written says how noisy its times are
           "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
           # glibc's memcpy tuning (e.g. its non-temporal threshold) moves copy-bound figures: record it
           "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}
    return env


def write_report(path: str | os.PathLike, report: dict[str, Any], *, print_json: bool = False) -> None:
    """Write `report` as sorted JSON, atomically (safefiles.AtomicFile), and echo it to stdout when asked."""
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    _write_text(Path(path), text)
    if print_json:
        print(text)


def write_run(path: str | os.PathLike, bench: str, run: str, report: dict[str, Any], *,
              print_json: bool = False) -> None:
    """Write `report` (sorted, as `write_report` writes a report) as run `run` of the report of runs at `path`,
    keeping its other runs as they are, byte for byte; a new run goes last. Atomic, and under a lock on the
    folder, so that runs written at once by two processes both stay."""
    path = Path(path)
    text = json.dumps(report, sort_keys=True, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _folder_lock(path.parent):
        runs = _runs_at(path, bench)
        runs[run] = json.loads(text)
        _write_text(path, json.dumps({"bench": bench, RUNS: runs}, indent=1))
    if print_json:
        print(json.dumps(runs[run], indent=1))


def read_run(path: str | os.PathLike, bench: str, run: str) -> dict[str, Any] | None:
    """Run `run` of the report of runs at `path` (None: no such file or run), to resume it."""
    return _runs_at(Path(path), bench).get(run)


def _runs_at(path: Path, bench: str) -> dict[str, Any]:
    if not path.exists():
        return {}
    report = json.loads(path.read_text())
    if not is_report_of_runs(report) or report.get("bench") != bench:
        raise SystemExit(f"{path} is not a report of {bench}'s runs ({{\"bench\": \"{bench}\", \"runs\": ...}}); "
                         "give --out a new file or one this benchmark wrote")
    return report[RUNS]


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as f:
        f.write((text + "\n").encode())


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (no lock file left beside the reports)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def recheck_block(module: str, args: list[str], outputs: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The recipe `tieredkv recheck` replays (tieredkv/provenance/recheck.py): `python -m <module> <args>` must
    print one JSON object with these `outputs` names and its own `domain`; `extra` adds `inputs`/`relations`."""
    return {"argv": ["python", "-m", module, *args], "outputs": outputs, **extra}


def recipe_with_domain(block: dict[str, Any] | None, earlier: dict[str, Any] | None,
                       current: dict[str, Any]) -> dict[str, Any] | None:
    """`block` with the determinism domain its rows were made in (`tieredkv recheck` reads a block's own domain
    before the report's). A resumed run that kept the recipe's rows (the same outputs as `earlier`'s recipe)
    keeps the domain `earlier` recorded for them; else the rows are this run's, made in `current`. NOTE: a
    report's top-level domain is its last writer's, which need not be the one the recipe's rows came from."""
    if block is None:
        return None
    earlier = earlier or {}
    before = earlier.get("recheck") or {}
    kept = (before.get("domain") or earlier.get("domain")) if before.get("outputs") == block["outputs"] else None
    return {**block, "domain": kept or current}


def sha256_json(value: Any) -> str:
    """SHA-256 of `value` as sorted, compact JSON: a hash of counts and outcomes for a recheck block."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recipe_argv(parser: argparse.ArgumentParser, values: dict[str, Any], *, drop: Iterable[str] = (),
                **overrides: Any) -> list[str]:
    """The command-line options that give `values` (a run's vars(), as its report records them) under `parser`:
    every option whose value differs from its default, `overrides` first, the dests in `drop` left out (where a
    run writes, what it prints). An older report lacks the options added since: they take their defaults."""
    values, drop = {**values, **overrides}, set(drop)
    argv = []
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest == "help" or dest in drop or dest not in values:
            continue
        value = values[dest]
        if value is None or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def print_recheck(outputs: dict[str, str], domain: dict[str, Any], inputs: Iterable[str] = (),
                  relations: dict[str, bool] | None = None) -> None:
    """What a `--recheck-only` run prints for `tieredkv recheck`: one JSON object on stdout."""
    print(json.dumps({"outputs": outputs, "domain": domain, "inputs": sorted(inputs), "relations": relations or {}},
                     sort_keys=True))
