"""Hashes of what the library computes, to show a refactor changed no behaviour.

Runs a fixed set of small, seeded computations on every test model and on smollm2, and prints one
JSON object of SHA-256 hashes: graft-vs-fresh logits (`verify`), and `TieredModel` logits and
greedy output ids with retrieval active under every position policy (own, fixed, fixed with
question-time re-encoding). Run it before and after a change on the same machine and compare:

    python -m bench.tools.behaviour_hashes > before.json    # ... change ...
    python -m bench.tools.behaviour_hashes > after.json && diff before.json after.json

Hashes are specific to one determinism domain (machine, threads, versions): compare runs of one
machine, never against another's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile

import torch

from bench.lib.report import environment
from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.models.loading import TINY_MODELS, load_model
from tieredkv.provenance.verify import VerifySpec, verify


def sha(t) -> str:
    if isinstance(t, torch.Tensor):
        return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()
    return hashlib.sha256(json.dumps(t).encode()).hexdigest()


def doc_ids(lm, n: int, seed: int) -> list[int]:
    if lm.name == "smollm2":
        from tieredkv.question.corpus import python_reference

        return lm.codec.encode(python_reference())[seed * 997:][:n]
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def tiered_run(lm, config: TieredConfig, doc: list[int], question: list[int]) -> dict[str, str]:
    """Ingest `doc`, answer `question` (8 greedy tokens); then graft the artifact and answer again."""
    with tempfile.TemporaryDirectory() as tmp, PageStore(tmp, StoreConfig()) as store:
        tm = TieredModel(lm, store, config)
        try:
            art = tm.ingest(doc)
            logits = tm.prefill(question[:-1], logits_to_keep=0)
            tm.graft(art)
            out = tm.generate(question, max_new_tokens=8)
            tm.graft(art)
            out_again = tm.generate(question, max_new_tokens=8)
        finally:
            tm.close()
    return {"artifact": art.artifact_id, "question_logits": sha(logits), "answer_ids": sha(out),
            "answer_ids_after_graft": sha(out_again)}


def model_hashes(name: str) -> dict[str, object]:
    lm = load_model(name)
    small = name != "smollm2"
    page = 32 if small else 128
    rep = verify(lm, VerifySpec(tokens=96 if small else 256, samples=3, continuation=8, page_size=page, seed=0))
    res: dict[str, object] = {"verify": sha([[r["input_sha256"], r["fresh_logits_sha256"], r["grafted_logits_sha256"]]
                                             for r in rep["rows"]]),
                              "verify_sha256_equal": rep["sha256_equal"]}
    doc, question = doc_ids(lm, 24 * page + 7, 1), doc_ids(lm, 13, 2)
    policies = {"own": TieredConfig(page_size=page, local_pages=4, topk_pages=2)}
    if name != "tiny-gpt2":
        policies["fixed"] = TieredConfig(page_size=page, local_pages=4, topk_pages=2, position="fixed")
        policies["fixed+reencode"] = TieredConfig(page_size=page, local_pages=4, topk_pages=2, position="fixed",
                                                  reencode_pages=3)
    for policy, cfg in policies.items():
        try:
            res[policy] = tiered_run(lm, cfg, doc, question)
        except Exception as e:  # recorded, so that a fix shows up as a changed line
            res[policy] = f"error: {type(e).__name__}: {e}"
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join([*TINY_MODELS, "smollm2"]))
    a = ap.parse_args()
    report = {"environment": environment(), "models": {m: model_hashes(m) for m in a.models.split(",")}}
    report["environment"].pop("load_avg_1_5_15", None)
    print(json.dumps(report, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
