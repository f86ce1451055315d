"""The remote tier against a real 3-node Redis cluster (no replicas) on loopback."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from paging import (
    CorruptPageError,
    PageNotFoundError,
    PageStore,
    RemoteTier,
    RemoteTierWarning,
    RemoteUnavailableError,
    StoreConfig,
)
from testkit.redis_server import RedisCluster3, requires_server
from tests.remote.test_tier import FP, make_chain

pytestmark = requires_server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with RedisCluster3(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def test_pages_spread_over_every_node_and_read_back_verified(cluster, tmp_path):
    pages = make_chain(30)
    with PageStore(tmp_path / "a", StoreConfig(remote=cluster.url)) as a:
        a.put_many(pages)
        a.put_manifest("art", b"m")
    per_node = [redis.Redis(port=n.port).dbsize() for n in cluster.nodes]
    assert all(n > 0 for n in per_node) and sum(per_node) == 30 + 3  # + 2 sets + manifest
    with PageStore(tmp_path / "b", StoreConfig(remote=cluster.url + "?batch=7")) as b:
        assert b.list_manifests() == ["art"] and b.get_manifest("art") == b"m"
        assert b.get_many([p.key for p in pages]) == pages
        assert b.stats()["remote"]["hits"] == 30
    tier = RemoteTier(cluster.url)
    assert sorted(tier.keys()) == sorted(p.key for p in pages)  # SCAN over every node


def test_tampered_page_on_a_cluster_node_is_detected(cluster):
    page = make_chain(1, seed=5)[0]
    tier = RemoteTier(cluster.url)
    tier.put(page)
    name = tier.page_name(FP, page.key)
    raw = redis.cluster.RedisCluster.from_url(cluster.url.replace("redis+cluster", "redis"))
    raw.set(name, raw.get(name)[:-1] + b"\x01")
    with pytest.raises(CorruptPageError):
        tier.get(page.key)
    assert raw.get(name) is None
    raw.close()


def test_a_dead_node_is_a_clear_error_and_the_store_degrades(cluster, tmp_path):
    pages = make_chain(12, seed=9)
    url = cluster.url + "?retries=1&backoff=0.01&connect_timeout=0.5&timeout=1&down=60"
    RemoteTier(url).put_many(pages)
    cluster.nodes[2].kill()
    try:
        with pytest.raises(RemoteUnavailableError, match="unreachable"):
            RemoteTier(url, fingerprints=[FP]).get_many([p.key for p in pages])
        # pages on the live nodes first: served verified; then the dead node's: a warning, then misses
        tier = RemoteTier(url)
        on_dead = {p.key: key_slot(tier.page_name(FP, p.key).encode()) >= 10923 for p in pages}
        live, dead = [p for p in pages if not on_dead[p.key]], [p for p in pages if on_dead[p.key]]
        assert live and dead
        with pytest.warns(RemoteTierWarning):
            with PageStore(tmp_path / "c", StoreConfig(remote=url)) as c:
                assert [c.get(p.key) for p in live] == live
                for p in dead:
                    with pytest.raises(PageNotFoundError):
                        c.get(p.key)
    finally:
        cluster.nodes[2].start()
