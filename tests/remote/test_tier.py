"""RemoteTier against a real redis-server: URL config, key layout, batching, verification,
tampering, eviction, kill and restart in the middle of a transfer."""

from __future__ import annotations

import hashlib
import os

import pytest
import redis
import torch

from paging import (
    FORMAT_VERSION,
    ROOT_KEY,
    CorruptPageError,
    ManifestNotFoundError,
    Page,
    PageConflictError,
    PageLayout,
    PageStore,
    PagingError,
    RemoteConfig,
    RemoteError,
    RemoteTier,
    RemoteTierWarning,
    RemoteUnavailableError,
    StoreConfig,
)
from testkit.faults import make_chain
from testkit.redis_server import RedisServer

FP, FP2 = "ab" * 32, "cd" * 32
LAYOUT = PageLayout(2, 1, 4, "float32", 4)  # 256 payload bytes per page


def raw_client(server) -> redis.Redis:
    return redis.Redis(port=server.port)


# -- configuration (no server) --------------------------------------------------------
def test_url_parsing_and_validation():
    c = RemoteConfig.from_url("redis://u:secret@10.0.0.5:6380/2?timeout=1.5&retries=5"
                              "&batch=8&ttl=60&prefix=lab&down=2&health_check_interval=30")
    assert (c.timeout_s, c.retries, c.batch_pages, c.page_ttl_s, c.prefix, c.down_s) == \
        (1.5, 5, 8, 60, "lab", 2.0)
    assert not c.is_cluster
    assert c.url == "redis://u:secret@10.0.0.5:6380/2?health_check_interval=30"
    assert "secret" not in c.safe_url and "u:***@10.0.0.5:6380" in c.safe_url
    assert RemoteConfig.from_url("redis+cluster://h:7000").is_cluster
    assert RemoteConfig.from_url("redis+cluster://h:7000").url == "redis://h:7000"
    assert RemoteConfig.from_url("rediss://h:7000?cluster=1").is_cluster
    assert RemoteConfig.from_url("unix:///run/redis.sock").url == "unix:///run/redis.sock"
    for bad in ("localhost:6379", "http://h:1", "redis://h?timeout=x", "redis://h?retries=-1",
                "redis://h?batch=0", "redis://h?cluster=maybe", "redis://h?prefix=a{b}",
                "redis://h?ttl=0", "unix:///s?cluster=1", None):
        with pytest.raises(PagingError):
            RemoteConfig.from_url(bad)


@pytest.mark.parametrize("url", ["redis://[::1", "redis://u:secret@[::1", "redis+cluster://[::1",
                                 "redis://[zz]:6379", "redis://]::1[", "redis://[::1?password=secret"])
def test_a_malformed_url_is_a_typed_error_without_the_password(url):
    for parse in (RemoteConfig.from_url, lambda u: StoreConfig(remote=u)):
        with pytest.raises(PagingError) as info:  # was: a raw ValueError "Invalid IPv6 URL"
            parse(url)
        assert "secret" not in str(info.value) and "\n" not in str(info.value)
        if "is malformed" in str(info.value):
            assert "redis://[::1]:6379" in str(info.value)


def test_unsent_pages_name_the_real_store_and_remote_in_one_line(tmp_path):
    page = make_chain(1)[0]
    path = tmp_path / "my store"
    url = "redis://u:secret@127.0.0.1:1/0?retries=0&connect_timeout=0.5&prefix=lab"
    with pytest.warns(RemoteTierWarning, match="continuing with the local tiers only"):
        store = PageStore(path, StoreConfig(remote=url, remote_mode="write-back"))
    store.put(page)
    with pytest.warns(RemoteTierWarning) as record:
        store.close()
    [text] = [str(w.message) for w in record if "were not written" in str(w.message)]
    assert "--store DIR" not in text and "--remote URL" not in text  # was: the literal placeholders
    assert f"--store '{os.path.realpath(path)}'" in text and "secret" not in text and "\n" not in text
    assert "--remote 'redis://u:***@127.0.0.1:1/0?retries=0&connect_timeout=0.5&prefix=lab'" in text


def test_unreachable_server_is_a_typed_error_that_says_what_to_do():
    tier = RemoteTier("redis://127.0.0.1:1/0?retries=1&backoff=0.01&connect_timeout=0.5")
    with pytest.raises(RemoteUnavailableError, match="unreachable during ping after 1 retries"):
        tier.ping()
    with pytest.raises(RemoteUnavailableError, match="check that the server is up"):
        tier.put_many(make_chain(1))


