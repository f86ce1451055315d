"""PageStore.read_layers: one layer of a list of pages stacked in one tensor, the bytes `fetch_layer` serves,
without device-tier entries; a page that fails verification is never served."""
from __future__ import annotations

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
