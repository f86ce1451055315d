"""Configuration of the retrieval-streamed attention (what goes into the working set)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

POSITION_POLICIES = ("own", "fixed")


@dataclass(frozen=True)
class TieredConfig:
    """Working set per full-attention layer and query chunk:

        [ sink pages ][ top-k retrieved pages ][ local pages ][ unsealed tail + current chunk ]

    When every sealed page fits (`<= sink + topk + local` pages) the working set is the whole
    context in position order and attention is exactly the model's own. Sliding-window layers
    always see exactly their window.

    position: "own" keeps every key at its absolute position (exact; the default inside the
    model's window). "fixed" re-rotates sink and retrieved pages so they sit right before the
    local window (InfLLM-style; approximate; meant for contexts beyond the window).
    """

    page_size: int | None = None  # None: the model's default (128 for smollm2)
    # Prefill chunk = chunk_pages pages, cut at multiples of its size. NOTE: with more than one
    # page per chunk, a page's bytes also depend on where the document's last chunk ends, which
    # page keys do not cover: ingesting a document that extends an earlier one in the same store
    # can then raise PageConflictError. 1 (the default) keeps keys sound; 4 prefills ~1.7x faster.
    chunk_pages: int = 1
    sink_pages: int = 1
    local_pages: int = 16
    topk_pages: int = 16
    summary: str = "minmax"
    num_repr: int = 4
    position: str = "own"
    write_batch: int = 16  # sealed pages written to the store per LMDB transaction

    def __post_init__(self):
        from index import SUMMARY_METHODS

        if self.page_size is not None and self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.chunk_pages < 1:
            raise ValueError(f"chunk_pages must be >= 1, got {self.chunk_pages}")
        if self.sink_pages < 0 or self.local_pages < 1 or self.topk_pages < 0:
            raise ValueError("sink_pages >= 0, local_pages >= 1 and topk_pages >= 0 are required")
        if self.summary not in SUMMARY_METHODS:
            raise ValueError(f"summary must be one of {SUMMARY_METHODS}, got {self.summary!r}")
        if self.position not in POSITION_POLICIES:
            raise ValueError(f"position must be one of {POSITION_POLICIES}, got {self.position!r}")
        if self.write_batch < 1:
            raise ValueError("write_batch must be >= 1")

    @property
    def capacity_pages(self) -> int:
        return self.sink_pages + self.topk_pages + self.local_pages

    def working_set_pages(self, num_kv_heads: int) -> int:
        """The most pages one layer's working set can hold: retrieval takes the union of every KV
        head's top-k, so a device tier of this many pages (all layers) never evicts mid-forward."""
        return self.sink_pages + self.local_pages + num_kv_heads * self.topk_pages

    def regime(self, page_size: int) -> dict:
        """What decides the K/V bytes of pages sealed under this config."""
        d = asdict(self)
        d.pop("write_batch")
        d["page_size"] = page_size
        return d

    def regime_fingerprint(self, model_fingerprint: str, page_size: int) -> str:
        """Page keys of tiered contexts hash this instead of the bare model fingerprint: pages computed
        with retrieval attention are other bytes than a full-attention deposit of the same tokens."""
        blob = json.dumps({"model": model_fingerprint, "regime": self.regime(page_size)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()
