"""Host-memory tier: a byte-budgeted dict of pages (pinned payloads under CUDA)."""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import numpy as np
import torch

from .errors import PagingError
from .layout import PageLayout
from .page import Page, PageHeader, check_little_endian
from .tier import Tier


class HostTier(Tier):
    """Pages in RAM. `put` refuses (returns False) past `budget_bytes`; it never evicts.

    With CUDA present (or `pin_memory=True`), the payload lives in one page-locked uint8
    buffer per page so host -> device copies can be asynchronous (`get_pinned`); `get`
    rebuilds an immutable `Page` from it (one host copy). Without CUDA the `Page` itself
    is kept. Accounting counts payload bytes only.
    """

    name = "host"

    def __init__(self, budget_bytes: int, *, pin_memory: bool | None = None) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) \
                or budget_bytes < 0:
            raise PagingError(f"HostTier budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self.is_pinned = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._pages: dict[str, Page] = {}
        # key -> (Page fields without payload, pinned uint8 [nbytes])
        self._pinned: dict[str, tuple[dict[str, Any], torch.Tensor]] = {}
        self._sizes: dict[str, int] = {}
        self._nbytes = 0

    def can_fit(self, nbytes: int) -> bool:
        return self._nbytes + nbytes <= self.budget_bytes

    def put(self, page: Page) -> bool:
        if page.key in self._sizes:
            return True  # pages are immutable and content-addressed
        if not self.can_fit(page.nbytes):
            return False
        if self.is_pinned:
            buf = self._alloc_pinned(page.nbytes)
            buf.numpy()[:] = np.frombuffer(page.payload, dtype=np.uint8)  # one copy, from the immutable bytes
            fields = {name: getattr(page, name) for name in
                      ("key", "parent_key", "fingerprint", "start", "token_ids", "layout",
                       "payload_blake3")}
            self._pinned[page.key] = (fields, buf)
        else:
            self._pages[page.key] = page
        self._sizes[page.key] = page.nbytes
        self._nbytes += page.nbytes
        return True

    def get(self, key: str) -> Page | None:
        page = self._pages.get(key)
        if page is not None or key not in self._pinned:
            return page
        fields, buf = self._pinned[key]
        return Page(**fields, payload=buf.numpy().tobytes())

    def peek(self, key: str) -> tuple[PageHeader, memoryview | torch.Tensor] | None:
        """The header and payload of `key` without copying it: the page's own bytes, or its pinned
        uint8 buffer. Verified when admitted (`put` takes verified pages only), so readers do not
        hash it again. NOTE: a view of the tier's memory; copy out of it before the page is removed."""
        page = self._pages.get(key)
        if page is not None:
            return page.header, memoryview(page.payload)
        entry = self._pinned.get(key)
        if entry is None:
            return None
        fields, buf = entry
        return PageHeader(**fields), buf

    @staticmethod
    def _alloc_pinned(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def get_pinned(self, key: str) -> torch.Tensor | None:
        """The pinned payload (uint8 [nbytes]) of `key`; None when absent or not pinned."""
        entry = self._pinned.get(key)
        return None if entry is None else entry[1]

    def pinned_layer(self, key: str, layer: int) -> torch.Tensor | None:
        """A view [2, Hkv, T, D] (K then V) of one layer in pinned memory, no copy.

        None when `key` is absent or not pinned. NOTE: the view aliases the tier's buffer:
        copy it (`.to(device, non_blocking=True)`) before the page can be removed.
        """
        entry = self._pinned.get(key)
        if entry is None:
            return None
        fields, buf = entry
        lay, t = fields["layout"], len(fields["token_ids"])
        if not 0 <= layer < lay.num_layers:
            raise IndexError(f"layer {layer} out of range 0..{lay.num_layers - 1}")
        n = lay.layer_nbytes(t)
        return buf[layer * n:(layer + 1) * n].view(lay.torch_dtype).view(
            2, lay.num_kv_heads, t, lay.head_dim)

    def layer_view(self, key: str, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K, V [Hkv, T, D] of one layer of `key` when this tier holds it unpinned: views of the page's own
        immutable payload, no copy; None when it holds the page pinned or not at all. Touches no LRU order.

        NOTE: read-only by contract (torch has no read-only tensors): writing into them would change a
        verified page's bytes. They keep the whole payload alive: `PageStore` gives the device-tier entries
        it made of them their own copies when this tier lets the page go (`PageStore._own_device_entries`)."""
        page = self._pages.get(key)
        if page is None:
            return None
        lay, t = page.layout, len(page.token_ids)
        if not 0 <= layer < lay.num_layers:
            raise IndexError(f"layer {layer} out of range 0..{lay.num_layers - 1}")
        n = lay.layer_nbytes(t)
        kv = _frombuffer(page.payload, lay.torch_dtype, n // lay.itemsize, layer * n).view(
            2, lay.num_kv_heads, t, lay.head_dim)
        return kv[0], kv[1]

    def layer_bytes(self, key: str, layer: int) -> tuple[PageLayout, int, memoryview] | None:
        """(layout, tokens, the bytes of one layer's K then V) of `key`, a view of this tier's copy (pinned
        or not, no copy); None when absent. Touches no LRU order. NOTE: read-only by contract, like
        `layer_view`; copy out of it (it keeps the payload alive while it lives)."""
        page = self._pages.get(key)
        if page is not None:
            lay, t, mv = page.layout, len(page.token_ids), memoryview(page.payload)
        else:
            entry = self._pinned.get(key)
            if entry is None:
                return None
            lay, t, mv = entry[0]["layout"], len(entry[0]["token_ids"]), memoryview(entry[1].numpy())
        if not 0 <= layer < lay.num_layers:
            raise IndexError(f"layer {layer} out of range 0..{lay.num_layers - 1}")
        n = lay.layer_nbytes(t)
        return lay, t, mv[layer * n:(layer + 1) * n]

    def size_of(self, key: str) -> int:
        return self._sizes[key]

    def contains(self, key: str) -> bool:
        return key in self._sizes

    def remove(self, key: str) -> bool:
        size = self._sizes.pop(key, None)
        if size is None:
            return False
        self._pages.pop(key, None)
        self._pinned.pop(key, None)
        self._nbytes -= size
        return True

    def keys(self) -> Iterator[str]:
        return iter(list(self._sizes))

    @property
    def num_pages(self) -> int:
        return len(self._sizes)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def close(self) -> None:
        self._pages.clear()
        self._pinned.clear()
        self._sizes.clear()
        self._nbytes = 0


_warned = False


def _frombuffer(payload: bytes, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    """`torch.frombuffer` of immutable bytes, without the warning torch gives (once per process) that the
    buffer is not writable: these views are read-only by contract (`HostTier.layer_view`)."""
    global _warned
    if _warned:
        return torch.frombuffer(payload, dtype=dtype, count=count, offset=offset)
    check_little_endian()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        out = torch.frombuffer(payload, dtype=dtype, count=count, offset=offset)
    _warned = True
    return out
