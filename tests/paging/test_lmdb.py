"""LMDB tier: persistence, verified reads, quarantine, map growth, conflicts, crashes."""

from __future__ import annotations

import functools
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import lmdb
import pytest
import torch

from paging import (
    ROOT_KEY,
    CorruptPageError,
    LMDBTier,
    ManifestNotFoundError,
    Page,
    PageConflictError,
    PageLayout,
    PagingError,
    StoreFullError,
)
from testkit.faults import make_chain as unit_chain

FP = "ab" * 32
LAYOUT = PageLayout(2, 2, 4, "float32", 4)
NB = LAYOUT.payload_nbytes(4)  # 512 payload bytes per full page
REPO = pathlib.Path(__file__).resolve().parents[2]


make_chain = functools.partial(unit_chain, layout=LAYOUT, token_ids=lambda i: [i, i + 1, i + 2, i + 3])


def raw_env(path) -> lmdb.Environment:
    return lmdb.open(str(path), max_dbs=4, subdir=True)


def test_put_get_reopen_finds_every_page(tmp_path):
    pages = make_chain(10)
    with LMDBTier(tmp_path / "s") as tier:
        assert tier.put(pages[0]) is True
        assert tier.put_many(pages[1:]) == [True] * 9
        assert tier.num_pages == 10 and tier.nbytes == 10 * NB
    with LMDBTier(tmp_path / "s") as tier:
        assert tier.num_pages == 10 and tier.nbytes == 10 * NB
        assert sorted(tier.keys()) == sorted(p.key for p in pages)
        for p in pages:
            assert tier.get(p.key) == p and tier.contains(p.key)
            assert tier.get_raw(p.key) == p.to_bytes()
        assert tier.verified_reads == 10
        assert tier.get("11" * 32) is None and not tier.contains("11" * 32)
        assert tier.remove(pages[0].key) and not tier.remove(pages[0].key)
        assert tier.num_pages == 9 and tier.nbytes == 9 * NB
        assert tier.disk_nbytes > 0 and tier.map_size == 1 << 30


def test_keys_iterates_in_short_batches(tmp_path, monkeypatch):
    monkeypatch.setattr("paging.lmdb_tier._KEY_BATCH", 3)
    pages = make_chain(10)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_many(pages)
        assert list(tier.keys()) == sorted(p.key for p in pages)


def test_same_bytes_idempotent_other_bytes_conflict(tmp_path):
    a = make_chain(1, seed=0)[0]
    # same key (same fingerprint, parent, tokens, start), other KV bytes
    b = Page.seal(LAYOUT, FP, ROOT_KEY, 0, [0, 1, 2, 3],
                  [torch.ones(2, 4, 4)] * 2, [torch.ones(2, 4, 4)] * 2)
    assert a.key == b.key and a.payload != b.payload
    with LMDBTier(tmp_path / "s") as tier:
        assert tier.put(a) and tier.put(a) and tier.put_many([a, a])
        assert tier.num_pages == 1 and tier.nbytes == NB
        others = make_chain(3, seed=5)
        with pytest.raises(PageConflictError):
            tier.put_many(others + [b])
        assert tier.num_pages == 1  # the whole batch was refused
        assert tier.get(a.key) == a


def test_double_open_same_path_refused(tmp_path):
    tier = LMDBTier(tmp_path / "s")
    try:
        with pytest.raises(PagingError, match="already open"):
            LMDBTier(tmp_path / "s" / ".." / "s")
    finally:
        tier.close()
    LMDBTier(tmp_path / "s").close()  # close unregisters
    tier.close()  # idempotent


def _corrupt_stored(path, key: str, offset_from_end: int) -> None:
    env = raw_env(path)
    try:
        db = env.open_db(b"pages")
        with env.begin(write=True, db=db) as txn:
            value = bytearray(txn.get(key.encode()))
            value[len(value) - offset_from_end] ^= 0x10
            txn.put(key.encode(), bytes(value))
    finally:
        env.close()


@pytest.mark.parametrize("offset_from_end", [1, 200, 300])  # payload, payload, header
def test_changed_byte_is_quarantined_never_served(tmp_path, offset_from_end):
    pages = make_chain(3)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_many(pages)
    _corrupt_stored(tmp_path / "s", pages[1].key, offset_from_end)
    with LMDBTier(tmp_path / "s") as tier:
        bad = tier.get_raw(pages[1].key)
        with pytest.raises(CorruptPageError) as info:
            tier.get(pages[1].key)
        assert info.value.key == pages[1].key
        assert tier.get(pages[1].key) is None and tier.get_raw(pages[1].key) is None
        assert tier.quarantined_keys() == [pages[1].key]
        assert tier.get_quarantined(pages[1].key) == bad
        assert (tier.corrupt_detected, tier.quarantined, tier.num_quarantined) == (1, 1, 1)
        assert tier.num_pages == 2 and tier.nbytes == 2 * NB
        assert tier.get(pages[0].key) == pages[0]
        # recomputing and putting the page again restores it
        tier.put(pages[1])
        assert tier.get(pages[1].key) == pages[1]


