"""The page: an immutable, self-verifying block of post-rotary K/V for `T` tokens.

Identity is a hash chain (nano-vllm / vLLM style)::

    key_i = sha256( fingerprint[32] | key_{i-1}[32] | start:int64 LE | T:uint32 LE
                    | token_ids:int32 LE * T )            key_{-1} = ROOT_KEY

Payload (raw little-endian, no padding)::

    +---------------------+---------------------+-----+-------------------------+
    | K_0 [Hkv, T, D]     | V_0 [Hkv, T, D]     | ... | K_{L-1} | V_{L-1}       |
    +---------------------+---------------------+-----+-------------------------+

Wire framing (`to_bytes` / `from_bytes`)::

    b"TKVP" | version:uint32 LE | header_len:uint64 LE | header JSON | payload

The header is canonical JSON (sorted keys, compact, ASCII) of every field but the payload,
plus `header_sha256` = sha256 of the canonical JSON of the other header fields.
NOTE: the key binds fingerprint, parent, start and tokens and `payload_blake3` binds the
payload, but nothing else binds the layout; `header_sha256` closes that gap so that any
changed header byte is detected.

Digests: SHA-256 names things (page keys, the chain, headers); the payload's checksum is BLAKE3
(`payload_digest`), several times faster per core on megabyte payloads (bench/digest.py), so a
verified restore is not bound by hashing. Version 1 pages carried `payload_sha256` instead: this
build reads one as corrupt (never served), and refuses a version 1 store or file at open.
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import blake3
import numpy as np
import torch

from .errors import CorruptPageError, LayoutMismatchError, PagingError
from .framing import PREFIX, canonical_json, is_int, pack_prefix, strict_json, unpack_prefix
from .layout import PageLayout

FORMAT_VERSION = 2
LEGACY_FORMAT_VERSIONS = frozenset({1})  # payload_sha256: refused, never misread
ROOT_KEY = "0" * 64
MAGIC = b"TKVP"
MAX_HEADER_NBYTES = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_HEADER_FIELDS = frozenset(
    {"key", "parent_key", "fingerprint", "start", "token_ids", "layout", "payload_blake3",
     "header_sha256"}
)


def format_note(version: bytes | int) -> str:
    """Why a stored format version is not this build's, in a few words (for refusals)."""
    legacy = str(version.decode() if isinstance(version, bytes) else version) in map(str, LEGACY_FORMAT_VERSIONS)
    return "its payload digests are SHA-256, this build's are BLAKE3" if legacy else "an unknown format"


def payload_digest(data: bytes | bytearray | memoryview) -> str:
    """The checksum of a page payload: BLAKE3, 64 hex characters, one thread (callers hash pages in parallel)."""
    return blake3.blake3(data).hexdigest()


def _check_hex64(name: str, value: Any) -> str:
    if not isinstance(value, str) or _HEX64.fullmatch(value) is None:
        raise PagingError(f"{name} must be 64 lowercase hex characters (a sha256 hexdigest), "
                          f"got {value!r}")
    return value


def check_little_endian() -> None:
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise PagingError("page payloads are little-endian; this host is big-endian, "
                          "which paging does not support")


def page_key(fingerprint: str, parent_key: str, token_ids: Sequence[int], start: int) -> str:
    """Chain hash of a page (see module docstring). Deterministic across machines."""
    _check_hex64("fingerprint", fingerprint)
    _check_hex64("parent_key", parent_key)
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not (
        0 <= start < (1 << 63)
    ):
        raise PagingError(f"start must be a non-negative int64, got {start!r}")
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < _INT32_MIN or ids.max() > _INT32_MAX):
        raise PagingError("token ids must fit in int32")
    h = hashlib.sha256()
    h.update(bytes.fromhex(fingerprint))
    h.update(bytes.fromhex(parent_key))
    h.update(struct.pack("<qI", int(start), ids.size))
    h.update(ids.astype("<i4").tobytes())
    return h.hexdigest()


