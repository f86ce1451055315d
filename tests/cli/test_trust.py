"""Trust, the command line: `export` writes only regular files, and every bad input is one line, exit 2.

Issue 16, case 5 (export onto a device node, FIFO or symlink replaced it) and case 11 (tracebacks,
silently accepted numbers, empty stores created at mistyped paths, a window overrun without a word).
Every command runs through the real entry point in one child process (tests/test_trust_store.cli_many).
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from paging import PageStore, StoreConfig
from testkit.trust_faults import ENV, bad_cli_inputs, cli_many
from tests.trust.test_store import REPO
from tieredkv.artifacts.artifact import deposit
from tieredkv.artifacts.portable import ArtifactWriteError, export_artifact
from tieredkv.question.corpus import python_reference

TEXT = python_reference().encode("ascii", "ignore").decode()[:120]


@pytest.fixture(scope="module")
def store_with_artifact(tmp_path_factory, tiny_model):
    lm = tiny_model("tiny-llama")
    path = tmp_path_factory.mktemp("trust-cli") / "s"
    with PageStore(path, StoreConfig()) as s:
        art = deposit(lm, TEXT, s, page_size=8)
        export_artifact(s, art.artifact_id, path.parent / "a.tkva")
    return path, art


def _one_line(result: dict, starts: str) -> str:
    lines = [line for line in result["err"].splitlines() if line.strip()]
    assert result["rc"] == 2 and len(lines) == 1, result
    assert lines[0].startswith(starts), result
    assert "Traceback" not in result["err"]
    return lines[0]


# -- case 5 -------------------------------------------------------------------------------------------
def test_case5_export_refuses_a_fifo_a_symlink_a_directory_and_a_device_node(store_with_artifact, tmp_path):
    store, art = store_with_artifact
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    directory = tmp_path / "dir"
    directory.mkdir()
    targets = {"a FIFO": fifo, "a symlink": link, "a directory": directory}
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        targets["a device node"] = device
    except PermissionError:
        pass  # not root: the FIFO, symlink and directory cases still run; a device needs CAP_MKNOD
    results = cli_many(*[["export", "--store", str(store), "--artifact", art.artifact_id, "-o", str(p), "--quiet"]
                         for p in targets.values()])
    for (kind, _path), result in zip(targets.items(), results):
        line = _one_line(result, "tieredkv: error: ArtifactWriteError: refusing to write")
        assert f"it is {kind}" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.path.islink(link) and target.read_text() == "keep me"
    if "a device node" in targets:
        assert stat.S_ISCHR(os.lstat(device).st_mode)  # was: replaced by a regular file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["fifo", "precious.txt", "link", "dir"] +
                                                                (["null"] if "a device node" in targets else []))
    with PageStore(store, StoreConfig()) as s, pytest.raises(ArtifactWriteError, match="a symlink"):
        export_artifact(s, art.artifact_id, link)


def test_case5_export_to_stdout_and_over_a_regular_file(store_with_artifact, tmp_path):
    store, art = store_with_artifact
    proc = subprocess.run([sys.executable, "-m", "tieredkv.cli", "export", "--store", str(store), "--artifact",
                           art.artifact_id, "-o", "-"], capture_output=True, env=ENV, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (store.parent / "a.tkva").read_bytes()
    assert json.loads(proc.stderr)["file_bytes"] == len(proc.stdout)  # the summary went to stderr
    old = tmp_path / "old.tkva"
    old.write_bytes(b"an older export")
    (result,) = cli_many(["export", "--store", str(store), "--artifact", art.artifact_id, "-o", str(old), "--quiet"])
    assert result["rc"] == 0 and old.read_bytes() == (store.parent / "a.tkva").read_bytes()


# -- case 11 ------------------------------------------------------------------------------------------
def test_case11_every_bad_input_is_one_line_exit_2(store_with_artifact, tmp_path):
    store, art = store_with_artifact
    cases = bad_cli_inputs(tmp_path, store, art.artifact_id)
    missing = tmp_path / "mistyped-store"
    results = cli_many(*[argv for argv, _, _ in cases.values()])
    for (name, (_argv, error, words)), result in zip(cases.items(), results):
        start = f"{error}: error: " if error.startswith("tieredkv ") else f"tieredkv: error: {error}: "
        line = _one_line(result, start)
        assert words in line, (name, line)
    assert not missing.exists()  # was: an empty store created there, exit 0
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    assert not list(tmp_path.glob("left-*"))  # was: a store left behind by each refused deposit or library add
    assert not any("hunter3" in r["err"] + r["out"] for r in results)  # the URL's ?password= is masked


def test_case11_a_mistyped_store_for_push_is_refused_once_the_server_answers(tmp_path, redis_server):
    (result,) = cli_many(["remote", "push", "--store", str(tmp_path / "nope"), "--remote", redis_server.url])
    line = _one_line(result, "tieredkv: error: InputError: ")
    assert "does not exist" in line and not (tmp_path / "nope").exists()


def test_case11_importing_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opener = threading.Timer(60, lambda: open(fifo, "wb").close())  # unblocks a reader that waits, if any
    opener.start()
    try:
        (result,) = cli_many(["import", str(fifo), "--store", str(tmp_path / "s")], timeout=50)
    finally:
        opener.cancel()
    assert "is not a regular file" in _one_line(result, "tieredkv: error: InputError: ")


def test_case11_a_store_under_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        (result,) = cli_many(["deposit", "--model", "tiny-llama", "--store", str(ro / "s"), "--text", "hi",
                              "--quiet"])
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    line = _one_line(result, "tieredkv: error: PagingError: cannot open store")
    assert "Read-only file system" in line


def test_a_refused_command_removes_only_what_it_made(tmp_path):
    """`--store out/a` made out/ too; another command made out/b meanwhile: out/b stays (was: out/ removed)."""
    from tieredkv.cli.common import nothing_left_if_refused

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with nothing_left_if_refused(str(out / "a")):
            (out / "a").mkdir(parents=True)
            (out / "b").mkdir()
            raise RuntimeError("refused")
    assert not (out / "a").exists() and (out / "b").is_dir()
    with pytest.raises(RuntimeError):
        with nothing_left_if_refused(str(out / "x" / "y" / "z")):
            (out / "x" / "y" / "z").mkdir(parents=True)
            raise RuntimeError("refused")
    assert sorted(os.listdir(out)) == ["b"]  # x/y/z and the x/, x/y/ made for it are gone
