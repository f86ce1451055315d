"""`check_store`: re-hash a store's pages and manifests; quarantine what fails, say what broke.

A corrupt page is moved to quarantine by PageStore.check (it is never served again); the
artifacts that name it are reported as incomplete, to be re-imported or re-deposited.
"""
from __future__ import annotations

import json
from typing import Any

from paging import PageStore
from paging.errors import CorruptPageError, ManifestNotFoundError


def check_store(store: PageStore, *, sample: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Re-verify a `sample` fraction of the pages and every manifest; JSON-able report."""
    report = store.check(sample=sample, seed=seed)
    corrupt_manifests, incomplete = [], {}
    for artifact_id in store.list_manifests():
        try:
            manifest = json.loads(store.get_manifest(artifact_id))
            keys = manifest["pages"]
        except (CorruptPageError, ManifestNotFoundError, ValueError, KeyError, TypeError):
            corrupt_manifests.append(artifact_id)
            continue
        missing = [k for k in keys if not store.contains(k)]
        if missing:
            incomplete[artifact_id] = {"missing_pages": len(missing), "first_missing": missing[0]}
    return {
        "store": store.path,
        "sample": sample,
        "checked": report["checked"],
        "ok": report["ok"],
        "corrupt": report["corrupt"],
        "quarantined_keys": report["quarantined_keys"],
        "quarantined_total": store.lmdb_tier.num_quarantined,
        "artifacts": len(store.list_manifests()),
        "corrupt_manifests": corrupt_manifests,
        "incomplete_artifacts": incomplete,
        "hint": _hint(report["corrupt"], corrupt_manifests, incomplete),
    }


def _hint(num_corrupt: int, corrupt_manifests: list[str], incomplete: dict) -> str:
    if not (num_corrupt or corrupt_manifests or incomplete):
        return "every checked page and manifest verified"
    return ("corrupt bytes were quarantined and will not be served; re-import the affected artifacts from "
            "a verified file (`tieredkv import`) or deposit them again")
