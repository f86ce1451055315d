"""CLI: `export`, `import` and `check` — moving artifacts between machines, and store integrity.

    tieredkv export --store DIR --artifact ID -o FILE|-
    tieredkv import FILE --store DIR [--model NAME [--allow-domain-mismatch] [--verify-recompute FRACTION]]
    tieredkv check  --store DIR [--sample FRACTION] [--seed N] [--recompute FRACTION --model NAME]

`check` exits 1 when it finds corrupt pages or manifests, artifacts whose pages are gone
(quarantined earlier) or do not chain, pages that do not reproduce (--recompute), artifacts that
--recompute could not recompute here (not verified: the reason is given), or a store
that does not match its commit record (rolled back): the store cannot serve them until they are
re-imported or re-deposited.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tieredkv.cli.common import (
    DEFAULT_MODEL,
    InputError,
    fraction,
    model_arg,
    nonneg_int,
    nothing_left_if_refused,
    open_store,
    print_json,
    regular_file,
    require_store,
    store_args,
)


def cmd_export(args) -> int:
    import sys

    from tieredkv.artifacts.portable import export_artifact
    from tieredkv.progress import count_bar

    to_stdout = args.output == "-"
    with open_store(args.store, must_exist=True, readonly_fallback=True) as store, \
            count_bar("export", None, unit="page", quiet=args.quiet or to_stdout) as bar:
        summary = export_artifact(store, args.artifact, sys.stdout.buffer if to_stdout else args.output, progress=bar)
    summary = {**summary, "store": str(args.store)}
    if to_stdout:  # the file went to stdout: the summary goes to stderr
        print(json.dumps(summary, indent=2, sort_keys=True), file=sys.stderr)
    else:
        print_json(summary)
    return 0


def cmd_import(args) -> int:
    from tieredkv.artifacts.portable import import_artifact, read_header
    from tieredkv.progress import count_bar

    expected_fp = expected_domain = recomputer = None
    if args.verify_recompute is not None and args.model is None:
        raise InputError("--verify-recompute needs --model (the model that recomputes the pages)")
    if args.seed is not None and args.verify_recompute is None:
        raise InputError("--seed picks the pages --verify-recompute recomputes: give --verify-recompute FRACTION "
                         "too, or drop --seed")
    if args.allow_domain_mismatch and args.model is None:
        raise InputError("--allow-domain-mismatch needs --model (the domain to compare with)")
    path = regular_file(args.file, "artifact file")  # NOTE: after the flags: a usage error is told first
    promise = "not checked (no --model): give --model to compare the artifact's domain with this machine's"
    if args.model is not None:
        from tieredkv.models.loading import load_model
        from tieredkv.provenance.domain import determinism_domain, domain_differences

        lm = load_model(args.model, quiet=args.quiet)
        art = read_header(path).artifact
        expected_fp, expected_domain = lm.fingerprint, determinism_domain(lm.model, lm.fingerprint, art.page_size)
        diffs = domain_differences(art.domain, expected_domain)
        promise = ("same domain: grafts give logits byte-equal to a fresh computation here" if not diffs else
                   f"another domain ({'; '.join(diffs)}): grafts run, but their logits are not promised to equal a "
                   "fresh computation here, and the pages are not recomputable here")
        if args.verify_recompute is not None:
            if diffs:
                raise InputError(f"--verify-recompute: the artifact was made in another determinism domain "
                                 f"({'; '.join(diffs)}); its pages reproduce only in their own domain")
            from tieredkv.artifacts.recompute import Recomputer

            recomputer = Recomputer(lm, art, args.verify_recompute, seed=args.seed or 0)
    with (nothing_left_if_refused(args.store), open_store(args.store) as store,
          count_bar("import", None, unit="page", quiet=args.quiet) as bar):
        art = import_artifact(path, store, expected_fingerprint=expected_fp, expected_domain=expected_domain,
                              allow_domain_mismatch=args.allow_domain_mismatch, progress=bar, recompute=recomputer)
    out = {**art.summary(), "store": str(args.store), "file": str(args.file), "exactness": promise}
    if recomputer is not None:
        out["recompute"] = recomputer.report()
    print_json(out)
    return 0


CHECK_CHILD_ENV = "TIEREDKV_CHECK_CHILD"  # set in the child process that walks the store


def cmd_check(args) -> int:
    """Walk the store in a child process: LMDB checksums nothing, and a damaged page pointer can crash it
    inside the C library (SIGBUS, or an assertion that aborts); the parent turns that into a report."""
    # NOTE: else a user may take the report for a check against it
    if args.model is not None and args.recompute is None:
        raise InputError("--model is the model --recompute recomputes pages with; check compares no model "
                         "without it: give --recompute FRACTION too, or drop --model")
    if os.environ.get(CHECK_CHILD_ENV):
        return _check_here(args)
    require_store(args.store)  # here, before a second interpreter starts for nothing
    argv = ["check", "--store", args.store, "--sample", repr(args.sample), "--seed", str(args.seed)]
    argv += [] if args.recompute is None else ["--recompute", repr(args.recompute),
                                               "--model", args.model or DEFAULT_MODEL]
    child = subprocess.run([sys.executable, "-m", "tieredkv.cli", *argv], capture_output=True, text=True,
                           env={**os.environ, CHECK_CHILD_ENV: "1"})
    sys.stdout.write(child.stdout)
    if child.returncode >= 0:
        sys.stderr.write(child.stderr)
        return child.returncode
    name = signal.Signals(-child.returncode).name
    said = " ".join((child.stderr.strip().splitlines() or [""])[-1].split())[:200]
    return _unreadable(args.store, None, f"LMDB crashed ({name}{': ' + said if said else ''}) while reading "
                       f"{args.store}/data.mdb: a page pointer or page of the file was altered, so the library read "
                       "where no page is (LMDB checksums nothing)")  # (opened None: the open may have crashed)


def _unreadable(store: str, opened: bool | None, damage: str) -> int:
    """check's report on a store it could not read (to the end, once opened): exit 1."""
    from paging.errors import REBUILD_HINT

    print_json({"store": store, "healthy": False, "opened": opened, "store_damage": [damage],
                "hint": f"the store cannot be read{'' if opened is False else ' to the end'}; {REBUILD_HINT}"})
    return 1


