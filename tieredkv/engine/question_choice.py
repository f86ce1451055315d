"""TieredConfig(selection="question"): a question's own attention chooses each layer's far pages, once.

SnapKV's observation (Li et al., 2024), at page granularity: the queries of the prompt's last tokens already
attend to what the answer will need. At the question's forward over a sealed context that retrieves, each
full-attention layer scores every sealed page's stored keys against every query of the question, exactly (a
softmax over the document's keys, per query head), and each KV head ranks the far pages (not sink, not local)
by the attention mass its query heads give them. That ranking is held for the question and its answer: every
forward of that layer reads each head's top-k of it (`retrieval="per_head"`) or their union (`"union"`), and
no index search runs. Approximate: the document's pages are read once per layer per question (a scan, at
question time), the decode steps read only their working set. Pages are scored at their own positions (what
full attention would give them), under either position policy.

    arm(cache, words)                 at a question over a sealed context (TieredModel._read_for); `words`: the
                                      pages' BM25 ranking for selection="hybrid", fused by rank
    held_ranking(ctx, layer, query)   each KV head's far pages, best first: computed at the layer's first
                                      forward after `arm`, then held (PlacementPolicy.ranked_per_head)
"""
from __future__ import annotations

import itertools
import weakref

import torch

from tieredkv.engine.working_set import far_pages, fuse

_SCALING: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {layer: its attention's scale}


def arm(cache, words: list[int] | None = None) -> None:
    """The next forward of every full-attention layer chooses its pages by the question's attention; with
    `words` (far pages, best first: the pages' BM25 for the question's words, selection="hybrid"), by that
    attention's ranking and `words` fused by rank."""
    cache.question_ranking, cache.question_words = {}, words


def held_ranking(ctx, layer_idx: int, query: torch.Tensor, k: int) -> list[list[int]]:
    """Each KV head's best `k` far pages for this layer, best first, as the question's queries ranked them (the
    far pages of the context when the question ran, passing over those that have since joined the local
    window). Every forward of a decode step calls this: each row is read only as far as its k-th page."""
    ranking = ctx.question_ranking
    if layer_idx not in ranking:
        ranking[layer_idx] = rank_by_attention(ctx, layer_idx, query)
    c = ctx.config
    far = far_pages(len(ctx.spans), sink=c.sink_pages, local=c.local_pages)
    return [list(itertools.islice((p for p in row if p in far), k)) for row in ranking[layer_idx]]


@torch.inference_mode()
def rank_by_attention(ctx, layer_idx: int, query: torch.Tensor) -> list[list[int]]:
    """Far pages per KV head, ranked by the attention mass of `query` ([1, Hq, q, D], the question's queries at
    this layer, post-rotary) over each page's keys (ties: the earlier page)."""
    c = ctx.config
    mass = page_mass(ctx, layer_idx, query)  # [Hkv, pages]
    far = far_pages(len(ctx.spans), sink=c.sink_pages, local=c.local_pages)
    ranked = [sorted(far, key=lambda p: (-float(row[p]), p)) for row in mass]
    words = ctx.question_words
    return [fuse([row, words]) for row in ranked] if words else ranked


def page_mass(ctx, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
    """[Hkv, pages] float64: the softmax weight the queries of each KV head's query heads give each sealed page's
    keys, summed over its tokens and over those queries; every query normalised over the document's keys (its
    own prompt's keys left out). The pages are read one at a time (`page_kv`): the device tier's budget holds."""
    hkv = ctx.layout.num_kv_heads
    hq, q, d = query.shape[1], query.shape[2], query.shape[3]
    grouped = query[0].reshape(hkv, (hq // hkv) * q, d).double()  # [Hkv, G*q, D]
    scale = attention_scaling(ctx.model, layer_idx, d)
    per_page = []
    for span in ctx.spans:
        k, _ = ctx.page_kv(span.page_id, layer_idx)  # [Hkv, T, D]
        logits = torch.matmul(grouped, k.to(device=grouped.device, dtype=torch.float64).transpose(1, 2)) * scale
        per_page.append(torch.logsumexp(logits, dim=-1))  # [Hkv, G*q]
    lse = torch.stack(per_page, dim=-1)  # [Hkv, G*q, pages]
    return torch.exp(lse - torch.logsumexp(lse, dim=-1, keepdim=True)).sum(dim=1)


def attention_scaling(model, layer_idx: int, head_dim: int) -> float:
    """The softmax scale of the model's attention at `layer_idx` (its module's `scaling`), else head_dim^-0.5."""
    scales = _SCALING.get(model)
    if scales is None:
        scales = _SCALING[model] = {
            m.layer_idx: float(m.scaling) for m in model.modules()
            if isinstance(getattr(m, "layer_idx", None), int) and isinstance(getattr(m, "scaling", None), (int, float))}
    return scales.get(layer_idx, head_dim ** -0.5)
