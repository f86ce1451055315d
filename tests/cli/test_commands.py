"""Foundation: the CLI's output shapes, and exactness across a process restart.

Every command runs as its own process (`python -m tieredkv.cli ...`): one deposits, others graft,
so the grafted pages always come back from LMDB, SHA-256-verified, in a process that never saw
them being made.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paging import PageStore
from testkit.graft_child import fresh_logits
from tieredkv.artifacts.artifact import graft, grafted_token_ids
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.question.corpus import python_reference

CHILD = Path(__file__).resolve().parents[2] / "testkit" / "graft_child.py"
ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
# ASCII, so byte tokens == characters; 96 tokens = 3 full pages of tiny-llama
TEXT = python_reference().encode("ascii", "ignore").decode()[:96]
CONTINUATION = " and so the reference continues."


def _run(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, env=ENV, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc


def _cli(*args: str) -> subprocess.CompletedProcess:
    return _run("-m", "tieredkv.cli", *args)


@pytest.fixture(scope="module")
def deposited(tmp_path_factory):
    """A tiny-llama artifact deposited by a CLI process that has exited since."""
    store = tmp_path_factory.mktemp("cli") / "store"
    out = _cli("deposit", "--model", "tiny-llama", "--store", str(store), "--text", TEXT, "--quiet")
    return store, json.loads(out.stdout)


def test_deposit_prints_the_artifact_summary(deposited):
    _, summary = deposited
    assert {"artifact", "tokens", "pages", "root_sha256"} <= summary.keys()
    assert summary["tokens"] == len(TEXT) == 96
    assert summary["pages"] == 3
    assert len(summary["root_sha256"]) == 64


def test_graft_across_a_process_restart_is_exact(deposited, tiny_model):
    store, summary = deposited
    out = _run(str(CHILD), "--model", "tiny-llama", "--store", str(store), "--artifact", summary["artifact"],
               "--continuation", CONTINUATION)
    child = json.loads(out.stdout)
    assert child["verified_reads"] == summary["pages"]  # every page came from disk, verified
    assert child["num_threads"] == torch.get_num_threads()

    lm = tiny_model("tiny-llama")
    cont = lm.codec.encode(CONTINUATION)
    fresh = fresh_logits(lm, lm.codec.encode(TEXT), cont, lm.default_page_size)
    assert child["shape"] == list(fresh.shape)
    assert child["logits_sha256"] == sha256_tensor(fresh)


def test_graft_prints_the_generated_text(deposited, tiny_model):
    store, summary = deposited
    out = _cli("graft", "--model", "tiny-llama", "--store", str(store), "--artifact", summary["artifact"][:8],
               "--prompt", "Q: what?", "--max-new-tokens", "6")
    # the same greedy continuation, computed here from a graft of the same pages
    lm = tiny_model("tiny-llama")
    with PageStore(store) as s:
        cache = graft(lm, summary["artifact"], s)
        prefix = grafted_token_ids(s, cache.tieredkv_artifact)
    ids = torch.tensor([prefix + lm.codec.encode("Q: what?")])
    with torch.inference_mode():
        gen = lm.model.generate(ids, past_key_values=cache, max_new_tokens=6, do_sample=False,
                                pad_token_id=lm.codec.eos_token_id)
    assert gen.shape[1] > ids.shape[1]
    assert out.stdout == (lm.codec.decode(gen[0, ids.shape[1]:].tolist()) + "\n").encode("utf-8")


def test_stats_prints_json(deposited):
    store, summary = deposited
    stats = json.loads(_cli("stats", "--store", str(store)).stdout)
    assert stats["artifacts"] == [summary["artifact"]]
    assert stats["lmdb"]["pages"] == summary["pages"]
    assert stats["lmdb"]["quarantined"] == 0
    assert {"device", "host", "lmdb", "integrity"} <= stats.keys()


def test_verify_json_report(tiny_model):
    out = _cli("verify", "--model", "tiny-llama", "--samples", "2", "--tokens", "64", "--json")
    report = json.loads(out.stdout)
    assert {"samples", "sha256_equal", "kl_max", "argmax_agreement", "model_fingerprint", "domain"} <= report.keys()
    assert report["samples"] == report["sha256_equal"] == 2
    assert report["kl_max"] == 0.0 and report["argmax_agreement"] == 1.0
    assert report["model_fingerprint"] == tiny_model("tiny-llama").fingerprint
    assert report["domain"]["fingerprint"] == report["model_fingerprint"]
    assert "rows" not in report  # only with --rows


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """`tieredkv stats | head`: when the reader of stdout is gone, the command stops with the status
    of a process SIGPIPE ended (141) and writes nothing to stderr: no error line, no traceback."""
    store = tmp_path / "store"
    PageStore(str(store)).close()
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first write
    try:
        proc = subprocess.run([sys.executable, "-m", "tieredkv.cli", "stats", "--store", str(store)],
                              stdout=write_end, stderr=subprocess.PIPE, env=ENV, timeout=120)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr.decode()) == (141, "")