def test_put_over_corrupt_value_quarantines_and_replaces(tmp_path):
    pages = make_chain(2)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_many(pages)
    _corrupt_stored(tmp_path / "s", pages[0].key, 1)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put(pages[0])  # not a conflict: the stored bytes were corrupt
        assert tier.get(pages[0].key) == pages[0]
        assert tier.num_quarantined == 1 and tier.nbytes == 2 * NB


def test_check_reports_and_quarantines(tmp_path):
    pages = make_chain(6)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_many(pages)
    _corrupt_stored(tmp_path / "s", pages[2].key, 5)
    _corrupt_stored(tmp_path / "s", pages[4].key, 280)
    with LMDBTier(tmp_path / "s") as tier:
        report = tier.check()
        assert report["checked"] == 6 and report["ok"] == 4 and report["corrupt"] == 2
        assert sorted(report["quarantined_keys"]) == sorted([pages[2].key, pages[4].key])
        assert tier.check() == {"checked": 4, "ok": 4, "corrupt": 0, "quarantined_keys": [], "damaged_keys": []}
        part = tier.check(sample=0.5, seed=3)
        assert part == tier.check(sample=0.5, seed=3) and part["checked"] <= 4
        assert tier.check(sample=0.0)["checked"] == 0


def test_map_full_grows_and_loses_nothing(tmp_path):
    pages = make_chain(200)
    with LMDBTier(tmp_path / "s", map_size=64 * 1024) as tier:
        for p in pages[:100]:
            tier.put(p)
        tier.put_many(pages[100:])  # one big batch past the map
        assert tier.map_size > 64 * 1024
        assert tier.num_pages == 200
        assert all(tier.get(p.key) == p for p in pages)


def test_map_full_at_max_is_clean_store_full(tmp_path):
    pages = make_chain(300)
    with LMDBTier(tmp_path / "s", map_size=128 * 1024, max_map_size=256 * 1024) as tier:
        stored = 0
        with pytest.raises(StoreFullError, match="max_map_size") as info:
            for i in range(0, 300, 10):
                tier.put_many(pages[i:i + 10])
                stored = i + 10
        # the advice removes documents (their shared pages kept), never pages other documents list
        assert "tieredkv rm" in str(info.value) and "delete pages" not in str(info.value)
        assert tier.map_size == 256 * 1024
        assert tier.num_pages == stored and tier.nbytes == stored * NB  # no half batch
        assert tier.check()["corrupt"] == 0
    with LMDBTier(tmp_path / "s", map_size=256 * 1024) as tier:
        assert tier.num_pages == stored


def test_manifests_and_meta(tmp_path):
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_manifest("art-b", b"\x00manifest")
        tier.put_manifest("art-a", b"{}")
        tier.put_manifest("art-a", b"{}")  # idempotent
        with pytest.raises(PageConflictError):
            tier.put_manifest("art-a", b"{1}")
        assert tier.get_manifest("art-b") == b"\x00manifest"
        assert tier.list_manifests() == ["art-a", "art-b"]
        assert tier.delete_manifest("art-a") and not tier.delete_manifest("art-a")
        with pytest.raises(ManifestNotFoundError):
            tier.get_manifest("art-a")
        with pytest.raises(KeyError):
            tier.get_manifest("nope")
        tier.set_meta("fingerprint", "3f2a")
        assert tier.get_meta("fingerprint") == "3f2a" and tier.get_meta("x") is None
        with pytest.raises(PagingError):
            tier.set_meta("__paging.payload_nbytes", "0")
    env = raw_env(tmp_path / "s")
    with env.begin(write=True, db=env.open_db(b"manifests")) as txn:
        txn.put(b"art-b", txn.get(b"art-b")[:-1] + b"X")
    env.close()
    with LMDBTier(tmp_path / "s") as tier:
        with pytest.raises(CorruptPageError) as info:
            tier.get_manifest("art-b")
        assert info.value.key == "art-b"
        assert tier.get_meta("fingerprint") == "3f2a"


def test_readonly_open(tmp_path):
    pages = make_chain(2)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put_many(pages)
    with LMDBTier(tmp_path / "s", readonly=True) as tier:
        assert tier.get(pages[0].key) == pages[0]
        with pytest.raises(PagingError, match="read-only"):
            tier.put(pages[0])


