"""The page store: one facade over the device, host and LMDB tiers.

    fetch_layer(key, l) --> DeviceTier[(key, l)] --miss--> get(key)
    fetch_layers(keys, l)   the same for a list, misses read in one pass
    get(key)            --> HostTier[key] --miss--> LMDBTier[key] (verified) --> promote
                                          --miss--> remote (verified) --> LMDB + host
    put(page)           --> LMDBTier (every page, persistent) --> HostTier (admit, LRU)
                                                              --> remote (through / back)

Invariants: LMDB holds every page the store wrote or read (host and device hold copies, so
evicting them loses nothing); no tier ever exceeds its byte budget; a page read from disk
or from the remote is verified before it is used. The remote (optional, shared by several
machines, see remote_tier.py) is an extra source and sink, never the only copy of a page
this store wrote; when it is down the store works from its local tiers. Policy (one
LRUPolicy per budgeted tier) is kept apart from the tiers, which only move bytes. The
store knows bytes and tensors, never models.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Container, Hashable, Iterable, Sequence

import psutil
import torch

from .device_tier import DeviceTier, tensors_nbytes
from .documents import DocumentRecord, Documents, Removal
from .errors import CorruptPageError, ManifestNotFoundError, PageNotFoundError, PagingError
from .framing import is_int
from .host_tier import HostTier
from .layer_reads import LayerDigests
from .lmdb_tier import MAX_MAP_SIZE, LMDBTier
from .page import Page
from .page_layers import PageLayers
from .policy import LRUPolicy
from .remote_tier import REMOTE_MODES, RemoteConfig, RemoteLink, RemoteTier, push_command
from .restore import Restored, restore_pages
from .tier_stats import TierCounters

REMOTE_ENV = "TIEREDKV_REMOTE"

_MiB, _GiB = 1 << 20, 1 << 30


def _check_device(device: str) -> None:
    """Refuse a device this machine cannot put tensors on, now rather than at the first page read."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise PagingError(f"device {device!r} is not a torch device: {exc}") from None
    if dev.type == "meta":
        raise PagingError(f"device {device!r} holds no data, so no page can be read onto it; give a real "
                          f"device such as 'cpu' or 'cuda'")
    if dev.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise PagingError(f"device {device!r}: torch finds no CUDA device on this machine (torch "
                          f"{torch.__version__}); use device='cpu', or a CUDA build of torch on a machine with a GPU")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise PagingError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA devices "
                          f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}); give one of them")


