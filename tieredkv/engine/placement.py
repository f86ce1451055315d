"""Placement policies: which sealed pages a full-attention layer attends to, and at which positions.

    TieredCache.working_set(layer, query)
        └─ layer.plan(query)                          the layer kind decides (LAYER_KINDS below)
             ├─ SlidingWindowLayer: exactly its window, own positions (no policy involved)
             └─ FullAttentionLayer: policy.select(ctx, layer, query) -> page ids, position order
                                    policy.place(ctx, page ids)      -> page id -> position shift
                                    (retrieval="per_head": select_heads / place_heads, the same split
                                    into the pages every KV head reads and each head's own top-k)

A policy sees the context through its cache (`ctx`): `spans`, `config`, `index`, `retrieving`,
`local_first`, `reencoded`. It decides; the cache fetches pages, moves keys and builds the mask.

    own     OwnPositions   every key at its absolute position (exact; the default inside the window)
    fixed   FixedDistance  sink and retrieved pages packed right before the local window (InfLLM;
                           approximate; for contexts beyond the model's window)

Diagnostics subclass or wrap a policy (`testkit.placement.ForcedPages`) and install it with
`TieredModel.use_policy`, instead of replacing the cache's methods.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from tieredkv.engine.tiered_config import QUESTION_SELECTIONS
from tieredkv.engine.working_set import HeadPages, fixed_positions, merge_ranked, retrieval_excluded, select_pages


def grouped_queries(query: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """query [1, Hq, q, D] -> [Hkv, G*q, D]: the queries that read each KV head (GQA: query head j
    reads KV head j // G)."""
    hq, q, d = query.shape[1], query.shape[2], query.shape[3]
    return query[0].reshape(num_kv_heads, hq // num_kv_heads, q, d).reshape(num_kv_heads, -1, d)


class PlacementPolicy:
    """Select pages for a full-attention layer and a query chunk, and place them.

    The base class retrieves with the page index (each KV head's top-k, union over heads) and keeps
    every key at its own position. Subclasses override `scoring_query` (where pages are scored),
    `retrieve` (which pages) or `place` (where they sit)."""

    name: ClassVar[str] = "own"
    # A retrieving decode step may leave each page where it already sits in the working-set buffer
    # (keys in any order, holes masked; kv_buffer.py): only the pages that joined are copied. Other
    # float bytes than position order, so only for approximate policies; never for prefill chunks
    # (ingest writes pages), exact paths, or policies whose answers are measured as they are.
    slots_in_place: ClassVar[bool] = False

    def select(self, ctx, layer_idx: int, query: torch.Tensor) -> list[int]:
        """Page ids this layer attends to, in position order: every page while the context fits one
        working set, else sink + retrieved + re-encoded + local pages."""
        n, c = len(ctx.spans), ctx.config
        if not ctx.retrieving:
            return list(range(n))
        found = self.retrieve(ctx, layer_idx, query)
        ctx.retrieval_log.append(list(found))
        return select_pages(n, sink=c.sink_pages, local=c.local_pages, retrieved=[*found, *ctx.reencoded])

    def retrieve(self, ctx, layer_idx: int, query: torch.Tensor) -> list[int]:
        """Far pages (not sink, not local) the index scores highest for `query`, union over KV heads
        (at most `config.union_pages` of them, filled by rank: `merge_ranked`), in position order; or the
        pages a question holds (`ctx.held_pages`, TieredConfig.selection="lexical"), searching nothing."""
        if ctx.held_pages is not None:
            exclude = retrieval_excluded(len(ctx.spans), sink=ctx.config.sink_pages, local=ctx.config.local_pages)
            return sorted(set(ctx.held_pages) - exclude)
        return merge_ranked(self.ranked_per_head(ctx, layer_idx, query), ctx.config.union_pages)

    def retrieve_per_head(self, ctx, layer_idx: int, query: torch.Tensor) -> list[list[int]]:
        """Each KV head's top-k far pages (not sink, not local) for `query`, in position order."""
        return [sorted(row) for row in self.ranked_per_head(ctx, layer_idx, query)]

    def ranked_per_head(self, ctx, layer_idx: int, query: torch.Tensor) -> list[list[int]]:
        """Each KV head's top-k far pages (not sink, not local) for `query`, best first: the index's, or under
        TieredConfig.selection="question" (or "hybrid") the ranking the question chose (question_choice.py)."""
        c = ctx.config
        if ctx.question_ranking is not None and c.selection in QUESTION_SELECTIONS:
            from tieredkv.engine.question_choice import held_ranking

            return held_ranking(ctx, layer_idx, query, c.topk_pages)
        grouped = grouped_queries(self.scoring_query(ctx, layer_idx, query), ctx.layout.num_kv_heads)
        exclude = retrieval_excluded(len(ctx.spans), sink=c.sink_pages, local=c.local_pages)
        ids, _ = ctx.index.search(layer_idx, grouped.float().cpu().numpy(), c.topk_pages, exclude=exclude)
        return [[int(p) for p in row if p >= 0] for row in ids]

    def select_heads(self, ctx, layer_idx: int, query: torch.Tensor) -> tuple[list[int], list[list[int]] | None]:
        """`select`, split for `TieredConfig.retrieval="per_head"` while the context retrieves: the pages
        every KV head reads (sink and local, position order) and each head's own top-k. Else
        `(select(...), None)`: the union. So too with held pages (the same for every head), with re-encoded
        pages (`fixed` packs them among the union's pages: reencode.py computed them there) and for a policy
        that overrides `select` (a diagnostic that decides the selection itself)."""
        c = ctx.config
        if (c.retrieval != "per_head" or not ctx.retrieving or ctx.reencoded or ctx.held_pages is not None
                or type(self).select is not PlacementPolicy.select):
            return self.select(ctx, layer_idx, query), None
        rows = self.retrieve_per_head(ctx, layer_idx, query)
        # NOTE: every head ranks the same eligible pages, more than top-k of them while retrieving
        assert len({len(r) for r in rows}) == 1, f"heads retrieved unequal counts {[len(r) for r in rows]}"
        found = merge_ranked(rows)
        ctx.retrieval_log.append(found)
        if len({sum(ctx.spans[p].end - ctx.spans[p].start for p in row) for row in rows}) > 1:
            # a partial page among them (a context continued after a partial last page): heads would read
            # unequal numbers of keys, which one buffer cannot hold; the union serves this forward
            return select_pages(len(ctx.spans), sink=c.sink_pages, local=c.local_pages, retrieved=found), None
        return select_pages(len(ctx.spans), sink=c.sink_pages, local=c.local_pages, retrieved=()), rows

    def scoring_query(self, ctx, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        return query

    def place(self, ctx, page_ids: list[int]) -> dict[int, int]:
        """Page id -> position shift for the pages this layer attends to ({}: own positions)."""
        return {}

    def place_heads(self, ctx, shared: list[int], rows: list[list[int]]) -> tuple[dict[int, int], HeadPages]:
        """`place` for `select_heads`' split: the shared pages' shifts, and each head's pages with theirs."""
        return {}, HeadPages(tuple(map(tuple, rows)), tuple((0,) * len(r) for r in rows))


class OwnPositions(PlacementPolicy):
    """Every key at its absolute position: exact, and meant for contexts inside the model's window."""

    name = "own"
    slots_in_place = True


class FixedDistance(PlacementPolicy):
    """InfLLM-style: sink and retrieved pages sit right before the local window, so attention never
    spans more than one working set. With `score_frame="attended"` pages are scored there too:
    summaries hold page-relative keys and the queries are moved to match."""

    name = "fixed"
    slots_in_place = True

    def scoring_query(self, ctx, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        if not ctx.config.relative_scoring:
            return query
        from tieredkv.engine.rotary import rerotate

        # a page at relative 0 sits where the nearest far page is attended: right before the local window
        return rerotate(ctx.model, query, ctx.page_size - ctx.spans[ctx.local_first].start, layer_idx)

    def place(self, ctx, page_ids: list[int]) -> dict[int, int]:
        if not ctx.retrieving:
            return {}
        first = ctx.local_first
        return fixed_positions(ctx.spans, [i for i in page_ids if i < first], ctx.spans[first].start)

    def place_heads(self, ctx, shared: list[int], rows: list[list[int]]) -> tuple[dict[int, int], HeadPages]:
        """Per head as `place` packs its own far pages: the shared far pages (the sink) first, then the
        head's pages in position order, right before the local window. Every head packs as many tokens,
        so the sink lands at one position for all of them."""
        first = ctx.local_first
        far = [i for i in shared if i < first]
        per_head = [fixed_positions(ctx.spans, [*far, *row], ctx.spans[first].start) for row in rows]
        shifts = {i: per_head[0][i] for i in far}
        assert all(d[i] == shifts[i] for d in per_head for i in far), "heads pack the shared pages differently"
        moved = tuple(tuple(d[p] for p in row) for d, row in zip(per_head, rows))
        return shifts, HeadPages(tuple(map(tuple, rows)), moved)


POLICIES: dict[str, type[PlacementPolicy]] = {"own": OwnPositions, "fixed": FixedDistance}


def policy_for(position: str) -> PlacementPolicy:
    return POLICIES[position]()

