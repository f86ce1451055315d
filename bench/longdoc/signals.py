"""Which signal finds the page that answers a question? Ranks under each signal the reading could use.

    votes      the reading's attention signal: how many layers retrieve the page in a probe forward of
               the question (each layer: the union of its KV heads' top-k, as attention retrieves)
    bound      the page index's own score, every page: Quest bound of the chunk's mean query per
               (layer, KV head), z-scored over pages and summed
    contrast   `bound` for the question minus `bound` for the same prompt without a question (pages
               that every prompt attends to, "hubs", cancel)
    lexical    BM25 of the question's words over the page's text
    hybrid     reciprocal-rank fusion of votes and lexical (the reading's "hybrid")

Used by bench/longdoc_qa.py's "signals" system.
"""
from __future__ import annotations

import numpy as np
import torch

from tieredkv.engine import attention
from tieredkv.engine.placement import PlacementPolicy, grouped_queries
from tieredkv.question.reading import fuse, lexical_scores
from tieredkv.question.reencode import attention_votes


class _Queries(PlacementPolicy):
    """`base`'s selection; records each layer's scoring queries grouped by KV head."""

    def __init__(self, base: PlacementPolicy):
        self.base, self.queries = base, {}

    def select(self, ctx, layer_idx, query):
        q = self.base.scoring_query(ctx, layer_idx, query)
        self.queries[layer_idx] = grouped_queries(q, ctx.layout.num_kv_heads).float().cpu().numpy()
        return self.base.select(ctx, layer_idx, query)

    def place(self, ctx, page_ids):
        return self.base.place(ctx, page_ids)


@torch.inference_mode()
def bound_scores(tm, prompt_ids) -> np.ndarray:
    """[N] sum over (layer, KV head) of the z-scored index score of every page for `prompt_ids`."""
    base, rec = tm.cache.policy, _Queries(tm.cache.policy)
    tm.cache.policy = rec
    try:
        with attention.activate(tm.cache):
            tm.model(input_ids=torch.tensor([list(prompt_ids)]), past_key_values=tm.cache, use_cache=True,
                     logits_to_keep=1)
    finally:
        tm.cache.policy = base
    n, index = len(tm.cache.spans), tm.cache.index
    total = np.zeros(n)
    for layer, q in rec.queries.items():
        ids, sc = index.search(layer, q, n)
        for h in range(index.num_heads):
            v = np.zeros(n)
            keep = ids[h] >= 0
            v[ids[h][keep]] = sc[h][keep]
            total += (v - v.mean()) / (v.std() + 1e-9)
    return total


def _rank(order: list[int], answer_pages: list[int]) -> int | None:
    hits = [order.index(p) + 1 for p in answer_pages if p in order]
    return min(hits) if hits else None


def signal_ranks(tm, art, q_ids, null_ids, question: str, answer_pages: list[int], *,
                 allow_domain_mismatch: bool = False) -> dict:
    """Rank of the best answer page under each signal, among pages after the sink; `art` (the context
    of `tm`) is grafted afresh after each probe (a probe leaves the prompt's tokens in the cache)."""
    cache = tm.cache
    cands = list(range(tm.config.sink_pages, len(cache.spans)))
    votes = attention_votes(cache, q_ids)
    words = lexical_scores(cache, cands, question, tm.lm.codec)
    q_bound = bound_scores(tm, q_ids)
    tm.graft(art, allow_domain_mismatch=allow_domain_mismatch)
    null_bound = bound_scores(tm, null_ids)
    tm.graft(art, allow_domain_mismatch=allow_domain_mismatch)
    orders = {"votes": sorted((p for p in cands if votes.get(p)), key=lambda p: (-votes[p], p)),
              "lexical": sorted((p for p in cands if words.get(p)), key=lambda p: (-words[p], p)),
              "bound": sorted(cands, key=lambda p: (-q_bound[p], p)),
              "contrast": sorted(cands, key=lambda p: (-(q_bound[p] - null_bound[p]), p))}
    orders["hybrid"] = fuse([orders["votes"], orders["lexical"]])
    return {name: _rank(order, answer_pages) for name, order in orders.items()}
