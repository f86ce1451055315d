"""Where a library's entries live: namespaced meta records in the PageStore's LMDB.

    lib:<name>:entry:<problem sha256>  ->  {"entry": {...}, "entry_sha256": ...}   one per problem
    lib:<name>:index                   ->  {"version": v, "problems": [sha256, ...]}  the commit point
    lib:<name>:context                 ->  {"version": v, "artifact": id, "regime": ...}  derived data

NOTE: an entry is written before the index names it (and its artifact before the entry), each in
its own transaction, so a crash half-way leaves an unnamed entry, never an index naming a missing
one. Meta values carry no checksum of their own in the store, so each entry carries its SHA-256
and is checked on every read. One writer per library at a time.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from paging import PageStore
from tieredkv.errors import TieredKVError
from tieredkv.library.verifiers import normalize_text

LIBRARY_FORMAT = 1
PREFIX = "lib:"


class LibraryNameError(TieredKVError, ValueError):
    """A library name that is empty or holds ':' (the separator of the store's meta keys)."""


class CorruptLibraryError(TieredKVError):
    """A library record failed its SHA-256 check or does not parse."""


def problem_sha256(problem: str) -> str:
    """The address of a problem: SHA-256 of its normalized text (NFKC, casefold, collapsed whitespace)."""
    return hashlib.sha256(normalize_text(problem).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LibraryEntry:
    """One verified solution and what backs it."""

    problem: str
    problem_sha256: str
    solution: str
    artifact_id: str  # chat-formatted problem + solution, deposited as byte-exact pages
    prompt_tokens: int  # the artifact's first `prompt_tokens` ids are the chat prompt; the rest the solution
    verdict: dict[str, Any]  # {"accepted": True, "reason": ...}
    verifier: dict[str, Any]  # verifier_identity(): name, source_sha256, version
    model_fingerprint: str
    source: str  # "add" (given) or "solve" (generated, then verified: the flywheel)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LibraryEntry":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


class LibraryIndex:
    """Reads and writes one named library's records in `store`; knows nothing of models."""

    def __init__(self, store: PageStore, name: str = "default"):
        if not name.strip() or ":" in name:
            raise LibraryNameError(f"library name must be non-empty and without ':', got {name!r}; give --library NAME")
        self.store, self.name = store, name
        self.namespace = f"{PREFIX}{name}:"

    # ------------------------------------------------------------------ index
    def _index(self) -> dict[str, Any]:
        raw = self.store.get_meta(self.namespace + "index")
        if raw is None:
            return {"format": LIBRARY_FORMAT, "version": 0, "problems": []}
        try:
            return json.loads(raw)
        except ValueError:
            raise CorruptLibraryError(f"library {self.name!r} index in {self.store.path} does not parse") from None

    @property
    def version(self) -> int:
        """Bumped by every change; the library's context document is re-ingested when it moves."""
        return int(self._index()["version"])

    def problem_hashes(self) -> list[str]:
        return list(self._index()["problems"])

    def __len__(self) -> int:
        return len(self.problem_hashes())

    # ------------------------------------------------------------------ entries
    def get(self, problem_hash: str) -> LibraryEntry | None:
        raw = self.store.get_meta(f"{self.namespace}entry:{problem_hash}")
        if raw is None or problem_hash not in self._index()["problems"]:
            return None
        try:
            rec = json.loads(raw)
            body = json.dumps(rec["entry"], sort_keys=True, ensure_ascii=False).encode("utf-8")
            ok = hashlib.sha256(body).hexdigest() == rec["entry_sha256"]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise CorruptLibraryError(
                f"library {self.name!r} entry {problem_hash[:16]}… in {self.store.path} fails its SHA-256 check; "
                "add the problem again to replace it")
        return LibraryEntry.from_dict(rec["entry"])

    def entries(self) -> list[LibraryEntry]:
        """Every entry, in the order it was first added."""
        return [e for e in (self.get(h) for h in self.problem_hashes()) if e is not None]

    def put(self, entry: LibraryEntry) -> int:
        """Write `entry` (replacing one for the same problem), then the index; returns the new version."""
        body = entry.to_dict()
        blob = json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")
        rec = {"entry": body, "entry_sha256": hashlib.sha256(blob).hexdigest()}
        self.store.set_meta(f"{self.namespace}entry:{entry.problem_sha256}", json.dumps(rec, ensure_ascii=False))
        index = self._index()
        if entry.problem_sha256 not in index["problems"]:
            index["problems"].append(entry.problem_sha256)
        index["version"] = int(index["version"]) + 1
        self.store.set_meta(self.namespace + "index", json.dumps(index))  # last: the entry becomes visible
        return index["version"]

    # ------------------------------------------------------------------ the ingested context
    def context(self) -> dict[str, Any] | None:
        raw = self.store.get_meta(self.namespace + "context")
        return None if raw is None else json.loads(raw)

    def set_context(self, version: int, artifact_id: str, regime: str) -> None:
        self.store.set_meta(self.namespace + "context",
                            json.dumps({"version": version, "artifact": artifact_id, "regime": regime}))
