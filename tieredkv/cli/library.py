"""`tieredkv library add|solve|list`: verified solutions."""
from __future__ import annotations

import sys

from tieredkv.cli.common import (
    MAX_NEW_TOKENS,
    int_between,
    model_arg,
    nothing_left_if_refused,
    open_store,
    print_json,
    store_args,
    utf8_text,
)

VERIFIER_HELP = ("`arithmetic`, `answer-key:FILE.json` (JSON object: problem -> answer) or `package.module:name` "
                 "(a Verifier class or instance, or a function (problem, solution) -> bool)")


def _library(args, store):
    from tieredkv.library.solutions import Library
    from tieredkv.models.loading import load_model

    return Library(load_model(args.model), store, name=args.library, max_new_tokens=args.max_new_tokens,
                   confirm_tokens=args.confirm_tokens)


def cmd_add(args) -> int:
    from tieredkv.library.verifiers import load_verifier

    verifier = load_verifier(args.verifier)
    with nothing_left_if_refused(args.store), open_store(args.store) as store:
        entry = _library(args, store).add(args.problem, args.solution, verifier)
    print_json({**entry.to_dict(), "store": args.store, "library": args.library})
    return 0


def cmd_solve(args) -> int:
    from tieredkv.library.verifiers import load_verifier

    verifier = load_verifier(args.verifier)
    with nothing_left_if_refused(args.store) as outcome, open_store(args.store) as store:
        result = _library(args, store).solve(args.problem, verifier, deposit=not args.no_deposit)
        if not result.accepted:
            outcome.refused()  # NOTE: an unverified answer deposits nothing; a store made for it goes again
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.answer)
        print(f"[{result.route}; {'verified' if result.accepted else 'NOT verified'} ({result.verdict.reason}); "
              f"{result.decode_tokens} decode tokens, {result.prefill_tokens} prefilled, {result.grafted_tokens} "
              f"grafted{'; deposited' if result.deposited else ''}]", file=sys.stderr)
    return 0 if result.accepted else 1


def cmd_list(args) -> int:
    from tieredkv.library.entries import LibraryIndex

    with open_store(args.store, must_exist=True, readonly_fallback=True) as store:
        index = LibraryIndex(store, args.library)
        entries = index.entries()
        version = index.version
    if args.json:
        print_json({"library": args.library, "version": version, "entries": [e.to_dict() for e in entries]})
        return 0
    print(f"library {args.library!r}: {len(entries)} verified entries, version {version}")
    for e in entries:
        problem = " ".join(e.problem.split())
        solution = " ".join(e.solution.split())
        print(f"  {e.problem_sha256[:12]}  [{e.source}, {e.verifier['name']}]  {problem[:60]!r} -> {solution[:60]!r}")
    return 0


def register(sub) -> None:
    lib = sub.add_parser("library", help="verified solutions: recurring problems answered from grafted pages")
    lsub = lib.add_subparsers(dest="library_cmd", required=True)

    def common(p, *, model: bool = True) -> None:
        if model:
            model_arg(p)
            p.add_argument("--max-new-tokens", type=int_between(1, MAX_NEW_TOKENS), default=32,
                           help="decode budget for a new problem")
            p.add_argument("--confirm-tokens", type=int_between(1, MAX_NEW_TOKENS), default=4,
                           help="decode budget for a recurring problem (end-of-turn check)")
        store_args(p)
        p.add_argument("--library", default="default", help="library name inside the store (default: %(default)s)")
        p.add_argument("--json", action="store_true")

    p = lsub.add_parser("add", help="deposit a solution, if the verifier accepts it")
    common(p)
    p.add_argument("--problem", type=utf8_text, required=True)
    p.add_argument("--solution", type=utf8_text, required=True)
    p.add_argument("--verifier", required=True, help=VERIFIER_HELP)
    p.set_defaults(fn=cmd_add)

    p = lsub.add_parser("solve", help="answer a problem: recurring from the library, else generate and verify")
    common(p)
    p.add_argument("--problem", type=utf8_text, required=True)
    p.add_argument("--verifier", required=True, help=VERIFIER_HELP)
    p.add_argument("--no-deposit", action="store_true", help="do not keep a verified generated answer")
    p.set_defaults(fn=cmd_solve)

    p = lsub.add_parser("list", help="the library's verified entries")
    common(p, model=False)
    p.set_defaults(fn=cmd_list)
