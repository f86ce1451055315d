"""`check_store`: re-hash a store's pages and manifests; quarantine what fails, say what broke.

A corrupt page is moved to quarantine by PageStore.check (it is never served again); the
artifacts that name it are reported as incomplete, to be re-imported or re-deposited. Every
manifest is verified (manifest.py: its id commits to its model, domain and root) and every
complete artifact's pages are walked as a chain. The store itself is compared with its commit
record (paging/commit_record.py): a store that rolled back to an older snapshot is reported, not
called healthy, even when every page it still holds verifies.
"""
from __future__ import annotations

from typing import Any

from paging import PageStore
from paging.errors import REBUILD_HINT, CorruptPageError, ManifestNotFoundError, PageNotFoundError, StoreCorruptedError
from tieredkv.artifacts.artifact import store_fingerprint
from tieredkv.artifacts.manifest import ManifestIntegrityError, parse_manifest, verify_artifact


def check_store(store: PageStore, *, sample: float = 1.0, seed: int = 0,
                recompute: tuple[Any, float] | None = None) -> dict[str, Any]:
    """Re-verify a `sample` fraction of the pages, every manifest and chain, and the commit record.

    `recompute=(lm, fraction)` also recomputes a seeded `fraction` of each sound artifact's pages with
    model `lm` (recompute.py) and reports which do not reproduce; artifacts it cannot recompute here
    (another model or domain, a TieredModel context) are listed with the reason.
    """
    damage = store.lmdb_tier.audit()
    try:
        bound = store_fingerprint(store)
    except StoreCorruptedError as exc:
        bound = None
        damage.append(str(exc))
    other_model: list[str] = []
    report = store.check(sample=sample, seed=seed)
    corrupt_manifests = list(store.lmdb_tier.damaged_manifest_keys())
    incomplete: dict[str, dict[str, Any]] = {}
    broken_chains: dict[str, str] = {}
    seen: dict[str, tuple[str, int, str, int]] = {}  # key -> (parent, start, fingerprint, tokens)
    recomputed: list[dict[str, Any]] = []
    artifacts = store.list_manifests()
    for artifact_id in artifacts:
        try:
            art = parse_manifest(store.get_manifest(artifact_id), stored_as=artifact_id, where=store.path)
        except (CorruptPageError, ManifestNotFoundError, ManifestIntegrityError):
            corrupt_manifests.append(artifact_id)
            continue
        if bound is not None and art.fingerprint != bound:
            other_model.append(artifact_id)
        missing = [k for k in art.page_keys if not store.contains(k)]
        if missing:
            incomplete[artifact_id] = {"missing_pages": len(missing), "first_missing": missing[0]}
            continue
        why = _chain_problem(store, art, seen)
        if why:
            broken_chains[artifact_id] = why
        elif recompute is not None:
            recomputed.append(_recompute(store, art, *recompute, seed=f"{seed}:{artifact_id}"))
    if other_model:
        damage.append(f"store {store.path} is bound to model {bound[:16]}…, but {len(other_model)} of its artifacts "
                      f"({', '.join(other_model[:3])}) were made by another: its model_fingerprint meta was altered")
    forged = [r["artifact"] for r in recomputed if r.get("mismatches")]
    # NOTE: asked to recompute, an artifact that could not be is not verified: hashes alone cannot catch
    # forged K/V (a file whose every hash was recomputed), so it is never part of a healthy verdict
    not_verified = {r["artifact"]: r["skipped"] for r in recomputed if "skipped" in r}
    healthy = not (report["corrupt"] or corrupt_manifests or incomplete or broken_chains or damage or forged
                   or not_verified)
    return {
        "store": store.path,
        "sample": sample,
        "checked": report["checked"],
        "ok": report["ok"],
        "corrupt": report["corrupt"],
        "quarantined_keys": report["quarantined_keys"],
        "damaged_keys": report.get("damaged_keys", []),
        "quarantined_total": store.lmdb_tier.num_quarantined,
        "artifacts": len(artifacts),
        "corrupt_manifests": corrupt_manifests,
        "incomplete_artifacts": incomplete,
        "broken_chains": broken_chains,
        "store_damage": damage,
        **({} if recompute is None else {"recompute": _recompute_summary(recomputed, recompute[1]),
                                         "not_verified": not_verified}),
        "commit_record": store.lmdb_tier.record_note or "matches the store",
        "healthy": healthy,
        "hint": _hint(healthy, damage, forged, not_verified),
    }


