"""Deposit and graft: knowledge prefilled once, kept as byte-exact pages, grafted at its own positions.

    deposit:  ids ──canonical chunks──> model ──CaptureCache──> Page.seal ──> store (LMDB)
                                                                     └──> manifest (written last)
    graft:    manifest ──> PageStore.restore (BLAKE3-verified on all cores, straight into per-layer
              K/V tensors; chain checked) ──> DynamicCache at positions [0, N)

NOTE: the manifest is committed after every page it names, in its own transaction, so a deposit
killed half-way leaves verified pages and no visible artifact.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from paging import ROOT_KEY, Page, PageLayout, PageStore, PageWriter, page_key
from paging.errors import (
    REBUILD_HINT,
    CorruptPageError,
    LayoutMismatchError,
    ManifestNotFoundError,
    StoreCorruptedError,
)
from paging.restore import Restored
from tieredkv.artifacts.capture import CaptureCache
from tieredkv.artifacts.manifest import iter_pages, parse_manifest, read_back
from tieredkv.artifacts.record import Artifact, artifact_id, is_hex64
from tieredkv.engine import attention
from tieredkv.engine.schedule import canonical_chunks
from tieredkv.errors import ArtifactNotFoundError, EmptyInputError, ModelMismatchError
from tieredkv.models.loading import LoadedModel, forward_for
from tieredkv.models.token_ids import check_token_ids
from tieredkv.provenance.domain import check_domain, determinism_domain, sha256_ids

STORE_FINGERPRINT_META = "model_fingerprint"


def store_fingerprint(store) -> str | None:
    """The model fingerprint a store is bound to (None: not bound yet). A recorded value that is not a
    SHA-256 hex digest was damaged on disk: StoreCorruptedError, not a blamed model."""
    recorded = store.get_meta(STORE_FINGERPRINT_META)
    if recorded is not None and not is_hex64(recorded):
        raise StoreCorruptedError(
            f"store {store.path} records model fingerprint {recorded[:40]!r}, which is not a SHA-256 hex digest: "
            f"its meta was altered on disk — {REBUILD_HINT}")
    return recorded


def bind_store(store: PageStore, lm: LoadedModel) -> None:
    """A store holds one model's pages: record the fingerprint on first use, refuse another model after.
    NOTE: the first binding is a compare-and-set, so of two models depositing into a new store at once
    one binds it and the other is refused."""
    recorded = store_fingerprint(store)
    if recorded is None:
        recorded = store.set_meta_if_absent(STORE_FINGERPRINT_META, lm.fingerprint)
    if recorded != lm.fingerprint:
        raise ModelMismatchError(f"store {store.path}", recorded, lm.fingerprint)


@dataclass(frozen=True)
class DepositOptions:
    """A deposit's settings, validated on construction: the one check for `deposit()` and the CLI alike."""

    page_size: int | None = None  # tokens per page; None: the model's default
    name: str = ""  # a label; the artifact id, not the name, is what identifies the pages

    def __post_init__(self) -> None:
        from tieredkv.engine.tiered_config import MAX_PAGE_SIZE, check_ints

        check_ints(self, {"page_size": (1, MAX_PAGE_SIZE)})
        if not isinstance(self.name, str):
            raise ValueError(f"DepositOptions.name must be a str, got {type(self.name).__name__}")


def encode_source(lm: LoadedModel, source: str | Sequence[int]) -> list[int]:
    """Text through the model's tokenizer, token ids through the same check as `TieredModel.ingest`."""
    if not isinstance(source, str):
        return check_token_ids(source, lm.model, "deposit", "or pass the text itself")
    ids = lm.codec.encode(source)
    if not ids:
        raise EmptyInputError("nothing to deposit: the text is empty")
    return ids


