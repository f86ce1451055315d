"""Export and import: an artifact moved between machines as one verified file.

    export:  store ──pass 1: each page verified, (len, digest)──> header
                   ──pass 2: page by page──> temp file ──fsync──> rename ──fsync(dir)
    import:  file ──header (bounded, hashed)──> pass 1: every page verified, chain, tokens,
                   model, domain, conflicts ──> pass 2: pages in batches ──> manifest (last)

The file format is in file_format.py. Pages stream one at a time (a background thread
reads the next one while the current one is hashed or written), so an artifact of many GB
never sits whole in memory.

NOTE: import writes nothing until the whole file has verified. Pass 2 re-reads the file and
checks every page's digest again, so a file changed between the passes is refused too; pages
it had added by then are removed again. Like deposit, the manifest is committed last, in its
own transaction: a killed import leaves verified pages and no visible artifact.
"""
from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from paging import ROOT_KEY, Page, PageLayout, PageStore, PageWriter
from paging.errors import CorruptPageError, ManifestNotFoundError, PageConflictError
from paging.page import is_valid_page, payload_digest
from safefiles import AtomicFile
from safefiles import check_target as _check_target
from tieredkv.artifacts.artifact import STORE_FINGERPRINT_META, Artifact, load_artifact, store_fingerprint
from tieredkv.artifacts.file_format import (
    FILE_VERSION,
    ArtifactFormatError,
    ArtifactHeader,
    ArtifactIntegrityError,
    ArtifactTruncatedError,
    ArtifactVersionError,
    ArtifactWriteError,
    encode_header,
    iter_page_blobs,
    read_header,
    read_token_ids,
)
from tieredkv.artifacts.manifest import verify_artifact
from tieredkv.errors import ModelMismatchError
from tieredkv.provenance.domain import check_domain, sha256_ids

T = TypeVar("T")
_PREFETCH_DEPTH = 2

__all__ = ["ArtifactFormatError", "ArtifactIntegrityError", "ArtifactTruncatedError", "ArtifactVersionError",
           "ArtifactWriteError", "export_artifact", "import_artifact", "read_header", "verify_file"]


