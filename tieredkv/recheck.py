"""`recheck`: re-run what a report says produced its hashes, and compare them, so a reader can re-check
any number. A report is a pre-registration: on a machine in the same determinism domain the re-run
must give the committed output hashes byte for byte. Timings are never compared.

The convention (any benchmark can follow it):

    "domain":  {...}                                  determinism_domain() of the run
    "recheck": {"argv": ["python", "bench/x.py", "--recheck-only", ...],
                "outputs": {"<name>": "<sha256>", ...}}

`argv` re-runs a deterministic sub-computation; it prints one JSON object with the same `outputs`
names and its own `domain`. argv[0] "tieredkv" runs this package's CLI and "python" this
interpreter; relative paths are resolved from the repository that holds the report.
`tieredkv verify --json --rows` reports need no block: their spec fields give the argv, and every
row's input, fresh-logits and grafted-logits hashes are compared.

Exit status of the CLI: 0 every hash reproduced, 1 some differ or are missing, 2 refused (another
determinism domain, an unsupported report, a re-run that failed).
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tieredkv.domain import DOMAIN_FIELDS, domain_differences
from tieredkv.errors import DomainMismatchError, TieredKVError

VERIFY_DEFAULTS = {"seed": 0, "continuation": 16}  # `tieredkv verify` defaults, used if a report omits them
# Domain fields known without loading the model: checked before spending time on a re-run.
ENVIRONMENT_FIELDS = ("torch", "transformers", "machine", "num_threads", "device_kind")


class RecheckError(TieredKVError):
    """The report cannot be re-checked (no recipe, the re-run failed or printed no JSON)."""


@dataclass(frozen=True)
class Plan:
    """How to re-run a report: the command, the hashes it must reproduce, and the domain it claims."""

    kind: str  # "recheck" (a report with a recheck block) or "verify"
    argv: list[str]
    outputs: dict[str, str]
    domain: dict[str, Any]
    assumed: tuple[str, ...] = ()  # spec values the report did not record (defaults were used)


@dataclass
class Result:
    plan: Plan
    items: list[dict[str, Any]] = field(default_factory=list)  # name, committed, rerun, ok
    domain_differences: list[str] = field(default_factory=list)
    rerun_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.items) and all(i["ok"] for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.plan.kind, "argv": self.plan.argv, "assumed": list(self.plan.assumed),
                "ok": self.ok, "matched": sum(i["ok"] for i in self.items), "items": self.items,
                "domain_differences": self.domain_differences, "rerun_s": round(self.rerun_s, 2)}


# ----------------------------------------------------------------------------- reading a report
def verify_outputs(report: dict[str, Any]) -> dict[str, str]:
    """Every hash a `verify --rows` report commits to, by name."""
    out = {"corpus": report.get("corpus_sha256")}
    for r in report["rows"]:
        i = r["sample"]
        out[f"sample {i:03d} input"] = r["input_sha256"]
        out[f"sample {i:03d} fresh_logits"] = r["fresh_logits_sha256"]
        out[f"sample {i:03d} grafted_logits"] = r["grafted_logits_sha256"]
    return {k: v for k, v in out.items() if v is not None}


def plan_for(report: dict[str, Any]) -> Plan:
    if "recheck" in report:
        block = report["recheck"]
        if not isinstance(block.get("argv"), list) or not isinstance(block.get("outputs"), dict):
            raise RecheckError('the "recheck" block needs "argv" (a list) and "outputs" (name -> sha256)')
        domain = block.get("domain") or report.get("domain")
        if not isinstance(domain, dict):
            raise RecheckError("the report records no determinism domain; it cannot be re-checked")
        return Plan("recheck", [str(a) for a in block["argv"]], dict(block["outputs"]), domain)
    rows = report.get("rows")
    if isinstance(rows, list) and rows and isinstance(rows[0], dict) and "fresh_logits_sha256" in rows[0]:
        spec, assumed = {}, []
        for key, default in VERIFY_DEFAULTS.items():
            spec[key] = report.get(key, default)
            if key not in report:
                assumed.append(f"{key}={default} (not recorded in the report; the verify default)")
        argv = ["tieredkv", "verify", "--model", str(report["model"]), "--tokens", str(report["tokens"]),
                "--samples", str(report["samples"]), "--shift", str(report["shift"]),
                "--page-size", str(report["page_size"]), "--seed", str(spec["seed"]),
                "--continuation", str(spec["continuation"]), "--json", "--rows", "--quiet"]
        return Plan("verify", argv, verify_outputs(report), report["domain"], tuple(assumed))
    if "sha256_equal" in report and "rows" not in report:
        raise RecheckError("this verify report has no per-sample rows; produce it with `tieredkv verify --json "
                           "--rows` so that every hash can be re-checked")
    raise RecheckError('the report has no "recheck" block and is not a `tieredkv verify --json --rows` report; '
                       "see docs/LIBRARY.md (Reports) for the convention")


# ----------------------------------------------------------------------------- the domain
def environment_now(recorded: dict[str, Any]) -> dict[str, Any]:
    """The domain fields this process can tell without loading the model."""
    import torch
    import transformers

    from tieredkv.domain import device_kind

    kind = str(recorded.get("device_kind", "cpu"))
    device = "cuda" if kind.startswith("cuda") and torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "transformers": transformers.__version__, "machine": platform.machine(),
            "num_threads": torch.get_num_threads(), "device_kind": device_kind(device)}


def environment_differences(recorded: dict[str, Any]) -> list[str]:
    now = environment_now(recorded)
    return [f"{k}: {recorded.get(k)!r} -> {now[k]!r}" for k in ENVIRONMENT_FIELDS if recorded.get(k) != now[k]]


def _refuse(diffs: list[str]) -> DomainMismatchError:
    return DomainMismatchError(
        f"the report was produced in another determinism domain ({'; '.join(diffs)}); its hashes are not "
        "expected to reproduce here. Re-check on a machine of that domain, or pass --allow-domain-mismatch to "
        "re-run anyway (differences are then not evidence against the report)")


# ----------------------------------------------------------------------------- re-running
def repo_root(report_path: Path) -> Path:
    """The repository holding the report (the nearest parent with pyproject.toml), else the current dir."""
    for d in [report_path.resolve().parent, *report_path.resolve().parents]:
        if (d / "pyproject.toml").is_file():
            return d
    return Path.cwd()


def resolve_argv(argv: list[str]) -> list[str]:
    if not argv:
        raise RecheckError("the recheck argv is empty")
    head = argv[0]
    if head == "tieredkv":
        return [sys.executable, "-m", "tieredkv.cli", *argv[1:]]
    if head in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def run_subprocess(argv: list[str], cwd: Path) -> dict[str, Any]:
    """Run `argv` in `cwd`; the last JSON object on its stdout is the re-run's output."""
    proc = subprocess.run(resolve_argv(argv), cwd=cwd, capture_output=True, text=True, check=False)
    text = proc.stdout.strip()
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else _no_json(argv, proc)
    except ValueError:
        return _no_json(argv, proc)