# -- crashes --------------------------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys, torch
    from paging import LMDBTier, Page, PageLayout, ROOT_KEY
    lay = PageLayout(2, 2, 4, "float32", 4)
    tier = LMDBTier(sys.argv[1], map_size=1 << 20)
    g = torch.Generator().manual_seed(0)
    parent, n = ROOT_KEY, 0
    while True:
        batch = []
        for _ in range(50):
            ks = [torch.randn(2, 4, 4, generator=g) for _ in range(2)]
            vs = [torch.randn(2, 4, 4, generator=g) for _ in range(2)]
            p = Page.seal(lay, "ab" * 32, parent, 4 * n, [n % 7] * 4, ks, vs)
            parent, n = p.key, n + 1
            batch.append(p)
        tier.put_many(batch)
        print(n, flush=True)
""")

_READER = textwrap.dedent("""
    import sys, time, lmdb
    env = lmdb.open(sys.argv[1], max_dbs=4, subdir=True)
    txn = env.begin()  # held open until SIGKILL: a stale reader slot
    print("ready", flush=True)
    time.sleep(60)
""")


def _spawn(code: str, path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                            text=True, env=env)


def test_sigkill_mid_put_many_then_reopen(tmp_path):
    path = tmp_path / "s"
    proc = _spawn(_WRITER, path)
    committed = 0
    try:
        deadline = time.monotonic() + 30
        while committed < 500 and time.monotonic() < deadline:  # 10 commits, then kill
            line = proc.stdout.readline()
            assert line, "writer died early"
            committed = int(line)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert committed >= 500 and proc.returncode == -signal.SIGKILL
    with LMDBTier(path) as tier:
        assert tier.reader_check() == 0  # works; the killed writer left no reader
        n = tier.num_pages
        assert n >= committed and n % 50 == 0  # whole batches only
        report = tier.check()
        assert report == {"checked": n, "ok": n, "corrupt": 0, "quarantined_keys": [], "damaged_keys": []}
        assert tier.nbytes == n * NB
        tier.put_many(make_chain(3, seed=9))  # still writable
        assert tier.num_pages == n + 3


def test_stale_reader_of_killed_process_is_cleared(tmp_path):
    path = tmp_path / "s"
    with LMDBTier(path) as tier:  # this process keeps the lock file open meanwhile
        proc = _spawn(_READER, path)
        try:
            assert proc.stdout.readline().strip() == "ready"
            assert str(proc.pid) in tier._env.readers()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
        assert str(proc.pid) in tier._env.readers()  # stale slot of a dead process
        assert tier.reader_check() == 1
        assert str(proc.pid) not in tier._env.readers()
        tier.put_many(make_chain(2))
        assert tier.num_pages == 2
    with LMDBTier(path) as tier:
        assert tier.reader_check() == 0 and tier.num_pages == 2


def test_disk_full_maps_to_store_full(tmp_path, monkeypatch):
    """ENOSPC (DiskError), or EIO with no free space (what LMDB reports for a short write
    on a full disk, seen on a 256 KiB tmpfs), is StoreFullError; nothing is written."""
    import paging.lmdb_tier as lt
    pages = make_chain(3)
    with LMDBTier(tmp_path / "s") as tier:
        tier.put(pages[0])

        def failing(txn, exc):
            txn.put(b"junk", b"x", db=tier._dbs["pages"])
            raise exc

        with pytest.raises(StoreFullError, match="disk full"):
            tier._write(lambda txn: failing(txn, lmdb.DiskError("mdb_put", 28)))
        monkeypatch.setattr(lt, "_disk_free", lambda path: 0)
        with pytest.raises(StoreFullError):
            tier._write(lambda txn: failing(txn, lmdb.Error("mdb_txn_commit: I/O error")))
        monkeypatch.setattr(lt, "_disk_free", lambda path: 1 << 40)
        with pytest.raises(PagingError) as info:
            tier._write(lambda txn: failing(txn, lmdb.Error("mdb_txn_commit: I/O error")))
        assert not isinstance(info.value, StoreFullError)
        assert list(tier.keys()) == [pages[0].key] and tier.nbytes == NB


def test_use_after_fork_refused(tmp_path):
    with LMDBTier(tmp_path / "s") as tier:
        pid = os.fork()
        if pid == 0:  # the child uses the parent's environment: refused, with the reason
            code = 3
            try:
                tier.get("11" * 32)
                code = 1
            except PagingError as exc:
                code = 0 if "fork" in str(exc) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert tier.get("11" * 32) is None  # the parent's own use is unaffected


def test_store_of_the_sha256_page_format_is_refused_at_open(tmp_path):
    """A store written by a build whose pages carried SHA-256 payload digests is refused, never misread."""
    with LMDBTier(tmp_path / "s") as tier:
        tier.put(make_chain(1)[0])
    env = raw_env(tmp_path / "s")
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            txn.put(b"__paging.format_version", b"1")
    finally:
        env.close()
    with pytest.raises(PagingError, match="holds page format '1'; this build reads 2 .its payload digests are "
                                          "SHA-256, this build's are BLAKE3. — re-deposit into a new store"):
        LMDBTier(tmp_path / "s")
