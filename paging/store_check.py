"""`PageStore.check`: pages re-hashed, manifests read, each document's chain of pages walked, the store
compared with its commit record; one hint per kind of finding.

What paging can tell without knowing models: a page whose bytes fail their SHA-256 (quarantined), a manifest
that does not read, a document missing pages (corrupt ones are quarantined; others were removed outside the
store's own commands or lost), a chain whose pages do not follow each other, a store that is not what it
committed. `tieredkv check` (tieredkv/artifacts/check.py) adds what needs the artifact format: that each
manifest is genuine (its id commits to its model, domain and root) and the store's model binding.
"""
from __future__ import annotations

from typing import Any

from .documents import PageStore, pages_of
from .errors import (
    REBUILD_HINT,
    CorruptPageError,
    ManifestNotFoundError,
    PageNotFoundError,
)
from .framing import is_int, strict_json

HINTS = {
    "damage": f"the store does not match its commit record: nothing more is written to it — {REBUILD_HINT}",
    "forged": "{n} artifacts hold pages that do not reproduce with this model in their own domain (forged, or made "
              "by other software): do not graft them; delete them and deposit them again",
    "corrupt": "corrupt bytes were quarantined and will not be served; re-import the affected artifacts from a "
               "verified file (`tieredkv import`) or deposit them again",
    "missing": "{n} artifacts are missing pages no tier holds (freed outside `tieredkv rm`/`gc`, or lost): they "
               "cannot be grafted; re-import them from a verified file (`tieredkv import`), deposit them again, or "
               "remove them (`tieredkv rm`); free pages only with `tieredkv rm` or `gc`, which keep pages other "
               "documents share",
    "manifests": "{n} manifests are not genuine or do not read: nothing of them is used; remove them (`tieredkv rm`) "
                 "and re-import or deposit those artifacts again",
    "chains": "{n} artifacts' pages do not form their chain: do not graft them; re-import or deposit them again",
}
HEALTHY = "every checked page and manifest verified, and the store matches its commit record"


def check_pages_and_documents(store: PageStore, sample: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """The whole report: see the module docstring; `healthy` is True only when nothing was found."""
    lm = store.lmdb_tier
    damage = lm.audit()
    report = lm.check(sample=sample, seed=seed)
    for key in report["quarantined_keys"]:
        store.forget_pages([key])
    corrupt_manifests = list(lm.damaged_manifest_keys())
    incomplete: dict[str, dict[str, Any]] = {}
    broken: dict[str, str] = {}
    seen: dict[str, tuple[str, int, str, int]] = {}  # key -> (parent, start, fingerprint, tokens)
    artifacts = store.list_manifests()
    for artifact_id in artifacts:
        try:
            data = store.get_manifest(artifact_id)
            keys, num_tokens = pages_of(data), strict_json(data).get("tokens")
            if not is_int(num_tokens):
                raise ValueError("no token count")
        except (CorruptPageError, ManifestNotFoundError, ValueError, UnicodeDecodeError, RecursionError):
            corrupt_manifests.append(artifact_id)
            continue
        missing = [k for k in keys if not store.contains(k)]
        if missing:
            incomplete[artifact_id] = {"missing_pages": len(missing), "first_missing": missing[0]}
            continue
        why = chain_problem(store, keys, num_tokens, seen)
        if why:
            broken[artifact_id] = why
    out = {**report, "quarantined_total": lm.num_quarantined, "artifacts": len(artifacts),
           "corrupt_manifests": corrupt_manifests, "incomplete_artifacts": incomplete, "broken_chains": broken,
           "store_damage": damage, "commit_record": lm.record_note or "matches the store"}
    return finish(store, out)


def finish(store: PageStore, report: dict[str, Any], forged: list[str] = ()) -> dict[str, Any]:
    """Set `healthy` and `hint` (one sentence per kind of finding, the gravest first) from the findings."""
    lm = store.lmdb_tier
    quarantined = {i for i, v in report["incomplete_artifacts"].items()
                   if lm.get_quarantined(v["first_missing"]) is not None}
    found = [("damage", 1 if report["store_damage"] else 0), ("forged", len(forged)),
             ("corrupt", int(bool(report["corrupt"] or quarantined))),
             ("missing", len(report["incomplete_artifacts"]) - len(quarantined)),
             ("manifests", len(report["corrupt_manifests"])), ("chains", len(report["broken_chains"]))]
    hints = [HINTS[kind].format(n=n) for kind, n in found if n]
    report["healthy"] = not hints
    report["hint"] = "; also ".join(hints) if hints else HEALTHY
    return report


def chain_problem(store: PageStore, keys: list[str], num_tokens: int | None, seen: dict,
                  fingerprint: str | None = None) -> str | None:
    """Why the pages `keys` do not form one chain of `num_tokens` tokens (None: any count), or None if they
    do: each page's
    parent is the page before it, at the next position, all with one fingerprint (`fingerprint` when given).
    Each page is read once per check (`seen` keeps the headers)."""
    parent, pos = "0" * 64, 0
    for key in keys:
        if key not in seen:
            try:
                page = store.lmdb_tier.get(key) or (store.get(key) if store.contains(key) else None)
            except CorruptPageError as exc:
                return f"page {key}: {exc.reason}"
            except PageNotFoundError:
                page = None
            if page is None:
                return f"page {key} vanished during the check"
            seen[key] = (page.parent_key, page.start, page.fingerprint, page.num_tokens)
        p_parent, p_start, p_fp, n = seen[key]
        fingerprint = p_fp if fingerprint is None else fingerprint
        if p_parent != parent or p_start != pos or p_fp != fingerprint:
            return f"page {key} does not follow the page before it (parent, position or fingerprint differs)"
        parent, pos = key, pos + n
    return None if num_tokens is None or pos == num_tokens else \
        f"its pages hold {pos} tokens, the manifest says {num_tokens}"