def _header_digest(fields: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the header fields (without `header_sha256`)."""
    return hashlib.sha256(canonical_json(fields)).hexdigest()


@dataclass(frozen=True)
class PageHeader:
    """Every field of a page but its payload: what a reader needs to place and check the bytes."""

    key: str
    parent_key: str
    fingerprint: str
    start: int
    token_ids: tuple[int, ...]
    layout: PageLayout
    payload_blake3: str

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Page(PageHeader):
    """An immutable page: its header's fields and the payload. Build it with `Page.seal` or
    `Page.from_bytes`, not directly."""

    payload: bytes = field(repr=False)

    def __post_init__(self) -> None:
        # NOTE: structural checks only; hashes are verified by `from_bytes`.
        for name in ("key", "parent_key", "fingerprint", "payload_blake3"):
            _check_hex64(name, getattr(self, name))
        if not 1 <= len(self.token_ids) <= self.layout.page_size:
            raise LayoutMismatchError(
                f"a page holds 1..{self.layout.page_size} tokens, got {len(self.token_ids)}")
        if len(self.payload) != self.layout.payload_nbytes(len(self.token_ids)):
            raise LayoutMismatchError(
                f"payload is {len(self.payload)} bytes; layout expects "
                f"{self.layout.payload_nbytes(len(self.token_ids))}")

    @classmethod
    def seal(cls, layout: PageLayout, fingerprint: str, parent_key: str, start: int,
             token_ids: Sequence[int], keys: Sequence[torch.Tensor],
             values: Sequence[torch.Tensor]) -> "Page":
        """Copy K/V of every layer to immutable bytes, hash them and derive the key.

        keys[l], values[l]: [Hkv, T, D] (or [1, Hkv, T, D]) of `layout.torch_dtype`.
        """
        check_little_endian()
        ids = tuple(int(t) for t in token_ids)
        num_tokens = len(ids)
        if not 1 <= num_tokens <= layout.page_size:
            raise LayoutMismatchError(
                f"a page holds 1..{layout.page_size} tokens, got {num_tokens}")
        if len(keys) != layout.num_layers or len(values) != layout.num_layers:
            raise LayoutMismatchError(
                f"expected K and V for {layout.num_layers} layers, got "
                f"{len(keys)} and {len(values)}")
        want = (layout.num_kv_heads, num_tokens, layout.head_dim)
        parts: list = []  # NOTE: uint8 numpy views, joined once below (one copy of the K/V, not two)
        for layer in range(layout.num_layers):
            for name, t in (("keys", keys[layer]), ("values", values[layer])):
                if t.dim() == 4 and t.shape[0] == 1:
                    t = t[0]  # [1, Hkv, T, D] -> [Hkv, T, D]
                if tuple(t.shape) != want or t.dtype != layout.torch_dtype:
                    raise LayoutMismatchError(
                        f"{name}[{layer}] is {tuple(t.shape)} {t.dtype}; layout expects "
                        f"{want} {layout.torch_dtype}")
                t = t.detach().to("cpu").contiguous()
                parts.append(t.view(torch.uint8).numpy())  # bf16-safe
        payload = b"".join(parts)
        key = page_key(fingerprint, parent_key, ids, start)
        return cls(key=key, parent_key=parent_key, fingerprint=fingerprint, start=int(start),
                   token_ids=ids, layout=layout,
                   payload_blake3=payload_digest(payload), payload=payload)

    @property
    def nbytes(self) -> int:
        return len(self.payload)

    def _tensors(self, offset: int, num_layers: int,
                 device: torch.device | str | None) -> torch.Tensor:
        """Fresh tensor [num_layers, 2, Hkv, T, D] copied from payload[offset:]."""
        check_little_endian()
        lay, t = self.layout, self.num_tokens
        n = num_layers * lay.layer_nbytes(t)
        # NOTE: copy only the needed slice into a writable buffer; frombuffer on the
        # immutable payload would alias read-only memory (and warn).
        buf = bytearray(memoryview(self.payload)[offset:offset + n])
        out = torch.frombuffer(buf, dtype=lay.torch_dtype).view(
            num_layers, 2, lay.num_kv_heads, t, lay.head_dim)
        if device is not None and torch.device(device).type != "cpu":
            out = out.to(device)
        return out

    def layer_kv(self, layer: int, device: torch.device | str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of one layer: each [Hkv, T, D] in the layout dtype (a fresh copy)."""
        if not 0 <= layer < self.layout.num_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.layout.num_layers - 1}")
        kv = self._tensors(layer * self.layout.layer_nbytes(self.num_tokens), 1, device)
        return kv[0, 0], kv[0, 1]

    def kv_tensor(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Every layer's K and V as one fresh tensor [num_layers, 2, Hkv, T, D]."""
        return self._tensors(0, self.layout.num_layers, device)

    def kv(self, device: torch.device | str | None = None
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(K, V) of every layer, each [Hkv, T, D] (fresh copies, one per page)."""
        kv = self.kv_tensor(device)
        return [(kv[i, 0], kv[i, 1]) for i in range(self.layout.num_layers)]

    def _header_fields(self) -> dict[str, Any]:
        return {"key": self.key, "parent_key": self.parent_key,
                "fingerprint": self.fingerprint, "start": self.start,
                "token_ids": list(self.token_ids), "layout": self.layout.to_dict(),
                "payload_blake3": self.payload_blake3}

    def to_bytes(self) -> bytes:
        """Self-describing wire form (see module docstring)."""
        fields = self._header_fields()
        fields["header_sha256"] = _header_digest(self._header_fields())
        header = canonical_json(fields)
        return pack_prefix(MAGIC, FORMAT_VERSION, len(header)) + header + self.payload

    @classmethod
    def from_bytes(cls, buf: bytes | bytearray | memoryview, *,
                   expected_key: str | None = None) -> "Page":
        """Parse and fully verify a page; any failure raises CorruptPageError.

        NOTE: every length read from `buf` is checked against len(buf) before use, so
        a hostile header cannot make us allocate.
        """
        header, payload = cls.open_bytes(buf, expected_key=expected_key)
        if payload_digest(payload) != header.payload_blake3:
            raise CorruptPageError(expected_key, "payload_blake3 mismatch: the payload was altered")
        return cls(**vars(header), payload=bytes(payload))

    @staticmethod
    def open_bytes(buf: bytes | bytearray | memoryview, *,
                   expected_key: str | None = None) -> tuple[PageHeader, memoryview]:
        """Parse and check a page's framing and header, without hashing its payload.

        Returns the header and a zero-copy view of the payload. NOTE: the payload is NOT verified
        yet: check payload_digest(payload) == header.payload_blake3 before the bytes are used (`from_bytes`
        does; restore.py hashes each page before it copies it). Any other failure raises CorruptPageError.
        """
        try:
            return _parse(memoryview(buf).cast("B"), expected_key)
        except CorruptPageError:
            raise
        except (PagingError, ValueError, TypeError, RecursionError, struct.error) as exc:
            raise CorruptPageError(expected_key, f"{type(exc).__name__}: {exc}") from None

    @property
    def header(self) -> PageHeader:
        return PageHeader(**{f.name: getattr(self, f.name) for f in fields(PageHeader)})


def _parse(mv: memoryview, expected_key: str | None) -> tuple[PageHeader, memoryview]:
    def corrupt_page(reason: str) -> CorruptPageError:
        return CorruptPageError(expected_key, reason)

    if len(mv) < PREFIX.size:
        raise corrupt_page(f"truncated: {len(mv)} bytes, the fixed prefix alone is {PREFIX.size}")
    magic, version, header_len = unpack_prefix(mv)
    if magic != MAGIC:
        raise corrupt_page(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version in LEGACY_FORMAT_VERSIONS:
        raise corrupt_page(f"page format version {version} (SHA-256 payload digests); this build reads version "
                           f"{FORMAT_VERSION}: re-deposit its text with this build")
    if version != FORMAT_VERSION:
        raise corrupt_page(f"page format version {version}; this build reads version {FORMAT_VERSION}")
    if header_len > MAX_HEADER_NBYTES:
        raise corrupt_page(f"header_len {header_len} exceeds the {MAX_HEADER_NBYTES}-byte cap")
    if header_len > len(mv) - PREFIX.size:
        raise corrupt_page(f"truncated: header_len {header_len} but only "
                  f"{len(mv) - PREFIX.size} bytes follow the prefix")
    raw = bytes(mv[PREFIX.size:PREFIX.size + header_len])
    try:
        hdr = strict_json(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise corrupt_page(f"header is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(hdr, dict) or set(hdr) != _HEADER_FIELDS:
        got = sorted(hdr) if isinstance(hdr, dict) else type(hdr).__name__
        raise corrupt_page(f"header must be an object with fields {sorted(_HEADER_FIELDS)}, got {got}")
    if canonical_json(hdr) != raw:
        raise corrupt_page("header is not in canonical form")
    for name in ("key", "parent_key", "fingerprint", "payload_blake3", "header_sha256"):
        _check_hex64(name, hdr[name])
    ids = hdr["token_ids"]
    # NOTE: json gives int, bool, float, ... exactly (never a subclass); type() is bool-safe and C-speed
    if not isinstance(ids, list) or not set(map(type, ids)) <= {int} or \
            (ids and (min(ids) < _INT32_MIN or max(ids) > _INT32_MAX)):
        raise corrupt_page("token_ids must be a list of int32")
    if not is_int(hdr["start"]):
        raise corrupt_page("start must be an int")
    header_sha = hdr.pop("header_sha256")
    if _header_digest(hdr) != header_sha:
        raise corrupt_page("header_sha256 mismatch: the header was altered")
    try:
        layout = PageLayout.from_dict(hdr["layout"])
    except LayoutMismatchError as exc:
        raise corrupt_page(f"bad layout: {exc}") from None
    if not 1 <= len(ids) <= layout.page_size:
        raise corrupt_page(f"{len(ids)} tokens; a page holds 1..{layout.page_size}")
    payload = mv[PREFIX.size + header_len:]
    want = layout.payload_nbytes(len(ids))
    if len(payload) != want:
        raise corrupt_page(f"payload is {len(payload)} bytes; layout expects {want}")
    key = page_key(hdr["fingerprint"], hdr["parent_key"], ids, hdr["start"])
    if key != hdr["key"]:
        raise corrupt_page(f"key mismatch: header says {hdr['key']}, contents hash to {key}")
    if expected_key is not None and key != expected_key:
        raise corrupt_page(f"stored under {expected_key} but the page is {key}")
    # the payload's digest is checked by the caller (from_bytes, or restore.py before copying)
    return PageHeader(key, hdr["parent_key"], hdr["fingerprint"], hdr["start"], tuple(ids), layout,
                      hdr["payload_blake3"]), payload


def is_valid_page(raw: bytes | memoryview, key: str) -> bool:
    """Whether `raw` parses and verifies as the page stored under `key`."""
    try:
        Page.from_bytes(raw, expected_key=key)
        return True
    except CorruptPageError:
        return False
