"""Spot re-computation: catch a forged artifact by recomputing a seeded sample of its pages.

Hashes catch corruption, not forgery: whoever changes a page's K/V can recompute every hash and
the artifact id too. But a page is reproducible: in its determinism domain, the model fed the
pages before it and the page's own tokens, with the canonical schedule, writes exactly the bytes
a deposit wrote (DESIGN.md, the exactness contract). So for each sampled page i:

    cache <- stored pages [0, i) (as a graft would)  -->  prefill tokens of page i  -->  K/V bytes
    equal to the stored page i?  yes: it is what the model computes;  no: forged (or not made here)

A page that is not sampled is only appended to the cache. Each forged page is caught with
probability `fraction`; the report says which fraction was checked. Only deposits (pages keyed by
the model fingerprint, full attention) are reproducible this way; pages sealed under retrieval
(TieredModel contexts) depend on what was retrieved and are reported as not recomputable.
"""
from __future__ import annotations

import random
from typing import Any

import torch

from paging import Page
from tieredkv.artifacts.artifact import Artifact, install_kv, prefill
from tieredkv.artifacts.capture import CaptureCache
from tieredkv.errors import DomainMismatchError, ModelMismatchError, TieredKVError, UnsupportedModelError
from tieredkv.provenance.domain import determinism_domain, domain_differences


class RecomputeMismatchError(TieredKVError):
    """A page's K/V differ from what the model computes from the pages before it: forged, or not made
    by this model in this determinism domain."""


def sample_pages(num_pages: int, fraction: float, seed: int | str) -> list[int]:
    """Indices of a seeded sample: each page with probability `fraction`, never none."""
    if not 0.0 < fraction <= 1.0:
        raise TieredKVError(f"the recompute fraction must be in (0, 1], got {fraction}")
    rng = random.Random(seed)
    chosen = [i for i in range(num_pages) if rng.random() < fraction]
    return chosen or [rng.randrange(num_pages)]


def why_not_recomputable(lm, art: Artifact) -> str | None:
    """Why `art`'s pages cannot be recomputed by `lm` here (None: they can)."""
    if art.fingerprint != lm.fingerprint:
        return f"made by model {art.fingerprint[:16]}…, not by {lm.name} ({lm.fingerprint[:16]}…)"
    if art.domain.get("regime") is not None:
        return "sealed under retrieval attention (a TieredModel context): its pages depend on what was retrieved"
    diffs = domain_differences(art.domain, determinism_domain(lm.model, lm.fingerprint, art.page_size))
    if diffs:
        return (f"made in another determinism domain ({'; '.join(diffs)}): its pages are not expected to reproduce "
                "here")
    return None


class Recomputer:
    """Feed an artifact's verified pages in order; sampled ones are recomputed and compared."""

    def __init__(self, lm, art: Artifact, fraction: float, seed: int | str = 0) -> None:
        if art.fingerprint != lm.fingerprint:
            raise ModelMismatchError(f"artifact {art.artifact_id} (recompute)", art.fingerprint, lm.fingerprint)
        why = why_not_recomputable(lm, art)
        if why is not None:
            cls = UnsupportedModelError if art.domain.get("regime") is not None else DomainMismatchError
            raise cls(f"cannot recompute the pages of artifact {art.artifact_id}: {why}; recompute on a machine of "
                      "the artifact's domain, or leave out the recompute option")
        self.lm, self.art, self.fraction = lm, art, fraction
        self.seed = seed
        self.chosen = sample_pages(len(art.page_keys), fraction, seed)
        self._todo = set(self.chosen)
        self._last = max(self.chosen)
        self._cache = CaptureCache(lm.model.config, capacity=min(art.num_tokens, (self._last + 1) * art.page_size))
        self._next = 0
        self.checked: list[int] = []
        self.mismatches: list[int] = []

    @torch.inference_mode()
    def feed(self, page: Page) -> None:
        """Page `i` of the artifact (in order). Raises RecomputeMismatchError at the first forged page."""
        i = self._next
        self._next += 1
        if i > self._last or self.mismatches:
            return
        if i not in self._todo:
            install_kv(self._cache, page.kv_tensor(), self.lm.model.device)
            return
        prefill(self.lm, list(page.token_ids), self._cache, start=page.start, page_size=self.art.page_size)
        k, v = self._cache.take()
        fresh = Page.seal(page.layout, page.fingerprint, page.parent_key, page.start, page.token_ids, k, v)
        self.checked.append(i)
        if fresh.payload != page.payload:
            self.mismatches.append(i)
            raise RecomputeMismatchError(
                f"page {i} ({page.key[:16]}…) of artifact {self.art.artifact_id} does not reproduce: model "
                f"{self.lm.name} computes other K/V from the pages before it, in the artifact's own domain — the "
                "artifact was forged or made by other software; do not use it")

    @property
    def is_done(self) -> bool:
        """Every sampled page was fed (later pages need not be read)."""
        return self._next > self._last or bool(self.mismatches)

    def report(self) -> dict[str, Any]:
        n = len(self.art.page_keys)
        return {"artifact": self.art.artifact_id, "pages": n, "pages_recomputed": len(self.checked),
                "fraction_recomputed": round(len(self.checked) / n, 4), "fraction_asked": self.fraction,
                "seed": self.seed, "recomputed_pages": self.checked, "mismatches": self.mismatches,
                "reproduced": not self.mismatches and len(self.checked) == len(self.chosen)}
