"""Foundation: bad input is refused with a reason, never served.

Another model's store or artifact, a changed byte in a stored page, a map that fills, an unknown
artifact id, and a deposit killed with SIGKILL half-way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import lmdb
import pytest

from paging import CorruptPageError, PageNotFoundError, PageStore, StoreConfig
from testkit.graft_child import fresh_logits, grafted_logits
from tieredkv.artifacts.artifact import Artifact, deposit, graft, load_artifact
from tieredkv.errors import ArtifactNotFoundError, ModelMismatchError
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.question.corpus import python_reference

CONFIG = StoreConfig(host_budget_bytes=64 << 20)


def _ids(lm, n: int, offset: int = 0) -> list[int]:
    ids = lm.codec.encode(python_reference()[offset:offset + n + 64])[:n]
    assert len(ids) == n
    return ids


# -- another model ------------------------------------------------------------------------
def test_store_bound_to_another_model_is_refused(tiny_model, tmp_path):
    llama, qwen = tiny_model("tiny-llama"), tiny_model("tiny-qwen2")
    with PageStore(tmp_path / "s", CONFIG) as store:
        deposit(llama, _ids(llama, 70), store)
        with pytest.raises(ModelMismatchError) as exc:
            deposit(qwen, _ids(qwen, 70), store)
        assert store.list_manifests() and store.lmdb_tier.num_pages == 3  # nothing of qwen's written
    msg = str(exc.value)
    assert llama.fingerprint in msg and qwen.fingerprint in msg and "re-deposit" in msg


def test_artifact_made_by_another_model_is_refused(tiny_model, tmp_path):
    llama, qwen = tiny_model("tiny-llama"), tiny_model("tiny-qwen2")
    with PageStore(tmp_path / "llama", CONFIG) as store:
        art = deposit(llama, _ids(llama, 70), store)
        manifest = store.get_manifest(art.artifact_id)
        # by object and by id, against the store it lives in
        for ref in (art, art.artifact_id):
            with pytest.raises(ModelMismatchError) as exc:
                graft(qwen, ref, store)
            assert llama.fingerprint in str(exc.value) and qwen.fingerprint in str(exc.value)
    # the manifest copied into a store that qwen owns is refused all the same
    with PageStore(tmp_path / "qwen", CONFIG) as store:
        deposit(qwen, _ids(qwen, 40), store)
        store.put_manifest(art.artifact_id, manifest)
        assert isinstance(load_artifact(store, art.artifact_id), Artifact)
        with pytest.raises(ModelMismatchError) as exc:
            graft(qwen, art.artifact_id, store)
        assert llama.fingerprint in str(exc.value) and qwen.fingerprint in str(exc.value)


# -- a changed byte -----------------------------------------------------------------------
def test_flipped_payload_byte_is_detected_quarantined_and_never_served(tiny_model, tmp_path):
    """A corrupt page is a clear error (CorruptPageError), not a silent recompute and never served.

    The page is moved to quarantine, so the next graft fails with PageNotFoundError until the page
    is recomputed (a re-deposit) or re-imported.
    """
    lm = tiny_model("tiny-llama")
    path = tmp_path / "s"
    with PageStore(path, CONFIG) as store:
        art = deposit(lm, _ids(lm, 100), store)
    victim = art.page_keys[1]

    env = lmdb.open(str(path), max_dbs=4, subdir=True)
    try:
        pages = env.open_db(b"pages", create=False)
        with env.begin(write=True, db=pages) as txn:
            raw = bytearray(txn.get(victim.encode()))
            raw[-7] ^= 0x01  # the payload is the tail of the stored value
            txn.put(victim.encode(), bytes(raw))
    finally:
        env.close()

    with PageStore(path, CONFIG) as store:  # host tier cold: every page comes from LMDB
        with pytest.raises(CorruptPageError) as exc:
            graft(lm, art.artifact_id, store)
        assert victim in str(exc.value)
        assert store.lmdb_tier.quarantined_keys() == [victim]
        assert not store.contains(victim)
        assert store.stats()["integrity"]["corrupt_detected"] == 1
        with pytest.raises(PageNotFoundError):
            graft(lm, art.artifact_id, store)
        report = store.check()
        assert report["corrupt"] == 0 and report["ok"] == report["checked"] == len(art.page_keys) - 1
        # a re-deposit recomputes the missing page; the artifact grafts exactly again
        assert deposit(lm, _ids(lm, 100), store) == art
        cont = _ids(lm, 16, offset=5000)
        assert sha256_tensor(grafted_logits(lm, art, store, cont)) == \
            sha256_tensor(fresh_logits(lm, _ids(lm, 100), cont, art.page_size))


# -- a map that fills ----------------------------------------------------------------------
def test_full_map_grows_and_loses_nothing(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    small = StoreConfig(host_budget_bytes=0, lmdb_map_size=64 << 10)  # host off: reads come from LMDB
    ids = _ids(lm, 32 * 16)  # 16 pages of 16 KiB: four times the map
    with PageStore(tmp_path / "s", small) as store:
        first_map = store.lmdb_tier.map_size
        art = deposit(lm, ids, store)
        assert store.lmdb_tier.map_size > first_map
        assert store.lmdb_tier.num_pages == len(art.page_keys) == 16
    with PageStore(tmp_path / "s", small) as store:  # reopened with the small map size again
        assert store.list_manifests() == [art.artifact_id]
        report = store.check()
        assert report["ok"] == report["checked"] == 16
        cont = _ids(lm, 16, offset=9000)
        assert sha256_tensor(grafted_logits(lm, art.artifact_id, store, cont)) == \
            sha256_tensor(fresh_logits(lm, ids, cont, art.page_size))


# -- unknown id ---------------------------------------------------------------------------
def test_unknown_artifact_id_says_what_exists(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", CONFIG) as store:
        with pytest.raises(ArtifactNotFoundError, match="holds no artifacts"):
            graft(lm, "feedface", store)
        art = deposit(lm, _ids(lm, 40), store)
        with pytest.raises(ArtifactNotFoundError) as exc:
            graft(lm, "feedface", store)
    msg = str(exc.value)
    assert "'feedface'" in msg and art.artifact_id in msg and "tieredkv stats" in msg


def test_cli_unknown_artifact_exits_2_with_one_line(tmp_path):
    PageStore(tmp_path / "s", CONFIG).close()  # an empty store (a missing one is its own one-line error)
    proc = subprocess.run(
        [sys.executable, "-m", "tieredkv.cli", "graft", "--model", "tiny-llama", "--store", str(tmp_path / "s"),
         "--artifact", "feedface", "--prompt", "hi", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tieredkv: error: ArtifactNotFoundError: ") and "feedface" in lines[0]
    assert proc.stdout == ""


# -- kill -9 ------------------------------------------------------------------------------
def test_sigkill_during_deposit_leaves_a_sound_store_and_no_artifact(tmp_path):
    text = tmp_path / "long.txt"
    text.write_text(python_reference())  # ~465K byte tokens: far longer than the test waits
    store_path = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tieredkv.cli", "deposit", "--model", "tiny-llama", "--store", str(store_path),
         "--quiet", str(text)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    data = store_path / "data.mdb"
    deadline = time.monotonic() + 90
    try:
        # wait until several page batches are committed (one batch of 8 pages is ~130 KiB)
        while time.monotonic() < deadline and proc.poll() is None:
            if data.is_file() and data.stat().st_size > (1 << 20):
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"deposit ended before it was killed: {proc.stderr.read().decode()}"
        time.sleep(0.3)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    with PageStore(store_path, CONFIG) as store:
        assert store.list_manifests() == []  # the manifest is written last: no partial artifact
        num_pages = store.lmdb_tier.num_pages
        assert num_pages >= 8
        report = store.check()
        assert report["checked"] == report["ok"] == num_pages and report["corrupt"] == 0
        assert store.stats()["lmdb"]["quarantined"] == 0
