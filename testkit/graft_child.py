"""Helpers for the foundation tests, also runnable as a child process.

    python testkit/graft_child.py --model M --store DIR --artifact ID --continuation TEXT

grafts the artifact (in this fresh process), prefills the continuation after it with the
canonical schedule and prints JSON with the SHA-256 of the continuation's logits.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

import torch
from transformers import DynamicCache

from tieredkv.artifacts.artifact import graft, prefill
from tieredkv.models.loading import LoadedModel
from tieredkv.provenance.domain import sha256_tensor


def continuation_logits(lm: LoadedModel, cache, cont: Sequence[int], start: int, page_size: int) -> torch.Tensor:
    """Logits [C, vocab] of `cont` prefilled at positions [start, start+C) after whatever `cache` holds."""
    chunks = []
    prefill(lm, list(cont), cache, start=start, page_size=page_size,
            on_chunk=lambda _s, _e, out: chunks.append(out.logits[0]), logits_to_keep=0)
    return torch.cat(chunks, 0)


def fresh_logits(lm: LoadedModel, prefix: Sequence[int], cont: Sequence[int], page_size: int) -> torch.Tensor:
    """The baseline: a fresh canonical prefill of prefix + continuation; the continuation's logits.

    NOTE: a page-aligned prefix is one prefill call over prefix + continuation (the prefix end is
    a chunk boundary already); an unaligned one must stop the schedule at the prefix end, since a
    graft does (this is what `verify` compares against).
    """
    n = len(prefix)
    cache = DynamicCache(config=lm.model.config)
    if n % page_size:
        prefill(lm, list(prefix), cache, page_size=page_size)
        return continuation_logits(lm, cache, cont, n, page_size)
    chunks = []

    def keep(s, e, out):
        if s >= n:
            chunks.append(out.logits[0])

    prefill(lm, list(prefix) + list(cont), cache, page_size=page_size, on_chunk=keep, logits_to_keep=0)
    return torch.cat(chunks, 0)


def grafted_logits(lm: LoadedModel, artifact, store, cont: Sequence[int]) -> torch.Tensor:
    cache = graft(lm, artifact, store)
    art = cache.tieredkv_artifact
    return continuation_logits(lm, cache, cont, art.num_tokens, art.page_size)


def main(argv: list[str] | None = None) -> int:
    from paging import PageStore
    from tieredkv.models.loading import load_model

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--artifact", required=True)
    p.add_argument("--continuation", required=True)
    a = p.parse_args(argv)
    lm = load_model(a.model)
    with PageStore(a.store) as store:
        logits = grafted_logits(lm, a.artifact, store, lm.codec.encode(a.continuation))
        verified_reads = store.stats()["integrity"]["verified_reads"]
    print(json.dumps({"logits_sha256": sha256_tensor(logits), "shape": list(logits.shape),
                      "num_threads": torch.get_num_threads(), "verified_reads": verified_reads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