# -- pages ----------------------------------------------------------------------------
def test_roundtrip_batched_and_key_layout(redis_server):
    pages = make_chain(7)
    tier = RemoteTier(redis_server.url + "?batch=3")
    assert tier.put_many(pages) == [True] * 7
    assert tier.counters["round_trips"] == 3  # 7 pages in pipelines of 3
    names = sorted(k.decode() for k in raw_client(redis_server).keys())
    want = sorted([f"tkv:v{FORMAT_VERSION}:{FP[:16]}:p:{p.key}" for p in pages]
                  + [f"tkv:v{FORMAT_VERSION}:fingerprints"])
    assert names == want and "{" not in "".join(names)  # no hash tags: spread over slots
    assert raw_client(redis_server).get(tier.page_name(FP, pages[0].key)) == pages[0].to_bytes()

    other = RemoteTier(redis_server.url)  # knows no namespace yet: reads the fingerprints set
    missing = "11" * 32
    got = other.get_many([p.key for p in pages] + [missing])
    assert got[:7] == pages and got[7] is None
    assert other.get(missing) is None
    assert other.contains_many([pages[0].key, missing]) == [True, False]
    assert other.counters["hits"] == 7 and other.counters["corrupt_detected"] == 0
    assert sorted(other.keys()) == sorted(p.key for p in pages) and other.num_pages == 7
    assert other.nbytes == sum(len(p.to_bytes()) for p in pages)
    assert other.remove(pages[0].key) and not other.remove(pages[0].key)
    assert other.get(pages[0].key) is None


def test_two_models_two_namespaces(redis_server):
    a, b = make_chain(2, fp=FP), make_chain(2, fp=FP2, seed=1)
    RemoteTier(redis_server.url).put_many(a + b)
    names = {k.decode() for k in raw_client(redis_server).keys()}
    assert sum(n.startswith(f"tkv:v{FORMAT_VERSION}:{FP[:16]}:p:") for n in names) == 2
    assert sum(n.startswith(f"tkv:v{FORMAT_VERSION}:{FP2[:16]}:p:") for n in names) == 2
    reader = RemoteTier(redis_server.url)
    assert reader.get_many([b[1].key, a[0].key, b[0].key]) == [b[1], a[0], b[0]]
    # another prefix is another world
    assert RemoteTier(redis_server.url + "?prefix=lab").get(a[0].key) is None


def test_ttl_applies_to_pages_only(redis_server):
    tier = RemoteTier(redis_server.url + "?ttl=100")
    page = make_chain(1)[0]
    tier.put(page)
    tier.put_manifest("art", b"{}")
    r = raw_client(redis_server)
    assert 0 < r.ttl(tier.page_name(FP, page.key)) <= 100
    assert r.ttl(tier.manifest_name("art")) == -1


@pytest.mark.parametrize("tamper", ["flip_payload", "truncate", "swap", "garbage", "header"])
def test_tampered_page_is_detected_never_served(redis_server, tamper):
    pages = make_chain(2)
    tier = RemoteTier(redis_server.url)
    tier.put_many(pages)
    r, name = raw_client(redis_server), tier.page_name(FP, pages[0].key)
    good = r.get(name)
    bad = {"flip_payload": good[:-1] + bytes([good[-1] ^ 1]),
           "truncate": good[:-3],
           "swap": pages[1].to_bytes(),  # a valid page, under the wrong key
           "garbage": b"not a page",
           "header": good.replace(b'"start":0', b'"start":1', 1)}[tamper]
    assert bad != good
    r.set(name, bad)
    with pytest.raises(CorruptPageError) as info:
        tier.get(pages[0].key)
    assert info.value.key == pages[0].key and "remote" in info.value.reason
    assert tier.counters["corrupt_detected"] == 1 and tier.counters["hits"] == 0
    assert r.get(name) is None  # deleted: the next writer heals it
    tier.put(pages[0])
    assert tier.get(pages[0].key) == pages[0]


def test_corrupt_value_is_not_deleted_if_it_changed_meanwhile(redis_server):
    page = make_chain(1)[0]
    tier = RemoteTier(redis_server.url)
    tier.put(page)
    name = tier.page_name(FP, page.key)
    tier._delete_if_same(name, b"other bytes")
    assert raw_client(redis_server).get(name) == page.to_bytes()


def test_get_many_reports_corrupt_as_missing(redis_server):
    pages = make_chain(3)
    tier = RemoteTier(redis_server.url)
    tier.put_many(pages)
    raw_client(redis_server).set(tier.page_name(FP, pages[1].key), b"x")
    got, corrupt = tier.fetch([p.key for p in pages])
    assert got == [pages[0], None, pages[2]] and list(corrupt) == [pages[1].key]
    assert tier.get_many([pages[1].key]) == [None]  # deleted on detection: now a plain miss


