"""CLI: `export`, `import` and `check` — moving artifacts between machines, and store integrity.

    tieredkv export --store DIR --artifact ID -o FILE
    tieredkv import FILE --store DIR [--model NAME [--allow-domain-mismatch]]
    tieredkv check  --store DIR [--sample FRACTION] [--seed N]

`check` exits 1 when it finds corrupt pages or manifests, or artifacts whose pages are gone
(quarantined earlier): the store cannot serve them until they are re-imported or re-deposited.
"""
from __future__ import annotations

import argparse

from tieredkv.cli.common import model_arg, open_store, print_json


def cmd_export(a) -> int:
    from tieredkv.artifacts.portable import export_artifact
    from tieredkv.progress import count_bar

    with open_store(a.store) as store, count_bar("export", None, unit="page", quiet=a.quiet) as bar:
        summary = export_artifact(store, a.artifact, a.output, progress=bar)
    print_json({**summary, "store": str(a.store)})
    return 0


def cmd_import(a) -> int:
    from tieredkv.artifacts.portable import import_artifact, read_header
    from tieredkv.progress import count_bar

    expected_fp = expected_domain = None
    if a.model is not None:
        from tieredkv.domain import determinism_domain
        from tieredkv.models import load_model

        lm = load_model(a.model)
        page_size = read_header(a.file).artifact.page_size
        expected_fp, expected_domain = lm.fingerprint, determinism_domain(lm.model, lm.fingerprint, page_size)
    elif a.allow_domain_mismatch:
        raise SystemExit("tieredkv import: --allow-domain-mismatch needs --model (the domain to compare with)")
    with open_store(a.store) as store, count_bar("import", None, unit="page", quiet=a.quiet) as bar:
        art = import_artifact(a.file, store, expected_fingerprint=expected_fp, expected_domain=expected_domain,
                              allow_domain_mismatch=a.allow_domain_mismatch, progress=bar)
    print_json({**art.summary(), "store": str(a.store), "file": str(a.file)})
    return 0


def cmd_check(a) -> int:
    from tieredkv.artifacts.check import check_store

    with open_store(a.store) as store:
        report = check_store(store, sample=a.sample, seed=a.seed)
    print_json(report)
    return 1 if report["corrupt"] or report["corrupt_manifests"] or report["incomplete_artifacts"] else 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--sample must be in (0, 1], got {text}")
    return value


def register(sub) -> None:
    e = sub.add_parser("export", help="write an artifact to one portable, verified file")
    e.add_argument("--store", required=True)
    e.add_argument("--artifact", required=True, help="artifact id or unique prefix")
    e.add_argument("-o", "--output", required=True, help="file to write (atomically replaced)")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(fn=cmd_export)

    i = sub.add_parser("import", help="verify an artifact file completely, then add it to a store")
    i.add_argument("file")
    i.add_argument("--store", required=True)
    model_arg(i, default=None)
    i.add_argument("--allow-domain-mismatch", action="store_true",
                   help="import although --model runs in another determinism domain (no byte-exact guarantee)")
    i.add_argument("--quiet", action="store_true")
    i.set_defaults(fn=cmd_import)

    c = sub.add_parser("check", help="re-hash stored pages; quarantine and report corrupt ones; exit 1 if any "
                       "page or manifest is corrupt or an artifact lacks pages")
    c.add_argument("--store", required=True)
    c.add_argument("--sample", type=_fraction, default=1.0, help="fraction of pages to re-hash (default 1)")
    c.add_argument("--seed", type=int, default=0, help="which pages a --sample below 1 picks")
    c.set_defaults(fn=cmd_check)
