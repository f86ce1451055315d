"""Question-time reading (fixed policy; approximate): find the passages a question is about among the
stored pages, and read them afresh, together, right before the question.

    rank     every document page, by two signals over the stored pages:
               attention  one probe forward of the question over a throwaway copy of the context:
                          how many layers retrieve the page (each layer: the union of its KV heads'
                          top-k by the page index, as attention itself retrieves)
               lexical    BM25 of the question's words over the page's text (its token ids, decoded)
             fused by reciprocal rank (Cormack et al. 2009): a page high in either list ranks high
    choose   the best pages, each with `neighbours` pages either side (a passage, not a sentence cut
             at a page boundary), until `pages` document pages are chosen
    read     the sink page and the chosen pages, computed afresh by the model in document order
             and packed right before the question, so the question reads them as one short
             document; attention then sees exactly those pages and the question's own tokens
             (`CompactReading`)

Nothing stored changes: the re-encoded K/V live in the cache for this context only
(`TieredCache.reencoded`), and the question's pages are keyed under a fingerprint that names them.
This is GemFilter's and InfiniRetri's "select, then re-read the selection", with the selection made
over the memory tier's own pages and index.
"""
from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from tieredkv import attention
from tieredkv.placement import PlacementPolicy
from tieredkv.tiered_config import ReadingConfig  # noqa: F401  (re-exported)

RRF_K = 60  # reciprocal-rank fusion constant (Cormack, Clarke and Buettcher 2009)


@dataclass
class Reading:
    """What one question read: the chosen pages and how each signal ranked them."""

    pages: list[int]  # document pages read (position order, sink excluded)
    ranked: list[int]  # every candidate page, best first, by the configured signal
    attention_votes: dict[int, int] = field(default_factory=dict)
    lexical_scores: dict[int, float] = field(default_factory=dict)

    def to_dict(self, top: int = 16) -> dict:
        d = asdict(self)
        d["ranked"] = self.ranked[:top]
        d["attention_votes"] = dict(sorted(self.attention_votes.items(), key=lambda kv: -kv[1])[:top])
        d["lexical_scores"] = {p: round(s, 3) for p, s in
                               sorted(self.lexical_scores.items(), key=lambda kv: -kv[1])[:top]}
        return d


def attention_votes(cache, prompt_ids: Sequence[int]) -> dict[int, int]:
    """Page id -> how many layers retrieve it in one forward of `prompt_ids`, run over a throwaway
    copy of `cache`'s sealed context with its own placement policy."""
    from tieredkv.tiered_cache import TieredCache

    shadow = TieredCache(cache.model, cache.store, cache.config, fingerprint=cache.fingerprint,
                         page_size=cache.page_size, policy=cache.policy, persist=False)
    shadow.attach(cache.page_keys, cache.spans, cache.layout, cache.index)
    model = cache.model
    try:
        # One forward: its own tokens are never sealed, so the shared index is not touched.
        with attention.activate(shadow), torch.inference_mode():
            model(input_ids=torch.tensor([list(prompt_ids)], device=model.device), past_key_values=shadow,
                  use_cache=True, logits_to_keep=1)
    finally:
        shadow.close()
    return dict(collections.Counter(p for sel in shadow.retrieval_log for p in sel))


def fuse(rankings: Sequence[Sequence[int]]) -> list[int]:
    """Reciprocal-rank fusion of best-first page lists (ties: the earlier page)."""
    score: dict[int, float] = collections.defaultdict(float)
    for ranking in rankings:
        for r, p in enumerate(ranking):
            score[p] += 1.0 / (RRF_K + r + 1)
    return sorted(score, key=lambda p: (-score[p], p))


def rank(candidates: Sequence[int], votes: dict[int, int] | None, lexical: dict[int, float] | None,
         signal: str) -> list[int]:
    """The candidates that `signal` scored, best first (pages no signal scored are left out)."""
    by_votes = sorted((p for p in candidates if votes and votes.get(p)), key=lambda p: (-votes[p], p))
    by_words = sorted((p for p in candidates if lexical and lexical.get(p, 0) > 0), key=lambda p: (-lexical[p], p))
    first = {"attention": [by_votes], "lexical": [by_words], "hybrid": [by_votes, by_words]}[signal]
    return fuse(first) if len(first) > 1 else list(first[0])


def choose(ranked: Sequence[int], candidates: Sequence[int], count: int, neighbours: int) -> list[int]:
    """Up to `count` candidate pages: each ranked page with its neighbours, best pages first."""
    allowed, chosen = set(candidates), []
    for p in ranked:
        for q in [p, *(p + d for k in range(1, neighbours + 1) for d in (-k, k))]:
            if q in allowed and q not in chosen and len(chosen) < count:
                chosen.append(q)
        if len(chosen) >= count:
            break
    return sorted(chosen)


class CompactReading(PlacementPolicy):
    """Attention over exactly the re-encoded pages (already at their packed positions) and the pages
    sealed after the document (the question's own): no retrieval, no local window."""

    name = "compact"

    def __init__(self, document_pages: int):
        self.document_pages = document_pages

    def select(self, ctx, layer_idx, query):
        return sorted({*ctx.reencoded, *range(self.document_pages, len(ctx.spans))})

    def place(self, ctx, page_ids):
        return {}  # re-encoded keys were computed where they sit; the question's pages are at their own


def lexical_scores(cache, candidates: Sequence[int], query: str, codec) -> dict[int, float]:
    """Page id -> BM25 of `query`'s words over the page's text (the page's token ids, decoded)."""
    from index.lexical import BM25Index

    if cache.lexical_index is None or len(cache.lexical_index) != len(cache.spans):  # built at the first question
        cache.lexical_index = BM25Index([codec.decode(cache.page_token_ids(p)) for p in range(len(cache.spans))])
    scores = cache.lexical_index.scores(query)
    return {p: float(scores[p]) for p in candidates if scores[p] > 0}


def read(cache, prompt_ids: Sequence[int], query: str, config: ReadingConfig, codec) -> Reading:
    """Rank the document's pages for a question, choose its passages, read them afresh right before it
    (the sink page first), and make attention see only them and the question (`CompactReading`)."""
    from tieredkv.reencode import reencode

    num_pages = len(cache.spans)
    framed = config.frame_tokens is not None and cache.config.sink_pages == 1
    candidates = list(range(0 if framed else min(cache.config.sink_pages, num_pages), num_pages))
    votes = attention_votes(cache, prompt_ids) if config.signal in ("attention", "hybrid") else {}
    words = lexical_scores(cache, candidates, query, codec) if config.signal in ("lexical", "hybrid") else {}
    ranked = rank(candidates, votes, words, config.signal)
    # nothing matched (no word of the question in the document): the document's end, as truncation reads
    pages = choose(ranked, candidates, config.pages, config.neighbours) or candidates[-config.pages:]
    # the frame stands for the sink page, unless the page itself was chosen (then it is read whole)
    frame = config.frame_tokens if framed and 0 not in pages else None
    reencode(cache, pages, end=cache.sealed_upto, keep_packed=True, sink_tokens=frame)
    cache.policy = CompactReading(num_pages)  # this context only: a reset restores the model's policy
    return Reading(pages, ranked, votes, words)