@torch.inference_mode()
def prefill(lm: LoadedModel, ids: Sequence[int], cache, *, start: int = 0, page_size: int,
            on_chunk: Callable[[int, int, Any], None] | None = None, logits_to_keep: int | None = 1,
            position_offset: int = 0):
    """Canonical prefill of `ids` (absolute positions `[start, start+len)`) into `cache`.

    Returns the logits of the last chunk (its last `logits_to_keep` positions; 0 = all; None = no
    logits: only the decoder runs, not the LM head, and None is returned; the K/V are the same).
    `position_offset` feeds every token that many positions later (used to measure shifted grafts).
    """
    out = None
    run, extra = forward_for(lm.model, logits_to_keep)
    for s, e in canonical_chunks(start, start + len(ids), page_size):
        x = torch.tensor([list(ids[s - start:e - start])], device=lm.model.device)
        pos = torch.arange(s + position_offset, e + position_offset, device=lm.model.device)[None]
        out = run(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True, **extra)
        if on_chunk is not None:
            on_chunk(s, e, out)
    return None if out is None or logits_to_keep is None else out.logits


def deposit_forward(lm: LoadedModel, ids: Sequence[int], cache: CaptureCache, *, start: int = 0, page_size: int,
                    on_chunk: Callable[[int, int, Any], None]) -> None:
    """The forward `deposit` runs: canonical chunks, grouped attention on CPU (`attention.grouped_prefill`),
    no LM head. `on_chunk` must `cache.take()` each chunk's K/V (deposit seals them into a page).
    bench/restore_ceiling.py times it alone, nothing sealed or written, to split a deposit's time."""
    with attention.grouped_prefill(lm.model):
        prefill(lm, ids, cache, start=start, page_size=page_size, on_chunk=on_chunk, logits_to_keep=None)


class Behind:
    """Run calls on one background thread, in order, at most `depth` waiting: `with Behind() as b:
    b.submit(fn, ...)`. Leaving the block waits for every call; the first error is raised (at the next
    submit or on leaving); after an error nothing else runs."""

    def __init__(self, depth: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tieredkv-seal")
        self._pending: collections.deque = collections.deque()
        self.depth = depth

    def submit(self, fn: Callable[..., None], *args) -> None:
        while len(self._pending) >= self.depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(fn, *args))

    def __enter__(self) -> "Behind":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                for fut in self._pending:
                    fut.cancel()
            while self._pending:
                fut = self._pending.popleft()
                if not fut.cancelled() and exc_type is None:
                    fut.result()
                elif not fut.cancelled():
                    fut.exception()  # wait: never leave a write running behind an error
        finally:
            self._pool.shutdown(wait=True)


@torch.inference_mode()
def deposit(lm: LoadedModel, source: str | Sequence[int], store: PageStore, *, page_size: int | None = None,
            name: str = "", progress: Callable[[int, int], None] | None = None) -> Artifact:
    """Prefill `source` with the canonical schedule, seal one page per chunk, write them, then the manifest.

    Pages already in the store (same chain, same model) are grafted instead of recomputed: the
    contract makes both give the same bytes, so a deposit that extends an earlier one costs only
    its new tokens.
    """
    options = DepositOptions(page_size, name)
    ids = encode_source(lm, source)
    bind_store(store, lm)
    page_size = options.page_size or lm.default_page_size
    fp = lm.fingerprint
    domain = determinism_domain(lm.model, fp, page_size)
    chunks = list(canonical_chunks(0, len(ids), page_size))
    keys, parent = [], ROOT_KEY
    for s, e in chunks:
        parent = page_key(fp, parent, ids[s:e], s)
        keys.append(parent)
    store.hold(keys)  # NOTE: kept from eviction and gc (a size cap) until the manifest that lists them is written
    num_reused = 0
    while num_reused < len(keys) and store.contains(keys[num_reused]):
        num_reused += 1
    cache = CaptureCache(lm.model.config, capacity=len(ids))  # every layer's K/V allocated once
    layout = None
    if num_reused:
        restored = store.restore(keys[:num_reused])
        layout = restored.headers[0].layout
        _same_page_size(layout, page_size, store)
        install_kv(cache, restored.kv, lm.model.device)
    # NOTE: deposited pages go to LMDB only. Admitting them to the host tier kept every page alive
    # (and evicted others) and slowed the deposit to 0.76 of its own forward, against 0.89 without
    # (lab/NOTEBOOK.md, "Where a deposit's time goes"); a graft reads them back from LMDB, verified.
    writer = PageWriter(store, admit=False)

    def seal(s: int, e: int, _out) -> None:
        nonlocal layout
        k, v = cache.take()  # this chunk's K/V per layer: fresh tensors, not reused by the next forward
        if layout is None:
            layout = PageLayout(num_layers=len(k), num_kv_heads=k[0].shape[0], head_dim=k[0].shape[-1],
                                dtype=str(k[0].dtype).replace("torch.", ""), page_size=page_size)
        i = s // page_size
        page = Page.seal(layout, fp, keys[i - 1] if i else ROOT_KEY, s, ids[s:e], k, v)
        assert page.key == keys[i], "page key does not match the chain computed up front"
        behind.submit(writer.add, page)
        if progress is not None:
            progress(e, len(ids))

    start = num_reused * page_size if num_reused < len(keys) else len(ids)
    # NOTE: a page is sealed (copied, hashed) here, between two forwards, and written on one background
    # thread, in order, while the model computes the next chunk: the LMDB commit and its fsync overlap
    # the forward. Sealing there too slowed the forward by up to 20% (the copy holds the GIL and the
    # hashing takes a core from the forward's threads; lab/NOTEBOOK.md, "Deposit"). Only that thread
    # touches the store until `behind` is drained.
    with Behind() as behind:
        deposit_forward(lm, ids[start:], cache, start=start, page_size=page_size, on_chunk=seal)
    writer.flush()
    if layout is None:  # everything was reused
        layout = store.get(keys[0]).layout
    root = keys[-1]
    art = Artifact(artifact_id(fp, root, domain), fp, domain, len(ids), page_size, tuple(keys),
                   sha256_ids(ids), layout.to_dict(), name)
    art = put_manifest(store, art)
    read_back(store, art)  # NOTE: success is reported only for what LMDB gives back, verified
    return art