def _no_json(argv: list[str], proc) -> dict[str, Any]:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RecheckError(f"the re-run `{' '.join(argv)}` exited {proc.returncode} without a JSON report: "
                       + " | ".join(tail))


def rerun_outputs(plan: Plan, rerun: dict[str, Any]) -> dict[str, str]:
    if plan.kind == "verify":
        return verify_outputs(rerun)
    if not isinstance(rerun.get("outputs"), dict):
        raise RecheckError(f'the re-run `{" ".join(plan.argv)}` printed JSON without "outputs"')
    return rerun["outputs"]


def recheck(report_path: str | Path, *, allow_domain_mismatch: bool = False,
            runner: Callable[[list[str], Path], dict[str, Any]] | None = None) -> Result:
    """Re-run the report's recipe (`runner`, default: a subprocess) and compare every committed hash;
    refuses another determinism domain (DomainMismatchError) unless `allow_domain_mismatch`."""
    path = Path(report_path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise RecheckError(f"{path} is not JSON: {e}") from None
    plan = plan_for(report)
    result = Result(plan)
    diffs = environment_differences(plan.domain)
    if diffs and not allow_domain_mismatch:
        raise _refuse(diffs)  # before a re-run that could not confirm anything
    t0 = time.perf_counter()
    rerun = (runner or run_subprocess)(plan.argv, repo_root(path))
    result.rerun_s = time.perf_counter() - t0
    rerun_domain = rerun.get("domain")
    diffs = domain_differences(plan.domain, rerun_domain) if isinstance(rerun_domain, dict) else \
        ["the re-run reported no domain"]
    if diffs and not allow_domain_mismatch:
        raise _refuse(diffs)
    result.domain_differences = diffs
    got = rerun_outputs(plan, rerun)
    for name, committed in plan.outputs.items():
        now = got.get(name)
        result.items.append({"name": name, "committed": committed, "rerun": now, "ok": now == committed})
    for name in sorted(set(got) - set(plan.outputs)):
        result.items.append({"name": name, "committed": None, "rerun": got[name], "ok": False})
    return result


def format_table(result: Result, *, only_failures: bool = False) -> str:
    short = lambda h: "-" if h is None else h[:16] + "…"  # noqa: E731
    lines = ["| item | committed | re-run | result |", "|---|---|---|---|"]
    for i in result.items:
        if only_failures and i["ok"]:
            continue
        lines.append(f"| {i['name']} | {short(i['committed'])} | {short(i['rerun'])} | "
                     f"{'match' if i['ok'] else 'DIFFERS'} |")
    n_ok = sum(i["ok"] for i in result.items)
    lines.append("")
    lines.append(f"{n_ok}/{len(result.items)} hashes reproduced ({result.plan.kind}, re-run {result.rerun_s:.1f}s)")
    for a in result.plan.assumed:
        lines.append(f"assumed: {a}")
    for d in result.domain_differences:
        lines.append(f"domain differs (allowed): {d}")
    return "\n".join(lines)


__all__ = ["Plan", "Result", "RecheckError", "recheck", "plan_for", "format_table", "verify_outputs",
           "DOMAIN_FIELDS"]
