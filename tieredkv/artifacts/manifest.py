"""Manifests are verified wherever they are read, before anything is written or served.

A manifest names an artifact's pages. Its id commits to the fingerprint its page keys hash, its
determinism domain and its root page (`artifact_id`), and the root commits to every page before
it (the hash chain). So a manifest is genuine when:

    1. it is the canonical JSON of an Artifact (record.parse_record: fields, types, layout),
    2. its page count is ceil(tokens / page_size) and root_sha256 is its last page key,
    3. its id is artifact_id(chain fingerprint, root, domain) and it is stored under that id,
    4. (when its pages are read) each page's parent is the page before it, at the next position,
       hashed with that fingerprint (`iter_pages`).

Another document's manifest renamed to this id, or a manifest cut to fewer pages, fails 3; a
list of keys that does not chain fails 4. Nothing of such a manifest is grafted, pulled, pushed
or certified.
"""
from __future__ import annotations

from typing import Iterator

from paging import ROOT_KEY, Page, PageStore
from paging.errors import CorruptPageError, StoreIntegrityError
from paging.framing import strict_json
from paging.page import PageHeader
from paging.restore import verify_stored
from tieredkv.artifacts.record import Artifact, artifact_id, chain_fingerprint, parse_record
from tieredkv.errors import TieredKVError


class ManifestIntegrityError(TieredKVError):
    """A manifest is not what its id commits to (renamed, cut, altered, or not a manifest at all)."""


def parse_manifest(data: bytes, *, stored_as: str | None = None, where: str = "the store") -> Artifact:
    """The Artifact of manifest bytes `data` (stored under `stored_as`), or ManifestIntegrityError."""
    label = f"manifest {stored_as!r} in {where}" if stored_as else f"a manifest in {where}"

    def not_genuine(reason: str, _cls=None) -> ManifestIntegrityError:
        return ManifestIntegrityError(f"{label} is not a genuine manifest: {reason}; it was not used — re-import "
                                      "the artifact from a verified file or deposit it again")

    try:
        m = strict_json(data)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise not_genuine(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(m, dict):
        raise not_genuine("not a JSON object")
    try:
        art, canonical = parse_record(m, not_genuine)
    except ManifestIntegrityError:
        raise
    except TieredKVError as exc:  # e.g. an unknown manifest format version
        raise not_genuine(str(exc)) from None
    if canonical != bytes(data):
        raise not_genuine("its bytes are not the canonical form its fields give")
    verify_artifact(art, not_genuine)
    if stored_as is not None and stored_as != art.artifact_id:
        raise not_genuine(f"it is stored under {stored_as!r} but names artifact {art.artifact_id!r}")
    return art


def verify_artifact(art: Artifact, bad=None) -> str:
    """Check that `art`'s id commits to its model, domain and root; returns the chain fingerprint."""
    def refused(reason: str, _cls=None) -> ManifestIntegrityError:
        return ManifestIntegrityError(f"artifact {art.artifact_id!r}: {reason}; it was not used")

    bad = bad or refused
    num_pages = -(-art.num_tokens // art.page_size) if art.page_size > 0 else -1
    if len(art.page_keys) != num_pages:
        raise bad(f"{art.num_tokens} tokens in pages of {art.page_size} need {num_pages} pages, the manifest "
                  f"lists {len(art.page_keys)}")
    try:
        page_fp = chain_fingerprint(art)
    except (TypeError, ValueError) as exc:
        raise bad(f"its domain's regime is invalid ({exc})") from None
    want = artifact_id(page_fp, art.page_keys[-1], art.domain)
    if art.artifact_id != want:
        raise bad(f"artifact id {art.artifact_id} does not match its model, domain and root hash (they give "
                  f"{want})")
    return page_fp


class ChainWalker:
    """Checks pages of `art` fed in order: parent, position, fingerprint, and the token count at the end."""

    def __init__(self, art: Artifact) -> None:
        self.art = art
        self.page_fp = verify_artifact(art)
        self.parent, self.pos, self.index = ROOT_KEY, 0, 0

    def step(self, page: PageHeader) -> None:
        art, key = self.art, self.art.page_keys[self.index]
        if page.key != key or page.parent_key != self.parent or page.start != self.pos or \
                page.fingerprint != self.page_fp:
            raise CorruptPageError(key, f"breaks the chain of artifact {art.artifact_id} (parent, position or "
                                        f"fingerprint differs)")
        self.parent, self.pos, self.index = key, self.pos + page.num_tokens, self.index + 1
        if self.index == len(art.page_keys) and self.pos != art.num_tokens:
            raise CorruptPageError(key, f"artifact {art.artifact_id} pages hold {self.pos} tokens, manifest says "
                                        f"{art.num_tokens}")


def check_root(art: Artifact, root: Page) -> None:
    """The manifest's token count and schedule against the page that ends it (before any other page is read)."""
    start = (len(art.page_keys) - 1) * art.page_size
    if root.key != art.root_sha256 or root.start != start or root.start + root.num_tokens != art.num_tokens:
        raise CorruptPageError(root.key, f"artifact {art.artifact_id}: its last page covers [{root.start}, "
                                         f"{root.start + root.num_tokens}), the manifest says [{start}, "
                                         f"{art.num_tokens})")


def _lost(store: PageStore, art: Artifact, key: str) -> StoreIntegrityError:
    return StoreIntegrityError(f"page {key} of artifact {art.artifact_id} is not in {store.path} after it was "
                               f"written; the store lost a committed write — run `tieredkv check`")


def iter_pages(store: PageStore, art: Artifact, *, local_only: bool = False) -> Iterator[Page]:
    """Every page of `art` in order, BLAKE3-verified by the store, with the hash chain checked.

    `local_only` reads LMDB itself (not the host copy): what a reader of the disk would get.
    """
    walker = ChainWalker(art)
    for key in art.page_keys:
        page = store.lmdb_tier.get(key) if local_only else store.get(key)  # raises CorruptPageError
        if page is None:
            raise _lost(store, art, key)
        walker.step(page)
        yield page


def read_back(store: PageStore, art: Artifact) -> None:
    """After a write: the manifest and every page are in LMDB, verified, chained. Else an error."""
    data = store.lmdb_tier.get_manifest(art.artifact_id)
    if parse_manifest(data, stored_as=art.artifact_id, where=store.path) != art:
        raise StoreIntegrityError(f"manifest {art.artifact_id} read back from {store.path} differs from the one "
                                  "written; run `tieredkv check`")
    walker = ChainWalker(art)
    for key, header in zip(art.page_keys, verify_stored(store, art.page_keys)):  # zero-copy, all cores
        if header is None:
            raise _lost(store, art, key)
        walker.step(header)