def put_manifest(store: PageStore, art: Artifact) -> Artifact:
    """Write `art`'s manifest; returns the artifact as stored. The same context stored before under another
    name is the same artifact (its id commits to the model, domain and every token, not to the name): the
    stored manifest is kept and returned, its label with it."""
    from paging.errors import PageConflictError

    try:
        store.put_manifest(art.artifact_id, art.to_json())
        return art
    except PageConflictError:
        stored = load_artifact(store, art.artifact_id)
        if dataclasses.replace(stored, name=art.name) != art:
            raise
        return stored


def _same_page_size(layout: PageLayout, page_size: int, store: PageStore) -> None:
    """Refuse, before anything is written, to reuse a stored page sealed at another page size.

    NOTE: a deposit's page keys hash the model, the parent page and the tokens, not the page size: a text
    that fits one page at both sizes has the same first key, and a manifest over the page stored at the
    other size would be refused as not genuine on every read (the bytes are the same, the header's
    layout is not)."""
    if layout.page_size != page_size:
        raise LayoutMismatchError(
            f"store {store.path} holds this text's first page sealed at page size {layout.page_size}, not "
            f"{page_size}: deposit it at page size {layout.page_size} (`--page-size {layout.page_size}`), or into "
            "another store")


def load_artifact(store: PageStore, artifact_id: str) -> Artifact:
    """Find an artifact by id (or unique id prefix) in `store`; its manifest is verified (manifest.py)."""
    try:
        return parse_manifest(store.get_manifest(artifact_id), stored_as=artifact_id, where=store.path)
    except ManifestNotFoundError:
        pass
    matches = [a for a in store.list_manifests() if a.startswith(artifact_id)] if artifact_id else []
    if len(matches) == 1:
        return parse_manifest(store.get_manifest(matches[0]), stored_as=matches[0], where=store.path)
    known = store.list_manifests()
    hint = f"known: {', '.join(known[:10])}" if known else "the store holds no artifacts"
    what = "ambiguous prefix" if matches else "no artifact"
    raise ArtifactNotFoundError(f"{what} {artifact_id!r} in store {store.path} ({hint}); "
                                "`tieredkv stats --store DIR` lists them")


def require_stored(store: PageStore, art: Artifact) -> Artifact:
    """`art` if `store` still holds its manifest; an Artifact object kept from before its document was removed
    (`tieredkv rm`, eviction under a size cap) is refused, even when some of its pages are still stored."""
    try:
        store.get_manifest(art.artifact_id)
    except ManifestNotFoundError:
        raise ArtifactNotFoundError(
            f"artifact {art.artifact_id} ({art.name or 'unnamed'}) is no longer in store {store.path}: it was removed "
            "or evicted after this Artifact object was made; deposit or import it again") from None
    return art


