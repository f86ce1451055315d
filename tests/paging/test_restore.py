"""PageStore.restore: pages back to back in one tensor, byte-equal to their K/V, verified when read
from LMDB, not hashed again from the host tier, and never served when corrupt."""
from __future__ import annotations

import lmdb
import pytest
import torch

from paging import CorruptPageError, PageNotFoundError, PageStore, StoreConfig
from paging.restore import kv_view, restore_nbytes
from tests.paging.test_store import LAYOUT, NB, make_chain


def _expected(pages) -> torch.Tensor:
    """[L, 2, Hkv, N, D]: every page's K/V, concatenated along tokens."""
    return torch.stack([torch.stack([torch.cat([p.layer_kv(layer)[kv] for p in pages], dim=1) for kv in (0, 1)])
                        for layer in range(LAYOUT.num_layers)])


def _config(host_pages: int = 0) -> StoreConfig:
    return StoreConfig(host_budget_bytes=host_pages * NB)


def _store(path, host_pages: int = 0) -> PageStore:
    return PageStore(path, _config(host_pages))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_restore_from_lmdb_is_byte_equal_and_verified(make_store, workers):
    pages = make_chain(7)
    store = make_store(config=_config())
    store.put_many(pages)
    got = store.restore([p.key for p in pages], workers=workers)
    assert torch.equal(got.kv, _expected(pages))
    assert [h.key for h in got.headers] == [p.key for p in pages] and got.headers[3] == pages[3].header
    assert (got.stats.verified_pages, got.stats.host_pages) == (7, 0)
    assert store.stats()["integrity"]["verified_reads"] == 7
    assert store.host_tier.num_pages == 0  # the caller holds the K/V: no host copy is made


def test_restore_takes_host_copies_as_they_are(make_store):
    pages = make_chain(5)
    store = make_store(config=_config(host_pages=2))
    store.put_many(pages)  # the last two stay in the host tier
    got = store.restore([p.key for p in pages])
    assert torch.equal(got.kv, _expected(pages))
    assert (got.stats.host_pages, got.stats.verified_pages) == (2, 3)


def test_restore_into_a_reused_buffer(make_store):
    pages = make_chain(4)
    buffer = torch.full((restore_nbytes(16, LAYOUT) + 5,), 7, dtype=torch.uint8)
    store = make_store(config=_config())
    store.put_many(pages)
    for n in (4, 2):
        got = store.restore([p.key for p in pages[:n]], buffer=buffer)
        assert got.kv.data_ptr() == buffer.data_ptr()
        assert torch.equal(got.kv, _expected(pages[:n]))
    with pytest.raises(Exception, match="flat uint8"):
        kv_view(buffer[:10], LAYOUT, 16)


def test_pinned_host_buffers_are_restored_without_a_page_copy(tmp_path, monkeypatch):
    """The CUDA pinned path's logic, with the pinned allocator swapped for a plain one."""
    from paging import HostTier
    monkeypatch.setattr(HostTier, "_alloc_pinned", staticmethod(lambda n: torch.empty(n, dtype=torch.uint8)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pages = make_chain(3)
    with _store(tmp_path / "s", host_pages=3) as store:
        assert store.host_tier.is_pinned
        store.put_many(pages)
        got = store.restore([p.key for p in pages])
        assert got.stats.host_pages == 3 and torch.equal(got.kv, _expected(pages))


def test_corrupt_payload_is_never_served_and_is_quarantined(tmp_path):
    pages = make_chain(4)
    path = tmp_path / "s"
    with _store(path) as store:
        store.put_many(pages)
    # another process flips a payload byte (LMDB: never open one path twice in a process)
    _flip_in_child_process(path, pages[2].key)
    buffer = torch.full((restore_nbytes(16, LAYOUT),), 7, dtype=torch.uint8)
    with _store(path) as store:
        with pytest.raises(CorruptPageError, match=pages[2].key[:12]):
            store.restore([p.key for p in pages], buffer=buffer)
        # hashed before it is copied: the bad page's slot in the caller's memory keeps what it held
        assert bool((kv_view(buffer, LAYOUT, 16)[:, :, :, 8:12].contiguous().view(torch.uint8) == 7).all())
        assert store.lmdb_tier.num_quarantined == 1
        with pytest.raises(PageNotFoundError):  # quarantined: a miss from now on, never the bad bytes
            store.restore([p.key for p in pages])


def _flip_in_child_process(path, key: str) -> None:
    import multiprocessing as mp
    proc = mp.get_context("spawn").Process(target=_flip_in_child, args=(str(path), key))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0


def _flip_in_child(path: str, key: str) -> None:
    env = lmdb.open(path, max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        db = env.open_db(b"pages", txn=txn)
        raw = bytearray(txn.get(key.encode(), db=db))
        raw[-3] ^= 0x40  # a payload byte: framing and header still parse
        txn.put(key.encode(), bytes(raw), db=db)
    env.close()


def test_missing_page_is_a_typed_error(make_store):
    pages = make_chain(3)
    store = make_store(config=_config())
    store.put_many(pages[:2])
    with pytest.raises(PageNotFoundError):
        store.restore([p.key for p in pages])
    with pytest.raises(ValueError):
        store.restore([])
