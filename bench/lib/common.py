"""Helpers the benchmarks share: hardware and versions, input hashes, timing, machine ceilings, output.

Environment, id hashing and the atomic JSON write live in `report.py` (one implementation); this
module re-exports them next to what timing-based benchmarks add: a synchronising timer, the
machine's measured memcpy and SHA-256 throughput, dropping a file from the OS page cache, and a
markdown table.

    from bench.lib.common import environment, timed, memcpy_bytes_per_s, write_report
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from bench.lib.report import environment, sha256_ids, write_report
from tieredkv.cli.common import positive_int
from tieredkv.engine.tiered_config import RETRIEVAL_MODES

__all__ = ["environment", "sha256_ids", "write_report", "sync_device", "timed", "best_of",
           "memcpy_bytes_per_s", "sha256_bytes_per_s", "drop_file_cache", "resident_fraction",
           "markdown_table", "fmt_bytes", "add_retrieval_args", "retrieval_kwargs"]


def sync_device() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """`with timed() as t: ...` then `t["s"]`: wall seconds, the device synchronised at both ends."""
    t: dict[str, float] = {}
    sync_device()
    start = time.perf_counter()
    try:
        yield t
    finally:
        sync_device()
        t["s"] = time.perf_counter() - start


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """Minimum wall seconds of `repeats` calls of `fn` (after the first call has warmed it up)."""
    times = []
    for _ in range(repeats):
        with timed() as t:
            fn()
        times.append(t["s"])
    return min(times)


def memcpy_bytes_per_s(nbytes: int = 1 << 30, repeats: int = 3, *, preallocated: bool = False) -> float:
    """Host memory copy throughput, bytes per second, over `nbytes` bytes.

    Default: `Tensor.clone()` (allocate + copy, as a restore into a fresh cache does; the new
    pages fault in). `preallocated=True`: `dst.copy_(src)` into a buffer already touched.
    """
    src = torch.ones(nbytes, dtype=torch.uint8)
    if preallocated:
        dst = torch.zeros_like(src)
        s = best_of(lambda: dst.copy_(src), repeats)
    else:
        src.clone()
        s = best_of(src.clone, repeats)
    return nbytes / s


def sha256_bytes_per_s(nbytes: int = 256 << 20, repeats: int = 2) -> float:
    """Single-stream hashlib SHA-256 throughput over a `nbytes` buffer."""
    buf = os.urandom(1 << 20) * (nbytes >> 20)
    s = best_of(lambda: hashlib.sha256(buf).digest(), repeats)
    return nbytes / s


def drop_file_cache(paths: Sequence[str | os.PathLike]) -> str:
    """Evict files from the OS page cache (fsync, then POSIX_FADV_DONTNEED): no root, only these files.

    Returns the method used, or why it could not be done. Check with `resident_fraction`.
    """
    if not hasattr(os, "posix_fadvise"):
        return "unavailable: no posix_fadvise on this platform"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(POSIX_FADV_DONTNEED) per file"


def resident_fraction(path: str | os.PathLike) -> float | None:
    """Share of `path`'s pages in the OS page cache (util-linux `fincore`), or None if unknown."""
    exe = shutil.which("fincore")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
        res, size = int(out[0]), int(out[1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None
    return res / size if size else 0.0


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """`columns` = (header, key, format spec); a missing or None value prints as '-'."""
    head = "| " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for r in rows:
        cells = []
        for _, key, spec in columns:
            v = r.get(key)
            cells.append("-" if v is None else format(v, spec))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_retrieval_args(ap) -> None:
    """`--retrieval` and `--union-pages` (TieredConfig.retrieval and .union_pages); `retrieval_kwargs` reads them."""
    ap.add_argument("--retrieval", choices=RETRIEVAL_MODES, default="union",
                    help="TieredConfig.retrieval: the union of the KV heads' top-k, or per_head: each head its own "
                         "(a working set of fixed size)")
    ap.add_argument("--union-pages", type=positive_int, default=None,
                    help="TieredConfig.union_pages: cap the union of the KV heads' top-k at this many pages, "
                         "filled by rank")


def retrieval_kwargs(ap, a) -> dict[str, Any]:
    """TieredConfig's retrieval fields from `add_retrieval_args`' flags; a cap without the union is a usage error."""
    if a.union_pages is not None and a.retrieval != "union":
        ap.error("--union-pages caps --retrieval union only")
    return {"retrieval": a.retrieval, "union_pages": a.union_pages}


BM25_PAGES = 6  # the bm25 baseline's pages (bench/longdoc_qa.py, bench/ruler.py)


def bm25_pages(codec, doc_ids: Sequence[int], question: str, page_size: int, k: int = BM25_PAGES) -> list[int]:
    """The bm25 baseline's choice: the document's top-k pages by BM25 of the question, in document order."""
    from index.lexical import bm25_scores

    pages = [doc_ids[i:i + page_size] for i in range(0, len(doc_ids), page_size)]
    scores = bm25_scores([codec.decode(list(p)) for p in pages], question)
    return sorted(sorted(range(len(pages)), key=lambda i: (-scores[i], i))[:k])
