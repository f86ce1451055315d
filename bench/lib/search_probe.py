"""Page-search time and recall during decode: a stand-in for a TieredCache's PageIndex.

    with SearchProbe(tm.cache, compare=True) as probe:   # the cache searches through the probe
        ... decode steps ...
    probe.ms_per_step(steps), probe.flat_ms_per_step(steps), probe.recall()

Every `search` is timed (per step: the median search times the searches per step, so that a neighbour's
burst on a shared machine does not land in one mean); with `compare` the same call also runs the flat
scan (`PageIndex.search_flat`, timed apart) and the two selections are compared: recall is the share of
the flat scan's top-k pages (per KV head) that the search returned, and `identical` counts searches whose
ids and scores are the same bytes. Everything else is forwarded to the index.
"""
from __future__ import annotations

import time
from typing import Self

import numpy as np


class SearchProbe:
    def __init__(self, cache, *, compare: bool) -> None:
        self.cache, self.index, self.compare = cache, cache.index, compare
        self.times: list[float] = []
        self.flat_times: list[float] = []
        self.searches = self.identical = self.found = self.wanted = 0

    def __enter__(self) -> Self:
        self.cache.index = self
        return self

    def __exit__(self, *exc) -> None:
        self.cache.index = self.index

    def __getattr__(self, name):
        return getattr(self.index, name)

    def search(self, layer, queries, k, exclude=()):
        t0 = time.perf_counter()
        ids, scores = self.index.search(layer, queries, k, exclude)
        self.times.append(time.perf_counter() - t0)
        self.searches += 1
        if self.compare:
            t0 = time.perf_counter()
            ref_ids, ref_scores = self.index.search_flat(layer, queries, k, exclude)
            self.flat_times.append(time.perf_counter() - t0)
            self.identical += int(np.array_equal(ids, ref_ids) and scores.tobytes() == ref_scores.tobytes())
            for got, ref in zip(ids, ref_ids):
                self.found += len(set(got[got >= 0].tolist()) & set(ref[ref >= 0].tolist()))
                self.wanted += int((ref >= 0).sum())
        return ids, scores

    def ms_per_step(self, steps: int) -> float:
        return _per_step(self.times, steps)

    def flat_ms_per_step(self, steps: int) -> float:
        return _per_step(self.flat_times, steps)

    def recall(self) -> float | None:
        return self.found / self.wanted if self.wanted else None


def _per_step(times: list[float], steps: int) -> float:
    return 1000 * float(np.median(times)) * len(times) / steps if times else 0.0
