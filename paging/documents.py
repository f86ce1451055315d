"""Documents in a store: the manifests that name pages, when each was made and last used, which are in use.

    manifest "<id>"            JSON with "pages" (its page keys), "name", "tokens", "model_fingerprint"
    meta "documents/<id>"      {"created": unix time, "last_used": unix time}   (its own short transaction)

A page may be listed by several manifests (documents that share a prefix share its pages). Removing a
document frees only the pages no other document lists; a garbage collection frees the pages no document
lists (left by a crash between a deposit's pages and its manifest). NOTE: these reference counts are
derived from the manifests inside the transaction that frees the pages (LMDBTier.free_unreferenced), never
kept as counters that could drift. The usage times live outside the manifest, whose hash names the document.

In use: a document pinned by this process (`pin`, or `with in_use(id)`, or pinned for as long as a holder
object lives) is never evicted nor removed; it is what a live cache streams pages of.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from .errors import CorruptPageError, ManifestNotFoundError, PagingError, StoreFullError
from .framing import body_len, is_int, strict_json
from .lmdb_tier import LMDBTier


class PageStore(Protocol):
    """What this module and store_check.py use of a `paging.store.PageStore` (which imports them both, so
    they name this protocol rather than the class)."""

    path: str

    @property
    def lmdb_tier(self) -> LMDBTier: ...
    def contains(self, key: str) -> bool: ...
    def get(self, key: str) -> Any: ...
    def get_manifest(self, artifact_id: str) -> bytes: ...
    def list_manifests(self) -> list[str]: ...
    def get_meta(self, name: str) -> str | None: ...
    def set_meta(self, name: str, value: str) -> None: ...
    def forget_pages(self, keys: Any) -> None: ...
    def pending_keys(self) -> Any: ...

log = logging.getLogger("tieredkv")

USAGE_PREFIX = "documents/"
DERIVED_DIR = "indexes"  # <store>/indexes/<id>.*: a document's derived files (retrieval index, token ids)
_PAGE_KEY = re.compile(r"[0-9a-f]{64}")


class DocumentNotFoundError(PagingError, KeyError):
    """No document (manifest) of that id or name is in the store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "document not found"


class DocumentInUseError(PagingError):
    """The document is pinned by a live cache of this process; it is neither removed nor evicted."""


def pages_of(data: bytes) -> list[str]:
    """The page keys a manifest lists (ValueError if `data` is not a manifest that lists them)."""
    try:
        m = strict_json(data)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not a manifest ({type(exc).__name__})") from None
    keys = m.get("pages") if isinstance(m, dict) else None
    if not isinstance(keys, list) or not all(isinstance(k, str) and _PAGE_KEY.fullmatch(k) for k in keys):
        raise ValueError("not a manifest: no list of page keys")
    return keys


@dataclass(frozen=True)
class DocumentRecord:
    """One stored document, as `PageStore.list_documents` reports it.

    num_bytes: payload bytes of its stored pages; own_bytes: those no other document lists (what removing
    it frees); num_missing: listed pages the store does not hold. created / last_used: unix times, None for
    a document stored before they were recorded. fingerprint: the model's, from the manifest.
    """

    artifact_id: str
    name: str
    num_tokens: int
    num_pages: int
    num_bytes: int
    own_bytes: int
    num_missing: int
    fingerprint: str
    created: float | None
    last_used: float | None
    is_in_use: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Removal:
    """What removing documents (rm, gc, eviction) freed."""

    artifact_ids: tuple[str, ...]
    num_pages: int
    nbytes: int
    files: tuple[str, ...]
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"artifacts": list(self.artifact_ids), "pages_freed": self.num_pages, "bytes_freed": self.nbytes,
                "files_removed": list(self.files), "dry_run": self.dry_run}


