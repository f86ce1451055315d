"""PageStore.fetch_layers: one layer of a list of pages, the same as fetch_layer of each page in turn (the
batch's own entries pinned): torch.equal bytes, the same device entries, evictions, LRU order and counters;
a page that fails verification never served."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from paging import ROOT_KEY, CorruptPageError, Page, PageLayout, PageStore, StoreConfig
from testkit.faults import flip_lmdb_value_bit, make_chain
from tests.paging.test_layer_reads import flip_in_child
from tests.paging.test_store import LAYER_NB, NB


def _state(store: PageStore) -> tuple:
    """What the fetches changed: device entries (in insertion order), host pages, counters, integrity."""
    s = store.stats()
    return list(store.device_tier.keys()), sorted(store.host_tier.keys()), s["tiers"], s["integrity"], s["device"]


@pytest.mark.parametrize("host_pages, device_layers", [(6, 12), (3, 3), (0, 2), (2, 0)])
def test_a_batch_is_fetch_layer_of_each_page_in_turn(make_store, host_pages, device_layers):
    """Host tiers that hold every page, some (the rest read from LMDB, whole, then layer by layer) or none;
    device tiers that keep everything, evict, or keep nothing."""
    pages = make_chain(6)
    config = StoreConfig(host_budget_bytes=host_pages * NB, device_budget_bytes=device_layers * LAYER_NB)
    batched, one_by_one = make_store(config=config), make_store(config=config)
    for store in (batched, one_by_one):
        store.put_many(pages)
    rng = random.Random(0)
    for _ in range(40):
        keys = [p.key for p in rng.sample(pages, rng.randint(1, 4))]
        layer = rng.randrange(2)
        pin = {(pages[rng.randrange(6)].key, layer)}
        got = batched.fetch_layers(keys, layer, pin=pin)
        want = [one_by_one.fetch_layer(key, layer, pin=pin | {(k, layer) for k in keys}) for key in keys]
        for (k, v), (k1, v1), key in zip(got, want, keys):
            ref = next(p for p in pages if p.key == key).layer_kv(layer)
            assert torch.equal(k, k1) and torch.equal(v, v1) and torch.equal(k, ref[0]) and torch.equal(v, ref[1])
        assert _state(batched) == _state(one_by_one)
        assert batched.device_tier.nbytes <= batched.device_tier.budget_bytes


def test_a_repeated_key_is_a_hit_the_second_time(make_store):
    pages = make_chain(2)
    store = make_store(config=StoreConfig(device_budget_bytes=4 * LAYER_NB))
    store.put_many(pages)
    (k0, _), (k1, _) = store.fetch_layers([pages[0].key, pages[0].key], 1)
    assert k0 is k1 and store.stats()["tiers"]["device"]["hits"] == 1


def _within(t: torch.Tensor, payload: bytes) -> bool:
    """Whether `t`'s bytes lie inside `payload`'s memory (a view of it, not a copy)."""
    first = np.frombuffer(payload, dtype=np.uint8).ctypes.data
    return first <= t.data_ptr() and t.data_ptr() + t.nbytes <= first + len(payload)


def test_a_cpu_store_serves_host_pages_without_a_copy(make_store):
    """A CPU store's misses that the host tier holds are views of the page's payload: one copy fewer per page
    (the working-set buffer copies them next); the same bytes as `Page.layer_kv`."""
    pages = make_chain(4)
    store = make_store(config=StoreConfig(device_budget_bytes=8 * LAYER_NB))
    store.put_many(pages)
    for layer in (0, 1):
        for (k, v), page in zip(store.fetch_layers([p.key for p in pages], layer), pages):
            ref_k, ref_v = page.layer_kv(layer)
            assert _within(k, page.payload) and _within(v, page.payload)
            assert torch.equal(k, ref_k) and torch.equal(v, ref_v)
            assert store.device_tier.get((page.key, layer))[0] is k


def test_an_entry_owns_its_bytes_once_the_host_lets_the_page_go(make_store):
    """A device-tier entry made of views of a host page gets its own copy when the host tier evicts or drops the
    page: no entry keeps a whole page alive past both budgets. Keys, sizes, order and LRU order are unchanged."""
    pages = make_chain(6)
    store = make_store(config=StoreConfig(host_budget_bytes=2 * NB, device_budget_bytes=12 * LAYER_NB))
    store.put_many(pages[:2])
    store.fetch_layers([p.key for p in pages[:2]], 0)
    store.fetch_layers([pages[0].key], 1)
    before = _state(store), list(store._device_lru), store.device_tier.nbytes
    store.put_many(pages[2:4])  # the host tier evicts pages 0 and 1
    assert not store.host_tier.contains(pages[0].key) and not store.host_tier.contains(pages[1].key)
    assert (_state(store)[0], list(store._device_lru), store.device_tier.nbytes) == (before[0][0], before[1], before[2])
    for page, layer in ((pages[0], 0), (pages[1], 0), (pages[0], 1)):
        k, v = store.device_tier.get((page.key, layer))
        assert not _within(k, page.payload) and not _within(v, page.payload)
        assert k.untyped_storage().nbytes() == LAYER_NB // 2 and v.untyped_storage().nbytes() == LAYER_NB // 2
        ref_k, ref_v = page.layer_kv(layer)
        assert torch.equal(k, ref_k) and torch.equal(v, ref_v)
    assert store.device_tier.nbytes <= store.device_tier.budget_bytes


def test_bfloat16_pages_are_the_same_bytes(make_store):
    layout, parent, pages = PageLayout(2, 2, 8, "bfloat16", 4), ROOT_KEY, []
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        kv = [torch.randn(2, 4, 8, generator=gen).to(torch.bfloat16) for _ in range(4)]
        pages.append(Page.seal(layout, "ab" * 32, parent, 4 * i, [i] * 4, kv[::2], kv[1::2]))
        parent = pages[-1].key
    store = make_store(config=StoreConfig(device_budget_bytes=1 << 20))
    store.put_many(pages)
    for (k, v), p in zip(store.fetch_layers([p.key for p in pages], 1), pages):
        ref_k, ref_v = p.layer_kv(1)
        assert k.dtype == torch.bfloat16 and torch.equal(k.view(torch.int16), ref_k.view(torch.int16))
        assert torch.equal(v.view(torch.int16), ref_v.view(torch.int16))


def test_a_corrupt_lmdb_page_in_a_batch_is_never_served(tmp_path, make_store):
    pages = make_chain(3)
    config = StoreConfig(host_budget_bytes=0, device_budget_bytes=6 * LAYER_NB)
    with PageStore(tmp_path / "s", config) as store:
        store.put_many(pages)
    flip_lmdb_value_bit(tmp_path / "s", pages[1].key, -3 * 8 + 2)  # bit 2 of the value's third byte from the end
    store = make_store(tmp_path / "s", config)
    with pytest.raises(CorruptPageError):
        store.fetch_layers([p.key for p in pages], 0)
    assert store.device_tier.nbytes == 0 and store.stats()["integrity"]["quarantined"] == 1
    good = store.fetch_layers([pages[0].key, pages[2].key], 0)  # the others are still served
    assert all(torch.equal(k, p.layer_kv(0)[0]) for (k, _), p in zip(good, (pages[0], pages[2])))


def test_a_changed_byte_in_a_batched_layer_read_is_never_served(tmp_path):
    pages = make_chain(2)
    path = tmp_path / "s"
    with PageStore(path, StoreConfig(host_budget_bytes=0, device_budget_bytes=0)) as store:
        store.put_many(pages)
        store.fetch_layers([p.key for p in pages], 0)  # read whole: digests known
        flip_in_child(path, pages[1].key, LAYER_NB + 7)  # a byte of layer 1 of page 1, changed on disk
        with pytest.raises(CorruptPageError):
            store.fetch_layers([p.key for p in pages], 1)
        assert store.lmdb_tier.num_quarantined == 1 and not store.reads_layers(pages[1].key)
        (k, v), = store.fetch_layers([pages[0].key], 1)
        assert torch.equal(k, pages[0].layer_kv(1)[0]) and torch.equal(v, pages[0].layer_kv(1)[1])
