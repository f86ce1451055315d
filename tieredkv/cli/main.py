"""The `tieredkv` command line. Each subcommand prints JSON or text; errors are one line that says what to do.

Exit status: 0 done; 1 a check or comparison found a problem (check, verify, recheck, library solve);
2 an error (bad arguments or input, a refused operation), always as one line on stderr.
"""
from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
import warnings

from paging.errors import PagingError
from tieredkv.cli.common import (
    MAX_PAGE_SIZE,
    InputError,
    OneLineParser,
    int_at_least,
    int_between,
    nothing_left_if_refused,
    positive_int,
    read_text_file,
    require_store,
    store_args,
    utf8_text,
)
from tieredkv.cli.common import model_arg as _model_arg
from tieredkv.cli.common import open_store as _open_store
from tieredkv.cli.common import print_json as _print
from tieredkv.errors import EmptyInputError, TieredKVError

DEBUG_ENV = "TIEREDKV_DEBUG"  # set to 1 to see the traceback of an unexpected error
MAX_SHIFT = 1 << 24  # positions a verify may graft away: more than any context this project reaches


EXTENSIONS = ("tieredkv.cli.qa", "tieredkv.cli.portable", "tieredkv.cli.remote", "tieredkv.cli.library",
              "tieredkv.cli.recheck", "tieredkv.cli.store_cmds")


def cmd_deposit(args) -> int:
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model
    from tieredkv.progress import token_bar

    if (args.file is None) == (args.text is None):
        raise InputError("give exactly one of FILE or --text")
    text = args.text if args.text is not None else read_text_file(args.file, "FILE")
    if not text.strip():
        raise EmptyInputError(
            f"nothing to deposit: {'--text' if args.text is not None else args.file} is empty or blank")
    lm = load_model(args.model, quiet=args.quiet)
    with nothing_left_if_refused(args.store), _open_store(args.store) as store, \
            token_bar("deposit", quiet=args.quiet) as bar:
        art = deposit(lm, text, store, page_size=args.page_size, name=args.name or (args.file or ""), progress=bar)
    _print({**art.summary(), "store": str(args.store)})
    return 0


def cmd_graft(args) -> int:
    require_store(args.store)  # before torch and the model load for nothing
    import torch

    from tieredkv.artifacts.artifact import graft, grafted_token_ids, load_artifact
    from tieredkv.models.loading import load_model

    lm = load_model(args.model)
    with _open_store(args.store, must_exist=True) as store:
        art = load_artifact(store, args.artifact)
        new = lm.codec.encode(args.prompt)
        _check_window(lm, art.num_tokens + len(new), args.max_new_tokens)
        cache = graft(lm, art, store, allow_domain_mismatch=args.allow_domain_mismatch)
        prefix = grafted_token_ids(store, art)
    ids = torch.tensor([prefix + new])
    with torch.inference_mode():
        out = lm.model.generate(ids, past_key_values=cache, max_new_tokens=args.max_new_tokens, do_sample=False,
                                pad_token_id=lm.codec.eos_token_id)
    print(lm.codec.decode(out[0, ids.shape[1]:].tolist()))
    return 0


def _check_window(lm, num_tokens: int, max_new_tokens: int) -> None:
    """Refuse a generation that would run past the model's trained window (positions it never saw)."""
    from tieredkv.models.loading import trained_window

    window = trained_window(lm.model)
    if window is not None and num_tokens + max_new_tokens > window:
        room = window - num_tokens
        fix = f"lower --max-new-tokens to {room} or less" if room > 0 else "use a shorter artifact or prompt"
        raise InputError(f"{num_tokens} tokens of context and prompt plus --max-new-tokens {max_new_tokens} run past "
                         f"the model's window of {window} positions; {fix} (or use `tieredkv qa`, whose fixed "
                         "position policy is made for beyond the window)")


def cmd_verify(args) -> int:
    from tieredkv.models.loading import load_model
    from tieredkv.progress import count_bar
    from tieredkv.provenance.verify import VerifySpec, verify

    lm = load_model(args.model, quiet=args.quiet or args.json)
    spec = VerifySpec(tokens=args.tokens, samples=args.samples, continuation=args.continuation, shift=args.shift,
                      page_size=args.page_size, seed=args.seed)
    with count_bar("verify", spec.samples, unit="sample", quiet=args.quiet or args.json) as bar:
        report = verify(lm, spec, progress=bar)
    if not args.rows:
        report.pop("rows")
    if args.json:
        _print(report)
    else:
        print(f"model {report['model']} ({report['model_fingerprint'][:16]}…), domain {report['domain_id']}, "
              f"shift {report['shift']}")
        print(f"  samples           {report['samples']}")
        print(f"  sha256_equal      {report['sha256_equal']}/{report['samples']}")
        kl = report["kl_max"]
        print(f"  kl_max            {'nan' if kl is None else format(kl, '.3g')}")
        print(f"  argmax_agreement  {report['argmax_agreement']:.4f}")
    return 0 if args.shift or report["sha256_equal"] == report["samples"] else 1


