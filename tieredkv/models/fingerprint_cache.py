"""Fingerprints of local model directories, cached by file identity so that a load does not hash every
weight again (hashing runs at about 650 MiB/s: some 21 s for a 7B model in bf16).

One entry per directory and dtype, `$TIEREDKV_CACHE/fingerprints/<sha256(path, dtype)[:32]>.json`, records
the directory's real path, the dtype, the versions of the libraries that decide what its files load as,
and for every file under it (symlinked files followed, as transformers follows them; a symlinked directory
counted by its own identity; tieredkv's own `tieredkv-*` files left out) its relative path, size, mtime_ns,
ctime_ns and inode. A load takes the fingerprint from the entry only when every one of those matches what
the directory holds both before and after the weights are read (tieredkv/models/loading.py; a file changed
during the load is hashed from memory and not recorded). Anything else (a file touched, rewritten, added,
removed or renamed; another library version; an entry that is damaged, unreadable, hand-edited or of
another format) hashes the loaded weights again and rewrites the entry atomically. A cache that cannot be
written only costs the hashing.

NOTE: identity is metadata, not content, as with `make`: someone who can rewrite a file while keeping its
size, mtime, ctime and inode (by resetting the clock or editing the filesystem underneath), or who can
write the cache directory and recompute an entry's digest, can make a stale fingerprint be trusted. The
embedded model's converted copy does not rely on this cache: it is checked against the SHA-256 manifest
of its files on every load.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safefiles import AtomicFile

FORMAT = 1  # NOTE: bump together with the fingerprint's own scheme (tieredkv-fingerprint-v1)
_OWN_PREFIX = "tieredkv-"
_HEX64 = re.compile(r"[0-9a-f]{64}")
Identity = dict[str, list[int]]


def directory_identity(directory: Path) -> Identity:
    """Relative path -> [size, mtime_ns, ctime_ns, inode] of every file under `directory` ([] for an entry
    that cannot be read as a file: a dangling symlink, a socket)."""
    files: Identity = {}
    for root, dirs, names in os.walk(directory):
        rel_root = Path(root).relative_to(directory)
        if rel_root == Path("."):
            dirs[:] = [d for d in dirs if not d.startswith(_OWN_PREFIX)]
            names = [n for n in names if not n.startswith(_OWN_PREFIX)]
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            files[(rel_root / name).as_posix()] = _identity(os.path.join(root, name))
    return dict(sorted(files.items()))


def _identity(path: str) -> list[int]:
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def entry_key(directory: Path, dtype: str, files: Identity) -> dict[str, Any]:
    """Everything a cached fingerprint is valid for."""
    import safetensors
    import tokenizers
    import torch
    import transformers

    versions = {"safetensors": safetensors.__version__, "tokenizers": tokenizers.__version__,
                "torch": torch.__version__, "transformers": transformers.__version__}
    return {"format": FORMAT, "directory": str(directory.resolve()), "dtype": dtype, "versions": versions,
            "files": files}


def entry_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    name = hashlib.sha256(f"{key['directory']}\0{key['dtype']}".encode()).hexdigest()[:32]
    return cache_dir / "fingerprints" / f"{name}.json"


def cached_fingerprint(cache_dir: Path, key: dict[str, Any], compute: Callable[[], str]) -> str:
    """The fingerprint recorded for exactly `key`, else `compute()`, recorded for next time."""
    path = entry_path(cache_dir, key)
    recorded = _read_entry(path)
    if recorded is not None and {k: recorded.get(k) for k in key} == key:
        return recorded["fingerprint"]
    fingerprint = compute()
    _write_entry(path, {**key, "fingerprint": fingerprint})
    return fingerprint


def _digest(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "entry_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_entry(path: Path) -> dict[str, Any] | None:
    """The entry at `path` if it is whole and consistent, else None (so the caller recomputes)."""
    try:
        entry = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not (isinstance(entry, dict) and isinstance(entry.get("fingerprint"), str)
            and _HEX64.fullmatch(entry["fingerprint"]) and entry.get("entry_sha256") == _digest(entry)):
        return None
    return entry


def _write_entry(path: Path, entry: dict[str, Any]) -> None:
    entry = {**entry, "entry_sha256": _digest(entry)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with AtomicFile(path) as f:
            f.write(json.dumps(entry, sort_keys=True, indent=1).encode() + b"\n")
    except OSError:  # NOTE: a read-only or full cache still loads; the fingerprint is just hashed each time
        pass