# ----------------------------------------------------------------------------- export
def export_artifact(store: PageStore, artifact_id: str, path: str | os.PathLike | BinaryIO, *,
                    progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write artifact `artifact_id` (id or unique prefix) of `store` to `path`, atomically.

    `path` is a regular file (replaced atomically) or a name that does not exist yet; a directory,
    symlink, FIFO, socket or device is refused (ArtifactWriteError) before anything is read. A
    binary stream (stdout) is written as it goes.

    Every page is read verified from the store (a corrupt page raises CorruptPageError and no
    file is written). Deterministic: the same artifact always gives the same bytes. Returns a
    summary with the file's size and SHA-256.
    """
    if not hasattr(path, "write"):
        check_target(Path(path))  # before any work; AtomicFile checks again just before the rename
    art = load_artifact(store, artifact_id)
    page_fp = chain_fingerprint(art)
    # Pass 1: verify the chain and size every page blob, so the header can go first.
    ids: list[int] = []
    sections: list[tuple[int, str]] = []
    for i, (page, blob) in enumerate(_prefetch(_store_pages(store, art))):
        check_chain_page(art, page_fp, i, page)
        ids.extend(page.token_ids)
        sections.append((len(blob), payload_digest(blob)))
    if sha256_ids(ids) != art.token_ids_sha256:
        raise CorruptPageError(art.artifact_id, "the token ids of the stored pages do not hash to the "
                               "manifest's token_ids_sha256; re-deposit the artifact")
    tokens = _token_bytes(ids)
    header = encode_header(art, hashlib.sha256(tokens).hexdigest(), sections)
    digest = hashlib.sha256()
    nbytes = 0

    def write_all(f: BinaryIO) -> None:
        nonlocal nbytes
        for chunk in (header, tokens):
            f.write(chunk)
            digest.update(chunk)
            nbytes += len(chunk)
        # Pass 2: the same pages again, streamed; the store is immutable per key, so a changed
        # blob means the store changed under us (an alarm, not a race to paper over).
        for i, (_, blob) in enumerate(_prefetch(_store_pages(store, art))):
            if len(blob) != sections[i][0] or payload_digest(blob) != sections[i][1]:
                raise CorruptPageError(art.page_keys[i], "page bytes changed between the two export passes")
            f.write(blob)
            digest.update(blob)
            nbytes += len(blob)
            if progress is not None:
                progress(i + 1, len(art.page_keys))

    if hasattr(path, "write"):  # a stream (stdout): written as it goes, not atomically
        write_all(path)
        path.flush()
        where = getattr(path, "name", "<stream>")
    else:
        where = Path(path)
        with AtomicFile(where, ArtifactWriteError) as f:
            write_all(f)
    return {**art.summary(), "path": str(where), "file_bytes": nbytes, "file_sha256": digest.hexdigest(),
            "format_version": FILE_VERSION}


def _store_pages(store: PageStore, art: Artifact) -> Iterator[tuple[Page, bytes]]:
    for key in art.page_keys:
        page = store.get(key)  # verified (quarantined and raised if corrupt)
        yield page, page.to_bytes()


def _token_bytes(ids: list[int]) -> bytes:
    import numpy as np

    return np.asarray(ids, dtype="<i4").tobytes()


# ----------------------------------------------------------------------------- import
def verify_file(src: str | os.PathLike | BinaryIO, *,
                on_page: Callable[[int, Page, bytes], None] | None = None) -> ArtifactHeader:
    """Verify a whole artifact file (a path or a seekable binary file) without a store: header,
    every page, the chain, the tokens.

    Raises ArtifactFormatError (or a subclass) on the first problem. `on_page(i, page, blob)`
    sees each verified page (import uses it to look for conflicts in the target store).
    """
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as f:
            return verify_file(f, on_page=on_page)
    f = src
    header = read_header(f)
    art = header.artifact
    page_fp = chain_fingerprint(art)
    ids = read_token_ids(f, header)
    if sha256_ids(ids) != art.token_ids_sha256:
        raise ArtifactIntegrityError("token ids do not hash to the manifest's token_ids_sha256")
    for i, blob in enumerate(_prefetch(iter_page_blobs(f, header))):
        try:
            page = Page.from_bytes(blob, expected_key=art.page_keys[i])
        except CorruptPageError as exc:
            raise ArtifactIntegrityError(f"page {i}: {exc.reason}") from None
        check_chain_page(art, page_fp, i, page)
        if list(page.token_ids) != ids[page.start:page.start + page.num_tokens]:
            raise ArtifactIntegrityError(f"page {i}: its token ids differ from the token id section")
        if on_page is not None:
            on_page(i, page, blob)
    return header


def import_artifact(path: str | os.PathLike, store: PageStore, *, expected_fingerprint: str | None = None,
                    expected_domain: dict[str, Any] | None = None, allow_domain_mismatch: bool = False,
                    progress: Callable[[int, int], None] | None = None, recompute=None) -> Artifact:
    """Verify the artifact file at `path` completely, then put its pages and manifest in `store`.

    Refused before anything is written: a malformed, truncated or altered file
    (ArtifactFormatError and subclasses), another model than `expected_fingerprint` or than the
    model the store is bound to (ModelMismatchError), another determinism domain than
    `expected_domain` unless `allow_domain_mismatch` (DomainMismatchError), and stored pages or
    a manifest with the same key but other bytes (PageConflictError). Importing twice is a no-op.
    `recompute` (a recompute.Recomputer for this artifact) sees every verified page in pass 1 and
    refuses the file (RecomputeMismatchError) if a sampled page does not reproduce.
    """
    _check_source(Path(path))
    header = read_header(path)
    art = header.artifact
    bound = store_fingerprint(store)
    for what, fp in ((f"store {store.path}", bound), ("the expected model", expected_fingerprint)):
        if fp is not None and fp != art.fingerprint:
            raise ModelMismatchError(f"artifact {art.artifact_id} in {path} (checked against {what})",
                                     art.fingerprint, fp)
    if expected_domain is not None:
        check_domain(art.domain, expected_domain, allow_mismatch=allow_domain_mismatch,
                     what=f"artifact {art.artifact_id} (file {path})")
    _check_manifest_slot(store, art, header.manifest)

    def no_conflict(i: int, page: Page, blob: bytes) -> None:
        stored = store.lmdb_tier.get_raw(page.key)
        if stored is not None and stored != blob and is_valid_page(stored, page.key):
            raise PageConflictError(f"page {i} ({page.key}) is in store {store.path} with other bytes: the same "
                                    "token chain produced different KV — check the determinism domain")
        if recompute is not None:
            recompute.feed(page)

    header = verify_file(path, on_page=no_conflict)  # pass 1: nothing is written yet
    added: list[str] = []
    try:
        with open(path, "rb") as f:
            if read_header(f).header_sha256 != header.header_sha256:
                raise ArtifactIntegrityError("the file changed while it was imported; import it again")
            with PageWriter(store, max_pages=len(art.page_keys)) as writer:  # batches by bytes
                for i, blob in enumerate(_prefetch(iter_page_blobs(f, header))):  # pass 2: sha-checked again
                    page = Page.from_bytes(blob, expected_key=art.page_keys[i])
                    if not store.contains(page.key):
                        added.append(page.key)
                    writer.add(page)
                    if progress is not None:
                        progress(i + 1, len(art.page_keys))
        if bound is None:
            store.set_meta(STORE_FINGERPRINT_META, art.fingerprint)
        try:
            store.get_manifest(art.artifact_id)
        except CorruptPageError:  # a damaged copy of this manifest: replace it with verified bytes
            store.delete_manifest(art.artifact_id)
        except ManifestNotFoundError:
            pass
        store.put_manifest(art.artifact_id, header.manifest)  # last: the artifact becomes visible
    except BaseException:
        for key in added:  # best effort: leave the store as it was
            try:
                store.remove(key)
            except Exception:
                pass
        raise
    return art


def _check_source(path: Path) -> None:
    """An artifact is read from a regular file: a directory cannot be read, and opening a FIFO would wait forever."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ArtifactFormatError(f"cannot read artifact file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise ArtifactFormatError(f"{path} is {kind}; give an artifact file written by `tieredkv export`")


def _check_manifest_slot(store: PageStore, art: Artifact, manifest: bytes) -> None:
    try:
        stored = store.get_manifest(art.artifact_id)
    except (ManifestNotFoundError, CorruptPageError):
        return  # absent, or corrupt and about to be replaced by verified bytes
    if stored != manifest:
        raise PageConflictError(f"store {store.path} holds artifact {art.artifact_id} with another manifest; "
                                "delete it first (PageStore.delete_manifest) if replacing it is intended")


# ----------------------------------------------------------------------------- chain checks
def chain_fingerprint(art: Artifact) -> str:
    """The fingerprint the artifact's page keys hash, after checking that the id commits to it.

    Deposits key pages by the model fingerprint; TieredModel contexts by a regime fingerprint
    (model + retrieval config, recorded in the domain), with their own id scheme.
    """
    def integrity_error(reason: str, _cls=None) -> ArtifactIntegrityError:
        return ArtifactIntegrityError(f"bad artifact: {reason}")

    return verify_artifact(art, integrity_error)


def check_chain_page(art: Artifact, page_fp: str, i: int, page: Page) -> None:
    """Page `i` of `art` sits where the manifest says: fingerprint, parent, position, size, layout."""
    start = i * art.page_size
    end = min(art.num_tokens, start + art.page_size)
    parent = art.page_keys[i - 1] if i else ROOT_KEY
    if page.key != art.page_keys[i] or page.fingerprint != page_fp or page.parent_key != parent:
        raise ArtifactIntegrityError(f"page {i} ({page.key}) breaks the chain of artifact {art.artifact_id}")
    if page.start != start or page.num_tokens != end - start:
        raise ArtifactIntegrityError(f"page {i} covers [{page.start}, {page.start + page.num_tokens}), the "
                                     f"manifest's schedule says [{start}, {end})")
    if page.layout != PageLayout.from_dict(art.layout):
        raise ArtifactIntegrityError(f"page {i} has layout {page.layout.to_dict()}, the manifest {art.layout}")


# ----------------------------------------------------------------------------- plumbing
def _prefetch(items: Iterator[T], depth: int = _PREFETCH_DEPTH) -> Iterator[T]:
    """Iterate `items` in a background thread, at most `depth` ahead (I/O and hashing overlap)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def run() -> None:
        try:
            for item in items:
                if not put((None, item)):
                    return
            put((None, done))
        except BaseException as exc:  # handed to the consumer
            put((exc, None))

    worker = threading.Thread(target=run, name="tieredkv-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            exc, item = q.get()
            if exc is not None:
                raise exc
            if item is done:
                return
            yield item
    finally:
        stop.set()
        worker.join()


def check_target(path: Path) -> None:
    """Refuse to replace anything but a regular file (safefiles.check_target)."""
    _check_target(path, ArtifactWriteError)

