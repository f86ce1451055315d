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

from tieredkv.cli.common import print_json


def _tier(url: str):
    from paging import RemoteTier

    return RemoteTier(url)


def cmd_ping(a) -> int:
    tier = _tier(a.remote)
    try:
        rtt = min(tier.ping() for _ in range(5))
        print_json({"remote": tier.config.safe_url, "rtt_ms": round(rtt * 1e3, 3), **tier.server_info(),
                    "artifacts": len(tier.list_manifests())})
    finally:
        tier.close()
    return 0


def cmd_ls(a) -> int:
    tier = _tier(a.remote)
    try:
        print_json({"remote": tier.config.safe_url, "artifacts": tier.list_manifests()})
    finally:
        tier.close()
    return 0


def cmd_push(a) -> int:
    from tieredkv.artifacts.artifact import load_artifact
    from tieredkv.cli.common import open_store

    t = time.perf_counter()
    tier = _tier(a.remote)
    with open_store(a.store) as store:
        if a.artifact:
            art = load_artifact(store, a.artifact)
            keys, ids = list(art.page_keys), [art.artifact_id]
        else:
            keys, ids = list(store.lmdb_tier.keys()), store.list_manifests()
        num_bytes = 0
        for i in range(0, len(keys), tier.config.batch_pages):
            pages = store.get_many(keys[i:i + tier.config.batch_pages])  # verified locally first
            tier.put_many(pages)
            num_bytes += sum(p.nbytes for p in pages)
        for artifact_id in ids:  # manifests after every page they name
            tier.put_manifest(artifact_id, store.get_manifest(artifact_id))
    tier.close()
    print_json({"remote": tier.config.safe_url, "pages": len(keys), "payload_bytes": num_bytes,
                "artifacts": ids, "seconds": round(time.perf_counter() - t, 3)})
    return 0


def cmd_pull(a) -> int:
    from paging import PageStore, StoreConfig
    from tieredkv.artifacts.artifact import load_artifact

    t = time.perf_counter()
    with PageStore(a.store, StoreConfig(remote=a.remote)) as store:
        art = load_artifact(store, a.artifact)  # the manifest, verified, kept locally
        arrived = store.prefetch(art.page_keys)
        store.get_many(art.page_keys)  # every page now local and verified, or a clear error
        remote = store.stats()["remote"]
    print_json({"artifact": art.artifact_id, "pages": len(art.page_keys), "pages_pulled": arrived,
                "bytes_pulled": remote["bytes_got"], "corrupt_detected": remote["corrupt_detected"],
                "store": a.store, "seconds": round(time.perf_counter() - t, 3)})
    return 0


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
    p.add_argument("--store", required=True)
    p.add_argument("--artifact", help="only this artifact (id or unique prefix)")
    p.set_defaults(fn=cmd_push)
    p = rsub.add_parser("pull", help="download an artifact (manifest + pages, verified) into a local store")
    url_arg(p)
    p.add_argument("--store", required=True)
    p.add_argument("--artifact", required=True)
    p.set_defaults(fn=cmd_pull)
