"""The artifact record and its manifest format: what a deposit names, how it is written and read back.

    Artifact ──to_json()──> manifest bytes (canonical JSON, MANIFEST_FORMAT) ──parse_record()──> Artifact

`artifact_id` commits to the fingerprint the page keys hash (`chain_fingerprint`), the determinism
domain and the root page. The store's manifests (manifest.py) and the portable file's header
(file_format.py) both check a manifest's fields with `parse_record`.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from paging import PageLayout
from paging.errors import LayoutMismatchError
from paging.framing import canonical_json, is_int
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.errors import TieredKVError
from tieredkv.provenance.domain import domain_id

MANIFEST_FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ARTIFACT_ID = re.compile(r"[0-9A-Za-z_.-]{1,200}")


class ArtifactFormatError(TieredKVError):
    """The file is not a valid artifact (malformed, truncated or altered); nothing was imported."""


class ArtifactVersionError(ArtifactFormatError):
    """The file, manifest or page format version is not one this build reads."""


class ArtifactIntegrityError(ArtifactFormatError):
    """A section's bytes do not match the hashes that commit to them, or contradict the manifest."""


@dataclass(frozen=True)
class Artifact:
    """A deposited context: a hash chain of pages plus what is needed to check a graft of it."""

    artifact_id: str
    fingerprint: str
    domain: dict[str, Any]
    num_tokens: int
    page_size: int
    page_keys: tuple[str, ...]
    token_ids_sha256: str
    layout: dict[str, Any]
    name: str = ""

    @property
    def root_sha256(self) -> str:
        """The last page key: it commits to the model, every token id and every position before it."""
        return self.page_keys[-1]

    def to_json(self) -> bytes:
        d = {"format": MANIFEST_FORMAT, "artifact": self.artifact_id, "model_fingerprint": self.fingerprint,
             "domain": self.domain, "domain_id": domain_id(self.domain), "tokens": self.num_tokens,
             "page_size": self.page_size, "pages": list(self.page_keys), "root_sha256": self.root_sha256,
             "token_ids_sha256": self.token_ids_sha256, "layout": self.layout, "name": self.name}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Artifact":
        d = json.loads(data)
        return cls(d["artifact"], d["model_fingerprint"], d["domain"], int(d["tokens"]), int(d["page_size"]),
                   tuple(d["pages"]), d["token_ids_sha256"], d["layout"], d.get("name", ""))

    def summary(self) -> dict[str, Any]:
        return {"artifact": self.artifact_id, "tokens": self.num_tokens, "pages": len(self.page_keys),
                "page_size": self.page_size, "root_sha256": self.root_sha256,
                "token_ids_sha256": self.token_ids_sha256, "model_fingerprint": self.fingerprint,
                "domain_id": domain_id(self.domain)}


def artifact_id(chain_fingerprint: str, root: str, domain: dict[str, Any]) -> str:
    """An artifact's id commits to the fingerprint its page keys hash, its domain and its root page."""
    return hashlib.sha256(f"{chain_fingerprint}:{domain_id(domain)}:{root}".encode()).hexdigest()[:20]


def chain_fingerprint(art: Artifact) -> str:
    """What `art`'s page keys hash: the model fingerprint for deposits (full attention), a regime
    fingerprint (model + retrieval config, recorded in the domain) for TieredModel contexts."""
    regime = art.domain.get("regime")
    if regime is None:
        return art.fingerprint
    # a regime without score_frame scored pages at their own positions (see TieredConfig.regime)
    return TieredConfig(**{"score_frame": "own", **regime}).regime_fingerprint(art.fingerprint, art.page_size)


def is_hex64(v: Any) -> bool:
    """A SHA-256 hex digest (lower case)."""
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


def parse_record(m: Any, bad: Callable[..., Exception]) -> tuple[Artifact, bytes]:
    """The Artifact a parsed manifest object `m` describes and its canonical bytes, checked field by field.

    `bad(reason, cls=ArtifactFormatError)` makes the error raised; `cls` says what kind of fault it is."""
    if not isinstance(m, dict):
        raise bad("manifest must be an object")
    if m.get("format") != MANIFEST_FORMAT:
        raise bad(f"manifest format {m.get('format')!r}; this build reads {MANIFEST_FORMAT}", ArtifactVersionError)
    try:
        art = Artifact.from_json(canonical_json(m))
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"manifest is incomplete ({type(exc).__name__}: {exc})") from None
    if not (isinstance(art.artifact_id, str) and _ARTIFACT_ID.fullmatch(art.artifact_id)):
        raise bad(f"artifact id {str(art.artifact_id)[:80]!r} is not 1-200 characters of [0-9A-Za-z_.-]")
    if not is_hex64(art.fingerprint) or not is_hex64(art.token_ids_sha256):
        raise bad("model_fingerprint and token_ids_sha256 must be sha256 hexdigests")
    if not isinstance(art.domain, dict) or not isinstance(art.name, str) or not isinstance(art.layout, dict):
        raise bad("domain and layout must be objects, name a string")
    if not (is_int(m["tokens"]) and is_int(m["page_size"]) and art.num_tokens >= 1 and art.page_size >= 1):
        raise bad("tokens and page_size must be positive ints")
    try:
        layout = PageLayout.from_dict(art.layout)
    except (LayoutMismatchError, TypeError) as exc:  # e.g. an unknown dtype
        raise bad(f"manifest layout: {exc}") from None
    if layout.page_size != art.page_size:
        raise bad(f"layout page_size {layout.page_size} != manifest page_size {art.page_size}")
    num_pages = -(-art.num_tokens // art.page_size)
    if len(art.page_keys) != num_pages or not all(is_hex64(k) for k in art.page_keys):
        raise bad(f"{art.num_tokens} tokens in pages of {art.page_size} need {num_pages} page keys "
                  f"(sha256 hexdigests), the manifest lists {len(art.page_keys)}")
    if m.get("root_sha256") != art.root_sha256:
        raise bad("root_sha256 is not the last page key", ArtifactIntegrityError)
    if m.get("domain_id") != domain_id(art.domain):
        raise bad("domain_id does not match the domain", ArtifactIntegrityError)
    if art.domain.get("fingerprint") != art.fingerprint or art.domain.get("page_size") != art.page_size:
        raise bad("the domain names another model or page size than the manifest", ArtifactIntegrityError)
    manifest = art.to_json()
    if json.loads(manifest) != m:
        raise bad("manifest has unknown or malformed fields")
    return art, manifest
