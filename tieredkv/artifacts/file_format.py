"""The portable artifact file: one self-describing, little-endian, safetensors-style file.

    +------+---------+------------+----------------------+------------------------------------+
    | TKVA | version | header_len | header (JSON, UTF-8) | data                               |
    | 4 B  | u32 LE  | u64 LE     | header_len bytes     | token ids | page 0 | page 1 | ...  |
    +------+---------+------------+----------------------+------------------------------------+

The header is canonical JSON (sorted keys, compact, ASCII, no NaN) with exactly these fields::

    format          "tieredkv.artifacts.artifact"
    format_version  the prefix version again (both must agree)
    manifest        the manifest the store keeps for the artifact (Artifact.to_json()):
                    model fingerprint, determinism domain, page keys, root hash, layout
    token_ids       {"dtype": "I32", "shape": [N], "data_offsets": [b, e], "sha256"}
    pages           [{"key", "data_offsets": [b, e], "blake3"}, ...] in chain order; each
                    range holds that page's Page.to_bytes() (its own header + payload digest);
                    "blake3" is paging.page.payload_digest of those bytes
    data_nbytes     size of the data section
    header_sha256   sha256 of the canonical JSON of every other field

Offsets are relative to the start of the data section. The sections are in-bounds,
non-overlapping and cover the data exactly (token ids first, then the pages in order), and
the file is exactly 16 + header_len + data_nbytes bytes long, so a truncation anywhere is
caught before any data is read.

NOTE: every length read from the file is checked against a cap and against the file size
before anything is allocated for it; a hostile header costs at most MAX_HEADER_NBYTES.
`header_sha256` makes every header byte matter (the page hashes cover the data).
Version 1 files digested their pages with SHA-256 (a "sha256" field, version 1 pages inside):
this build refuses them at the prefix, saying so.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

import numpy as np

from paging import PageLayout
from paging.framing import PREFIX, canonical_json, is_int, pack_prefix, strict_json, unpack_prefix
from paging.page import MAX_HEADER_NBYTES as PAGE_MAX_HEADER_NBYTES
from paging.page import payload_digest
from tieredkv.artifacts.record import (
    Artifact,
    ArtifactFormatError,
    ArtifactIntegrityError,
    ArtifactVersionError,
    is_hex64,
    parse_record,
)
from tieredkv.engine.schedule import canonical_chunks
from tieredkv.errors import TieredKVError

MAGIC = b"TKVA"
FILE_VERSION = 2
LEGACY_FILE_VERSIONS = frozenset({1})  # SHA-256 page digests, version 1 pages
FORMAT_NAME = "tieredkv.artifacts.artifact"
# NOTE: no conversion of a version 1 file exists: its pages would have to be re-verified under SHA-256 first
LEGACY_HINT = "import it with the tieredkv that wrote it and re-deposit its text with this build"
MAX_HEADER_NBYTES = 64 << 20  # ~250 bytes per page: room for ~250k pages
MAX_PAGE_NBYTES = 1 << 30
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: no per-character alternation
_HEADER_FIELDS = frozenset({"format", "format_version", "manifest", "token_ids", "pages", "data_nbytes",
                            "header_sha256"})
_TOKEN_FIELDS = frozenset({"dtype", "shape", "data_offsets", "sha256"})
_PAGE_FIELDS = frozenset({"key", "data_offsets", "blake3"})


class ArtifactTruncatedError(ArtifactFormatError):
    """The file is shorter (or longer) than its header says: a torn copy or download."""


class ArtifactWriteError(TieredKVError):
    """Writing the artifact file failed (disk full, file size limit, permissions); no file was left."""


@dataclass(frozen=True)
class Section:
    """A byte range `[begin, end)` of the data section and the digest of its bytes (SHA-256 for the token
    ids, `payload_digest` for a page)."""

    begin: int
    end: int
    digest: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class ArtifactHeader:
    """A parsed, self-consistent header. Data bytes are not verified yet (see portable.verify_file)."""

    version: int
    artifact: Artifact
    manifest: bytes  # exactly Artifact.to_json() of the source store
    token_ids: Section
    pages: tuple[Section, ...]  # one per artifact.page_keys entry
    data_offset: int  # absolute file offset of the data section
    data_nbytes: int
    header_sha256: str

    @property
    def file_nbytes(self) -> int:
        return self.data_offset + self.data_nbytes

    def summary(self) -> dict[str, Any]:
        return {**self.artifact.summary(), "format_version": self.version, "file_bytes": self.file_nbytes,
                "header_sha256": self.header_sha256}


# ----------------------------------------------------------------------------- writing

def encode_header(art: Artifact, token_sha256: str, page_sections: list[tuple[int, str]]) -> bytes:
    """Prefix + header for `art`; `page_sections` are (nbytes, payload_digest) of each page blob in order.

    Deterministic: the same artifact gives the same bytes (no timestamps, sorted keys).
    """
    num_tokens = art.num_tokens
    pos = 4 * num_tokens
    pages = []
    for key, (nbytes, digest) in zip(art.page_keys, page_sections, strict=True):
        pages.append({"key": key, "data_offsets": [pos, pos + nbytes], "blake3": digest})
        pos += nbytes
    fields = {
        "format": FORMAT_NAME,
        "format_version": FILE_VERSION,
        "manifest": json.loads(art.to_json()),
        "token_ids": {"dtype": "I32", "shape": [num_tokens], "data_offsets": [0, 4 * num_tokens],
                      "sha256": token_sha256},
        "pages": pages,
        "data_nbytes": pos,
    }
    fields["header_sha256"] = hashlib.sha256(canonical_json(fields)).hexdigest()
    header = canonical_json(fields)
    if len(header) > MAX_HEADER_NBYTES:
        raise ArtifactWriteError(f"artifact {art.artifact_id} needs a {len(header)}-byte header, over the "
                                 f"{MAX_HEADER_NBYTES}-byte cap; deposit it with a larger page size")
    return pack_prefix(MAGIC, FILE_VERSION, len(header)) + header


# ----------------------------------------------------------------------------- reading
def read_header(src: str | os.PathLike | BinaryIO) -> ArtifactHeader:
    """Parse and check the header of an artifact file (a path or a seekable binary file).

    Bounded: reads 16 bytes, then at most MAX_HEADER_NBYTES (and never more than the file
    holds). Raises ArtifactFormatError (or a subclass) saying what is wrong.
    """
    if isinstance(src, (str, os.PathLike)):
        with open(src, "rb") as f:
            return read_header(f)
    f = src
    size = f.seek(0, io.SEEK_END)
    f.seek(0)
    prefix = f.read(PREFIX.size)
    if len(prefix) < PREFIX.size:
        raise ArtifactTruncatedError(f"truncated: the file is {size} bytes, the fixed prefix alone is "
                                     f"{PREFIX.size}; re-copy or re-export it")
    magic, version, header_len = unpack_prefix(prefix)
    if magic != MAGIC:
        raise ArtifactFormatError(f"not a tieredkv artifact: magic {magic!r}, expected {MAGIC!r}")
    if version in LEGACY_FILE_VERSIONS:
        raise ArtifactVersionError(f"artifact file format version {version} (SHA-256 page digests); this build reads "
                                   f"version {FILE_VERSION} — {LEGACY_HINT}")
    if version != FILE_VERSION:
        raise ArtifactVersionError(f"artifact file format version {version}; this build reads version "
                                   f"{FILE_VERSION} — use a matching tieredkv or re-export the artifact")
    if header_len > MAX_HEADER_NBYTES:
        raise ArtifactFormatError(f"header length {header_len} exceeds the {MAX_HEADER_NBYTES}-byte cap")
    if header_len > size - PREFIX.size:
        raise ArtifactTruncatedError(f"truncated: header length {header_len} but only {size - PREFIX.size} "
                                     "bytes follow the prefix; re-copy or re-export it")
    raw = f.read(header_len)
    if len(raw) != header_len:
        raise ArtifactTruncatedError("the file shrank while its header was read")
    header = parse_header(raw, version=version, data_offset=PREFIX.size + header_len)
    if header.file_nbytes != size:
        what = "truncated" if size < header.file_nbytes else "trailing bytes"
        raise ArtifactTruncatedError(f"{what}: the header describes a {header.file_nbytes}-byte file, this one "
                                     f"is {size} bytes; re-copy or re-export it")
    return header


def parse_header(raw: bytes, *, version: int = FILE_VERSION, data_offset: int = 0) -> ArtifactHeader:
    """Check the header JSON `raw` field by field; see the module docstring for the schema."""
    def header_error(reason: str, cls: type[ArtifactFormatError] = ArtifactFormatError) -> ArtifactFormatError:
        return cls(f"bad artifact header: {reason}")

    # NOTE: JSON of N bytes can cost ~20N bytes parsed ("{}," is a 64-byte dict per 3 bytes) and
    # nests without limit; a real header is ~250 bytes per page with two containers and ~5 items
    # in it. Count containers and items outside strings first, in C, and refuse bombs unparsed.
    skeleton = _JSON_STRING.sub(b'""', raw)
    if skeleton.count(b"{") + skeleton.count(b"[") > 64 + len(raw) // 64 or skeleton.count(b",") > 64 + len(raw) // 16:
        raise header_error("too many JSON containers or items for its size (not a header this build writes)")
    del skeleton
    try:
        hdr = strict_json(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise header_error(f"not valid UTF-8 JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(hdr, dict) or set(hdr) != _HEADER_FIELDS:
        got = sorted(hdr)[:20] if isinstance(hdr, dict) else type(hdr).__name__
        raise header_error(f"must be an object with fields {sorted(_HEADER_FIELDS)}, got {got}")
    try:
        canonical = canonical_json(hdr) == raw
    except (ValueError, RecursionError):
        canonical = False
    if not canonical:
        raise header_error("not in canonical form (sorted keys, compact, ASCII)")
    digest = hdr.pop("header_sha256")
    if not is_hex64(digest) or hashlib.sha256(canonical_json(hdr)).hexdigest() != digest:
        raise header_error("header_sha256 mismatch: the header was altered", ArtifactIntegrityError)
    if hdr["format"] != FORMAT_NAME:
        raise header_error(f"format {hdr['format']!r}, expected {FORMAT_NAME!r}")
    if hdr["format_version"] != version:
        raise header_error(f"format_version {hdr['format_version']!r} disagrees with the prefix version {version}",
                  ArtifactVersionError)
    art, manifest = parse_record(hdr["manifest"], header_error)
    tokens = _parse_token_section(hdr["token_ids"], art.num_tokens, header_error)
    pages = _parse_page_sections(hdr["pages"], art, header_error)
    data_nbytes = hdr["data_nbytes"]
    if not is_int(data_nbytes) or data_nbytes < 0:
        raise header_error(f"data_nbytes must be a non-negative int, got {data_nbytes!r}")
    _check_layout_of_sections([tokens, *pages], data_nbytes, header_error)
    return ArtifactHeader(version, art, manifest, tokens, tuple(pages), data_offset, data_nbytes, digest)


def _parse_offsets(entry: dict, what: str, bad) -> tuple[int, int]:
    off = entry["data_offsets"]
    if not (isinstance(off, list) and len(off) == 2 and all(is_int(o) for o in off)):
        raise bad(f"{what}: data_offsets must be [begin, end] ints")
    begin, end = off
    if not 0 <= begin <= end:
        raise bad(f"{what}: data_offsets {off} are not a range 0 <= begin <= end")
    return begin, end


def _parse_token_section(t: Any, num_tokens: int, bad) -> Section:
    if not isinstance(t, dict) or set(t) != _TOKEN_FIELDS:
        raise bad(f"token_ids must be an object with fields {sorted(_TOKEN_FIELDS)}")
    if t["dtype"] != "I32":
        raise bad(f"token_ids dtype {str(t['dtype'])[:40]!r} is unknown; this build reads 'I32'")
    if t["shape"] != [num_tokens]:
        raise bad(f"token_ids shape {str(t['shape'])[:40]} != [{num_tokens}] (the manifest's token count)")
    begin, end = _parse_offsets(t, "token_ids", bad)
    if end - begin != 4 * num_tokens or not is_hex64(t["sha256"]):
        raise bad(f"token_ids span {end - begin} bytes for {num_tokens} int32 ids, or has no sha256")
    return Section(begin, end, t["sha256"])


def _parse_page_sections(entries: Any, art: Artifact, bad) -> list[Section]:
    if not isinstance(entries, list) or len(entries) != len(art.page_keys):
        raise bad(f"pages must be a list of {len(art.page_keys)} entries (one per manifest page)")
    layout = PageLayout.from_dict(art.layout)
    sizes = [e - s for s, e in canonical_chunks(0, art.num_tokens, art.page_size)]
    out = []
    for i, (entry, key) in enumerate(zip(entries, art.page_keys)):
        if not isinstance(entry, dict) or set(entry) != _PAGE_FIELDS:
            raise bad(f"page {i} must be an object with fields {sorted(_PAGE_FIELDS)}")
        if entry["key"] != key:
            raise bad(f"page {i} is {str(entry['key'])[:70]!r}, the manifest says {key}", ArtifactIntegrityError)
        if not is_hex64(entry["blake3"]):
            raise bad(f"page {i}: blake3 must be 64 lowercase hex characters")
        begin, end = _parse_offsets(entry, f"page {i}", bad)
        payload = layout.payload_nbytes(sizes[i])
        lo, hi = payload + PREFIX.size, payload + PREFIX.size + PAGE_MAX_HEADER_NBYTES
        if not lo < end - begin <= min(hi, MAX_PAGE_NBYTES):
            raise bad(f"page {i} spans {end - begin} bytes; {sizes[i]} tokens of this layout need "
                      f"{lo + 1}..{min(hi, MAX_PAGE_NBYTES)}")
        out.append(Section(begin, end, entry["blake3"]))
    return out


def _check_layout_of_sections(sections: list[Section], data_nbytes: int, bad) -> None:
    """In-bounds, non-overlapping, no gaps: the sections tile [0, data_nbytes) in file order."""
    pos = 0
    for i, s in enumerate(sections):
        what = "token_ids" if i == 0 else f"page {i - 1}"
        if s.end > data_nbytes:
            raise bad(f"{what} [{s.begin}, {s.end}) is out of range of the {data_nbytes}-byte data section")
        if s.begin < pos:
            raise bad(f"{what} [{s.begin}, {s.end}) overlaps the section before it (ends at {pos})")
        if s.begin > pos:
            raise bad(f"gap: {what} starts at {s.begin}, the section before it ends at {pos}")
        pos = s.end
    if pos != data_nbytes:
        raise bad(f"the sections end at {pos} but data_nbytes is {data_nbytes}")


def iter_page_blobs(f: BinaryIO, header: ArtifactHeader) -> Iterator[bytes]:
    """Each page section's bytes in chain order, one at a time, checked against the header's digest."""
    for i, s in enumerate(header.pages):
        f.seek(header.data_offset + s.begin)
        blob = f.read(s.nbytes)
        if len(blob) != s.nbytes:
            raise ArtifactTruncatedError(f"page {i}: the file ended inside its bytes; re-copy or re-export it")
        if payload_digest(blob) != s.digest:
            raise ArtifactIntegrityError(f"page {i} ({header.artifact.page_keys[i]}): the digest of its bytes does "
                                         "not match the header; the file was altered — re-copy or re-export it")
        yield blob


def read_token_ids(f: BinaryIO, header: ArtifactHeader) -> list[int]:
    """The token id section (int32 LE), SHA-256-checked against the header."""
    s = header.token_ids
    f.seek(header.data_offset + s.begin)
    raw = f.read(s.nbytes)
    if len(raw) != s.nbytes:
        raise ArtifactTruncatedError("the file ended inside the token id section; re-copy or re-export it")
    if hashlib.sha256(raw).hexdigest() != s.digest:
        raise ArtifactIntegrityError("token ids: sha256 does not match the header; the file was altered")
    return np.frombuffer(raw, dtype="<i4").tolist()
