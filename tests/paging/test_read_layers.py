"""PageStore.read_layers: one layer of a list of pages stacked in one tensor, the bytes `fetch_layer` serves,
without device-tier entries; a page that fails verification is never served."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from paging import CorruptPageError, PageStore, StoreConfig
from testkit.faults import flip_lmdb_value_bit, make_chain
from tests.paging.test_store import LAYER_NB, NB


@pytest.mark.parametrize("host_pages", [6, 3, 0])
def test_a_stack_is_the_bytes_of_each_page_layer(make_store, host_pages):
    """Host tiers that hold every page, some (the rest read from LMDB and verified) or none."""
    pages = make_chain(6)
    store = make_store(config=StoreConfig(host_budget_bytes=host_pages * NB, device_budget_bytes=4 * LAYER_NB))
    store.put_many(pages)
    for layer in (0, 1):
        order = [pages[i] for i in (4, 0, 5, 2)]
        stack = store.read_layers([p.key for p in order], layer)  # [n, 2, Hkv, T, D]
        assert stack.shape[:2] == (4, 2)
        for i, page in enumerate(order):
            k, v = page.layer_kv(layer)
            assert torch.equal(stack[i, 0], k) and torch.equal(stack[i, 1], v)
    assert store.device_tier.nbytes == 0  # nothing entered the device tier
    assert store.read_layers([], 0).numel() == 0


def test_a_corrupt_lmdb_page_in_a_stack_is_never_served(tmp_path, make_store):
    pages = make_chain(3)
    config = StoreConfig(host_budget_bytes=0, device_budget_bytes=6 * LAYER_NB)
    with PageStore(tmp_path / "s", config) as store:
        store.put_many(pages)
    flip_lmdb_value_bit(tmp_path / "s", pages[1].key, -3 * 8 + 2)
    store = make_store(tmp_path / "s", config)
    with pytest.raises(CorruptPageError):
        store.read_layers([p.key for p in pages], 0)
    assert store.stats()["integrity"]["quarantined"] == 1
    good = store.read_layers([pages[0].key, pages[2].key], 1)
    assert torch.equal(good[0, 0], pages[0].layer_kv(1)[0]) and torch.equal(good[1, 1], pages[2].layer_kv(1)[1])


@pytest.mark.parametrize("host_pages", [4, 0])
def test_layer_parts_are_each_pages_bytes_and_host_parts_are_not_copied(make_store, host_pages):
    pages = make_chain(4)
    store = make_store(config=StoreConfig(host_budget_bytes=host_pages * NB, device_budget_bytes=4 * LAYER_NB))
    store.put_many(pages)
    order = [pages[i] for i in (3, 1, 2)]
    got = store.layer_parts([p.key for p in order], 1)
    k0, _ = order[0].layer_kv(1)
    assert (len(got), got.heads, got.tokens, got.dim, got.dtype) == (3, k0.shape[0], k0.shape[1], k0.shape[2],
                                                                        k0.dtype)
    arrays = got.arrays(k0.numpy().dtype)
    for page, kv in zip(order, arrays):
        k, v = page.layer_kv(1)
        assert torch.equal(torch.from_numpy(kv[0].copy()), k) and torch.equal(torch.from_numpy(kv[1].copy()), v)
        if host_pages:  # a read-only view of the host tier's own payload
            assert not kv.flags.writeable
            assert np.shares_memory(kv, np.frombuffer(store.host_tier._pages[page.key].payload, dtype=np.uint8))
    assert torch.equal(got.stacked(), store.read_layers([p.key for p in order], 1))
    assert torch.equal(got[1:].stacked(), store.read_layers([p.key for p in order[1:]], 1))
    assert [torch.equal(k, p.layer_kv(1)[0]) for p, (k, _v) in zip(order, got)] == [True] * 3
    with pytest.raises(ValueError, match="cannot be viewed"):
        got.arrays(np.int8)
    assert len(store.layer_parts([], 0)) == 0 and store.layer_parts([], 0).stacked().numel() == 0
    assert store.device_tier.nbytes == 0
