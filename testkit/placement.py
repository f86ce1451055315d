"""A diagnostic placement policy: oracle retrieval, for measuring what retrieval misses (not shipped)."""
from __future__ import annotations

from typing import Iterable

import torch

from tieredkv.engine.placement import PlacementPolicy
from tieredkv.engine.working_set import select_pages


class ForcedPages(PlacementPolicy):
    """Oracle retrieval for diagnostics: `base`'s selection plus `pages` (or, with `replace`, `pages`
    instead of what retrieval found; sink and local pages stay). Placement is `base`'s. The retrieval
    log records what the index found, or `pages` when they replace it."""

    def __init__(self, base: PlacementPolicy, pages: Iterable[int], *, replace: bool = False):
        self.base, self.pages, self.replace = base, sorted({int(p) for p in pages}), replace
        self.name = f"{base.name}+forced"

    def select_heads(self, ctx, layer_idx: int, query: torch.Tensor) -> tuple[list[int], None]:
        return self.select(ctx, layer_idx, query), None  # the oracle's pages are for every head

    def select(self, ctx, layer_idx: int, query: torch.Tensor) -> list[int]:
        ids = self.base.select(ctx, layer_idx, query)
        if not ctx.retrieving:
            return ids
        if not self.replace:
            return sorted(set(ids) | set(self.pages))
        ctx.retrieval_log[-1] = list(self.pages)
        c = ctx.config
        return select_pages(len(ctx.spans), sink=c.sink_pages, local=c.local_pages, retrieved=self.pages)

    def place(self, ctx, page_ids: list[int]) -> dict[int, int]:
        return self.base.place(ctx, page_ids)
