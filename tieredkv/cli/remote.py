"""`tieredkv remote ...`: a shared Redis/Valkey tier — check it, push a store to it, pull an artifact.

    tieredkv remote ping --remote redis://host:6379/0
    tieredkv remote ls   --remote URL
    tieredkv remote push --store DIR --remote URL [--artifact ID]   # local pages + manifests -> server
    tieredkv remote pull --store DIR --remote URL --artifact ID     # server -> local, verified

Unlike a PageStore (which degrades to its local tiers), these commands fail loudly when the
server cannot be reached: that is what they are for.
"""
from __future__ import annotations

import argparse
import time

from paging.errors import PageNotFoundError, PagingError
from tieredkv.cli.common import print_json, store_args
from tieredkv.errors import TieredKVError


def _tier(url: str):
    from paging import RemoteTier

    return RemoteTier(url)


def cmd_ping(args) -> int:
    tier = _tier(args.remote)
    try:
        rtt = min(tier.ping() for _ in range(5))
        print_json({"remote": tier.config.safe_url, "rtt_ms": round(rtt * 1e3, 3), **tier.server_info(),
                    "artifacts": len(tier.list_manifests())})
    finally:
        tier.close()
    return 0


def cmd_ls(args) -> int:
    tier = _tier(args.remote)
    try:
        ids = tier.list_manifests()
        print_json({"remote": tier.config.safe_url, "artifacts": ids,
                    "documents": [_remote_document(tier, i) for i in ids]})
    finally:
        tier.close()
    return 0