def load_pages(store: PageStore, art: Artifact) -> list[Page]:
    """Every page of `art`, BLAKE3-verified by the store, with the chain re-checked (manifest.iter_pages).

    A manifest the store's remote served is kept locally once every page it names is (never before).
    """
    store.prefetch(art.page_keys)  # pipelined reads from a remote tier, if one is configured
    pages = list(iter_pages(store, art))
    store.keep_remote_manifest(art.artifact_id)
    return pages


def restore_artifact(store: PageStore, art: Artifact, *, buffer: torch.Tensor | None = None) -> Restored:
    """Every page of `art` restored back to back (`PageStore.restore`: host copies as they are, LMDB
    pages BLAKE3-verified on all cores, then copied), with the chain re-checked."""
    store.prefetch(art.page_keys)  # pipelined reads from a remote tier, if one is configured
    restored = store.restore(art.page_keys, buffer=buffer)
    parent, pos = ROOT_KEY, 0
    for header in restored.headers:
        if header.parent_key != parent or header.start != pos:
            raise CorruptPageError(header.key, f"breaks the chain of artifact {art.artifact_id} (parent or position "
                                               "differs)")
        parent, pos = header.key, pos + header.num_tokens
    if pos != art.num_tokens:
        raise CorruptPageError(art.root_sha256, f"artifact {art.artifact_id} pages hold {pos} tokens, manifest says "
                                                f"{art.num_tokens}")
    return restored


def install_kv(cache: DynamicCache, kv: torch.Tensor, device) -> None:
    """Put restored K/V (kv: [L, 2, Hkv, N, D]) into an empty cache as its first N tokens.

    A plain `DynamicLayer` adopts the tensors as they are (what its `update` would hold, without
    concatenating a copy); other layer kinds (sliding windows keep only their window) go through
    `cache.update`. Grafted K/V are not new pages: a `CaptureCache` does not record them."""
    for layer in range(kv.shape[0]):
        k, v = kv[layer, 0][None], kv[layer, 1][None]  # [1, Hkv, N, D]
        if torch.device(device) != k.device:
            k, v = k.to(device, non_blocking=True), v.to(device, non_blocking=True)
        target = cache.layers[layer] if layer < len(cache.layers) else None
        if type(target) is DynamicLayer and not target.is_initialized:
            target.lazy_initialization(k, v)
            target.keys, target.values = k, v
        else:
            DynamicCache.update(cache, k, v, layer)  # not CaptureCache.update: nothing to capture


def graft(lm: LoadedModel, artifact: Artifact | str, store: PageStore, *, allow_domain_mismatch: bool = False,
          cache: DynamicCache | None = None, buffer: torch.Tensor | None = None) -> DynamicCache:
    """Load `artifact` into a fresh cache at its own positions `[0, N)`.

    The plain HF `forward()` / `generate()` then continue from position N, with logits byte-equal
    to a fresh prefill under the same chunk schedule.

    `buffer`: reusable memory for the restored K/V (a flat uint8 CPU tensor of at least
    `restore_nbytes(N, layout)` bytes), so a session that grafts often does not fault in fresh pages
    each time. NOTE: on CPU the cache's layers are views of it until their first update (which
    concatenates into new tensors): do not graft into the same buffer while such a cache is in use.
    """
    art = load_artifact(store, artifact) if isinstance(artifact, str) else require_stored(store, artifact)
    if art.fingerprint != lm.fingerprint:
        raise ModelMismatchError(f"artifact {art.artifact_id}", art.fingerprint, lm.fingerprint)
    current = determinism_domain(lm.model, lm.fingerprint, art.page_size)
    check_domain(art.domain, current, allow_mismatch=allow_domain_mismatch, what=f"artifact {art.artifact_id}")
    restored = restore_artifact(store, art, buffer=buffer)
    cache = cache if cache is not None else DynamicCache(config=lm.model.config)
    install_kv(cache, restored.kv, lm.model.device)
    cache.tieredkv_artifact = art
    store.mark_used(art.artifact_id)  # the LRU order a size cap evicts in (paging/documents.py)
    return cache


def grafted_token_ids(store: PageStore, art: Artifact) -> list[int]:
    return [t for p in load_pages(store, art) for t in p.token_ids]
