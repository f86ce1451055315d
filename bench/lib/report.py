"""What every benchmark report carries: environment, hashes, and an atomic JSON write."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable

import psutil
import torch
import transformers

from tieredkv.provenance.domain import sha256_ids  # noqa: F401  (re-exported for the benchmarks)


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
    """Write `report` as sorted JSON (temp, fsync, rename), and echo it to stdout when asked."""
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if print_json:
        print(text)


def recheck_block(module: str, args: list[str], outputs: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The recipe `tieredkv recheck` replays (tieredkv/provenance/recheck.py): `python -m <module> <args>` must
    print one JSON object with these `outputs` names and its own `domain`; `extra` adds `inputs`/`relations`."""
    return {"argv": ["python", "-m", module, *args], "outputs": outputs, **extra}


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