# -- manifests ------------------------------------------------------------------------
def test_manifests_verified_listed_and_first_writer_wins(redis_server):
    tier = RemoteTier(redis_server.url)
    tier.put_manifest("a1", b'{"x": 1}')
    tier.put_manifest("a1", b'{"x": 1}')  # same bytes: no-op
    with pytest.raises(PageConflictError):
        tier.put_manifest("a1", b'{"x": 2}')
    tier.put_manifest("a2", b"{}")
    assert tier.list_manifests() == ["a1", "a2"]
    assert RemoteTier(redis_server.url).get_manifest("a1") == b'{"x": 1}'
    r = raw_client(redis_server)
    value = r.get(tier.manifest_name("a1"))
    assert value == hashlib.sha256(b'{"x": 1}').hexdigest().encode() + b'{"x": 1}'
    r.set(tier.manifest_name("a1"), value.replace(b"1}", b"9}"))
    with pytest.raises(CorruptPageError, match="manifest sha256 mismatch"):
        tier.get_manifest("a1")
    tier.put_manifest("a1", b'{"x": 1}')  # the corrupt value was deleted; rewritten
    assert tier.get_manifest("a1") == b'{"x": 1}'
    assert tier.delete_manifest("a1") and tier.list_manifests() == ["a2"]
    with pytest.raises(ManifestNotFoundError):
        tier.get_manifest("a1")


# -- the server's eviction policy -----------------------------------------------------
def test_eviction_is_the_servers_and_evicted_pages_are_misses(tmp_path):
    layout = PageLayout(2, 2, 16, "float32", 16)  # 8 KiB per page
    g = torch.Generator().manual_seed(0)
    pages, parent = [], ROOT_KEY
    for i in range(600):  # ~5 MiB into a 2 MiB server
        kv = [torch.randn(2, 16, 16, generator=g) for _ in range(2)]
        pages.append(Page.seal(layout, FP, parent, 16 * i, [i % 200] * 16, kv, kv))
        parent = pages[-1].key
    with RedisServer(tmp_path / "r", args=["--maxmemory", "2mb",
                                           "--maxmemory-policy", "allkeys-lru"]) as server:
        tier = RemoteTier(server.url, fingerprints=[FP])
        tier.put_many(pages)
        got = tier.get_many([p.key for p in pages])
        assert all(g is None or g == p for g, p in zip(got, pages))
        num_kept = sum(g is not None for g in got)
        assert 0 < num_kept < len(pages)
        assert tier.counters["corrupt_detected"] == 0
    with RedisServer(tmp_path / "n", args=["--maxmemory", "1mb",
                                           "--maxmemory-policy", "noeviction"]) as server:
        with pytest.raises(RemoteError, match="maxmemory-policy"):
            RemoteTier(server.url).put_many(pages)


# -- the server goes away in the middle of a transfer ---------------------------------
def _after_first_pipeline(tier: RemoteTier, action) -> list[int]:
    """Run `action` once, right after the first pipeline of `tier` completes (before the second
    starts); the returned counter counts pipelines started."""
    calls = [0]

    def hook(what):
        calls[0] += 1
        if calls[0] == 2:
            action()
    tier.before_round_trip = hook
    return calls


def test_restart_mid_transfer_retries_and_completes_verified(tmp_path):
    pages = make_chain(12)
    with RedisServer(tmp_path / "r", appendonly=True) as server:
        RemoteTier(server.url).put_many(pages)
        tier = RemoteTier(server.url + "?batch=4&retries=6&backoff=0.05", fingerprints=[FP])
        calls = _after_first_pipeline(tier, server.restart)
        assert tier.get_many([p.key for p in pages]) == pages  # 3 pipelines, 1 restart
        assert calls[0] == 3 and tier.counters["hits"] == 12
        # and writes: the restart happens between two pipelines of a put
        more = make_chain(8, seed=7)
        writer = RemoteTier(server.url + "?batch=4&retries=6&backoff=0.05")
        _after_first_pipeline(writer, server.restart)
        writer.put_many(more)
        assert RemoteTier(server.url).get_many([p.key for p in more]) == more


def test_kill_mid_transfer_is_a_clear_error_not_partial_data(tmp_path):
    pages = make_chain(12)
    with RedisServer(tmp_path / "r") as server:
        RemoteTier(server.url).put_many(pages)
        tier = RemoteTier(server.url + "?batch=4&retries=2&backoff=0.01&connect_timeout=0.5",
                          fingerprints=[FP])
        _after_first_pipeline(tier, server.kill)
        with pytest.raises(RemoteUnavailableError, match="unreachable during get of 4 pages"):
            tier.get_many([p.key for p in pages])
        assert tier.counters["hits"] == 0  # nothing from the half-done call was returned


def test_missing_redis_client_is_a_clear_error(monkeypatch, tmp_path):
    import sys

    from paging import PageStore, StoreConfig

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` now raises ImportError
    with pytest.raises(PagingError, match=r"pip install 'tieredkv\[remote\]'"):
        PageStore(tmp_path / "s", StoreConfig(remote="redis://127.0.0.1:1/0"))