class Documents:
    """The document-level bookkeeping of one PageStore: usage times, pins, removal and eviction."""

    def __init__(self, store: PageStore) -> None:
        self._store = store
        self._pins: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.num_evicted = 0
        self.bytes_evicted = 0

    # -- usage ------------------------------------------------------------------------------
    def usage(self, artifact_id: str) -> dict[str, float]:
        """{"created", "last_used"} of a document ({} when none was recorded or it does not parse)."""
        raw = self._store.get_meta(USAGE_PREFIX + artifact_id)
        try:
            d = json.loads(raw) if raw is not None else {}
        except ValueError:
            return {}
        ok = isinstance(d, dict) and all(isinstance(d.get(k), (int, float)) for k in ("created", "last_used"))
        return d if ok else {}

    def mark_used(self, artifact_id: str, *, now: float | None = None) -> None:
        """Record that `artifact_id` was used now (graft, open, ask): one small meta write of its own."""
        lm = self._store.lmdb_tier
        if lm.readonly or lm.damage:
            return  # NOTE: a read-only or damaged store is read as it is; its LRU order is not kept
        now = time.time() if now is None else now
        usage = self.usage(artifact_id) or {"created": now}
        try:
            self._store.set_meta(USAGE_PREFIX + artifact_id, json.dumps({**usage, "last_used": now}))
        except PagingError as exc:  # NOTE: bookkeeping: a store that takes no write now still serves the read
            log.warning("the use of document %s was not recorded (%s); its place in the eviction order is older "
                        "than it is", artifact_id, exc)

    def mark_created(self, artifact_id: str) -> None:
        if not self.usage(artifact_id):
            self.mark_used(artifact_id)

    # -- pins -------------------------------------------------------------------------------
    def pin(self, artifact_id: str, holder: object | None = None) -> None:
        """Mark `artifact_id` in use until `unpin` (or, with `holder`, until that object is garbage)."""
        if holder is not None:
            weakref.finalize(holder, self.unpin, artifact_id)  # (first: an object with no weak references raises)
        with self._lock:
            self._pins[artifact_id] += 1

    def unpin(self, artifact_id: str) -> None:
        with self._lock:
            self._pins[artifact_id] -= 1
            if self._pins[artifact_id] <= 0:
                del self._pins[artifact_id]

    @property
    def num_in_use(self) -> int:
        with self._lock:
            return len(self._pins)

    def is_in_use(self, artifact_id: str) -> bool:
        with self._lock:
            return self._pins[artifact_id] > 0

    @contextlib.contextmanager
    def in_use(self, artifact_id: str) -> Iterator[None]:
        self.pin(artifact_id)
        try:
            yield
        finally:
            self.unpin(artifact_id)

    # -- listing ----------------------------------------------------------------------------
    def list(self) -> list[DocumentRecord]:
        """Every readable local document, oldest first by creation (manifests that do not read are left to
        `check`)."""
        lm = self._store.lmdb_tier
        manifests: dict[str, dict[str, Any]] = {}
        for aid in lm.list_manifests():
            try:
                manifests[aid] = manifest_fields(lm.get_manifest(aid))
            except (CorruptPageError, ManifestNotFoundError, ValueError):
                continue
        counts = Counter(k for m in manifests.values() for k in set(m["pages"]))
        sizes = self._page_sizes(counts)
        out = []
        for aid, m in manifests.items():
            keys = set(m["pages"])
            usage = self.usage(aid)
            out.append(DocumentRecord(
                aid, m["name"], m["tokens"], len(m["pages"]),
                sum(sizes.get(k, 0) for k in keys), sum(sizes.get(k, 0) for k in keys if counts[k] == 1),
                sum(k not in sizes for k in keys), m["fingerprint"], usage.get("created"), usage.get("last_used"),
                self.is_in_use(aid)))
        return sorted(out, key=lambda r: (r.created or 0.0, r.artifact_id))

    def _page_sizes(self, keys) -> dict[str, int]:
        keys = list(keys)
        with self._store.lmdb_tier.views(keys) as views:
            return {k: body_len(v) for k, v in zip(keys, views) if v is not None}

    def find(self, ref: str) -> str:
        """The id of the document `ref` names: an id, a unique id prefix, or a unique name."""
        ids = self._store.lmdb_tier.list_manifests()
        if ref in ids:
            return ref
        hits = [i for i in ids if i.startswith(ref)] if ref else []
        if not hits:
            hits = [r.artifact_id for r in self.list() if r.name == ref]
        if len(hits) == 1:
            return hits[0]
        what = f"{len(hits)} documents match" if hits else "no document matches"
        raise DocumentNotFoundError(f"{what} {ref!r} in store {self._store.path}; give a full id "
                                    f"(`tieredkv ls --store {self._store.path}` lists them)")

    # -- removal ----------------------------------------------------------------------------
    def delete(self, artifact_id: str, *, dry_run: bool = False, keep: frozenset[str] = frozenset()) -> Removal:
        """Remove a document: its manifest, usage record and derived files, and the pages no other document
        lists. Refused for a document in use (DocumentInUseError) or absent (DocumentNotFoundError)."""
        if self.is_in_use(artifact_id):
            raise DocumentInUseError(f"document {artifact_id} is in use by a live cache of this process; close or "
                                     "reset what grafted it, then remove it")
        lm = self._store.lmdb_tier
        freed = lm.free_unreferenced(artifact_id, pages_of, keep=keep, meta_names=[USAGE_PREFIX + artifact_id],
                                     dry_run=dry_run)
        if not freed.found:
            raise DocumentNotFoundError(f"no document {artifact_id!r} in store {self._store.path}; `tieredkv ls` "
                                        "lists them")
        if freed.unreadable:
            log.warning("%d manifests of %s do not read (%s): no page was freed; run `tieredkv check`, "
                        "then `tieredkv gc`", len(freed.unreadable), self._store.path, ", ".join(freed.unreadable[:3]))
        files = self._derived_files(artifact_id)
        if not dry_run:
            self._store.forget_pages(freed.page_keys)
            for f in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
        return Removal((artifact_id,), len(freed.page_keys), freed.nbytes, tuple(files), dry_run)

    def gc(self, *, dry_run: bool = False) -> Removal:
        """Free the pages no document lists, and derived files of documents that are gone. Refused while a
        manifest does not read (its references are unknown)."""
        freed = self._store.lmdb_tier.free_unreferenced(None, pages_of, keep=self._store.pending_keys(),
                                                        dry_run=dry_run)
        if freed.unreadable:
            raise PagingError(f"{len(freed.unreadable)} manifests of {self._store.path} do not read "
                              f"({', '.join(freed.unreadable[:3])}), so which pages they list is unknown: nothing was "
                              "collected; run `tieredkv check`, remove or re-import them, then gc again")
        ids = set(self._store.lmdb_tier.list_manifests())
        root = Path(self._store.path) / DERIVED_DIR
        files = sorted(str(f) for f in root.glob("*") if f.name.split(".", 1)[0] not in ids) if root.is_dir() else []
        if not dry_run:
            self._store.forget_pages(freed.page_keys)
            for f in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
        return Removal((), len(freed.page_keys), freed.nbytes, tuple(files), dry_run)

    def _derived_files(self, artifact_id: str) -> list[str]:
        root = Path(self._store.path) / DERIVED_DIR
        return sorted(str(f) for f in root.glob(f"{glob_escape(artifact_id)}.*")) if root.is_dir() else []

    # -- eviction ---------------------------------------------------------------------------
    def evict_to_fit(self, extra_bytes: int, cap: int, keep: frozenset[str] = frozenset()) -> list[str]:
        """Evict whole least-recently-used documents until `extra_bytes` more page bytes fit under `cap`.

        Never a document in use, never a page another kept document lists or `keep` holds. Returns the ids
        evicted; StoreFullError (nothing evicted past what was needed) when everything evictable is not enough.
        """
        evicted: list[str] = []
        while self._store.lmdb_tier.nbytes + extra_bytes > cap:
            victim = self._lru_victim(keep)
            if victim is None:
                raise StoreFullError(
                    f"store {self._store.path}: {extra_bytes} more bytes of pages do not fit max_disk_bytes={cap} "
                    f"({self._store.lmdb_tier.nbytes} held) and no document that is not in use can be evicted; "
                    "raise max_disk_bytes, remove documents (`tieredkv rm`), or release the ones in use")
            removal = self.delete(victim.artifact_id, keep=keep)
            self.num_evicted += 1
            self.bytes_evicted += removal.nbytes
            evicted.append(victim.artifact_id)
            log.info("evicted document %s (%r, last used %s): %d pages, %d bytes freed, to fit %d bytes "
                     "under max_disk_bytes=%d", victim.artifact_id, victim.name, _when(victim.last_used),
                     removal.num_pages, removal.nbytes, extra_bytes, cap)
        return evicted

    def _lru_victim(self, keep: frozenset[str]) -> DocumentRecord | None:
        """The least recently used document not in use whose removal frees bytes (documents whose every page
        another lists free nothing, so they are kept)."""
        docs = [d for d in self.list() if not d.is_in_use and d.own_bytes > 0]
        docs.sort(key=lambda d: (d.last_used or 0.0, d.artifact_id))
        return docs[0] if docs else None


def manifest_fields(data: bytes) -> dict[str, Any]:
    """"pages", "name", "tokens" and "fingerprint" of a manifest (ValueError if it lists no pages); not a check
    that it is genuine (tieredkv/artifacts/manifest.py does that)."""
    m = strict_json(data)
    keys = pages_of(data)
    tokens = m.get("tokens")
    return {"pages": keys, "name": m.get("name") if isinstance(m.get("name"), str) else "",
            "tokens": tokens if is_int(tokens) else 0,
            "fingerprint": m.get("model_fingerprint") if isinstance(m.get("model_fingerprint"), str) else ""}


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def _when(t: float | None) -> str:
    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))
