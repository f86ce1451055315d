"""Damage LMDB itself reports, and bookkeeping of the store's own that does not parse: every command
names it as store damage (one line, exit 2; `check`: a report, exit 1), never "a bug in tieredkv".

Found by flipping bytes of data.mdb page by page (docs/RELIABILITY.md): a leaf page's type bits give
MDB_CORRUPTED on the first read through it; a node's key size set to 0 leaves an empty key, which
LMDB's get and delete refuse; the counter and the model binding in the meta database were read
without a check.
"""
from __future__ import annotations

import json
import os
import shutil

import lmdb
import pytest

from paging import PageStore, StoreConfig
from testkit.trust_faults import cli_many, key_offsets
from tieredkv.artifacts.artifact import deposit
from tieredkv.question.corpus import python_reference

PAGE = 16
LMDB_PAGE = 4096
P_LEAF, P_OVERFLOW = 0x02, 0x04


@pytest.fixture(scope="module")
def template(tiny_model, tmp_path_factory):
    store = tmp_path_factory.mktemp("lmdb-damage") / "s"
    with PageStore(store, StoreConfig()) as s:
        art = deposit(tiny_model("tiny-llama"), python_reference()[:300], s, page_size=PAGE)
    return store, art


def _copy(template, tmp_path, name: str):
    store, art = template
    copy = tmp_path / name
    shutil.copytree(store, copy)
    return copy, art


def _commands(store, art) -> list[list[str]]:
    return [["check", "--store", str(store)], ["check", "--store", str(store)], ["stats", "--store", str(store)],
            ["graft", "--model", "tiny-llama", "--store", str(store), "--artifact", art.artifact_id, "--prompt", "x",
             "--max-new-tokens", "2"],
            ["deposit", "--model", "tiny-llama", "--store", str(store), "--text", "more text", "--quiet"]]


def _named(result: dict, error: str) -> None:
    lines = [line for line in result["err"].splitlines() if line.strip()]
    assert result["rc"] == 2 and len(lines) == 1, result
    assert lines[0].startswith(f"tieredkv: error: {error}: ") and "this is a bug" not in lines[0], result


def _check_reports(result: dict, says: str) -> dict:
    report = json.loads(result["out"])
    assert result["rc"] == 1 and not report["healthy"], result
    assert any(says in d for d in report["store_damage"] + report.get("corrupt_manifests", [])), report
    return report


def _set_meta(store, name: bytes, value: bytes) -> None:
    env = lmdb.open(str(store), max_dbs=4)
    try:
        with env.begin(write=True, db=env.open_db(b"meta", create=False)) as txn:
            txn.put(name, value)
    finally:
        env.close()


def test_a_leaf_page_of_the_wrong_type_is_store_damage(template, tmp_path):
    store, art = _copy(template, tmp_path, "leaf")
    data = bytearray((store / "data.mdb").read_bytes())
    starts = {o - o % LMDB_PAGE for o in key_offsets(bytes(data), art.page_keys[0].encode())}
    for start in starts:  # the leaf that holds the page's key (and older copies of it, now free pages)
        assert data[start + 10] & P_LEAF  # the page's flags
        data[start + 10] = P_OVERFLOW  # was: "unexpected CorruptedError ... this is a bug", exit 2, from `check`
    (store / "data.mdb").write_bytes(bytes(data))
    first, second, stats, graft, deposit_ = cli_many(*_commands(store, art))
    for check in (first, second):
        report = _check_reports(check, "MDB_CORRUPTED")
        assert report["opened"], report  # opened, then walking the page tree found the damage
    for result in (graft, deposit_):
        _named(result, "StoreCorruptedError")