def _check_here(args) -> int:
    from tieredkv.artifacts.artifact import store_fingerprint
    from tieredkv.artifacts.check import check_store
    from tieredkv.errors import ModelMismatchError

    lm = None
    if args.recompute is not None:
        from tieredkv.models.loading import load_model

        lm = load_model(args.model or DEFAULT_MODEL)
    from paging.errors import StoreIntegrityError

    opened = False
    try:
        with open_store(args.store, must_exist=True, allow_damaged=True, readonly_fallback=True) as store:
            opened = True
            bound = store_fingerprint(store) if lm is not None else None
            if bound is not None and bound != lm.fingerprint:  # it could recompute nothing, and say healthy
                raise ModelMismatchError(f"store {args.store} (check --recompute needs the store's model)", bound,
                                         lm.fingerprint)
            report = check_store(store, sample=args.sample, seed=args.seed,
                                 recompute=None if lm is None else (lm, args.recompute))
    except StoreIntegrityError as exc:  # too damaged to open or to walk (truncated, a broken tree): a report
        return _unreadable(args.store, opened, " ".join(str(exc).split()))
    print_json(report)
    return 0 if report["healthy"] else 1


def register(sub) -> None:
    e = sub.add_parser("export", help="write an artifact to one portable, verified file")
    store_args(e, artifact="required")
    e.add_argument("-o", "--output", required=True, help="a new or regular file (atomically replaced), or - for "
                   "standard output; directories, symlinks, FIFOs and devices are refused")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(fn=cmd_export)

    i = sub.add_parser("import", help="verify an artifact file completely, then add it to a store")
    i.add_argument("file")
    store_args(i)
    model_arg(i, default=None)
    i.add_argument("--allow-domain-mismatch", action="store_true",
                   help="import although --model runs in another determinism domain (no byte-exact guarantee)")
    i.add_argument("--verify-recompute", type=fraction, metavar="FRACTION",
                   help="recompute this fraction of the pages (seeded sample) with --model and refuse the file if "
                        "one differs: catches a forged artifact, whose hashes all verify")
    i.add_argument("--seed", type=nonneg_int, help="which pages --verify-recompute picks (default 0)")
    i.add_argument("--quiet", action="store_true")
    i.set_defaults(fn=cmd_import)

    c = sub.add_parser("check", help="re-hash stored pages, manifests and chains, compare the store with its commit "
                       "record; quarantine and report what fails; exit 1 if anything is wrong")
    store_args(c)
    c.add_argument("--sample", type=fraction, default=1.0, help="fraction of pages to re-hash (default 1)")
    c.add_argument("--seed", type=nonneg_int, default=0, help="which pages --sample and --recompute pick")
    c.add_argument("--recompute", type=fraction, metavar="FRACTION",
                   help="also recompute this fraction of each artifact's pages with --model (seeded sample) and "
                        "compare the bytes: catches forged pages, whose hashes all verify")
    model_arg(c, default=None, note=f"the model --recompute uses (default {DEFAULT_MODEL})")
    c.set_defaults(fn=cmd_check)
