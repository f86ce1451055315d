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
from paging.errors import CorruptPageError, ManifestNotFoundError, StoreCorruptedError
from paging.store_check import chain_problem, finish
from tieredkv.artifacts.artifact import store_fingerprint
from tieredkv.artifacts.manifest import ManifestIntegrityError, parse_manifest, verify_artifact


def check_store(store: PageStore, *, sample: float = 1.0, seed: int = 0,
                recompute: tuple[Any, float] | None = None) -> dict[str, Any]:
    """Re-verify a `sample` fraction of the pages, every manifest and chain, and the commit record.

    `PageStore.check` does the pages, chains and commit record (paging/store_check.py); this adds what needs
    the artifact format: every manifest genuine (its id commits to its model, domain and root), its pages
    hashed with that model's fingerprint, and the store's model binding.
    `recompute=(lm, fraction)` also recomputes a seeded `fraction` of each sound artifact's pages with
    model `lm` (recompute.py) and reports which do not reproduce; artifacts it cannot recompute here
    (another model or domain, a TieredModel context) are listed with the reason.
    """
    report = store.check(sample=sample, seed=seed)
    damage = report["store_damage"]
    try:
        bound = store_fingerprint(store)
    except StoreCorruptedError as exc:
        bound = None
        damage.append(str(exc))
    other_model: list[str] = []
    corrupt, incomplete, broken = report["corrupt_manifests"], report["incomplete_artifacts"], report["broken_chains"]
    seen: dict[str, tuple[str, int, str, int]] = {}  # key -> (parent, start, fingerprint, tokens)
    recomputed: list[dict[str, Any]] = []
    for artifact_id in store.list_manifests():
        if artifact_id in corrupt:
            continue
        try:
            art = parse_manifest(store.get_manifest(artifact_id), stored_as=artifact_id, where=store.path)
        except (CorruptPageError, ManifestNotFoundError, ManifestIntegrityError):
            corrupt.append(artifact_id)
            incomplete.pop(artifact_id, None)
            broken.pop(artifact_id, None)
            continue
        if bound is not None and art.fingerprint != bound:
            other_model.append(artifact_id)
        if artifact_id in incomplete or artifact_id in broken:
            continue
        # NOTE: PageStore.check walked the chain (one fingerprint throughout): its first page's must be the model's
        why = chain_problem(store, list(art.page_keys[:1]), None, seen, fingerprint=verify_artifact(art))
        if why:
            broken[artifact_id] = why
        elif recompute is not None:
            recomputed.append(_recompute(store, art, *recompute, seed=f"{seed}:{artifact_id}"))
    if other_model:
        damage.append(f"store {store.path} is bound to model {bound[:16]}…, but {len(other_model)} of its artifacts "
                      f"({', '.join(other_model[:3])}) were made by another: its model_fingerprint meta was altered")
    forged = [r["artifact"] for r in recomputed if r.get("mismatches")]
    report = {"store": store.path, "sample": sample, **report}
    if recompute is not None:
        report["recompute"] = _recompute_summary(recomputed, recompute[1])
        # NOTE: asked to recompute, an artifact that could not be is not verified: hashes alone cannot catch
        # forged K/V (a file whose every hash was recomputed), so it is never part of a healthy verdict
        report["not_verified"] = {r["artifact"]: r["skipped"] for r in recomputed if "skipped" in r}
    report["commit_record"] = report.pop("commit_record")  # (keys in the order the report has always had)
    return _not_verified_verdict(finish(store, report, forged))


def _recompute(store: PageStore, art, lm, fraction: float, *, seed: str) -> dict[str, Any]:
    from tieredkv.artifacts.manifest import iter_pages
    from tieredkv.artifacts.recompute import RecomputeMismatchError, Recomputer, why_not_recomputable

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


def _not_verified_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """A store whose artifacts could not all be recomputed is not called healthy, and the hint says why."""
    not_verified = report.get("not_verified")
    if not not_verified:
        return report
    first, why = next(iter(not_verified.items()))
    hint = (f"{len(not_verified)} artifacts were NOT verified: they could not be recomputed here ({first}: {why}); "
            "their hashes hold, but only recomputing their pages shows the K/V are the model's — recompute them "
            "with their model in their domain, or ingest their documents again")
    report["hint"] = hint if report["healthy"] else f"{report['hint']}; also {hint}"
    report["healthy"] = False
    return report
