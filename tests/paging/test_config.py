"""StoreConfig and PageStore refuse what cannot work when they are made, with a typed one-line error
that says what to do: a map the machine cannot make, a blank path, a bool that is not one, a device
that holds no data or is not there."""

from __future__ import annotations

import os
import struct

import lmdb
import pytest
import torch

from paging import PageStore, PagingError, StoreConfig
from paging.errors import StoreCorruptedError

TOO_BIG = 1 << 62  # past the address space of any 64-bit machine, within what py-lmdb takes
MM_LAST_PG = 136  # offset of mm_last_pg in an LMDB meta page: page header 16 + magic, version, address, mapsize, 2 dbs


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_a_map_a_new_store_cannot_make_names_lmdb_map_size(tmp_path):
    with pytest.raises(PagingError) as info:  # was: StoreCorruptedError, "restore the store from a backup"
        PageStore(tmp_path / "new", StoreConfig(lmdb_map_size=TOO_BIG))
    assert not isinstance(info.value, StoreCorruptedError)
    assert "lmdb_map_size" in _one_line(info.value) and "smaller" in str(info.value)
    with pytest.raises(PagingError, match="lmdb_map_size") as again:  # what the failed open left is no store yet
        PageStore(tmp_path / "new", StoreConfig(lmdb_map_size=TOO_BIG))
    assert not isinstance(again.value, StoreCorruptedError)
    with PageStore(tmp_path / "new", StoreConfig()) as store:  # a sane map opens it
        store.set_meta("a", "b")


def test_a_map_too_big_for_a_healthy_store_is_the_config_not_damage(tmp_path):
    with PageStore(tmp_path / "s", StoreConfig()) as store:
        store.set_meta("a", "b")
    with pytest.raises(PagingError, match="lmdb_map_size") as info:
        PageStore(tmp_path / "s", StoreConfig(lmdb_map_size=TOO_BIG))
    assert not isinstance(info.value, StoreCorruptedError)
    with PageStore(tmp_path / "s", StoreConfig()) as store:
        assert store.get_meta("a") == "b"


def test_a_meta_page_asking_for_an_impossible_map_stays_store_damage(tmp_path):
    store = tmp_path / "s"
    with PageStore(store, StoreConfig()) as s:
        s.set_meta("a", "b")
    env = lmdb.open(str(store), max_dbs=4, readonly=True)
    offset = env.stat()["psize"] * (env.info()["last_txnid"] % 2) + MM_LAST_PG  # the current meta page
    env.close()
    raw = bytearray((store / "data.mdb").read_bytes())
    struct.pack_into("<Q", raw, offset, 1 << 50)  # last page number: a map of 2**62 bytes
    (store / "data.mdb").write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptedError, match="restore the store from a backup"):
        PageStore(store, StoreConfig())


@pytest.mark.parametrize("field", ["lmdb_map_size", "lmdb_max_map_size"])
def test_a_map_size_past_what_lmdb_takes_is_refused_in_the_config(field):
    with pytest.raises(PagingError, match=field):  # was: a raw OverflowError at open
        StoreConfig(**{field: 1 << 70})


@pytest.mark.parametrize("path", ["", "   ", "\t\n"])
def test_a_blank_store_path_is_refused(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PagingError, match="blank"):  # was: data.mdb in the current directory
        PageStore(path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["no", "", 0, 1, None])
@pytest.mark.parametrize("field", ["lmdb_readahead", "allow_damaged", "remote_from_env"])
def test_bool_fields_take_only_bools(field, value):
    with pytest.raises(PagingError, match=f"{field} must be a bool"):
        StoreConfig(**{field: value})


def test_the_meta_device_is_refused():
    with pytest.raises(PagingError, match="holds no data") as info:  # was: NotImplementedError at ingest
        StoreConfig(device="meta")
    _one_line(info.value)


def test_cuda_without_a_cuda_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0"):  # was: AssertionError "Torch not compiled with CUDA enabled" at ingest
        with pytest.raises(PagingError, match="no CUDA device") as info:
            StoreConfig(device=device)
        assert "device='cpu'" in _one_line(info.value)


def test_a_cuda_index_past_the_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert StoreConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(PagingError, match="has 2 CUDA devices"):
        StoreConfig(device="cuda:2")
