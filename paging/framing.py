"""The two byte framings of the project, each defined once.

Prefixed records (pages `TKVP`, artifact files `TKVA`):

    | magic (4 bytes) | format version (u32 LE) | header length (u64 LE) | header | body |

Checksummed values (manifests in LMDB and on the remote tier):

    | sha256(data) as 64 lowercase hex ascii | data |
"""
from __future__ import annotations

import hashlib
import struct

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
