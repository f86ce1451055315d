"""`tieredkv ls`, `rm` and `gc`: the documents of a store, removed with their own pages, unreferenced pages freed.

    tieredkv ls --store DIR [--json]              # name, id, tokens, pages, bytes, model, created, last used
    tieredkv rm NAME|ID ... --store DIR [--dry-run]   # pages other documents share stay; bytes freed reported
    tieredkv gc --store DIR [--dry-run]           # pages no document lists (left by a crash)
"""
from __future__ import annotations

import time
from typing import Any

from tieredkv.cli.common import open_store, print_json, store_args


def _when(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f}"


def document_rows(store) -> list[dict[str, Any]]:
    """One JSON row per stored document (times as ISO 8601 UTC)."""
    return [{"name": d.name, "artifact": d.artifact_id, "tokens": d.num_tokens, "pages": d.num_pages,
             "bytes": d.num_bytes, "own_bytes": d.own_bytes, "missing_pages": d.num_missing,
             "model": d.fingerprint[:12], "created": _when(d.created), "last_used": _when(d.last_used)}
            for d in store.list_documents()]


def cmd_ls(args) -> int:
    with open_store(args.store, must_exist=True) as store:
        rows, stats = document_rows(store), store.stats()
    lmdb = stats["lmdb"]
    summary = {"documents": len(rows), "pages": lmdb["pages"], "bytes": lmdb["bytes"],
               "max_disk_bytes": stats["disk_cap"]["max_disk_bytes"], "quarantined": lmdb["quarantined"]}
    if args.json:
        print_json({"store": args.store, "documents": rows, "summary": summary, "stats": stats})
        return 0
    head = ("NAME", "ID", "TOKENS", "PAGES", "MIB", "OWN MIB", "MODEL", "CREATED", "LAST USED")
    table = [head] + [(r["name"] or "-", r["artifact"], str(r["tokens"]), str(r["pages"]), _mib(r["bytes"]),
                       _mib(r["own_bytes"]), r["model"], r["created"] or "-", r["last_used"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"{summary['documents']} documents, {summary['pages']} pages, {_mib(summary['bytes'])} MiB of pages in "
          f"{args.store}" + (f" (quarantined: {summary['quarantined']})" if summary["quarantined"] else ""))
    return 0


def cmd_rm(args) -> int:
    out = []
    with open_store(args.store, must_exist=True) as store:
        ids = list(dict.fromkeys(store.find_document(ref) for ref in args.documents))  # all found before any goes
        names = {d.artifact_id: d.name for d in store.list_documents()}
        for artifact_id in ids:
            out.append({**store.delete_document(artifact_id, dry_run=args.dry_run).to_dict(),
                        "name": names.get(artifact_id, "")})
    freed = {"pages_freed": sum(r["pages_freed"] for r in out), "bytes_freed": sum(r["bytes_freed"] for r in out)}
    print_json({"store": args.store, "removed": out, **freed, "dry_run": args.dry_run})
    return 0


def cmd_gc(args) -> int:
    with open_store(args.store, must_exist=True) as store:
        removal = store.gc(dry_run=args.dry_run)
    print_json({"store": args.store, **removal.to_dict()})
    return 0


def register(sub) -> None:
    p = sub.add_parser("ls", help="the documents of a store: name, id, tokens, pages, bytes, model, created, last used")
    store_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object: documents, summary and the store's stats")
    p.set_defaults(fn=cmd_ls)

    p = sub.add_parser("rm", help="remove documents; pages other documents share stay, the bytes freed are reported")
    p.add_argument("documents", nargs="+", metavar="NAME|ID", help="a name, an id or a unique id prefix")
    store_args(p)
    p.add_argument("--dry-run", action="store_true", help="report what would be freed, change nothing")
    p.set_defaults(fn=cmd_rm)

    p = sub.add_parser("gc", help="free the pages no document lists (left by a crash between pages and manifest)")
    store_args(p)
    p.add_argument("--dry-run", action="store_true", help="report what would be freed, change nothing")
    p.set_defaults(fn=cmd_gc)
