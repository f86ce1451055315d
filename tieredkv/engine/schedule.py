"""The canonical prefill schedule: page-aligned chunks.

A graft can cut the context at any page boundary, so a chunk never crosses one: the K/V of a
page are then the same bytes whether the page was computed in a fresh prefill or after a graft
of the pages before it (GEMM shapes, and therefore floats, depend on the chunk).
"""
from __future__ import annotations

from typing import Iterator, Sequence


def canonical_chunks(start: int, end: int, page_size: int) -> Iterator[tuple[int, int]]:
    """Yield `[s, e)` chunks covering `[start, end)`, cut at every multiple of `page_size`.

    >>> list(canonical_chunks(0, 70, 32))
    [(0, 32), (32, 64), (64, 70)]
    >>> list(canonical_chunks(70, 100, 32))
    [(70, 96), (96, 100)]
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    if not 0 <= start <= end:
        raise ValueError(f"bad range [{start}, {end})")
    s = start
    while s < end:
        e = min(end, (s // page_size + 1) * page_size)
        yield s, e
        s = e


def page_chain(fingerprint: str, ids: Sequence[int], page_size: int) -> list[str]:
    """The page keys of `ids` sealed in canonical pages under `fingerprint` (paging.page_key's hash chain):
    the last key commits to every token id and position."""
    from paging import ROOT_KEY, page_key

    keys, parent = [], ROOT_KEY
    for s, e in canonical_chunks(0, len(ids), page_size):
        parent = page_key(fingerprint, parent, ids[s:e], s)
        keys.append(parent)
    return keys
