"""Which keys a layer attends to, and the mask for them, built from absolute positions.

Pure functions over page spans: no store, no model. The cache feeds them and assembles tensors.
"""
from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Span:
    """A sealed page's token range `[start, end)` and its index in the context."""

    page_id: int
    start: int
    end: int


@dataclass(frozen=True)
class HeadPages:
    """Retrieved pages that each KV head attends to alone (`TieredConfig.retrieval="per_head"`):
    `pages[h]`, the same count for every head, and `shifts[h]` their position shifts (zeros at own
    positions), in the order of their columns in the working set: position order when the block is
    laid out whole, kept columns after a decode step in place (head_block.py). Equal contents, equal
    bytes in the working set."""

    pages: tuple[tuple[int, ...], ...]  # [Hkv][m]
    shifts: tuple[tuple[int, ...], ...]  # [Hkv][m]

    @property
    def num_pages(self) -> int:
        return len(self.pages[0]) if self.pages else 0

    def union(self) -> list[int]:
        return sorted({p for row in self.pages for p in row})


def sliding_spans(spans: Sequence[Span], first_needed: int) -> list[tuple[Span, int]]:
    """Pages overlapping `[first_needed, ...)`, each with the offset of its first needed token.
    Spans are in position order: a binary search keeps this O(log pages + window)."""
    i = bisect.bisect_right(spans, first_needed, key=lambda s: s.end)
    return [(s, max(0, first_needed - s.start)) for s in spans[i:]]


def select_pages(num_pages: int, *, sink: int, local: int, retrieved: Sequence[int]) -> list[int]:
    """Sink pages, retrieved pages and local pages, unique, in position order."""
    chosen = set(range(min(sink, num_pages)))
    chosen.update(range(max(0, num_pages - local), num_pages))
    chosen.update(int(p) for p in retrieved if 0 <= int(p) < num_pages)
    return sorted(chosen)


def merge_ranked(rows: Sequence[Sequence[int]], cap: int | None = None) -> list[int]:
    """Up to `cap` unique pages from per-head rankings (`rows[h]`, best first), in position order: every
    row's first page, then every row's second, and so on (a head listed earlier wins a tie for the last
    places). With `cap` None or >= the union of the rows, that union."""
    cap = sum(len(r) for r in rows) if cap is None else cap
    chosen: dict[int, None] = {}
    for rank in range(max((len(r) for r in rows), default=0)):
        for row in rows:
            if rank < len(row) and len(chosen) < cap:
                chosen.setdefault(int(row[rank]))
    return sorted(chosen)


RRF_K = 60  # reciprocal-rank fusion constant (Cormack, Clarke and Buettcher 2009)


def fuse(rankings: Sequence[Sequence[int]]) -> list[int]:
    """Reciprocal-rank fusion of best-first page lists (ties: the earlier page)."""
    score: dict[int, float] = collections.defaultdict(float)
    for ranking in rankings:
        for r, p in enumerate(ranking):
            score[p] += 1.0 / (RRF_K + r + 1)
    return sorted(score, key=lambda p: (-score[p], p))


def retrieval_excluded(num_pages: int, *, sink: int, local: int) -> set[int]:
    return set(range(min(sink, num_pages))) | set(range(max(0, num_pages - local), num_pages))


def far_pages(num_pages: int, *, sink: int, local: int) -> range:
    """The pages retrieval chooses among (neither sink nor local), in position order: the complement of
    `retrieval_excluded`."""
    return range(min(sink, num_pages), max(0, num_pages - local))


def build_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, *, sliding_window: int | None, kind: str,
               dtype: torch.dtype, q_offset: int) -> torch.Tensor | None:
    """The mask the model's own attention would get, for keys at absolute positions `k_pos`.

    q_pos: [q] absolute query positions; k_pos: [kv] absolute key positions (working-set order).
    kind "sdpa": a bool mask [1, 1, q, kv] (True = attend), or None where transformers itself
    passes None (then sdpa uses `is_causal`); "eager": an additive float mask, always.
    """
    q, kv = q_pos.shape[0], k_pos.shape[0]
    allowed = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        allowed &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
    if kind == "sdpa":
        # NOTE: mirrors transformers' `_ignore_causal_mask_sdpa` so that, when the working set is
        # the whole context, sdpa runs the very same kernel path as the plain model.
        window_blocks = sliding_window is not None and kv >= sliding_window
        if not window_blocks and (q == 1 or kv == q or q_offset == 0):
            if bool(allowed[:, :].all()) or kv == q:
                return None
        return allowed[None, None]
    mask = torch.zeros((1, 1, q, kv), dtype=dtype, device=k_pos.device)
    return mask.masked_fill_(~allowed[None, None], torch.finfo(dtype).min)


def fixed_positions(spans: Sequence[Span], far: Sequence[int], local_start: int) -> dict[int, int]:
    """Fixed-distance placement: far pages (sink + retrieved, position order) packed right before
    `local_start`. Returns page_id -> position shift (virtual start - own start), always >= 0."""
    shifts, cursor = {}, local_start
    for pid in reversed(list(far)):
        s = spans[pid]
        n = s.end - s.start
        shifts[pid] = (cursor - n) - s.start
        cursor -= n
    return shifts
