"""`tieredkv recheck`: re-run a report's recipe and compare its committed hashes."""
from __future__ import annotations

from tieredkv.cli.common import print_json


def cmd_recheck(a) -> int:
    from tieredkv.recheck import format_table, recheck

    result = recheck(a.report, allow_domain_mismatch=a.allow_domain_mismatch)
    if a.json:
        print_json(result.to_dict())
    else:
        print(format_table(result, only_failures=a.failures_only))
    return 0 if result.ok else 1


def register(sub) -> None:
    r = sub.add_parser("recheck", help="re-run a report's recipe and confirm its committed output hashes")
    r.add_argument("report", help="a report JSON with a \"recheck\" block, or `tieredkv verify --json --rows` output")
    r.add_argument("--allow-domain-mismatch", action="store_true",
                   help="re-run even if the report's determinism domain differs (no guarantee then)")
    r.add_argument("--failures-only", action="store_true", help="list only the hashes that differ")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_recheck)
