"""The two byte framings of the project, each defined once.

Prefixed records (pages `TKVP`, artifact files `TKVA`):

    | magic (4 bytes) | format version (u32 LE) | header length (u64 LE) | header | body |

Checksummed values (manifests in LMDB and on the remote tier):

    | sha256(data) as 64 lowercase hex ascii | data |

Headers and manifests are strict JSON (`strict_json`): no duplicate keys, no NaN or Infinity.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

PREFIX = struct.Struct("<4sIQ")  # magic, version, header_len
DIGEST_NBYTES = 64


def pack_prefix(magic: bytes, version: int, header_len: int) -> bytes:
    return PREFIX.pack(magic, version, header_len)


def unpack_prefix(buf, offset: int = 0) -> tuple[bytes, int, int]:
    """(magic, version, header_len) of the record at `offset`; the caller checks the length first."""
    return PREFIX.unpack_from(buf, offset)


def body_len(raw: bytes) -> int:
    """Body length implied by a record's prefix (clamped to the bytes present; exact for intact records)."""
    if len(raw) < PREFIX.size:
        return 0
    header_len = unpack_prefix(raw)[2]
    return max(0, len(raw) - PREFIX.size - min(header_len, len(raw)))


def seal_value(data: bytes) -> bytes:
    """`data` behind its SHA-256 hex digest."""
    return hashlib.sha256(data).hexdigest().encode("ascii") + bytes(data)


def open_value(raw: bytes) -> bytes | None:
    """The data of a sealed value, or None when its digest does not match (corrupt or truncated)."""
    digest, data = raw[:DIGEST_NBYTES], raw[DIGEST_NBYTES:]
    if len(raw) < DIGEST_NBYTES or hashlib.sha256(data).hexdigest().encode("ascii") != digest:
        return None
    return bytes(data)


def canonical_json(obj: Any) -> bytes:
    """The one byte form of a JSON value that hashes are taken over: sorted keys, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def strict_json(raw: bytes | str) -> Any:
    """json.loads that refuses duplicate keys and NaN/Infinity (ValueError, UnicodeDecodeError or
    RecursionError): a header that two readers could read two ways is not a header."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw).decode("utf-8")
    return json.loads(raw, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON true must never pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("duplicate keys in JSON")
    return d


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")
