"""`tieredkv recheck`: re-run a report's recipe; check its hashes (same domain) or its relations (another
machine), and every claim it makes. A report of named runs: every run's recipe, or the one `--run` names."""
from __future__ import annotations

from tieredkv.cli.common import print_json


def cmd_recheck(args) -> int:
    from tieredkv.provenance.recheck import format_table, recheck_runs

    results = recheck_runs(args.report, runs=None if args.run is None else [args.run],
                           allow_domain_mismatch=args.allow_domain_mismatch)
    ok = all(r.ok for r in results.values())
    if "" in results:  # the report of one run
        result = results[""]
        if args.json:
            print_json(result.to_dict())
        else:
            print(format_table(result, only_failures=args.failures_only))
    elif args.json:
        print_json({"ok": ok, "runs": {name: r.to_dict() for name, r in results.items()}})
    else:
        for name, result in results.items():
            print(f"## run {name}: {' '.join(result.plan.argv)}\n")
            print(format_table(result, only_failures=args.failures_only) + "\n")
        held = [name for name, r in results.items() if r.ok]
        print(f"RUNS: {len(held)}/{len(results)} hold" +
              ("" if ok else f" (not: {', '.join(n for n in results if n not in held)})"))
    return 0 if ok else 1


def register(sub) -> None:
    r = sub.add_parser("recheck", help="re-run a report's recipe: committed hashes in the report's own domain, "
                       "relations and claims anywhere")
    r.add_argument("report", help="a report JSON with a \"recheck\" block, a report of named runs (each run's "
                   "recipe), or `tieredkv verify --json --rows` output")
    r.add_argument("--run", metavar="NAME", help="re-check only this run of a report of named runs")
    r.add_argument("--allow-domain-mismatch", action="store_true",
                   help="accept a re-run with another model, dtype, attention or page size and check only what "
                        "holds for any model (inputs, relations)")
    r.add_argument("--failures-only", action="store_true", help="list only the checks that fail")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_recheck)
