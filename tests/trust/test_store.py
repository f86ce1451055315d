"""Trust, the store on disk: a damaged data.mdb is reported or refused, never served or called healthy.

Issue 16, cases 2, 3, 4 and 6, each as reproduced there: a real LMDB store made by real deposits
(tiny-llama), damaged with the same bytes, then driven through the CLI in a child process (a
SIGBUS or a crash would end the child, not the test run).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lmdb
import pytest

from paging import LMDBTier, PageStore, StoreConfig
from paging.errors import StoreLockError
from testkit.faults import lmdb_used_nbytes
from testkit.trust_faults import ENV, cli_many
from tieredkv.artifacts.artifact import deposit, graft
from tieredkv.artifacts.check import check_store
from tieredkv.question.corpus import python_reference

REPO = Path(__file__).resolve().parents[2]
PAGE = 8


def _text(offset: int, n: int = 200) -> str:
    return python_reference().encode("ascii", "ignore").decode()[offset:offset + n]


def _one_line(result: dict, error: str) -> None:
    """Exit 2 with exactly one line on stderr naming the error."""
    lines = [line for line in result["err"].splitlines() if line.strip()]
    assert result["rc"] == 2 and len(lines) == 1, result
    assert lines[0].startswith(f"tieredkv: error: {error}: "), result


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def two_artifacts(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    store = tmp_path / "s"
    with PageStore(store, StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
        b = deposit(lm, _text(5000), s, page_size=PAGE)
    return store, a, b


# -- case 2: one flipped bit in LMDB's meta page ---------------------------------------------------------
def test_case2_a_flipped_bit_in_the_meta_page_is_reported_and_nothing_is_written(two_artifacts):
    store, a, b = two_artifacts
    env = lmdb.open(str(store), max_dbs=4, readonly=True)
    txnid = env.info()["last_txnid"]
    env.close()
    data = store / "data.mdb"
    raw = bytearray(data.read_bytes())
    offset = 128 + 4096 * (txnid % 2)  # bit 0 of the main tree's root page number in the current meta page
    raw[offset] ^= 1
    data.write_bytes(bytes(raw))
    before = _sha(data)
    check, stats, graft_, again = cli_many(
        ["check", "--store", str(store)], ["stats", "--store", str(store)],
        ["graft", "--model", "tiny-llama", "--store", str(store), "--artifact", a.artifact_id, "--prompt", "x",
         "--max-new-tokens", "2"],
        ["deposit", "--model", "tiny-llama", "--store", str(store), "--text", _text(9000), "--quiet"])
    assert check["rc"] == 1, check  # was: exit 0, "every checked page and manifest verified"
    report = json.loads(check["out"])
    assert not report["healthy"] and report["store_damage"], report
    assert any("commit record" in line or "committed" in line for line in report["store_damage"])
    for result in (stats, graft_, again):
        _one_line(result, "StoreIntegrityError")
        assert "restore the store from a backup" in result["err"]
    assert _sha(data) == before  # nothing was committed on top of the damaged snapshot


def _rolled_back(lm, store: Path):
    """Deposit two artifacts, then put back the data.mdb of after the first: (first, second)."""
    with PageStore(store, StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
    older = (store / "data.mdb").read_bytes()
    with PageStore(store, StoreConfig()) as s:
        b = deposit(lm, _text(5000), s, page_size=PAGE)
    (store / "data.mdb").write_bytes(older)  # the file as it was one artifact ago
    return a, b


def test_case2_an_older_copy_of_data_mdb_is_a_rollback_naming_the_lost_artifact(tiny_model, tmp_path):
    store = tmp_path / "s"
    _, b = _rolled_back(tiny_model("tiny-llama"), store)
    with pytest.raises(Exception) as exc:
        PageStore(store, StoreConfig())
    assert type(exc.value).__name__ == "StoreIntegrityError" and b.artifact_id in str(exc.value)
    with PageStore(store, StoreConfig(allow_damaged=True)) as s:
        report = check_store(s)
        with pytest.raises(Exception, match="nothing is written"):
            s.set_meta("x", "y")
    assert not report["healthy"]
    assert any("rolled back" in d for d in report["store_damage"])
    assert any(b.artifact_id in d for d in report["store_damage"])


def test_deleting_the_record_accepts_the_store_as_it_is(tiny_model, tmp_path):
    """The documented way out after restoring a backup on purpose."""
    lm = tiny_model("tiny-llama")
    store = tmp_path / "s"
    a, _ = _rolled_back(lm, store)
    (store / "tieredkv.commit").unlink()
    with PageStore(store, StoreConfig()) as s:
        report = check_store(s)
        assert s.list_manifests() == [a.artifact_id] and report["healthy"]
        assert report["commit_record"].startswith("no commit record existed")  # not "matches the store"
        graft(lm, a.artifact_id, s)


def test_a_damaged_record_is_damage_and_is_not_rewritten(tiny_model, tmp_path):
    """A record that fails its checksum cannot have been torn (it is replaced by a rename): it is
    reported, and never silently replaced by one that would bless a rolled-back data.mdb."""
    store = tmp_path / "s"
    _rolled_back(tiny_model("tiny-llama"), store)  # rolled back, and the record that would tell is damaged
    record = bytearray((store / "tieredkv.commit").read_bytes())
    record[len(record) // 2] ^= 0x10
    (store / "tieredkv.commit").write_bytes(bytes(record))
    with pytest.raises(Exception, match="failed its checksum") as exc:
        PageStore(store, StoreConfig())
    assert type(exc.value).__name__ == "StoreIntegrityError" and "tieredkv.commit" in str(exc.value)
    with PageStore(store, StoreConfig(allow_damaged=True)) as s:
        report = check_store(s)
        with pytest.raises(Exception, match="nothing is written"):
            s.set_meta("x", "y")
    assert not report["healthy"] and any("failed its checksum" in d for d in report["store_damage"])
    assert (store / "tieredkv.commit").read_bytes() == bytes(record)  # still the evidence, not overwritten


# -- case 3: lock.mdb deleted while a deposit runs ------------------------------------------------------
PAUSED_DEPOSIT = textwrap.dedent("""
    import json, sys
    from paging import PageStore, StoreConfig
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model
    lm = load_model("tiny-llama")
    store, text = sys.argv[1], sys.argv[2]
    paused = []
    def progress(done, total):
        if done >= 64 and not paused:       # a few batches are committed; the deposit is half-way
            paused.append(1)
            print("paused", flush=True)
            sys.stdin.readline()
    try:
        with PageStore(store, StoreConfig()) as s:
            art = deposit(lm, text, s, page_size=8, progress=progress)
        print(json.dumps({"artifact": art.artifact_id}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
""")


def test_case3_a_deleted_lock_file_cannot_let_two_deposits_commit_over_each_other(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    store = tmp_path / "s"
    first = subprocess.Popen([sys.executable, "-c", PAUSED_DEPOSIT, str(store), _text(0, 400)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ENV, cwd=REPO)
    try:
        assert first.stdout.readline().strip() == "paused", first.stderr.read()
        (store / "lock.mdb").unlink()  # as in the issue: while the deposit runs
        with PageStore(store, StoreConfig()) as s:  # the second deposit, start to end
            second = deposit(lm, _text(7000, 400), s, page_size=PAGE)
        first.stdin.write("\n")
        first.stdin.flush()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    result = json.loads(out.strip().splitlines()[-1])
    # was: both printed an artifact, then check exited 1 with one artifact gone or missing pages
    assert result.get("error") == StoreLockError.__name__, (result, err)
    assert "lock.mdb" in result["message"] and "deleted" in result["message"]
    with PageStore(store, StoreConfig()) as s:
        report = check_store(s)
        assert report["healthy"], report
        assert s.list_manifests() == [second.artifact_id]
        graft(lm, second.artifact_id, s)  # complete, verified, chained


def test_the_writer_lock_serialises_write_transactions_of_two_processes(tmp_path):
    """Each write transaction holds an exclusive flock on data.mdb for its whole life."""
    store = tmp_path / "s"
    tier = LMDBTier(store)
    holder = textwrap.dedent("""
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(1.0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder, str(store / "data.mdb")], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        t = time.perf_counter()
        tier.set_meta("k", "v")  # waits for the other holder
        waited = time.perf_counter() - t
    finally:
        proc.wait(timeout=30)
        tier.close()
    assert waited > 0.3


# -- case 4: data.mdb truncated -----------------------------------------------------------------------
def test_case4_a_truncated_data_mdb_is_a_clear_error_at_open_never_sigbus(two_artifacts, tmp_path):
    store, a, _ = two_artifacts
    size = lmdb_used_nbytes(store)  # the committed pages end here; the file may run on (zeros written ahead)
    commands, stores = [], []
    for cut in (None, 0, 100, 8192, 12288, size // 2, size - 4096):  # None: data.mdb deleted
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(store, copy)
        if cut is None:
            (copy / "data.mdb").unlink()  # was: "a directory without a store", as if none had been there
        else:
            os.truncate(copy / "data.mdb", cut)
        stores.append(copy)
        commands += [["stats", "--store", str(copy)], ["check", "--store", str(copy)],
                     ["graft", "--model", "tiny-llama", "--store", str(copy), "--artifact", a.artifact_id,
                      "--prompt", "x", "--max-new-tokens", "2"],
                     ["deposit", "--model", "tiny-llama", "--store", str(copy), "--text", _text(9000), "--quiet"]]
    results = cli_many(*commands)  # was: SIGBUS (exit 135) from 8 KiB on; truncated to 0: "healthy", exit 0
    for result in results:
        if result["argv"][0] == "check":  # a report that says so, exit 1
            report = json.loads(result["out"])
            assert result["rc"] == 1 and not report["healthy"] and not report["opened"], result
            assert "truncated" in report["store_damage"][0], result
            assert ("missing" in report["store_damage"][0]) == (result["argv"][2] == str(stores[0])), result
            continue
        _one_line(result, "StoreIntegrityError")
        assert "truncated" in result["err"], result
    assert not (stores[0] / "data.mdb").exists()  # no command created an empty store in its place
    for copy in stores[1:]:  # nothing was written: no deposit went ahead on an empty or short file
        assert (copy / "data.mdb").stat().st_size <= size


def test_a_cut_in_the_tail_written_ahead_is_no_damage(two_artifacts, tmp_path):
    """Writers extend data.mdb with zeros before LMDB appends (paging/lmdb_tier.py `_extend_file`): losing that
    tail loses no committed page, so the store opens healthy and takes the next deposit."""
    store, a, _ = two_artifacts
    used, size = lmdb_used_nbytes(store), (store / "data.mdb").stat().st_size
    assert size > used, "the last deposit extended the file ahead of its pages"
    copy = tmp_path / "cut"
    shutil.copytree(store, copy)
    os.truncate(copy / "data.mdb", used)
    check, dep = cli_many(["check", "--store", str(copy)],
                          ["deposit", "--model", "tiny-llama", "--store", str(copy), "--text", _text(9000), "--quiet"])
    assert check["rc"] == 0 and json.loads(check["out"])["healthy"], check
    assert dep["rc"] == 0, dep


# -- case 6: a corrupt byte in a stored key -------------------------------------------------------------
def _corrupt_key(data: Path, key: bytes) -> None:
    """Set the first byte of `key` where LMDB stores it as a key (a leaf node: key size u16 LE, then the key)."""
    raw = bytearray(data.read_bytes())
    size = len(key).to_bytes(2, "little")
    hits = [i for i in range(len(raw)) if raw.startswith(key, i) and raw[i - 2:i] == size]
    assert hits, "key not found in a leaf node"
    for i in hits:
        raw[i] = 0xFF
    data.write_bytes(bytes(raw))


def test_case6_a_corrupt_byte_in_a_stored_key_is_reported_by_every_check(two_artifacts):
    store, a, b = two_artifacts
    _corrupt_key(store / "data.mdb", a.page_keys[1].encode())
    _corrupt_key(store / "data.mdb", b.artifact_id.encode())
    first, second = cli_many(["check", "--store", str(store)], ["check", "--store", str(store)])
    for result in (first, second):  # was: a UnicodeDecodeError traceback, every time
        assert result["rc"] == 1 and "Traceback" not in result["err"], result
        report = json.loads(result["out"])
        assert not report["healthy"]
        assert any(m.startswith("\\xff") for m in report["corrupt_manifests"]), report
    report = json.loads(first["out"])
    assert report["damaged_keys"] and report["damaged_keys"][0].startswith("\\xff")
    # its page is no longer under its key: reported incomplete, or, where the damaged key broke the sort
    # order of the leaf that holds its manifest too (LMDB's binary search then misses it; which ids share
    # a leaf depends on the ids, so on the machine's floats), reported as a manifest that cannot be read
    assert a.artifact_id in report["incomplete_artifacts"] or a.artifact_id in report["corrupt_manifests"], report
