"""The page store: one facade over the device, host and LMDB tiers.

    fetch_layer(key, l) --> DeviceTier[(key, l)] --miss--> get(key)
    get(key)            --> HostTier[key] --miss--> LMDBTier[key] (verified) --> promote
    put(page)           --> LMDBTier (every page, persistent) --> HostTier (admit, LRU)

Invariants: LMDB holds every page the store holds (host and device hold copies, so evicting
them loses nothing); no tier ever exceeds its byte budget; a page read from disk is
verified before it is used. Policy (one LRUPolicy per budgeted tier) is kept apart from
the tiers, which only move bytes. The store knows bytes and tensors, never models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Container, Hashable, Iterable

import psutil
import torch

from .device_tier import DeviceTier, tensors_nbytes
from .errors import CorruptPageError, PageNotFoundError, PagingError
from .host_tier import HostTier
from .lmdb_tier import LMDBTier
from .page import Page
from .policy import LRUPolicy

_MiB, _GiB = 1 << 20, 1 << 30


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class StoreConfig:
    """Budgets and placement of a PageStore.

    host_budget_bytes None means 25% of the memory psutil reports available at open.
    """

    host_budget_bytes: int | None = None
    device_budget_bytes: int = 256 * _MiB
    device: str = "cpu"
    lmdb_map_size: int = 1 * _GiB
    lmdb_max_map_size: int | None = None

    def __post_init__(self) -> None:
        if self.host_budget_bytes is not None and not (
                _is_int(self.host_budget_bytes) and self.host_budget_bytes >= 0):
            raise PagingError(f"host_budget_bytes must be None or an int >= 0, got "
                              f"{self.host_budget_bytes!r}")
        if not (_is_int(self.device_budget_bytes) and self.device_budget_bytes >= 0):
            raise PagingError(f"device_budget_bytes must be an int >= 0, got "
                              f"{self.device_budget_bytes!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise PagingError(f"device {self.device!r} is not a torch device: {exc}") from None
        if not (_is_int(self.lmdb_map_size) and self.lmdb_map_size > 0):
            raise PagingError(f"lmdb_map_size must be an int > 0, got {self.lmdb_map_size!r}")
        if self.lmdb_max_map_size is not None and not (
                _is_int(self.lmdb_max_map_size)
                and self.lmdb_max_map_size >= self.lmdb_map_size):
            raise PagingError(f"lmdb_max_map_size must be None or an int >= lmdb_map_size "
                              f"({self.lmdb_map_size}), got {self.lmdb_max_map_size!r}")

    def resolved_host_budget(self) -> int:
        if self.host_budget_bytes is not None:
            return self.host_budget_bytes
        return int(psutil.virtual_memory().available // 4)


class PageStore:
    """Write-through page store; see the module docstring for the tiers and invariants."""

    def __init__(self, path: str | os.PathLike, config: StoreConfig = StoreConfig()) -> None:
        self.config = config
        self.path = os.fspath(path)
        self._lmdb = LMDBTier(path, map_size=config.lmdb_map_size,
                              max_map_size=config.lmdb_max_map_size)
        self._host = HostTier(config.resolved_host_budget())
        self._device = DeviceTier(config.device_budget_bytes, config.device)
        self._host_lru = LRUPolicy()
        self._device_lru = LRUPolicy()
        self._closed = False

    # Tiers are exposed for inspection; mutate them only through the store.
    @property
    def lmdb_tier(self) -> LMDBTier:
        return self._lmdb

    @property
    def host_tier(self) -> HostTier:
        return self._host

    @property
    def device_tier(self) -> DeviceTier:
        return self._device

    # -- pages ------------------------------------------------------------------------
    def _admit_host(self, page: Page) -> None:
        """Keep a host copy, evicting LRU host copies (LMDB keeps every page)."""
        if self._host.contains(page.key):
            self._host_lru.touch(page.key)
            return
        if page.nbytes > self._host.budget_bytes:
            return
        needed = self._host.nbytes + page.nbytes - self._host.budget_bytes
        for victim in self._host_lru.victims(needed, self._host.size_of):
            self._host.remove(victim)
            self._host_lru.forget(victim)
        if self._host.put(page):
            self._host_lru.touch(page.key)

    def put(self, page: Page) -> None:
        """Persist `page` (idempotent; other bytes under its key -> PageConflictError)."""
        self._lmdb.put(page)
        self._admit_host(page)

    def put_many(self, pages: Iterable[Page]) -> None:
        """Persist `pages` in one LMDB transaction (all or nothing), then cache them."""
        pages = list(pages)
        self._lmdb.put_many(pages)
        for page in pages:
            self._admit_host(page)

    def get(self, key: str) -> Page:
        """The verified page: host hit, else LMDB (verified) promoted into host.

        Raises PageNotFoundError if no tier holds it, CorruptPageError if the stored bytes
        fail verification (they are quarantined; recompute or re-import the page).
        """
        page = self._host.get(key)
        if page is not None:
            self._host_lru.touch(key)
            return page
        try:
            page = self._lmdb.get(key)
        except CorruptPageError:
            self._drop_copies(key)
            raise
        if page is None:
            raise PageNotFoundError(
                f"page {key} is not in store {self.path}; recompute it (prefill the tokens "
                f"again) or import the artifact that holds it")
        self._admit_host(page)
        return page

    def contains(self, key: str) -> bool:
        return self._host.contains(key) or self._lmdb.contains(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def remove(self, key: str) -> bool:
        """Drop `key` from every tier; False if the store did not hold it."""
        self._drop_copies(key)
        return self._lmdb.remove(key)

    def _drop_copies(self, key: str) -> None:
        if self._host.remove(key):
            self._host_lru.forget(key)
        for dkey in [d for d in self._device.keys() if isinstance(d, tuple) and d[0] == key]:
            self._device.remove(dkey)
            self._device_lru.forget(dkey)

    def fetch_layer(self, key: str, layer: int, *, pin: Container[Hashable] = ()
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of one layer of a page on `config.device`, each [Hkv, T, D].

        Cached in the device tier under (key, layer). To make room, LRU entries not in
        `pin` (the (key, layer) entries the caller needs right now) are evicted — only if
        that makes enough room. If it cannot fit, the tensors are returned uncached: the
        budget is never exceeded. NOTE: cached tensors are shared; do not modify them.
        """
        dkey = (key, layer)
        hit = self._device.get(dkey)
        if hit is not None:
            self._device_lru.touch(dkey)
            return hit[0], hit[1]
        k, v = self._load_layer(key, layer)
        size = tensors_nbytes((k, v))
        needed = self._device.nbytes + size - self._device.budget_bytes
        if needed > 0:
            victims = self._device_lru.victims(needed, self._device.size_of, pinned=pin)
            if sum(self._device.size_of(d) for d in victims) < needed:
                return k, v  # cannot fit without evicting pinned entries
            for victim in victims:
                self._device.remove(victim)
                self._device_lru.forget(victim)
        if self._device.put(dkey, (k, v)):
            self._device_lru.touch(dkey)
        return k, v

    def _load_layer(self, key: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh K, V [Hkv, T, D] on `config.device`; straight from pinned host memory
        (asynchronous copy) when the host tier holds the page pinned."""
        kv = self._host.pinned_layer(key, layer)  # [2, Hkv, T, D] or None
        if kv is None:
            return self.get(key).layer_kv(layer, device=self.config.device)
        self._host_lru.touch(key)
        if torch.device(self.config.device).type == "cpu":
            kv = kv.clone()
        else:
            kv = kv.to(self.config.device, non_blocking=True)
        return kv[0], kv[1]

    # -- manifests, meta, integrity -------------------------------------------------
    def put_manifest(self, artifact_id: str, data: bytes) -> None:
        self._lmdb.put_manifest(artifact_id, data)

    def get_manifest(self, artifact_id: str) -> bytes:
        return self._lmdb.get_manifest(artifact_id)

    def list_manifests(self) -> list[str]:
        return self._lmdb.list_manifests()

    def delete_manifest(self, artifact_id: str) -> bool:
        return self._lmdb.delete_manifest(artifact_id)

    def get_meta(self, name: str) -> str | None:
        return self._lmdb.get_meta(name)

    def set_meta(self, name: str, value: str) -> None:
        self._lmdb.set_meta(name, value)

    def check(self, sample: float = 1.0, seed: int = 0) -> dict:
        """Re-verify stored pages (see LMDBTier.check); drops cached copies of bad ones."""
        report = self._lmdb.check(sample=sample, seed=seed)
        for key in report["quarantined_keys"]:
            self._drop_copies(key)
        return report

    def stats(self) -> dict[str, dict[str, int]]:
        lm = self._lmdb
        return {
            "device": {"entries": self._device.num_entries, "bytes": self._device.nbytes,
                       "budget_bytes": self._device.budget_bytes},
            "host": {"pages": self._host.num_pages, "bytes": self._host.nbytes,
                     "budget_bytes": self._host.budget_bytes},
            "lmdb": {"pages": lm.num_pages, "bytes": lm.nbytes,
                     "disk_bytes": lm.disk_nbytes, "map_size": lm.map_size,
                     "quarantined": lm.num_quarantined},
            "integrity": {"verified_reads": lm.verified_reads,
                          "corrupt_detected": lm.corrupt_detected,
                          "quarantined": lm.quarantined},
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._device.clear()
        self._host.close()
        self._lmdb.close()

    def __enter__(self) -> "PageStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
