"""One layer of a page read from LMDB without reading the other layers.

A page holds every layer's K/V under one digest (the page format): verifying it means hashing the
whole payload, 30x more bytes than a retrieving layer needs for smollm2. When the host tier cannot
hold a context, every miss paid for that, and ingest and decode fell off a cliff (bench/
memory_vs_context.py with --host-budget-gib below the context's pages).

So the first time a page is read whole and verified, the digest (`payload_digest`) of each layer's
[2, Hkv, T, D] block is kept in memory (64 hex characters per layer; derived from verified bytes, never read from disk).
Later misses of that page read one layer's bytes zero-copy from LMDB, hash them, and copy them out
only if they hash to the digest: exactly the bytes that were verified before, or nothing.

    payload  | layer 0: K, V | layer 1: K, V | ... |      digests: payload_digest of each block
                  ^ a miss of layer 1 reads and hashes this block only
"""
from __future__ import annotations

import numpy as np
import torch

from .framing import PREFIX, unpack_prefix
from .layout import PageLayout
from .page import Page, payload_digest


class LayerDigests:
    """page key -> (layout, tokens, the digest of each layer's K/V block), from verified pages."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[PageLayout, int, tuple[str, ...]]] = {}
        self.num_reads = 0  # layers read and verified alone
        self.num_mismatches = 0  # layer bytes that did not hash to their digest (the page is re-read whole)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def remember(self, page: Page) -> None:
        """Keep the per-layer digests of `page`, a verified page (its payload hashed to its header)."""
        if page.key in self._entries:
            return
        n = page.layout.layer_nbytes(page.num_tokens)
        mv = memoryview(page.payload)
        digests = tuple(payload_digest(mv[i * n:(i + 1) * n]) for i in range(page.layout.num_layers))
        self._entries[page.key] = (page.layout, page.num_tokens, digests)

    def forget(self, key: str) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def read(self, lmdb_tier, key: str, layer: int) -> torch.Tensor | None:
        """[2, Hkv, T, D] (K then V) of one layer of `key`, read from LMDB and verified against its digest;
        None when no digest is known, the page is gone, or the bytes differ (the caller then reads the
        whole page, which verifies and quarantines). NOTE: bytes are hashed before they are copied."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        layout, num_tokens, digests = entry
        if not 0 <= layer < layout.num_layers:
            raise IndexError(f"layer {layer} out of range 0..{layout.num_layers - 1}")
        n = layout.layer_nbytes(num_tokens)
        out, present = None, False
        with lmdb_tier.views([key]) as raws:
            raw = raws[0]
            if raw is not None and len(raw) >= PREFIX.size:
                present = True
                start = PREFIX.size + unpack_prefix(raw)[2] + layer * n
                piece = raw[start:start + n]
                if len(piece) == n and payload_digest(piece) == digests[layer]:
                    out = torch.empty(n, dtype=torch.uint8)
                    out.numpy()[:] = np.frombuffer(piece, dtype=np.uint8)
                del piece
            del raw, raws  # NOTE: no view of the map outlives the transaction
        if out is None:
            self.num_mismatches += present
            self.forget(key)
            return None
        self.num_reads += 1
        return out.view(layout.torch_dtype).view(2, layout.num_kv_heads, num_tokens, layout.head_dim)