def _chain_problem(store: PageStore, art, seen: dict) -> str | None:
    """Why `art`'s pages do not form its chain (None if they do); each page is read once per check."""
    page_fp = verify_artifact(art)
    parent, pos = "0" * 64, 0
    for key in art.page_keys:
        if key not in seen:
            try:
                page = store.lmdb_tier.get(key)
            except CorruptPageError as exc:
                return f"page {key}: {exc.reason}"
            except PageNotFoundError:
                page = None
            if page is None:
                return f"page {key} vanished during the check"
            seen[key] = (page.parent_key, page.start, page.fingerprint, page.num_tokens)
        p_parent, p_start, p_fp, n = seen[key]
        if p_parent != parent or p_start != pos or p_fp != page_fp:
            return f"page {key} does not follow the page before it (parent, position or fingerprint differs)"
        parent, pos = key, pos + n
    return None if pos == art.num_tokens else f"its pages hold {pos} tokens, the manifest says {art.num_tokens}"


def _recompute(store: PageStore, art, lm, fraction: float, *, seed: str) -> dict[str, Any]:
    from tieredkv.artifacts.manifest import iter_pages
    from tieredkv.artifacts.recompute import Recomputer, RecomputeMismatchError, why_not_recomputable

    why = why_not_recomputable(lm, art)
    if why is not None:
        return {"artifact": art.artifact_id, "pages": len(art.page_keys), "pages_recomputed": 0, "skipped": why}
    rec = Recomputer(lm, art, fraction, seed)
    try:
        for page in iter_pages(store, art, local_only=True):
            rec.feed(page)
            if rec.is_done:
                break
    except RecomputeMismatchError:
        pass
    return rec.report()


def _recompute_summary(rows: list[dict[str, Any]], fraction: float) -> dict[str, Any]:
    pages = sum(r["pages"] for r in rows if "skipped" not in r)
    done = sum(r["pages_recomputed"] for r in rows)
    return {"fraction_asked": fraction, "artifacts_recomputed": sum("skipped" not in r for r in rows),
            "artifacts_skipped": sum("skipped" in r for r in rows), "pages_recomputed": done,
            "pages_in_recomputed_artifacts": pages,
            "fraction_recomputed": round(done / pages, 4) if pages else 0.0,
            "forged_artifacts": [r["artifact"] for r in rows if r.get("mismatches")], "artifacts": rows}


def _hint(healthy: bool, damage: list[str], forged: list[str], not_verified: dict[str, str]) -> str:
    if healthy:
        return "every checked page and manifest verified, and the store matches its commit record"
    if forged:
        return (f"{len(forged)} artifacts hold pages that do not reproduce with this model in their own domain "
                "(forged, or made by other software): do not graft them; delete them and deposit them again")
    if not_verified:
        first, why = next(iter(not_verified.items()))
        return (f"{len(not_verified)} artifacts were NOT verified: they could not be recomputed here ({first}: "
                f"{why}); their hashes hold, but only recomputing their pages shows the K/V are the model's — "
                "recompute them with their model in their domain, or ingest their documents again")
    if damage:
        return f"the store does not match its commit record: nothing more is written to it — {REBUILD_HINT}"
    return ("corrupt bytes were quarantined and will not be served; re-import the affected artifacts from "
            "a verified file (`tieredkv import`) or deposit them again")
