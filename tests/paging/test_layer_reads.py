"""A page the host tier does not hold: read whole and verified once, then one layer at a time, each
layer's bytes hashed against the digest the whole read left (paging/layer_reads.py)."""
from __future__ import annotations

import multiprocessing as mp

import lmdb
import pytest
import torch

from paging import CorruptPageError, PageStore, StoreConfig
from tests.paging.test_store import LAYER_NB, NB, make_chain

# neither the host nor the device tier keeps anything: every fetch_layer goes to LMDB
CONFIG = StoreConfig(host_budget_bytes=0, device_budget_bytes=0)


def _store(path) -> PageStore:
    return PageStore(path, CONFIG)


def _reads(store) -> tuple[int, int, int]:
    i = store.stats()["integrity"]
    return i["verified_reads"], i["verified_layer_reads"], i["layer_read_mismatches"]


def test_after_one_whole_read_a_miss_reads_one_layer(make_store):
    pages = make_chain(2)
    store = make_store(config=CONFIG)
    store.put_many(pages)
    assert not store.reads_layers(pages[1].key)
    k, v = store.fetch_layer(pages[1].key, 0)
    assert _reads(store) == (1, 0, 0) and store.reads_layers(pages[1].key)
    for layer in (1, 0, 1):
        k, v = store.fetch_layer(pages[1].key, layer)
        assert torch.equal(k, pages[1].layer_kv(layer)[0]) and torch.equal(v, pages[1].layer_kv(layer)[1])
    assert _reads(store) == (1, 3, 0)
    assert not store.reads_layers(pages[0].key)  # only pages read whole have digests


def _flip(path: str, key: str, offset_from_payload: int) -> None:
    env = lmdb.open(path, max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        db = env.open_db(b"pages", txn=txn)
        raw = bytearray(txn.get(key.encode(), db=db))
        raw[len(raw) - NB + offset_from_payload] ^= 0x10
        txn.put(key.encode(), bytes(raw), db=db)
    env.close()


def flip_in_child(path, key: str, offset_from_payload: int) -> None:
    proc = mp.get_context("spawn").Process(target=_flip, args=(str(path), key, offset_from_payload))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def test_a_changed_byte_in_the_layer_read_is_never_served(tmp_path):
    pages = make_chain(1)
    path = tmp_path / "s"
    with _store(path) as store:
        store.put_many(pages)
        store.fetch_layer(pages[0].key, 0)  # read whole: digests known
        flip_in_child(path, pages[0].key, LAYER_NB + 7)  # a byte of layer 1, changed on disk meanwhile
        with pytest.raises(CorruptPageError):
            store.fetch_layer(pages[0].key, 1)  # the layer mismatches; the whole read finds the page corrupt
        assert _reads(store)[2] == 1 and store.lmdb_tier.num_quarantined == 1
        assert not store.reads_layers(pages[0].key)


def test_other_layers_bytes_are_served_only_as_verified(tmp_path):
    """A changed byte in layer 1 does not stop layer 0 (its bytes are the verified ones); reading
    layer 1 then finds it."""
    pages = make_chain(1)
    path = tmp_path / "s"
    with _store(path) as store:
        store.put_many(pages)
        store.fetch_layer(pages[0].key, 1)
        flip_in_child(path, pages[0].key, LAYER_NB + 3)
        k, _ = store.fetch_layer(pages[0].key, 0)
        assert torch.equal(k, pages[0].layer_kv(0)[0]) and _reads(store) == (1, 1, 0)
        with pytest.raises(CorruptPageError):
            store.fetch_layer(pages[0].key, 1)


def test_the_prefetcher_leaves_pages_read_by_layer(make_store):
    from tieredkv.engine.prefetch import Prefetcher

    pages = make_chain(2)
    store = make_store(config=CONFIG)
    store.put_many(pages)
    store.fetch_layer(pages[0].key, 0)
    prefetcher = Prefetcher(store)
    try:
        prefetcher.submit([p.key for p in pages])
        assert prefetcher.counts["submitted"] == 1  # pages[1] only: pages[0] costs a layer on demand
    finally:
        prefetcher.close()
