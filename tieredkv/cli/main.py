"""The `tieredkv` command line. Each subcommand prints JSON or text; errors are one line that says what to do."""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from tieredkv.cli.common import model_arg as _model_arg, open_store as _open_store, print_json as _print
from tieredkv.errors import TieredKVError
from paging.errors import PagingError


EXTENSIONS = ("tieredkv.cli.qa", "tieredkv.cli.portable", "tieredkv.cli.remote", "tieredkv.cli.library",
              "tieredkv.cli.recheck")


def cmd_deposit(a) -> int:
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models import load_model
    from tieredkv.progress import token_bar

    if (a.file is None) == (a.text is None):
        raise TieredKVError("give exactly one of FILE or --text")
    text = a.text if a.text is not None else Path(a.file).read_text(encoding="utf-8")
    lm = load_model(a.model)
    with _open_store(a.store) as store, token_bar("deposit", quiet=a.quiet) as bar:
        art = deposit(lm, text, store, page_size=a.page_size, name=a.name or (a.file or ""), progress=bar)
    _print({**art.summary(), "store": str(a.store)})
    return 0


def cmd_graft(a) -> int:
    import torch

    from tieredkv.artifacts.artifact import graft, grafted_token_ids, load_artifact
    from tieredkv.models import load_model

    lm = load_model(a.model)
    with _open_store(a.store) as store:
        art = load_artifact(store, a.artifact)
        cache = graft(lm, art, store, allow_domain_mismatch=a.allow_domain_mismatch)
        prefix = grafted_token_ids(store, art)
    new = lm.codec.encode(a.prompt)
    ids = torch.tensor([prefix + new])
    with torch.inference_mode():
        out = lm.model.generate(ids, past_key_values=cache, max_new_tokens=a.max_new_tokens, do_sample=False,
                                pad_token_id=lm.codec.eos_token_id)
    print(lm.codec.decode(out[0, ids.shape[1]:].tolist()))
    return 0


def cmd_verify(a) -> int:
    from tieredkv.models import load_model
    from tieredkv.progress import count_bar
    from tieredkv.verify import VerifySpec, verify

    lm = load_model(a.model)
    spec = VerifySpec(tokens=a.tokens, samples=a.samples, continuation=a.continuation, shift=a.shift,
                      page_size=a.page_size, seed=a.seed)
    with count_bar("verify", spec.samples, unit="sample", quiet=a.quiet or a.json) as bar:
        report = verify(lm, spec, progress=bar)
    if not a.rows:
        report.pop("rows")
    if a.json:
        _print(report)
    else:
        print(f"model {report['model']} ({report['model_fingerprint'][:16]}…), domain {report['domain_id']}, "
              f"shift {report['shift']}")
        print(f"  samples           {report['samples']}")
        print(f"  sha256_equal      {report['sha256_equal']}/{report['samples']}")
        kl = report["kl_max"]
        print(f"  kl_max            {'nan' if kl is None else format(kl, '.3g')}")
        print(f"  argmax_agreement  {report['argmax_agreement']:.4f}")
    return 0 if a.shift or report["sha256_equal"] == report["samples"] else 1


def cmd_stats(a) -> int:
    with _open_store(a.store) as store:
        st = store.stats()
        st["artifacts"] = store.list_manifests()
    _print(st)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tieredkv", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("deposit", help="prefill a text once and keep it as byte-exact KV pages")
    _model_arg(d)
    d.add_argument("--store", required=True)
    d.add_argument("file", nargs="?")
    d.add_argument("--text")
    d.add_argument("--name", default="")
    d.add_argument("--page-size", type=int)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(fn=cmd_deposit)

    g = sub.add_parser("graft", help="graft a deposited artifact at its own positions and continue generating")
    _model_arg(g)
    g.add_argument("--store", required=True)
    g.add_argument("--artifact", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--allow-domain-mismatch", action="store_true",
                   help="graft across determinism domains (the byte-exact guarantee no longer holds)")
    g.set_defaults(fn=cmd_graft)

    v = sub.add_parser("verify", help="graft vs fresh: SHA-256 of logits, KL, argmax agreement over N samples")
    _model_arg(v)
    v.add_argument("--tokens", type=int, default=256, help="prefix length, varied per sample (default 256)")
    v.add_argument("--samples", type=int, default=50)
    v.add_argument("--continuation", type=int, default=16)
    v.add_argument("--shift", type=int, default=0, help="graft K positions away (keys re-rotated) to measure drift")
    v.add_argument("--page-size", type=int)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", action="store_true")
    v.add_argument("--rows", action="store_true", help="include per-sample rows (hashes) in the output")
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(fn=cmd_verify)

    s = sub.add_parser("stats", help="pages, bytes per tier, integrity summary")
    s.add_argument("--store", required=True)
    s.set_defaults(fn=cmd_stats)

    # Further command groups live in their own modules, each with `register(subparsers)`.
    for mod in EXTENSIONS:
        importlib.import_module(mod).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (TieredKVError, PagingError, FileNotFoundError) as e:
        print(f"tieredkv: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
