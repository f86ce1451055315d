"""Two races, each closed and shown by holding one process at a pause point (paging/pause_points.py) while
another runs: no sleep decides the order.

(a) `check` (or an open) reads the commit record and LMDB's state while another process deletes an artifact:
    it must never report that committed artifact lost.
(b) two different models deposit into a new store at the same moment: one binds it, the other is refused.

Each test holds process 1 at its pause point and asks whether the store's writer lock is held there. If it
is not, process 2 runs to its end first: the worst order the code allows. If it is, process 2 can only run
after process 1 is released.
"""
from __future__ import annotations

import multiprocessing

from paging import PageStore, StoreConfig
from testkit import races
from tieredkv.artifacts.artifact import STORE_FINGERPRINT_META, deposit
from tieredkv.question.corpus import python_reference

CTX = multiprocessing.get_context("spawn")


def _text(offset: int, n: int = 100) -> str:
    return python_reference().encode("ascii", "ignore").decode()[offset:offset + n]


def _interleave(point: str, store: str, first, first_args: tuple, second, second_args: tuple) -> tuple[dict, dict]:
    """Run `first` held at `point` and `second` in the worst order the store's writer lock allows."""
    held = races.Held.start_held(CTX, point, first, first_args)
    locked = races.writer_lock_is_held(store)
    other = races.Child.start(CTX, second, second_args)
    if not locked:  # nothing keeps process 2 out: let it finish in between
        done = other.result()
        held.release()
        return held.result(), done
    held.release()
    return held.result(), other.result()


def test_a_check_while_another_process_deletes_an_artifact_reports_nothing_lost(tiny_model, tmp_path):
    store = str(tmp_path / "s")
    lm = tiny_model("tiny-llama")
    with PageStore(store, StoreConfig()) as s:
        kept = deposit(lm, _text(0), s, page_size=8)
        gone = deposit(lm, _text(4000), s, page_size=8)
    check, deleted = _interleave("commit-record-read", store, races.open_and_audit, (store,),
                                 races.delete_manifest, (store, gone.artifact_id))
    assert deleted == {"ok": True, "value": True}, deleted
    # was: ["1 committed artifacts are gone: <gone>"] (the record read before the delete, the state after)
    assert check == {"ok": True, "value": []}, check
    with PageStore(store, StoreConfig()) as s:
        assert s.list_manifests() == [kept.artifact_id] and s.lmdb_tier.audit() == []


def test_two_models_depositing_into_a_new_store_at_once_bind_it_once(tmp_path):
    store = str(tmp_path / "s")
    PageStore(store, StoreConfig()).close()  # a new, empty store: both deposits find it unbound
    first, second = _interleave("meta-read", store, races.deposit_with, ("tiny-llama", store, _text(0)),
                                races.deposit_with, ("tiny-qwen2", store, _text(4000)))
    outcomes = sorted([first, second], key=lambda r: not r["ok"])
    # was: both deposits succeed, the second model's fingerprint over the first's, and the store holds both
    assert outcomes[0]["ok"] and not outcomes[1]["ok"], outcomes
    assert outcomes[1]["error"] == "ModelMismatchError", outcomes
    winner = "tiny-llama" if first["ok"] else "tiny-qwen2"
    fingerprint = races.model_fingerprint(winner)
    with PageStore(store, StoreConfig()) as s:
        assert s.get_meta(STORE_FINGERPRINT_META) == fingerprint
        assert s.list_manifests() == [outcomes[0]["value"]]


def test_set_meta_if_absent_is_one_compare_and_set(tmp_path):
    with PageStore(tmp_path / "s", StoreConfig()) as s:
        assert s.set_meta_if_absent("owner", "a") == "a"
        assert s.set_meta_if_absent("owner", "b") == "a" and s.get_meta("owner") == "a"
