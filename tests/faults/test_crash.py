"""SIGKILL mid-deposit and mid-export; stale readers of killed processes.

A few points each; bench/fault_suite.py sweeps 100+ kill points and records the outcomes.
"""
from __future__ import annotations

import hashlib

import pytest
import torch

from paging import PageStore
from testkit.faults import (
    PAGE_SIZE,
    ForkRunner,
    corpus_text,
    deposit_kill_run,
    export_kill_run,
    make_store,
    stale_reader_reclaimed,
    store_config,
)
from tieredkv.artifacts.portable import export_artifact
from tieredkv.models.loading import load_model


@pytest.fixture(scope="module")
def runner():
    return ForkRunner()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store that already holds one artifact (which no crash may damage), and its export."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("crash")
    ids = make_store(root / "template", [corpus_text(5 * PAGE_SIZE, seed=11)], load_model("tiny-llama"))
    torch.set_num_threads(threads)
    with PageStore(root / "template", store_config()) as store:
        export_artifact(store, ids[0], root / "base.tkva")
    return {"root": root, "path": root / "template", "ids": ids, "base_file": (root / "base.tkva").read_bytes()}


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3, 0.6])
def test_sigkill_during_deposit_leaves_a_verified_store_and_no_partial_artifact(runner, template, tmp_path, delay):
    r = deposit_kill_run(runner, template["path"], tmp_path / "work", corpus_text(2000, seed=12), delay,
                         template["ids"])
    assert r["survived"] and not r["lost"], r
    assert r["killed"] or r["state"] == "complete", r


def test_sigkill_during_export_leaves_the_old_file_or_the_new_one(runner, template, tmp_path):
    store_path = tmp_path / "store"
    import shutil

    shutil.copytree(template["path"], store_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    new_id = make_store(store_path, [corpus_text(4000, seed=13)], load_model("tiny-llama"))[0]
    torch.set_num_threads(threads)
    with PageStore(store_path, store_config()) as store:
        new_sha = export_artifact(store, new_id, tmp_path / "reference.tkva")["file_sha256"]
    path = tmp_path / "out" / "context.tkva"
    path.parent.mkdir()
    full = export_kill_run(runner, store_path, new_id, path, template["base_file"], new_sha, None)
    assert full["state"] == "new" and full["temps_left_by_kill"] == 0
    states = []
    for delay in (0.0, 0.3 * full["elapsed"], 0.6 * full["elapsed"], 0.9 * full["elapsed"]):
        r = export_kill_run(runner, store_path, new_id, path, template["base_file"], new_sha, delay)
        assert r["survived"] and r["temps_after_cleanup"] == 0, r
        states.append(r["state"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() in {new_sha, hashlib.sha256(template["base_file"]).hexdigest()}


def test_stale_reader_of_a_killed_process_is_reclaimed(template, tmp_path):
    import shutil

    shutil.copytree(template["path"], tmp_path / "s")
    r = stale_reader_reclaimed(str(tmp_path / "s"))
    assert r["exitcode"] == -9 and r["freed"] >= 1 and r["store_ok"], r
