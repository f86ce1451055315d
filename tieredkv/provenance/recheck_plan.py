"""What a re-check runs and what it reports: the plan read from a report, and one compared item.

recheck.py (reports with a recheck block) and recheck_verify.py (`tieredkv verify --json --rows`
reports) both build a `Plan` and compare the re-run into `item`s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tieredkv.errors import TieredKVError


class RecheckError(TieredKVError):
    """The report cannot be re-checked (no recipe, the re-run failed or printed no JSON)."""


@dataclass(frozen=True)
class Plan:
    """How to re-run a report: the command, the hashes it must reproduce, and the domain it claims."""

    kind: str  # "recheck" (a report with a recheck block) or "verify"
    argv: list[str]
    outputs: dict[str, str]
    domain: dict[str, Any]
    inferred: tuple[str, ...] = ()  # parameters the report did not record, and how they were determined
    inputs: frozenset[str] = frozenset()  # outputs that hash inputs: equal in any domain
    report: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def item(name: str, check: str, committed: Any, rerun: Any, ok: bool | None, note: str = "") -> dict[str, Any]:
    """One compared value: `check` is "hash", "relation", "claim" or "domain-specific"; `ok` None: not comparable."""
    return {"name": name, "check": check, "committed": committed, "rerun": rerun, "ok": ok,
            **({"note": note} if note else {})}
