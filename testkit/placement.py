"""Diagnostic placement policies (not shipped): oracle retrieval (`ForcedPages`), for measuring what retrieval
misses, and dense first layers (`DenseLayers`)."""
from __future__ import annotations

from typing import Iterable

import torch

from tieredkv.engine.placement import PlacementPolicy
from tieredkv.engine.working_set import far_pages, select_pages


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


class DenseLayers(PlacementPolicy):
    """Quest's dense first layers, for diagnostics: layers below `layers` attend to every page of the context;
    the others select and place as `base` does. The retrieval log records every far page for a dense layer."""

    def __init__(self, base: PlacementPolicy, layers: int):
        self.base, self.layers = base, layers
        self.name = f"{base.name}+dense{layers}"

    def _dense(self, ctx, layer_idx: int) -> list[int] | None:
        if layer_idx >= self.layers or not ctx.retrieving:
            return None
        c, n = ctx.config, len(ctx.spans)
        ctx.retrieval_log.append(list(far_pages(n, sink=c.sink_pages, local=c.local_pages)))
        return list(range(n))

    def select_heads(self, ctx, layer_idx: int, query: torch.Tensor):
        every = self._dense(ctx, layer_idx)
        return (every, None) if every is not None else self.base.select_heads(ctx, layer_idx, query)

    def select(self, ctx, layer_idx: int, query: torch.Tensor) -> list[int]:
        every = self._dense(ctx, layer_idx)
        return every if every is not None else self.base.select(ctx, layer_idx, query)

    def place(self, ctx, page_ids: list[int]) -> dict[int, int]:
        return self.base.place(ctx, page_ids)

    def place_heads(self, ctx, shared: list[int], rows: list[list[int]]):
        return self.base.place_heads(ctx, shared, rows)
