"""PageStore facade: write-through, promotion, device working set, stats, reopen."""

from __future__ import annotations

import dataclasses

import lmdb
import pytest
import torch

from paging import (
    ROOT_KEY,
    CorruptPageError,
    Page,
    PageConflictError,
    PageLayout,
    PageNotFoundError,
    PageStore,
    PageWriter,
    PagingError,
    StoreConfig,
)
from testkit.faults import make_chain

FP = "ab" * 32
LAYOUT = PageLayout(2, 1, 4, "float32", 4)
NB = LAYOUT.payload_nbytes(4)        # 256 payload bytes per page
LAYER_NB = LAYOUT.layer_nbytes(4)    # 128 bytes: K+V of one layer


def cfg(host_pages: int = 2, device_layers: int = 2, **kw) -> StoreConfig:
    return StoreConfig(host_budget_bytes=host_pages * NB,
                       device_budget_bytes=device_layers * LAYER_NB, **kw)


def test_config_validation():
    assert StoreConfig().host_budget_bytes is None
    assert StoreConfig().resolved_host_budget() > 0
    for bad in (dict(host_budget_bytes=-1), dict(device_budget_bytes=1.5),
                dict(device="nope"), dict(lmdb_map_size=0),
                dict(lmdb_map_size=4096, lmdb_max_map_size=1024)):
        with pytest.raises(PagingError):
            StoreConfig(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        StoreConfig().device = "cuda"  # frozen


def test_write_through_host_lru_and_promotion(make_store):
    p = make_chain(3)
    store = make_store(config=cfg(host_pages=2))
    store.put(p[0])
    store.put_many(p[1:])
    # LMDB has all three; host holds the two most recent (p0 evicted)
    assert sorted(store.host_tier.keys()) == sorted([p[1].key, p[2].key])
    assert store.lmdb_tier.num_pages == 3
    assert store.get(p[1].key) == p[1]             # host hit, now most recent
    assert store.stats()["integrity"]["verified_reads"] == 0
    assert store.get(p[0].key) == p[0]             # LMDB read, promoted
    assert store.stats()["integrity"]["verified_reads"] == 1
    assert sorted(store.host_tier.keys()) == sorted([p[0].key, p[1].key])  # p2 LRU
    assert all(store.contains(x.key) for x in p) and p[2].key in store
    with pytest.raises(PageNotFoundError) as info:
        store.get("11" * 32)
    assert isinstance(info.value, KeyError) and "recompute" in str(info.value)


def test_a_writer_that_does_not_admit_leaves_the_host_tier_alone(make_store):
    p = make_chain(4)
    store = make_store(config=cfg(host_pages=4))
    store.put(p[0])
    with PageWriter(store, max_pages=2, admit=False) as w:
        for page in p[1:]:
            w.add(page)
    assert store.lmdb_tier.num_pages == 4
    assert list(store.host_tier.keys()) == [p[0].key]  # the earlier host copy stays; none added
    assert store.get(p[3].key) == p[3]  # read from LMDB, verified, then cached as any read
    assert store.stats()["integrity"]["verified_reads"] == 1
    assert sorted(store.host_tier.keys()) == sorted([p[0].key, p[3].key])
    store = make_store(config=cfg(host_pages=4))
    with PageWriter(store) as w:  # the default admits
        for page in p:
            w.add(page)
    assert sorted(store.host_tier.keys()) == sorted(x.key for x in p)


def test_put_idempotent_and_conflict(make_store):
    a = make_chain(1)[0]
    b = Page.seal(LAYOUT, FP, ROOT_KEY, 0, [0] * 4, [torch.zeros(1, 4, 4)] * 2,
                  [torch.zeros(1, 4, 4)] * 2)
    store = make_store(config=cfg())
    store.put(a)
    store.put(a)
    with pytest.raises(PageConflictError):
        store.put(b)
    assert store.get(a.key) == a and store.stats()["lmdb"]["pages"] == 1


def test_fetch_layer_respects_budget_and_pins(make_store):
    p = make_chain(3)
    store = make_store(config=cfg(host_pages=3, device_layers=2))
    store.put_many(p)
    dev = store.device_tier
    k, v = store.fetch_layer(p[0].key, 0)
    assert torch.equal(k, p[0].layer_kv(0)[0]) and torch.equal(v, p[0].layer_kv(0)[1])
    assert tuple(k.shape) == (1, 4, 4) and k.device.type == "cpu"
    store.fetch_layer(p[0].key, 1)
    assert dev.nbytes == 2 * LAYER_NB
    hit = store.fetch_layer(p[0].key, 0)           # hit: (p0,0) most recent
    assert hit[0] is dev.get((p[0].key, 0))[0]
    store.fetch_layer(p[1].key, 0)                 # evicts LRU (p0,1)
    assert sorted(dev.keys()) == sorted([(p[0].key, 0), (p[1].key, 0)])
    # (p0,0) is LRU now but pinned: (p1,0) goes instead
    store.fetch_layer(p[2].key, 0, pin={(p[0].key, 0)})
    assert sorted(dev.keys()) == sorted([(p[0].key, 0), (p[2].key, 0)])
    # everything pinned: returned uncached, nothing evicted, budget kept
    everything = set(dev.keys())
    k, v = store.fetch_layer(p[1].key, 1, pin=everything)
    assert torch.equal(k, p[1].layer_kv(1)[0])
    assert set(dev.keys()) == everything and dev.nbytes <= dev.budget_bytes
    store = make_store(config=cfg(device_layers=0))  # zero budget
    store.put(p[0])
    assert torch.equal(store.fetch_layer(p[0].key, 1)[1], p[0].layer_kv(1)[1])
    assert store.device_tier.nbytes == 0


def test_stats_exact(make_store):
    p = make_chain(3)
    store = make_store(config=cfg(host_pages=2, device_layers=3))
    store.put_many(p)
    store.fetch_layer(p[0].key, 0)
    store.fetch_layer(p[0].key, 1)
    s = store.stats()
    assert s["device"] == {"entries": 2, "bytes": 2 * LAYER_NB,
                           "budget_bytes": 3 * LAYER_NB}
    assert s["host"] == {"pages": 2, "bytes": 2 * NB, "budget_bytes": 2 * NB}
    assert {k: s["lmdb"][k] for k in ("pages", "bytes", "quarantined")} == {
        "pages": 3, "bytes": 3 * NB, "quarantined": 0}
    assert s["lmdb"]["map_size"] == 1 << 30 and s["lmdb"]["disk_bytes"] > 0
    assert s["integrity"] == {"verified_reads": 1, "verified_layer_reads": 0, "layer_read_mismatches": 0,
                              "corrupt_detected": 0, "quarantined": 0}  # p0 came from LMDB once


@pytest.mark.parametrize("readahead", [True, False])
def test_reopen_finds_every_page(tmp_path, readahead):
    p = make_chain(5)
    with PageStore(tmp_path / "s", cfg(lmdb_readahead=readahead)) as store:
        store.put_many(p)
        store.put_manifest("art", b"chain")
        store.set_meta("fingerprint", FP)
    with PageStore(tmp_path / "s", cfg(lmdb_readahead=not readahead)) as store:
        assert store.stats()["lmdb"]["pages"] == 5 and store.stats()["host"]["pages"] == 0
        assert all(store.get(x.key) == x for x in p)
        assert store.get_manifest("art") == b"chain" and store.list_manifests() == ["art"]
        assert store.get_meta("fingerprint") == FP
        assert store.delete_manifest("art") and store.list_manifests() == []
        report = store.check()
        assert {k: report[k] for k in ("checked", "ok", "corrupt", "quarantined_keys", "damaged_keys")} == {
            "checked": 5, "ok": 5, "corrupt": 0, "quarantined_keys": [], "damaged_keys": []}
        assert report["healthy"] and report["artifacts"] == 0
        with pytest.raises(PagingError, match="already open"):
            PageStore(tmp_path / "s", cfg())


def test_corrupt_page_raises_is_quarantined_then_missing(tmp_path, make_store):
    p = make_chain(2)
    with PageStore(tmp_path / "s", cfg()) as store:
        store.put_many(p)
    env = lmdb.open(str(tmp_path / "s"), max_dbs=4)
    with env.begin(write=True, db=env.open_db(b"pages")) as txn:
        raw = bytearray(txn.get(p[0].key.encode()))
        raw[-3] ^= 0x04
        txn.put(p[0].key.encode(), bytes(raw))
    env.close()
    store = make_store(tmp_path / "s", cfg())
    with pytest.raises(CorruptPageError):
        store.fetch_layer(p[0].key, 0)
    with pytest.raises(PageNotFoundError):
        store.get(p[0].key)
    assert not store.contains(p[0].key) and store.device_tier.nbytes == 0
    s = store.stats()
    assert s["integrity"] == {"verified_reads": 0, "verified_layer_reads": 0, "layer_read_mismatches": 0,
                              "corrupt_detected": 1, "quarantined": 1}
    assert s["lmdb"]["pages"] == 1 and s["lmdb"]["quarantined"] == 1
    store.put(p[0])  # recompute and store again
    assert store.get(p[0].key) == p[0]


def test_remove_drops_every_copy(make_store):
    p = make_chain(2)
    store = make_store(config=cfg())
    store.put_many(p)
    store.fetch_layer(p[0].key, 0)
    assert store.remove(p[0].key) and not store.remove(p[0].key)
    assert not store.contains(p[0].key) and store.device_tier.num_entries == 0
    assert store.stats()["lmdb"]["pages"] == 1


def test_pinned_host_path_logic(tmp_path, monkeypatch):
    """The CUDA pinned-memory path, with the pinned allocator swapped for a plain one
    (no accelerator here): payload kept outside the Page, rebuilt exactly on get."""
    from paging import HostTier
    monkeypatch.setattr(HostTier, "_alloc_pinned",
                        staticmethod(lambda n: torch.empty(n, dtype=torch.uint8)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    p = make_chain(3)
    with PageStore(tmp_path / "s", cfg(host_pages=2, device_layers=4)) as store:
        assert store.host_tier.is_pinned
        store.put_many(p)
        assert store.host_tier.get_pinned(p[0].key) is None        # evicted
        assert store.host_tier.get_pinned(p[2].key).numel() == NB
        assert store.get(p[2].key) == p[2]
        for layer in range(2):
            k, v = store.fetch_layer(p[1].key, layer)
            ref_k, ref_v = p[1].layer_kv(layer)
            assert torch.equal(k, ref_k) and torch.equal(v, ref_v)
        k.add_(1)  # the cached copy is not the host buffer
        assert store.get(p[1].key) == p[1]
        assert store.host_tier.nbytes == 2 * NB
        with pytest.raises(IndexError):
            store.host_tier.pinned_layer(p[1].key, 2)


def test_host_budget_is_a_cap_with_lru_eviction_and_counters(tmp_path):
    p = make_chain(5)
    with PageStore(tmp_path / "s", cfg(host_pages=2)) as store:
        store.put_many(p)  # admitted in order: the last two stay
        assert sorted(store.host_tier.keys()) == sorted(x.key for x in p[3:])
        store.get(p[3].key)  # host hit: p3 becomes the most recently used
        store.get(p[0].key)  # LMDB hit, admitted: evicts p4, the least recently used
        assert sorted(store.host_tier.keys()) == sorted([p[0].key, p[3].key])
        assert store.host_tier.nbytes <= store.host_tier.budget_bytes == 2 * NB
        tiers = store.stats()["tiers"]
        assert {k: tiers["host"][k] for k in ("hits", "misses", "bytes_read", "evictions")} == {
            "hits": 1, "misses": 1, "bytes_read": NB, "evictions": 4}
        assert {k: tiers["lmdb"][k] for k in ("hits", "misses", "bytes_read", "evictions", "verify_failures")} == {
            "hits": 1, "misses": 0, "bytes_read": NB, "evictions": 0, "verify_failures": 0}
