"""Disk full (RLIMIT_FSIZE in a child; a tiny tmpfs when mount works) and LMDB map full.

Every case ends in a typed error or in growth; what was stored before is intact; no temp file stays.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from paging import PageStore, StoreFullError
from testkit.faults import (
    PAGE_SIZE,
    ForkRunner,
    audit_store,
    corpus_text,
    fsize_target,
    lmdb_used_nbytes,
    make_store,
    store_config,
)
from tieredkv.artifacts.portable import ArtifactWriteError, export_artifact, import_artifact
from tieredkv.models.loading import load_model

STORE_ERRORS = {"StoreFullError", "PagingError"}


@pytest.fixture(scope="module")
def runner():
    return ForkRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with a base artifact; a second artifact's file (~0.5 MB) to import or export."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("full")
    lm = load_model("tiny-llama")
    base = make_store(root / "base", [corpus_text(3 * PAGE_SIZE, seed=21)], lm)
    big = make_store(root / "big", [corpus_text(1000, seed=22)], lm)
    torch.set_num_threads(threads)
    with PageStore(root / "big", store_config()) as store:
        export_artifact(store, big[0], root / "big.tkva")
    return {"root": root, "base": root / "base", "base_ids": base, "big": root / "big", "big_id": big[0],
            "big_file": root / "big.tkva"}


def _fresh_base(world, path):
    shutil.copytree(world["base"], path)
    return path


def _base_intact(world, path) -> bool:
    a = audit_store(path)
    return a["corrupt"] == 0 and not a["partial"] and a["artifacts"] == world["base_ids"]


def test_export_to_a_full_disk_leaves_no_file_and_no_temp(runner, world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ctx.tkva").write_bytes(b"the previous export")
    r = runner.call(fsize_target, ("export", 64 * 1024, str(world["big"]), world["big_id"], str(out / "ctx.tkva")))
    assert not r["ok"] and r["error"] == "ArtifactWriteError" and "File too large" in r["message"], r
    assert os.listdir(out) == ["ctx.tkva"] and (out / "ctx.tkva").read_bytes() == b"the previous export"


def test_import_to_a_full_disk_is_a_clean_error_and_loses_nothing(runner, world, tmp_path):
    store = _fresh_base(world, tmp_path / "s")
    limit = lmdb_used_nbytes(store) + 64 * 1024  # past the committed pages, inside any extended tail
    r = runner.call(fsize_target, ("import", limit, str(store), str(world["big_file"]), None))
    assert not r["ok"] and r["error"] in STORE_ERRORS, r
    assert _base_intact(world, store)
    with PageStore(store, store_config()) as s:  # and with room again, it imports
        import_artifact(world["big_file"], s)
    assert len(audit_store(store)["artifacts"]) == 2


def test_deposit_to_a_full_disk_is_a_clean_error_and_loses_nothing(runner, world, tmp_path):
    store = _fresh_base(world, tmp_path / "s")
    limit = lmdb_used_nbytes(store) + 64 * 1024  # past the committed pages, inside any extended tail
    r = runner.call(fsize_target, ("deposit", limit, str(store), corpus_text(1500, seed=23), None))
    assert not r["ok"] and r["error"] in STORE_ERRORS, r
    assert _base_intact(world, store)


def test_map_full_at_the_cap_is_a_clean_error_then_growth_imports(world, tmp_path):
    store = _fresh_base(world, tmp_path / "s")
    size = os.path.getsize(store / "data.mdb")
    capped = store_config(lmdb_map_size=size + (128 << 10), lmdb_max_map_size=size + (128 << 10))
    with PageStore(store, capped) as s:
        with pytest.raises(StoreFullError, match="max_map_size"):
            import_artifact(world["big_file"], s)
        assert s.list_manifests() == world["base_ids"]
    assert _base_intact(world, store) and audit_store(store)["orphan_pages"] == 0  # the batch rolled back
    with PageStore(store, store_config(lmdb_map_size=size + (128 << 10))) as s:  # may grow: it does
        import_artifact(world["big_file"], s)
        assert s.lmdb_tier.map_size > size + (128 << 10)
    assert len(audit_store(store)["artifacts"]) == 2


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); RLIMIT_FSIZE cases cover disk full")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_export_to_a_real_full_filesystem(world, tiny_tmpfs):
    (tiny_tmpfs / "ctx.tkva").write_bytes(b"old")
    with PageStore(world["big"], store_config()) as store:
        with pytest.raises(ArtifactWriteError, match="No space left"):
            export_artifact(store, world["big_id"], tiny_tmpfs / "ctx.tkva")
    assert os.listdir(tiny_tmpfs) == ["ctx.tkva"] and (tiny_tmpfs / "ctx.tkva").read_bytes() == b"old"