def _remote_document(tier, artifact_id: str) -> dict:
    """id, name, tokens, pages and model of a manifest on the server (unreadable: the reason instead)."""
    from paging.documents import manifest_fields

    try:
        data = tier.get_manifest(artifact_id)
        m = manifest_fields(data) if data is not None else None
    except (PagingError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        return {"artifact": artifact_id, "error": f"{type(exc).__name__}: {exc}"}
    if m is None:
        return {"artifact": artifact_id, "error": "gone from the server"}
    return {"artifact": artifact_id, "name": m["name"], "tokens": m["tokens"], "pages": len(m["pages"]),
            "model": m["fingerprint"][:12]}


def cmd_push(args) -> int:
    from tieredkv.artifacts.artifact import load_artifact
    from tieredkv.artifacts.manifest import iter_pages, parse_manifest
    from tieredkv.cli.common import open_store

    t = time.perf_counter()
    tier = _tier(args.remote)
    try:
        tier.ping()  # fail now, not half-way
        with open_store(args.store, must_exist=True, remote_from_env=False) as store:
            if args.artifact:
                arts = [load_artifact(store, args.artifact)]
            else:
                arts = [parse_manifest(store.get_manifest(i), stored_as=i, where=store.path)
                        for i in store.list_manifests()]
            # NOTE: every manifest is verified and every page it names read back and chained before anything
            # is sent: the server never names an artifact that a reader could not graft
            incomplete = []
            for art in arts:
                try:
                    for _ in iter_pages(store, art, local_only=True):
                        pass
                except (PagingError, TieredKVError) as exc:
                    incomplete.append(f"{art.artifact_id} ({' '.join(str(exc).split())[:160]})")
            if incomplete:
                raise TieredKVError(f"not pushing: {len(incomplete)} artifacts of {args.store} "
                                    "are incomplete or broken: "
                                    f"{'; '.join(incomplete[:3])} — `tieredkv check --store {args.store}` shows what "
                                    "is wrong; re-import or re-deposit them, or push the sound ones with --artifact")
            keys = list(dict.fromkeys(k for art in arts for k in art.page_keys)) if args.artifact else \
                list(store.lmdb_tier.keys())
            num_bytes = 0
            for i in range(0, len(keys), tier.config.batch_pages):
                pages = store.get_many(keys[i:i + tier.config.batch_pages])  # verified locally first
                tier.put_many(pages)
                num_bytes += sum(p.nbytes for p in pages)
            for art in arts:  # manifests after every page they name
                tier.put_manifest(art.artifact_id, store.get_manifest(art.artifact_id))
    finally:
        tier.close()
    print_json({"remote": tier.config.safe_url, "pages": len(keys), "payload_bytes": num_bytes,
                "artifacts": [art.artifact_id for art in arts], "seconds": round(time.perf_counter() - t, 3)})
    return 0


def cmd_pull(args) -> int:
    from tieredkv.artifacts.artifact import STORE_FINGERPRINT_META, store_fingerprint
    from tieredkv.artifacts.manifest import ChainWalker, check_root, iter_pages, parse_manifest, read_back
    from tieredkv.cli.common import open_store
    from tieredkv.errors import ArtifactNotFoundError, ModelMismatchError

    t = time.perf_counter()
    tier = _tier(args.remote)
    try:
        tier.ping()  # unreachable: one clear error, before the local store is touched
        ids = tier.list_manifests()
        matches = [i for i in ids if i == args.artifact] or [i for i in ids if i.startswith(args.artifact)]
        if len(matches) != 1:
            what = "ambiguous prefix" if matches else "no artifact"
            raise ArtifactNotFoundError(f"{what} {args.artifact!r} on {tier.config.safe_url} ({len(ids)} artifacts "
                                        f"there); `tieredkv remote ls --remote URL` lists them")
        data = tier.get_manifest(matches[0])
        art = parse_manifest(data, stored_as=matches[0], where=tier.config.safe_url)  # before anything is written
        # NOTE: not nothing_left_if_refused: an interrupted pull keeps its verified pages, so the next one
        # fetches only what is missing
        with open_store(args.store, remote_from_env=False) as store:
            bound = store_fingerprint(store)
            if bound is not None and bound != art.fingerprint:
                raise ModelMismatchError(f"store {args.store}", bound, art.fingerprint)
            # NOTE: the page that ends the artifact first (the manifest's token count against it), then every
            # page in order, verified and chained before its batch is committed; the manifest last. Nothing is
            # written for a manifest that does not hold, an interrupted pull leaves verified pages and no
            # visible artifact, and the next pull fetches only what is missing.
            check_root(art, _fetch(tier, store, art, [art.root_sha256])[0][0])
            walker, arrived = ChainWalker(art), 0
            for i in range(0, len(art.page_keys), tier.config.batch_pages):
                pages, fetched = _fetch(tier, store, art, list(art.page_keys[i:i + tier.config.batch_pages]))
                for page in pages:
                    walker.step(page)
                if fetched:
                    store.put_many(fetched)  # one transaction per batch: a second pull resumes after it
                    arrived += len(fetched)
            if bound is None:
                store.set_meta(STORE_FINGERPRINT_META, art.fingerprint)
            for _ in iter_pages(store, art, local_only=True):  # every page in LMDB, verified and chained
                pass
            store.keep_manifest(art.artifact_id, data)
            read_back(store, art)
            remote = dict(tier.counters)
    finally:
        tier.close()
    print_json({"artifact": art.artifact_id, "pages": len(art.page_keys), "pages_pulled": arrived,
                "bytes_pulled": remote["bytes_got"], "corrupt_detected": remote["corrupt_detected"],
                "store": args.store, "seconds": round(time.perf_counter() - t, 3)})
    return 0


def _fetch(tier, store, art, keys: list[str]):
    """(pages of `keys` in order, the ones that came from the server): local copies are used as they are."""
    local = {k: store.lmdb_tier.get(k) for k in keys}
    need = [k for k in keys if local[k] is None]
    pages, corrupt = tier.fetch(need) if need else ([], {})
    if corrupt:
        raise next(iter(corrupt.values()))
    lost = [k for k, p in zip(need, pages) if p is None]
    if lost:
        raise PageNotFoundError(f"page {lost[0]} of artifact {art.artifact_id} is not on {tier.config.safe_url} "
                                f"({len(lost)} missing in this batch; evicted or never pushed): nothing of the "
                                "artifact was made visible — push it again from a store that holds it")
    got = dict(zip(need, pages))
    return [local[k] or got[k] for k in keys], pages


def register(sub) -> None:
    r = sub.add_parser("remote", help="a shared Redis/Valkey tier: ping, ls, push a store, pull an artifact")
    rsub = r.add_subparsers(dest="remote_cmd", required=True)

    def url_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--remote", required=True, help="redis://host:6379/0, redis+cluster://host:7000, "
                       "with ?timeout=&retries=&batch=&ttl=&prefix= (see docs/REMOTE.md)")

    p = rsub.add_parser("ping", help="round trip, server version and eviction policy")
    url_arg(p)
    p.set_defaults(fn=cmd_ping)
    p = rsub.add_parser("ls", help="artifacts whose manifests are on the server")
    url_arg(p)
    p.set_defaults(fn=cmd_ls)
    p = rsub.add_parser("push", help="upload a local store's pages and manifests (or one artifact)")
    url_arg(p)
    store_args(p, artifact="optional")
    p.set_defaults(fn=cmd_push)
    p = rsub.add_parser("pull", help="download an artifact (manifest + pages, verified) into a local store")
    url_arg(p)
    store_args(p, artifact="required")
    p.set_defaults(fn=cmd_pull)