def cmd_stats(args) -> int:
    with _open_store(args.store, must_exist=True, readonly_fallback=True) as store:
        from tieredkv.cli.store_cmds import document_rows

        st = store.stats()
        st["artifacts"] = store.list_manifests()
        st["documents"] = document_rows(store)
    _print(st)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from tieredkv import __version__

    p = OneLineParser(prog="tieredkv", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tieredkv {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("deposit", help="prefill a text once and keep it as byte-exact KV pages")
    _model_arg(d)
    store_args(d)
    d.add_argument("file", nargs="?")
    d.add_argument("--text", type=utf8_text)
    d.add_argument("--name", type=utf8_text, default="")
    d.add_argument("--page-size", type=int_between(1, MAX_PAGE_SIZE),
                   help="tokens per page and prefill chunk (default: the model's, 128 for smollm2); 512 deposits "
                        "as fast as a plain prefill on CPU, grafts and reuse then cut at 512-token boundaries")
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_deposit)

    g = sub.add_parser("graft", help="graft a deposited artifact at its own positions and continue generating")
    _model_arg(g)
    store_args(g, artifact="required")
    g.add_argument("--prompt", type=utf8_text, required=True)
    g.add_argument("--max-new-tokens", type=positive_int, default=32)  # the window bounds it (_check_window)
    g.add_argument("--allow-domain-mismatch", action="store_true",
                   help="graft across determinism domains (the byte-exact guarantee no longer holds)")
    g.set_defaults(fn=cmd_graft)

    v = sub.add_parser("verify", help="graft vs fresh: SHA-256 of logits, KL, argmax agreement over N samples")
    _model_arg(v)
    v.add_argument("--tokens", type=int_at_least(2), default=256,
                   help="prefix length, varied per sample (default 256)")
    v.add_argument("--samples", type=positive_int, default=50)
    v.add_argument("--continuation", type=positive_int, default=16)
    v.add_argument("--shift", type=int_between(0, MAX_SHIFT), default=0,
                   help="graft K positions away (keys re-rotated) to measure drift")
    v.add_argument("--page-size", type=int_between(1, MAX_PAGE_SIZE))
    v.add_argument("--seed", type=int_between(0, 2**63 - 1), default=0)
    v.add_argument("--json", action="store_true")
    v.add_argument("--rows", action="store_true", help="include per-sample rows (hashes) in the output")
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(fn=cmd_verify)

    s = sub.add_parser("stats", help="pages, bytes, hits, misses and evictions per tier, integrity summary, documents")
    store_args(s)
    s.set_defaults(fn=cmd_stats)

    # Further command groups live in their own modules, each with `register(subparsers)`.
    for mod in EXTENSIONS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. NOTE: the one error boundary of the CLI: whatever fails, the user gets one line
    on stderr and exit status 2 (set TIEREDKV_DEBUG=1 to see the traceback of an unexpected error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage error (one line, already printed) or --help: its status, as a return value
        return exc.code if isinstance(exc.code, int) else 2
    shown, warnings.showwarning = warnings.showwarning, _warning_line
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("tieredkv: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: every failure becomes one line
        if isinstance(e, BrokenPipeError) and _stdout_is_broken():  # not another pipe (a socket)
            return _stdout_gone()
        if os.environ.get(DEBUG_ENV):
            raise
        print(error_line(e), file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = shown


def _warning_line(message, category, _filename, _lineno, file=None, _line=None) -> None:
    """A warning as one line, as errors are (not Python's file:line, category and source line)."""
    out = file or sys.stderr
    if out is not None:  # NOTE: None where stderr was closed; print(file=None) would write to stdout
        print(f"tieredkv: warning: {category.__name__}: {' '.join(str(message).split())}", file=out)


def _stdout_is_broken() -> bool:
    """Whether stdout is a pipe nobody reads any more (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no real stdout
        return False


def _stdout_gone() -> int:
    """Whoever read our output stopped reading (`tieredkv stats | head`): stop quietly, as `cat` does,
    with the status of a process that SIGPIPE ended (128 + 13). Whatever is still buffered goes to
    /dev/null, so the interpreter's last flush finds no broken pipe either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def error_line(e: BaseException) -> str:
    """One line naming what failed and what to do."""
    text = " ".join(str(e).split()) or "(no message)"
    if isinstance(e, (TieredKVError, PagingError)) or type(e).__module__.startswith(("index", "paging", "tieredkv")):
        return f"tieredkv: error: {type(e).__name__}: {text}"
    if isinstance(e, OSError):
        where = f" ({e.filename})" if getattr(e, "filename", None) and str(e.filename) not in text else ""
        return f"tieredkv: error: {type(e).__name__}: {text}{where}; check the path, its permissions and free space"
    return (f"tieredkv: error: unexpected {type(e).__name__}: {text} — this is a bug in tieredkv; run again with "
            f"{DEBUG_ENV}=1 for the traceback and report it")


if __name__ == "__main__":
    sys.exit(main())
