"""`recheck`: re-run what a report says produced its hashes and claims, and compare, so a reader can
re-check any number. A report is a pre-registration.

The convention (any benchmark can follow it):

    "domain":  {...}                                  determinism_domain() of the run
    "recheck": {"argv": ["python", "-m", "bench.x", "--recheck-only", ...],
                "outputs": {"<name>": "<sha256>", ...}}

`argv` re-runs a deterministic sub-computation; it prints one JSON object with the same `outputs`
names and its own `domain`, and may add `"inputs": [names]` (outputs that hash what went in, the
same in any domain) and `"relations": {name: bool}` (facts the contract promises in any domain, such
as "grafted logits == fresh logits"). argv[0] "tieredkv" runs this package's CLI and "python" this
interpreter; relative paths are resolved from the repository that holds the report. A report of named
runs (report_runs.py: one file per benchmark) holds one such report per run, each re-checked by itself.
`tieredkv verify --json --rows` reports need no block: their spec fields give the argv (a field an
older report lacks is inferred from its rows and must be confirmed by every input hash).

Two ways to hold, decided by the re-run's determinism domain (which names the CPU, its kernels and
libraries, not just "x86_64"):

    same domain     every committed hash must be reproduced byte for byte
    another domain  committed output hashes are domain-specific and are not evidence either way; the
                    inputs must still hash equal, and the relations that hold anywhere (graft == fresh,
                    per row) must hold in the re-run

Either way every claim (counts, KL, argmax, equality flags) is checked against the report's own rows
and against the rows the re-run produced. A re-run with another model, dtype, attention or page size
is refused (that is another recipe, not another machine) unless --allow-domain-mismatch.

Exit status of the CLI: 0 everything checkable held, 1 something differs or nothing could be checked,
2 refused (another model, an unsupported report, a re-run that failed).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tieredkv.errors import DomainMismatchError
from tieredkv.provenance.domain import DOMAIN_FIELDS, domain_differences
from tieredkv.provenance.recheck_plan import Plan, RecheckError, item
from tieredkv.provenance.recheck_verify import is_verify_report, verify_items, verify_outputs, verify_plan
from tieredkv.provenance.report_runs import UnknownRunError, select_runs

# Domain fields that name the recipe (which model, how it is run) rather than the machine.
RECIPE_FIELDS = ("fingerprint", "dtype", "attn_implementation", "page_size", "tieredkv_format")
MAX_REPORT_BYTES = 64 << 20  # a verify report of the largest sample count is a few MiB
MAX_REPORT_DEPTH = 32  # reports nest a few levels (report -> rows -> row -> domain)


@dataclass
class Result:
    plan: Plan
    mode: str = "hash"  # "hash": same domain; "relation": another machine
    # each: name, check ("hash", "relation", "claim", "domain-specific"), committed, rerun, ok (None: not comparable)
    items: list[dict[str, Any]] = field(default_factory=list)
    domain_differences: list[str] = field(default_factory=list)
    rerun_s: float = 0.0
    run: str = ""  # the run's name in a report of named runs (report_runs.py); "" for the report of one run

    @property
    def ok(self) -> bool:
        return any(i["ok"] for i in self.items) and not any(i["ok"] is False for i in self.items)

    def count(self, check: str) -> tuple[int, int]:
        rows = [i for i in self.items if i["check"] == check]
        return sum(bool(i["ok"]) for i in rows), len(rows)

    def to_dict(self) -> dict[str, Any]:
        return {**({"run": self.run} if self.run else {}), "kind": self.plan.kind, "argv": self.plan.argv,
                "inferred": list(self.plan.inferred), "mode": self.mode, "ok": self.ok,
                "matched": sum(i["ok"] is True for i in self.items),
                "counts": {c: dict(zip(("held", "of"), self.count(c)))
                           for c in ("hash", "relation", "claim", "domain-specific")},
                "items": self.items, "domain_differences": self.domain_differences,
                "rerun_s": round(self.rerun_s, 2)}


# ----------------------------------------------------------------------------- reading a report
def load_report(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise RecheckError(f"{path} is a directory; give a report JSON file")
    if not path.is_file():
        raise RecheckError(f"{path} does not exist or is not a regular file; give a report JSON file")
    with open(path, "rb") as f:
        raw = f.read(MAX_REPORT_BYTES + 1)
    if len(raw) > MAX_REPORT_BYTES:
        raise RecheckError(f"{path} is larger than {MAX_REPORT_BYTES >> 20} MiB, more than any report holds; give "
                           "the report JSON file")
    try:
        report = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        why = f"nested deeper than {MAX_REPORT_DEPTH} levels" if isinstance(e, RecursionError) else \
            f"not JSON: {' '.join(str(e).split())}"
        raise RecheckError(f"{path} is {why}; give a report JSON file") from None
    if _depth(report) > MAX_REPORT_DEPTH:
        raise RecheckError(f"{path} is nested deeper than {MAX_REPORT_DEPTH} levels, which no report is; give a "
                           "report JSON file")
    if not isinstance(report, dict):
        raise RecheckError(f"{path} holds a JSON {type(report).__name__}, not a report object; see "
                           "docs/LIBRARY.md (Reports) for the convention")
    return report


def _depth(value: Any) -> int:
    """How deeply `value` nests lists and objects (iteratively: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_REPORT_DEPTH:
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def plan_for(report: dict[str, Any]) -> Plan:
    if "recheck" in report:
        block = report["recheck"]
        if not isinstance(block, dict) or not isinstance(block.get("argv"), list) or \
                not isinstance(block.get("outputs"), dict):
            raise RecheckError('the "recheck" block needs "argv" (a list) and "outputs" (name -> sha256)')
        domain = block.get("domain") or report.get("domain")
        if not isinstance(domain, dict):
            raise RecheckError("the report records no determinism domain; it cannot be re-checked")
        return Plan("recheck", [str(a) for a in block["argv"]], dict(block["outputs"]), domain,
                    inputs=frozenset(block.get("inputs", ())), report=report)
    if is_verify_report(report):
        return verify_plan(report)
    if "sha256_equal" in report and "rows" not in report:
        raise RecheckError("this verify report has no per-sample rows; produce it with `tieredkv verify --json "
                           "--rows` so that every hash can be re-checked")
    raise RecheckError('the report has no "recheck" block and is not a `tieredkv verify --json --rows` report; '
                       "see docs/LIBRARY.md (Reports) for the convention")


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


def recheck(report_path: str | Path, *, run: str | None = None, allow_domain_mismatch: bool = False,
            runner: Callable[[list[str], Path], dict[str, Any]] | None = None) -> Result:
    """Re-run the report's recipe (`runner`, default: a subprocess) and check it (see the module docstring).
    A report of named runs (report_runs.py) is re-checked one `run` at a time (None: its only run).

    Raises DomainMismatchError if the re-run used another recipe (model fingerprint, dtype, attention,
    page size) unless `allow_domain_mismatch`; another machine is never refused: it checks relations."""
    path = Path(report_path)
    runs = select_runs(load_report(path), None if run is None else [run], path)
    if len(runs) > 1:
        raise RecheckError(f"{path} holds {len(runs)} runs ({', '.join(runs)}); name one (--run NAME), or re-check "
                           "every run (`tieredkv recheck` without --run)")
    return _recheck_runs(path, runs, allow_domain_mismatch, runner)[next(iter(runs))]


def recheck_runs(report_path: str | Path, *, runs: list[str] | None = None, allow_domain_mismatch: bool = False,
                 runner: Callable[[list[str], Path], dict[str, Any]] | None = None) -> dict[str, Result]:
    """Re-check the named runs of a report (None: every run; a report of one run is one run named ""), each
    with its own recipe and determinism domain: each holds or fails by itself, as its own report would."""
    path = Path(report_path)
    return _recheck_runs(path, select_runs(load_report(path), runs, path), allow_domain_mismatch, runner)


def _recheck_runs(path: Path, runs: dict[str, dict[str, Any]], allow_domain_mismatch: bool,
                  runner: Callable[[list[str], Path], dict[str, Any]] | None) -> dict[str, Result]:
    results = {}
    for name, report in runs.items():
        try:
            results[name] = _recheck_one(report, repo_root(path), allow_domain_mismatch, runner or run_subprocess)
        except (RecheckError, DomainMismatchError) as e:
            if not name:
                raise
            raise type(e)(f"run {name!r} of {path}: {e}") from None
        results[name].run = name
    return results


def _recheck_one(report: dict[str, Any], root: Path, allow_domain_mismatch: bool,
                 runner: Callable[[list[str], Path], dict[str, Any]]) -> Result:
    plan = plan_for(report)
    t0 = time.perf_counter()
    rerun = runner(plan.argv, root)
    result = Result(plan, rerun_s=time.perf_counter() - t0)
    rerun_domain = rerun.get("domain")
    if not isinstance(rerun_domain, dict):
        raise RecheckError(f"the re-run `{' '.join(plan.argv)}` reported no determinism domain")
    diffs = domain_differences(plan.domain, rerun_domain)
    recipe = [d for d in diffs if d.split(":", 1)[0] in RECIPE_FIELDS]
    if recipe and not allow_domain_mismatch:
        raise DomainMismatchError(
            f"the re-run used another recipe than the report ({'; '.join(recipe)}): that is another model or "
            "setting, not another machine. Re-check with the report's model, or pass --allow-domain-mismatch to "
            "compare only what holds for any model (inputs, relations)")
    result.domain_differences = diffs
    result.mode = "relation" if diffs else "hash"
    if plan.kind == "verify":
        result.items = verify_items(plan, rerun, result.mode)
    else:
        result.items = block_items(plan, rerun, result.mode)
    return result


def block_items(plan: Plan, rerun: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """Items of a report with a recheck block: hashes, then the re-run's relations."""
    got = rerun.get("outputs")
    if not isinstance(got, dict):
        raise RecheckError(f'the re-run `{" ".join(plan.argv)}` printed JSON without "outputs"')
    inputs = plan.inputs | frozenset(rerun.get("inputs") or ())
    items = []
    for name, committed in plan.outputs.items():
        now = got.get(name)
        if mode == "hash" or name in inputs:
            items.append(item(name, "hash", committed, now, now == committed))
        else:
            items.append(item(name, "domain-specific", committed, now, None,
                               "matches" if now == committed else "differs (expected on another machine)"))
    if mode == "hash":
        for name in sorted(set(got) - set(plan.outputs)):
            items.append(item(name, "hash", None, got[name], False, "not in the report"))
    committed_rel = (plan.report.get("recheck") or {}).get("relations") or {}
    relations = rerun.get("relations") or {}
    for name in sorted(set(relations) | set(committed_rel)):
        now = relations.get(name)
        ok = now is True and committed_rel.get(name, True) is True
        items.append(item(name, "relation", committed_rel.get(name), now, ok))
    return items


def format_table(result: Result, *, only_failures: bool = False) -> str:
    def short(h: Any) -> str:
        if h is None:
            return "-"
        text = h if isinstance(h, str) else json.dumps(h)
        return text[:16] + "…" if isinstance(h, str) and len(h) == 64 else text[:24]

    lines = ["| item | check | committed | re-run | result |", "|---|---|---|---|---|"]
    for i in result.items:
        if only_failures and i["ok"] is not False:
            continue
        verdict = {True: "holds", False: "DIFFERS", None: "not comparable here"}[i["ok"]]
        lines.append(f"| {i['name']} | {i['check']} | {short(i['committed'])} | {short(i['rerun'])} | {verdict} |")
    lines.append("")
    lines += summary_lines(result)
    return "\n".join(lines)


def summary_lines(result: Result) -> list[str]:
    plan = result.plan
    out = [f"{plan.kind} report{f' (run {result.run})' if result.run else ''}, re-run {result.rerun_s:.1f}s"]
    if result.mode == "hash":
        out.append("domain: the same as the report's: every committed hash must be reproduced byte for byte")
    else:
        out.append("domain: ANOTHER machine or build than the report's — committed output hashes are "
                   "domain-specific and are not compared; inputs must hash equal and the relations that hold in "
                   "any domain are checked instead")
        for d in result.domain_differences:
            out.append(f"  differs: {d}")
    h, hn = result.count("hash")
    r, rn = result.count("relation")
    c, cn = result.count("claim")
    names = sorted({i["name"].split(" ", 2)[-1] if i["name"].startswith("sample ") else i["name"]
                    for i in result.items if i["check"] == "hash"})
    out.append(f"hash-equal: {h}/{hn} ({', '.join(names[:6])}{'…' if len(names) > 6 else ''})")
    out.append(f"relation-only: {r}/{rn} hold" + (f" ({_relation_names(result)})" if rn else ""))
    out.append(f"claims: {c}/{cn} hold (checked against the report's own rows and the re-run's)" if cn else
               "claims: none that can be checked (the recipe states no claims beside its outputs)")
    ds = [i for i in result.items if i["check"] == "domain-specific"]
    if ds:
        same = sum(i["rerun"] == i["committed"] for i in ds)
        out.append(f"not comparable here: {len(ds)} domain-specific hashes ({same} happen to match)")
    for a in plan.inferred:
        out.append(f"parameter: {a}")
    verdict = "the report holds" if result.ok else "the report does NOT hold" if any(
        i["ok"] is False for i in result.items) else "nothing could be checked here"
    out.append(f"RESULT: {verdict}" + (" (relation-only on this machine)" if result.mode == "relation" and
                                        result.ok else ""))
    return out


def _relation_names(result: Result) -> str:
    names = sorted({i["name"].split(" ", 2)[-1] if i["name"].startswith("sample ") else i["name"]
                    for i in result.items if i["check"] == "relation"})
    return ", ".join(names[:4]) + ("…" if len(names) > 4 else "")


__all__ = ["Plan", "Result", "RecheckError", "UnknownRunError", "recheck", "recheck_runs", "plan_for", "format_table",
           "verify_outputs", "DOMAIN_FIELDS"]