def test_a_key_size_of_zero_is_store_damage(template, tmp_path):
    """A node whose key size reads 0: LMDB's get and delete refuse an empty key (was MDB_BAD_VALSIZE or a
    PagingError, exit 2, from `check`), and the node's value is read from the wrong bytes."""
    store, art = _copy(template, tmp_path, "empty")
    data = bytearray((store / "data.mdb").read_bytes())
    for offset in key_offsets(bytes(data), art.page_keys[1].encode()):  # (older copies too: one is the live leaf)
        data[offset - 2:offset] = b"\0\0"
    (store / "data.mdb").write_bytes(bytes(data))
    first, second, stats, graft, deposit_ = cli_many(*_commands(store, art))
    for check in (first, second):
        report = json.loads(check["out"])
        assert check["rc"] == 1 and not report["healthy"], check
        assert "(an empty key)" in report.get("damaged_keys", []) or report["store_damage"], report
    _named(graft, "PageNotFoundError")  # its key is gone: the page is not served
    assert deposit_["rc"] == 0 or "this is a bug" not in deposit_["err"], deposit_  # (LMDB may write elsewhere)


def test_a_payload_counter_that_is_not_a_number_is_store_damage(template, tmp_path):
    store, art = _copy(template, tmp_path, "counter")
    _set_meta(store, b"__paging.payload_nbytes", b"x13568")  # was: `check` healthy; stats a bare ValueError
    first, second, stats, graft, deposit_ = cli_many(*_commands(store, art))
    for check in (first, second):
        _check_reports(check, "payload byte counter")
    _named(stats, "StoreCorruptedError")
    _named(deposit_, "StoreCorruptedError")
    assert graft["rc"] == 0, graft  # a read needs no counter: the pages themselves all verify


@pytest.mark.parametrize("value, says", [(b"f" * 64, "bound to model"), (b"not-a-digest", "not a SHA-256"),
                                         (b"\xff\xfe" * 32, "not UTF-8")])
def test_a_damaged_model_binding_is_store_damage_not_the_users_model(template, tmp_path, value, says):
    """Was: `check` healthy; deposit and import blamed the user's model; bytes not UTF-8 a bare error."""
    store, art = _copy(template, tmp_path, "binding")
    _set_meta(store, b"model_fingerprint", value)
    first, _second, _stats, _graft, deposit_ = cli_many(*_commands(store, art))
    _check_reports(first, says)
    if value == b"f" * 64:  # a well-formed fingerprint of another model: the binding itself cannot tell
        _named(deposit_, "ModelMismatchError")
    else:
        _named(deposit_, "StoreCorruptedError")


@pytest.mark.parametrize("signum", ["SIGBUS", "SIGABRT"])
def test_check_reports_a_crash_inside_lmdb_as_damage(template, tmp_path, monkeypatch, capsys, signum):
    """Some damaged page pointers crash liblmdb itself (SIGBUS reading past the file, an assertion that
    aborts; seen in the byte sweep): `check` walks the store in a child process and reports the crash.
    Here the child is killed by that signal as it starts (a sitecustomize on its PYTHONPATH)."""
    from tieredkv.cli import main

    store, _art = _copy(template, tmp_path, "crash")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "if os.environ.get('TIEREDKV_CHECK_CHILD'):\n"
        "    sys.stderr.write('mdb.c:6273: Assertion failed in mdb_cursor_next()\\n'); sys.stderr.flush()\n"
        f"    os.kill(os.getpid(), signal.{signum})\n")
    before = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(hook), before) if p))
    assert main(["check", "--store", str(store)]) == 1
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert not report["healthy"] and out.err == ""
    (damage,) = report["store_damage"]
    assert damage.startswith(f"LMDB crashed ({signum}: mdb.c:6273: Assertion failed") and str(store) in damage
    if before is None:
        monkeypatch.delenv("PYTHONPATH")
    else:
        monkeypatch.setenv("PYTHONPATH", before)
    assert main(["check", "--store", str(store)]) == 0  # the same store, walked by a child that lives: healthy
    assert json.loads(capsys.readouterr().out)["healthy"]
