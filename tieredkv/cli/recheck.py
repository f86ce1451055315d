"""`tieredkv recheck`: re-run a report's recipe; check its hashes (same domain) or its relations (another
machine), and every claim it makes."""
from __future__ import annotations

from tieredkv.cli.common import print_json


def cmd_recheck(args) -> int:
    from tieredkv.provenance.recheck import format_table, recheck

    result = recheck(args.report, allow_domain_mismatch=args.allow_domain_mismatch)
    if args.json:
        print_json(result.to_dict())
    else:
        print(format_table(result, only_failures=args.failures_only))
    return 0 if result.ok else 1


def register(sub) -> None:
    r = sub.add_parser("recheck", help="re-run a report's recipe: committed hashes in the report's own domain, "
                       "relations and claims anywhere")
    r.add_argument("report", help="a report JSON with a \"recheck\" block, or `tieredkv verify --json --rows` output")
    r.add_argument("--allow-domain-mismatch", action="store_true",
                   help="accept a re-run with another model, dtype, attention or page size and check only what "
                        "holds for any model (inputs, relations)")
    r.add_argument("--failures-only", action="store_true", help="list only the checks that fail")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_recheck)
