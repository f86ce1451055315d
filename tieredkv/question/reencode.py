"""Question-time re-encoding (fixed policy; approximate): the pages a prompt retrieves most,
computed afresh together before the prompt is answered.

A stored page's K/V were computed where the page sits in the document, attending to its own
neighbourhood. Beyond the window, `fixed` packs the retrieved pages next to each other, but their
K/V never saw one another: four needles of the same form stay four unrelated islands. Re-encoding
runs the model's own attention over the sink page and the most-retrieved pages, in position order,
at the positions `fixed` packs them to, so that each page's K/V are computed with the others
before it (lab/2026-11-29-placement_sweep/ measured what this changes: `reencode`).

    probe      one forward of the prompt over a throwaway cache attached to the same pages:
               which far pages do the most layers retrieve (a layer's selection is the
               union of its KV heads' top-k)?
    re-encode  the sink page and those pages, by the plain model, packed right before the local
               window; keys moved back to their own positions, so that each layer packs them with
               whatever else it retrieves, as `fixed` packs stored pages.

Re-encoded K/V are never written: they live in the cache (`TieredCache.reencoded`), for this
context only, on the model's device: N + 1 pages of every layer, whatever the context length.
Pages sealed after them (the prompt's, the answer's) are keyed under a fingerprint that names the
re-encoded pages, since their bytes depend on them. Every full-attention layer's working set holds
the re-encoded pages; sliding-window layers keep reading stored pages at their own positions.
"""
from __future__ import annotations

import collections
from typing import Sequence

import torch

from tieredkv.engine import attention


def attention_votes(cache, prompt_ids: Sequence[int]) -> dict[int, int]:
    """Page id -> how many layers retrieve it in one forward of `prompt_ids`, run over a throwaway
    copy of `cache`'s sealed context with its own placement policy (each layer's selection is the
    union of its KV heads' top-k)."""
    from tieredkv.engine.tiered_cache import TieredCache

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


def probe(cache, prompt_ids: Sequence[int], count: int) -> list[int]:
    """At most `count` far pages: those that the most layers retrieve in one forward of `prompt_ids`
    (`attention_votes`; ties: the earlier page), in position order."""
    votes = attention_votes(cache, prompt_ids)
    return sorted(sorted(votes, key=lambda p: (-votes[p], p))[:count])


def encode_fragments(cache, fragments: Sequence[tuple[int, int, int]], end: int, *, keep_packed: bool) -> None:
    """Compute `fragments` afresh, together, packed right before position `end`, and serve them to
    full-attention layers in place of their pages (`cache.reencoded`).

    fragments: (page id, first, last + 1) in own positions, in document order, one per page. Keys stay
    where they were computed with `keep_packed`, else are moved back to their own positions."""
    from tieredkv.engine.rotary import rerotate

    spans = cache.spans
    ids = {p: cache.page_token_ids(p)[lo - spans[p].start:hi - spans[p].start] for p, lo, hi in fragments}
    start = end - sum(len(x) for x in ids.values())  # the first token's packed position
    model = cache.model
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[t for p, _, _ in fragments for t in ids[p]]], device=model.device),
                    position_ids=torch.arange(start, end, device=model.device)[None], use_cache=True,
                    logits_to_keep=1)
    layers, at, fresh = out.past_key_values.layers, 0, {}
    for p, lo, _ in fragments:
        n, shift = len(ids[p]), start + at - lo
        # NOTE: sliding-window layers keep reading the stored page (and their fresh cache holds only
        # the window): they get None
        fresh[p] = (lo, [None if cache.layers[i].is_sliding else
                         (x.keys[0, :, at:at + n] if keep_packed
                          else rerotate(model, x.keys[0, :, at:at + n], -shift, i),
                          x.values[0, :, at:at + n])
                         for i, x in enumerate(layers)])
        at += n
    cache.adopt_reencoded(fresh)


def reencode(cache, pages: Sequence[int]) -> list[int]:
    """Compute the sink pages and `pages` (those before the local window) afresh, together, packed where
    `fixed` packs far pages (right before the local window), with keys moved back to their own positions,
    so each layer packs them with whatever else it retrieves. Returns the page ids re-encoded."""
    spans, first = cache.spans, cache.local_first
    far = sorted({*range(min(cache.config.sink_pages, first)), *(int(p) for p in pages if int(p) < first)})
    if far:
        encode_fragments(cache, [(p, spans[p].start, spans[p].end) for p in far], spans[first].start,
                         keep_packed=False)
    return far