@dataclass(frozen=True)
class StoreConfig:
    """Budgets and placement of a PageStore.

    host_budget_bytes: the host tier's cap in payload bytes; past it the least recently used host copies
    are dropped (LMDB keeps every page). None means 25% of the memory psutil reports available at open.
    max_disk_bytes: a cap on the page payload bytes kept in LMDB, or None for none. A write that would pass
    it first evicts whole least-recently-used documents that are not in use (documents.py); a write that
    cannot fit even so raises StoreFullError, nothing written.
    remote: a Redis/Valkey URL (see RemoteConfig.from_url) shared with other machines, or
    None for none; with remote_from_env=True a None remote is read from $TIEREDKV_REMOTE.
    remote_mode: "write-through" (send each put) or "write-back" (send in batches, before
    every manifest and on close).
    """

    host_budget_bytes: int | None = None
    device_budget_bytes: int = 256 * _MiB
    device: str = "cpu"
    lmdb_map_size: int = 1 * _GiB
    lmdb_max_map_size: int | None = None
    max_disk_bytes: int | None = None
    # NOTE: pages are large values stored contiguously, read whole: OS read-ahead makes cold reads
    # ~7x faster (64 -> 434 MiB/s on 4 MiB values, lab/2026-11-29-lmdb_readahead/). Turn it off only for a
    # store much larger than RAM read in small random pieces, where read-ahead would evict useful pages.
    lmdb_readahead: bool = True
    remote: str | None = None
    remote_mode: str = "write-through"
    remote_from_env: bool = False
    # Open a store that does not match its commit record (paging/commit_record.py) so that `check`
    # can report it; every write to it is refused. Off: such a store is refused at open.
    allow_damaged: bool = False
    # Open a store whose files cannot be written (a read-only file system, a directory this user may not
    # write) read-only, for commands that only read. Off: such a store is refused (StoreReadOnlyError).
    readonly_fallback: bool = False

    def __post_init__(self) -> None:
        if self.host_budget_bytes is not None and not (
                is_int(self.host_budget_bytes) and self.host_budget_bytes >= 0):
            raise PagingError(f"host_budget_bytes must be None or an int >= 0, got "
                              f"{self.host_budget_bytes!r}")
        if not (is_int(self.device_budget_bytes) and self.device_budget_bytes >= 0):
            raise PagingError(f"device_budget_bytes must be an int >= 0, got "
                              f"{self.device_budget_bytes!r}")
        _check_device(self.device)
        if self.max_disk_bytes is not None and not (is_int(self.max_disk_bytes) and self.max_disk_bytes > 0):
            raise PagingError(f"max_disk_bytes must be None or an int > 0, got {self.max_disk_bytes!r}")
        if not (is_int(self.lmdb_map_size) and 0 < self.lmdb_map_size <= MAX_MAP_SIZE):
            raise PagingError(f"lmdb_map_size must be an int from 1 to {MAX_MAP_SIZE}, got {self.lmdb_map_size!r}; "
                              f"give a size this machine can map, e.g. {_GiB} (the map grows as needed)")
        if self.lmdb_max_map_size is not None and not (
                is_int(self.lmdb_max_map_size)
                and self.lmdb_map_size <= self.lmdb_max_map_size <= MAX_MAP_SIZE):
            raise PagingError(f"lmdb_max_map_size must be None or an int from lmdb_map_size "
                              f"({self.lmdb_map_size}) to {MAX_MAP_SIZE}, got {self.lmdb_max_map_size!r}")
        if self.remote is not None:
            RemoteConfig.from_url(self.remote)  # raises PagingError with what is wrong
        for name in ("lmdb_readahead", "allow_damaged", "remote_from_env", "readonly_fallback"):
            if not isinstance(getattr(self, name), bool):
                raise PagingError(f"{name} must be a bool (True or False), got {getattr(self, name)!r}")
        if self.remote_mode not in REMOTE_MODES:
            raise PagingError(f"remote_mode must be one of {REMOTE_MODES}, got "
                              f"{self.remote_mode!r}")

    def resolved_host_budget(self) -> int:
        if self.host_budget_bytes is not None:
            return self.host_budget_bytes
        return int(psutil.virtual_memory().available // 4)

    def resolved_remote(self) -> str | None:
        if self.remote is not None:
            return self.remote
        return (os.environ.get(REMOTE_ENV) or None) if self.remote_from_env else None


class _Either:
    """`x in _Either(a, b)`: x in a or x in b (the caller's pins and a batch's own entries)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container[Hashable], b: Container[Hashable]) -> None:
        self.a, self.b = a, b

    def __contains__(self, x: object) -> bool:
        return x in self.b or x in self.a


class PageStore:
    """Write-through page store; see the module docstring for the tiers and invariants."""

    def __init__(self, path: str | os.PathLike, config: StoreConfig = StoreConfig()) -> None:
        self.config = config
        self.path = os.fspath(path)
        self._lmdb = LMDBTier(path, map_size=config.lmdb_map_size,
                              max_map_size=config.lmdb_max_map_size, readahead=config.lmdb_readahead,
                              allow_damaged=config.allow_damaged, readonly_fallback=config.readonly_fallback)
        self._host = HostTier(config.resolved_host_budget())
        self._device = DeviceTier(config.device_budget_bytes, config.device)
        self._host_lru = LRUPolicy()
        self._device_lru = LRUPolicy()
        self._layers = LayerDigests()  # pages whose layers a miss may read alone (layer_reads.py)
        self._remote: RemoteLink | None = None
        self._from_remote: dict[str, bytes] = {}  # manifests the remote served, not yet kept locally
        self._hash_pool: ThreadPoolExecutor | None = None
        self._hash_pool_lock = threading.Lock()
        self._closed = False
        self._documents = Documents(self)
        self._pending: set[str] = set()  # keys written or held for a manifest not written yet (never evicted)
        self._pending_lock = threading.Lock()
        self._counts = {name: TierCounters() for name in ("device", "host", "lmdb")}
        url = config.resolved_remote()
        if url is not None:
            try:
                self._remote = RemoteLink(RemoteConfig.from_url(url), config.remote_mode,
                                          load=self._peek, push=push_command(self._lmdb.path, url))
            except BaseException:
                self.close()
                raise

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

    @property
    def remote_tier(self) -> RemoteTier | None:
        """The remote tier while connected (None without a remote or before it answered)."""
        return None if self._remote is None else self._remote.tier

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
            self._own_device_entries(victim)
            self._host.remove(victim)
            self._host_lru.forget(victim)
            self._counts["host"].evictions += 1
        if self._host.put(page):
            self._host_lru.touch(page.key)

    def admit(self, page: Page) -> None:
        """Cache a page that was read and verified elsewhere (a prefetch thread) in the host tier.
        The page must already be in LMDB: admitting never makes a page persistent."""
        self._admit_host(page)

    def put(self, page: Page) -> None:
        """Persist `page` (idempotent; other bytes under its key -> PageConflictError)."""
        self._make_room([page])
        self._lmdb.put(page)
        self._admit_host(page)
        if self._remote is not None:
            self._remote.publish([page])

    def put_many(self, pages: Iterable[Page], *, admit: bool = True) -> None:
        """Persist `pages` in one LMDB transaction (all or nothing), then cache them in the host tier
        unless `admit` is False (a writer whose pages are read later, if ever, from LMDB)."""
        pages = list(pages)
        self._make_room(pages)
        self._lmdb.put_many(pages)
        for page in pages if admit else ():
            self._admit_host(page)
        if self._remote is not None:
            self._remote.publish(pages)

    def get(self, key: str) -> Page:
        """The verified page: host hit, else LMDB (verified) promoted into host, else the
        remote (verified) promoted into LMDB and host.

        Raises PageNotFoundError if no tier holds it, CorruptPageError if the stored bytes
        fail verification (they are quarantined; recompute or re-import the page). With a
        remote, a page corrupt in LMDB is replaced by a verified remote copy when there is one.
        """
        try:
            page = self._get_local(key)
        except CorruptPageError:
            healed = None if self._remote is None else self._pull([key])[0]
            if healed is None:
                raise
            return healed
        if page is None and self._remote is not None:
            page = self._pull([key])[0]
        if page is None:
            raise PageNotFoundError(self._not_found(key))
        return page

    def get_many(self, keys: Iterable[str]) -> list[Page]:
        """Like `get` for each key, with every remote read batched into pipelines."""
        keys = list(keys)
        out: list[Page | None] = []
        corrupt: dict[int, CorruptPageError] = {}
        for i, key in enumerate(keys):
            try:
                out.append(self._get_local(key))
            except CorruptPageError as exc:
                if self._remote is None:
                    raise
                out.append(None)
                corrupt[i] = exc
        need = [i for i, page in enumerate(out) if page is None]
        if need and self._remote is not None:
            for i, page in zip(need, self._pull([keys[i] for i in need])):
                out[i] = page
        for i, exc in corrupt.items():
            if out[i] is None:  # corrupt locally and no verified remote copy
                raise exc
        missing = [keys[i] for i, page in enumerate(out) if page is None]
        if missing:
            raise PageNotFoundError(self._not_found(missing[0], len(missing)))
        return out  # type: ignore[return-value]

    def prefetch(self, keys: Iterable[str]) -> int:
        """Copy the pages of `keys` that only the remote holds into LMDB and host, in
        pipelined batches; returns how many arrived. Missing or corrupt ones are skipped
        (a later `get` reports them)."""
        if self._remote is None:
            return 0
        need = [k for k in keys if not (self._host.contains(k) or self._lmdb.contains(k))]
        pages, _corrupt = self._remote.fetch(need)  # counted in stats()["remote"]
        self._promote([p for p in pages if p is not None])
        return sum(p is not None for p in pages)

    def _get_local(self, key: str) -> Page | None:
        page = self._host.get(key)
        if page is not None:
            self._host_lru.touch(key)
            self._counts["host"].hit(page.nbytes)
            return page
        self._counts["host"].miss()
        try:
            page = self._lmdb.get(key)
        except CorruptPageError:
            self._drop_copies(key)
            raise
        if page is not None:
            self._counts["lmdb"].hit(page.nbytes)
            self._admit_host(page)
        else:
            self._counts["lmdb"].miss()
        return page

    def restore(self, keys: Iterable[str], *, buffer: torch.Tensor | None = None,
                workers: int | None = None) -> Restored:
        """The K/V of `keys`, back to back, in one [L, 2, Hkv, N, D] host tensor (restore.py):
        host-tier copies as they are, LMDB pages through zero-copy views, BLAKE3-verified on all
        cores before they are copied; pages only a remote holds, or whose bytes fail, through `get`.
        `buffer`: reusable flat uint8 memory to restore into (no fresh pages to fault in)."""
        return restore_pages(self, list(keys), buffer=buffer, workers=workers)

    def hash_pool(self) -> ThreadPoolExecutor:
        """The threads that verify and copy pages for `restore` (one per core; started on first use,
        kept until `close`, so a restore does not pay for starting threads)."""
        with self._hash_pool_lock:
            if self._hash_pool is None:
                self._hash_pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                                     thread_name_prefix="tieredkv-restore")
            return self._hash_pool

    def touch_host(self, key: str) -> None:
        """A reader used the host copy of `key` (LRU order)."""
        self._host_lru.touch(key)
        self._counts["host"].hit(self._host.size_of(key) if self._host.contains(key) else 0)

    def drop_corrupt(self, key: str, raw: bytes) -> None:
        """A reader found the LMDB bytes `raw` of `key` corrupt: quarantine them, drop cached copies."""
        self._lmdb.quarantine(key, raw)
        self._drop_copies(key)

    def _peek(self, key: str) -> Page | None:
        """A local copy without touching LRU order (the remote's write-back queue)."""
        return self._host.get(key) or self._lmdb.get(key)

    def _promote(self, pages: list[Page]) -> None:
        if pages:
            self._lmdb.put_many(pages)
            for page in pages:
                self._admit_host(page)

    def _pull(self, keys: list[str]) -> list[Page | None]:
        """Read-through: verified remote pages, promoted into LMDB and host.
        Raises CorruptPageError (after promoting the good ones) if any failed verification."""
        pages, corrupt = self._remote.fetch(keys)
        self._promote([p for p in pages if p is not None])
        if corrupt:
            raise next(iter(corrupt.values()))
        return pages

    def _not_found(self, key: str, num_missing: int = 1) -> str:
        where = f"store {self.path}"
        if self._remote is not None:
            state = "" if self._remote.is_up else f" (unreachable: {self._remote.last_error})"
            where += f" nor remote {self._remote.config.safe_url}{state}"
        more = f" and {num_missing - 1} more pages are" if num_missing > 1 else " is"
        return (f"page {key}{more} not in {where}; recompute it (prefill the tokens again) or "
                f"import the artifact that holds it")

    def contains(self, key: str) -> bool:
        """In a local tier, or on the remote (not verified until `get`)."""
        return (self._host.contains(key) or self._lmdb.contains(key)
                or (self._remote is not None and self._remote.contains(key)))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.contains(key)

    def remove(self, key: str) -> bool:
        """Drop `key` from every tier (the shared remote too); False if no tier held it."""
        self._drop_copies(key)
        removed = self._lmdb.remove(key)
        if self._remote is not None:
            removed = self._remote.remove(key) or removed
        return removed

    def reads_layers(self, key: str) -> bool:
        """Whether a miss of one layer of `key` reads that layer alone (cheap: no need to prefetch the page)."""
        return key in self._layers

    def _drop_copies(self, key: str) -> None:
        self._layers.forget(key)
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
            self._counts["device"].hit(tensors_nbytes(hit))
            return hit[0], hit[1]
        self._counts["device"].miss()
        k, v = self._load_layer(key, layer)
        self._cache_on_device(dkey, k, v, pin)
        return k, v

    def fetch_layers(self, keys: Sequence[str], layer: int, *, pin: Container[Hashable] = ()
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`fetch_layer(key, layer, pin=...)` for each of `keys` in turn, with this batch's own (key, layer)
        entries pinned too: the same bytes, tiers, evictions, LRU order and counters, in fewer calls per page.

        NOTE: a retrieving decode step fetches ~25 pages per layer, and per page the calls cost more than the
        bytes. Here the misses are read first, in one pass (on a CPU store, pages the host tier holds unpinned
        are served as views of their payload, no copy: `HostTier.layer_view`; others through `fetch_layer`'s
        own reads, which verify what comes from LMDB), then the device tier is updated in the order of `keys`.
        A page that fails verification raises before anything of the batch is cached or returned. No entry is
        a view of a shared batch, and an entry made of a host page's views gets its own copy when the host
        tier lets the page go (`_own_device_entries`), so the budgets bound the memory entries hold."""
        device, dkeys = self._device, [(key, layer) for key in keys]
        need = list(dict.fromkeys(key for key, dkey in zip(keys, dkeys) if not device.contains(dkey)))
        loaded = dict(zip(need, self._load_layers(need, layer)))
        pinned = _Either(pin, set(dkeys))
        hits, lru, out = self._counts["device"], self._device_lru, []
        for key, dkey in zip(keys, dkeys):
            hit = device.get(dkey)  # a repeated key was cached by its first occurrence
            if hit is not None:
                lru.touch(dkey)
                hits.hit(tensors_nbytes(hit))
                out.append((hit[0], hit[1]))
                continue
            hits.miss()
            k, v = loaded[key]
            self._cache_on_device(dkey, k, v, pinned)
            out.append((k, v))
        return out

    def read_layers(self, keys: Sequence[str], layer: int) -> torch.Tensor:
        """K and V of one layer of each page of `keys`, copied into one fresh tensor [n, 2, Hkv, T, D] on
        `config.device` (every page must hold T tokens): `layer_parts` joined."""
        out = self.layer_parts(keys, layer).stacked()
        return out if self._device.device.type == "cpu" else out.to(self._device.device)

    def layer_parts(self, keys: Sequence[str], layer: int) -> PageLayers:
        """One layer of each page of `keys` (every page must hold the same tokens) as its bytes, not joined
        (page_layers.py): the bytes `fetch_layer` serves, for a caller that keeps its own copy (a working-set
        buffer). Host pages are views of their payloads, no copy.

        NOTE: the device tier is neither read nor filled: for a CPU store it would be a third copy of host
        memory, and its bookkeeping cost more per page than the bytes (lab/2026-12-07-flat-decode). Host hits
        are counted and touched as `get` counts them; every other page is read as `fetch_layer` reads it
        (LMDB verified: whole the first time, later one layer against the digests that left), so a page that
        fails verification raises and no part is returned."""
        host, lru, hits = self._host, self._host_lru, self._counts["host"]
        parts: list = []
        geometry = None  # (Hkv, T, D, dtype) of the first page
        for key in keys:
            found = host.layer_bytes(key, layer)
            if found is not None:
                lay, t, part = found
                lru.touch(key)
                hits.hit(host.size_of(key))
                shape = (lay.num_kv_heads, t, lay.head_dim, lay.torch_dtype)
            else:
                k, v = self._load_layer(key, layer)  # [Hkv, T, D] each
                part = torch.stack([k, v]).cpu().view(torch.uint8).numpy()  # bf16-safe
                shape = (k.shape[0], k.shape[1], k.shape[2], k.dtype)
            if geometry is None:
                geometry = shape
            elif shape != geometry:
                raise PagingError(f"layer_parts: page {key} is {shape}, the first page {geometry}; read pages of "
                                  f"unequal sizes with fetch_layers")
            parts.append(part)
        heads, t, dim, dtype = geometry or (0, 0, 0, torch.float32)
        return PageLayers(heads, t, dim, dtype, parts)

    def _cache_on_device(self, dkey: tuple[str, int], k: torch.Tensor, v: torch.Tensor,
                         pin: Container[Hashable]) -> None:
        """Keep (k, v) in the device tier, evicting LRU entries not in `pin` if that makes room; else not at all."""
        size = tensors_nbytes((k, v))
        needed = self._device.nbytes + size - self._device.budget_bytes
        if needed > 0:
            victims = self._device_lru.victims(needed, self._device.size_of, pinned=pin)
            if sum(self._device.size_of(d) for d in victims) < needed:
                return  # cannot fit without evicting pinned entries
            for victim in victims:
                self._device.remove(victim)
                self._device_lru.forget(victim)
                self._counts["device"].evictions += 1
        if self._device.put(dkey, (k, v)):
            self._device_lru.touch(dkey)

    def _load_layers(self, keys: list[str], layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`_load_layer` of each key in turn (so host evictions by LMDB reads fall as they would one by one);
        a CPU store serves an unpinned host page's layer as views of its payload (`HostTier.layer_view`: no
        copy; the device-tier entry made of them gets its own copy when the host tier lets the page go)."""
        cpu = self._device.device.type == "cpu"
        host_tier, host, lru, out = self._host, self._counts["host"], self._host_lru, []
        for key in keys:
            kv = host_tier.layer_view(key, layer) if cpu else None
            if kv is None:
                kv = self._load_layer(key, layer)
            else:  # what `get` does for a host hit
                lru.touch(key)
                host.hit(host_tier.size_of(key))
            out.append(kv)
        return out

    def _own_device_entries(self, key: str) -> None:
        """Before the host tier lets `key` go: a CPU store's device-tier entries of it may be views of its payload
        (`_load_layers`), which would keep the whole page alive past both budgets; each gets its own copy of its
        bytes (same key, size, place and LRU order; an entry that owned its bytes already is copied too)."""
        if self._device.device.type != "cpu" or not self._device.num_entries:
            return
        found = self._host.peek(key)
        if found is None:
            return
        for layer in range(found[0].layout.num_layers):
            entry = self._device.get((key, layer))
            if entry is not None:
                self._device.put((key, layer), tuple(t.clone() for t in entry))

    def _load_layer(self, key: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh K, V [Hkv, T, D] on `config.device`; straight from pinned host memory
        (asynchronous copy) when the host tier holds the page pinned. A page the host tier does not
        hold is read whole and verified the first time; later, that one layer is read alone and
        verified against the digests the whole read left (layer_reads.py)."""
        kv = self._host.pinned_layer(key, layer)  # [2, Hkv, T, D] or None
        if kv is None and not self._host.contains(key):
            kv = self._layers.read(self._lmdb, key, layer)
            if kv is None:
                page = self.get(key)  # verified (quarantined and healed or raised if corrupt)
                self._layers.remember(page)
                return page.layer_kv(layer, device=self.config.device)
            kv = kv.to(self.config.device)
            return kv[0], kv[1]
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
        """Store a manifest locally, then on the remote after every queued page; record its creation time
        (documents.py) and release its pages from the keys held for it."""
        self._lmdb.put_manifest(artifact_id, data)
        self._documents.mark_created(artifact_id)
        self._release_held(data)
        if self._remote is not None:
            self._remote.put_manifest(artifact_id, data)

    def get_manifest(self, artifact_id: str) -> bytes:
        """The manifest (its SHA-256 checked): LMDB, else the remote.

        NOTE: a manifest the remote serves is not written to LMDB here: a manifest must never be
        visible locally before its pages are. `keep_remote_manifest` keeps it once they are (the
        caller verified them), replacing a corrupt local copy.
        """
        try:
            return self._lmdb.get_manifest(artifact_id)
        except (ManifestNotFoundError, CorruptPageError):
            if self._remote is None:
                raise
            data = self._remote.get_manifest(artifact_id)
            if data is None:
                raise
        self._from_remote[artifact_id] = data
        return data

    def keep_remote_manifest(self, artifact_id: str) -> bool:
        """Write the manifest the remote served for `artifact_id` to LMDB; False if it served none."""
        data = self._from_remote.pop(artifact_id, None)
        if data is not None:
            self.keep_manifest(artifact_id, data)
        return data is not None

    def keep_manifest(self, artifact_id: str, data: bytes) -> None:
        """Write a verified manifest to LMDB only (not the remote), replacing a corrupt local copy."""
        try:
            if self._lmdb.get_manifest(artifact_id) == data:
                return
        except CorruptPageError:
            self._lmdb.delete_manifest(artifact_id)
        except ManifestNotFoundError:
            pass
        self._lmdb.put_manifest(artifact_id, data)
        self._documents.mark_created(artifact_id)

    def list_manifests(self) -> list[str]:
        local = self._lmdb.list_manifests()
        if self._remote is None:
            return local
        return sorted(set(local) | set(self._remote.list_manifests()))

    def delete_manifest(self, artifact_id: str) -> bool:
        deleted = self._lmdb.delete_manifest(artifact_id)
        if self._remote is not None:
            deleted = self._remote.delete_manifest(artifact_id) or deleted
        return deleted

    # -- documents (documents.py): list, remove, collect, pin, evict ----------------------------
    def list_documents(self) -> list[DocumentRecord]:
        """Every local document: name, id, tokens, pages, bytes (own bytes: what removing it frees), model
        fingerprint, created and last-used times, whether it is in use; oldest first."""
        return self._documents.list()

    def find_document(self, ref: str) -> str:
        """The id of the document `ref` names (id, unique id prefix or unique name); DocumentNotFoundError."""
        return self._documents.find(ref)

    def delete_document(self, artifact_id: str, *, dry_run: bool = False) -> Removal:
        """Remove a document from the local store: its manifest, usage record, derived files
        (<store>/indexes/<id>.*) and the pages no other document lists (shared prefix pages stay).
        DocumentInUseError while pinned; DocumentNotFoundError if absent. A remote tier is left as it is."""
        return self._documents.delete(artifact_id, dry_run=dry_run, keep=self.pending_keys())

    def gc(self, *, dry_run: bool = False) -> Removal:
        """Free the pages no document lists (and derived files of documents that are gone), except pages
        this process holds for a manifest it has not written yet."""
        return self._documents.gc(dry_run=dry_run)

    def mark_used(self, artifact_id: str) -> None:
        """Record that a document was used now (graft, open, ask): the LRU order eviction follows."""
        self._documents.mark_used(artifact_id)

    def pin(self, artifact_id: str, holder: object | None = None) -> None:
        """Mark a document in use (never evicted nor removed) until `unpin`, or while `holder` lives."""
        self._documents.pin(artifact_id, holder)

    def unpin(self, artifact_id: str) -> None:
        self._documents.unpin(artifact_id)

    def is_in_use(self, artifact_id: str) -> bool:
        return self._documents.is_in_use(artifact_id)

    def in_use(self, artifact_id: str):
        """`with store.in_use(id):` the document is pinned inside the block."""
        return self._documents.in_use(artifact_id)

    def evict_documents_to_fit(self, extra_bytes: int) -> list[str]:
        """Evict least-recently-used documents not in use until `extra_bytes` more page bytes fit under
        `max_disk_bytes` (nothing without a cap); returns the evicted ids, StoreFullError if they cannot."""
        cap = self.config.max_disk_bytes
        return [] if cap is None else self._documents.evict_to_fit(extra_bytes, cap, self.pending_keys())

    def hold(self, keys: Iterable[str]) -> None:
        """Keep pages a manifest about to be written will list (a deposit reusing stored ones) from eviction
        and gc until that manifest is written."""
        with self._pending_lock:
            self._pending.update(keys)

    def pending_keys(self) -> frozenset[str]:
        with self._pending_lock:
            return frozenset(self._pending)

    def _release_held(self, manifest: bytes) -> None:
        from .documents import pages_of

        try:
            keys = pages_of(manifest)
        except ValueError:
            return
        with self._pending_lock:
            self._pending.difference_update(keys)

    def _make_room(self, pages: list[Page]) -> None:
        """Under max_disk_bytes: hold the pages about to be written, evict documents until they fit."""
        self.hold(p.key for p in pages)
        if self.config.max_disk_bytes is not None:
            new = [p for p in pages if not self._lmdb.contains(p.key)]
            evicted = self.evict_documents_to_fit(sum(p.nbytes for p in new))
            self._counts["lmdb"].evictions += len(evicted)

    def forget_pages(self, keys: Iterable[str]) -> None:
        """Drop cached copies (host, device, layer digests) of pages removed from LMDB."""
        for key in keys:
            self._drop_copies(key)

    def flush_remote(self) -> int:
        """Send pages and manifests queued for the remote (write-back, or after an outage);
        returns pages sent."""
        return 0 if self._remote is None else self._remote.flush()

    def get_meta(self, name: str) -> str | None:
        return self._lmdb.get_meta(name)

    def set_meta(self, name: str, value: str) -> None:
        self._lmdb.set_meta(name, value)

    def set_meta_if_absent(self, name: str, value: str) -> str:
        """Compare-and-set: `value` unless `name` has one; returns the value held after (LMDBTier)."""
        return self._lmdb.set_meta_if_absent(name, value)

    def check(self, sample: float = 1.0, seed: int = 0) -> dict:
        """Re-verify a `sample` of the stored pages (corrupt ones quarantined, cached copies dropped), read every
        manifest, walk each document's chain, compare the store with its commit record (store_check.py): the
        report `tieredkv check` prints, less what needs the artifact format; `healthy`, and a `hint` per
        kind of finding."""
        from .store_check import check_pages_and_documents

        return check_pages_and_documents(self, sample=sample, seed=seed)

    def stats(self) -> dict[str, dict[str, Any]]:
        lm = self._lmdb
        return {
            "device": {"entries": self._device.num_entries, "bytes": self._device.nbytes,
                       "budget_bytes": self._device.budget_bytes},
            "host": {"pages": self._host.num_pages, "bytes": self._host.nbytes,
                     "budget_bytes": self._host.budget_bytes},
            "lmdb": {"pages": lm.num_pages, "bytes": lm.nbytes,
                     "disk_bytes": lm.disk_nbytes, "map_size": lm.map_size,
                     "quarantined": lm.num_quarantined},
            "integrity": {"verified_reads": lm.verified_reads, "verified_layer_reads": self._layers.num_reads,
                          "layer_read_mismatches": self._layers.num_mismatches,
                          "corrupt_detected": lm.corrupt_detected,
                          "quarantined": lm.quarantined},
            "tiers": {**{name: c.to_dict() for name, c in self._counts.items()},
                      "lmdb": {**self._counts["lmdb"].to_dict(),
                               "verify_failures": lm.corrupt_detected + self._layers.num_mismatches}},
            "disk_cap": {"max_disk_bytes": self.config.max_disk_bytes,
                         "documents_evicted": self._documents.num_evicted,
                         "bytes_evicted": self._documents.bytes_evicted,
                         "documents_in_use": self._documents.num_in_use},
            **({} if self._remote is None else {"remote": self._remote.stats()}),
        }

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._remote is not None:
                self._remote.close()  # flushes the write-back queue (reads LMDB)
        finally:
            self._close_local()

    def _close_local(self) -> None:
        if self._hash_pool is not None:
            self._hash_pool.shutdown(wait=True)
        self._device.clear()
        self._layers.clear()
        self._host.close()
        self._lmdb.close()

    def __enter__(self) -> "PageStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
