"""On-disk form of a PageIndex: one blob of faiss indexes plus a JSON sidecar.

    <path>        faiss.serialize_index of each (layer, head) index, concatenated in
                  layer-major order: (0,0) (0,1) ... (0,H-1) (1,0) ...
    <path>.json   {"format", "version", geometry, method, num_repr, num_pages,
                   "blob_sizes": [...], "sha256": hex of <path>, "byte_order"}

Each file is written atomically (temp file in the same directory, fsync, os.replace), blob
first. NOTE: a crash between the two replaces leaves a sidecar whose sha256 does not match
the blob; ``read_index_file`` then raises IndexStaleError and the caller rebuilds. That is
the intended recovery, so no lock or journal is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from safefiles import AtomicFile, open_regular, read_regular

from .errors import IndexStaleError

FORMAT = "tieredkv-page-index"
VERSION = 1
_MAX_SIDECAR_BYTES = 1 << 24  # bounded read; the sidecar holds L*H sizes, not data


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def write_index_file(path: str | os.PathLike, blobs: Sequence[np.ndarray],
                     meta: dict[str, Any]) -> None:
    """Write ``blobs`` (uint8 arrays) to ``path``; ``meta``, sizes and sha256 to the sidecar."""
    path = Path(path)
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path) as f:
        for blob in blobs:
            data = np.ascontiguousarray(blob, dtype=np.uint8).tobytes()
            digest.update(data)
            f.write(data)
    sidecar = {
        "format": FORMAT,
        "version": VERSION,
        **meta,
        "byte_order": sys.byteorder,
        "blob_sizes": [int(b.size) for b in blobs],
        "sha256": digest.hexdigest(),
    }
    with AtomicFile(sidecar_path(path)) as f:
        f.write(json.dumps(sidecar, indent=1, sort_keys=True).encode())


def read_index_file(path: str | os.PathLike) -> tuple[dict[str, Any], list[bytes]]:
    """Read and verify a saved index. Returns (sidecar dict, one bytes per faiss index).

    Raises IndexStaleError when either file is missing or unreadable, the sidecar is not
    ours, or the blob's size or sha256 does not match the sidecar.
    """
    path = Path(path)
    side = sidecar_path(path)
    try:
        meta = json.loads(read_regular(side, _MAX_SIDECAR_BYTES))
        if not isinstance(meta, dict):
            raise ValueError("sidecar is not a JSON object")
    except (OSError, ValueError) as e:
        raise _stale(path, f"cannot read sidecar {side}: {e}") from e
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise _stale(path, f"sidecar format {meta.get('format')!r} v{meta.get('version')!r} "
                           f"is not {FORMAT!r} v{VERSION}")
    if meta.get("byte_order") != sys.byteorder:
        raise _stale(path, f"saved on a {meta.get('byte_order')}-endian machine")
    sizes = meta.get("blob_sizes")
    if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes):
        raise _stale(path, "sidecar has no valid blob_sizes")

    digest = hashlib.sha256()
    chunks: list[bytes] = []
    try:
        with os.fdopen(open_regular(path), "rb") as f:
            for size in sizes:
                chunk = f.read(size)
                if len(chunk) != size:
                    raise _stale(path, "index file is shorter than its sidecar says")
                digest.update(chunk)
                chunks.append(chunk)
            if f.read(1):
                raise _stale(path, "index file is longer than its sidecar says")
    except OSError as e:
        raise _stale(path, f"cannot read index file: {e}") from e
    if digest.hexdigest() != meta.get("sha256"):
        raise _stale(path, "sha256 of the index file does not match its sidecar (corrupt or "
                           "torn write)")
    return meta, chunks


def _stale(path: Path, why: str) -> IndexStaleError:
    return IndexStaleError(f"page index at {path} is unusable: {why}; rebuild it from the page "
                           "store (new PageIndex, add() every stored page, save())")
