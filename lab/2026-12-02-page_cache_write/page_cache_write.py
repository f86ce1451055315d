"""What a first write into the page cache costs, by write size: the diagnostic behind `_extend_file`.

LMDB commits a run of pages with one writev of several MB. On Linux 6.x ext4 caches such a write in
2 MB folios; on a VM that reports free memory to its host (free-page reporting, as under Firecracker),
a 2 MB folio is a host fault to fill the first time. Each row writes the same bytes into a new file
(interleaved repeats, medians; a pause before each so that freed memory is reported again):

    pieces of 64 KB / 1 MB / 2 MB / 6 MB     pwrite of fresh bytes at the end of a new file
    extend in 1 MB, then 6 MB writes         what paging/lmdb_tier.py does: zeros past the end of the
                                             file in 1 MB pieces, then the 6 MB writes over them
                                             (the time of both counted)

    python bench/page_cache_write.py --json
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import environment, write_report  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "page_cache_write.json"
VALUE = 6 << 20  # one smollm2 page of 128 tokens is 5.9 MB


def write_file(path: str, data: bytes, piece: int, extend_first: bool) -> float:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start = time.perf_counter()
        if extend_first:
            zeros = memoryview(bytes(1 << 20))
            for off in range(0, len(data), 1 << 20):
                os.pwrite(fd, zeros[:min(1 << 20, len(data) - off)], off)
        view = memoryview(data)
        for off in range(0, len(data), piece):
            os.pwrite(fd, view[off:off + piece], off)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=180, help="bytes written per measurement, MiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pause-s", type=float, default=3.0, help="sleep before each write (free memory is reported)")
    p.add_argument("--dir", default=None, help="directory on the disk to test (default: the system temp dir)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.mib < 1 or args.repeats < 1 or args.pause_s < 0:
        p.error("--mib and --repeats must be >= 1, --pause-s >= 0")
    data = os.urandom(args.mib << 20)
    cases = {"pieces of 64 KB": (64 << 10, False), "pieces of 1 MB": (1 << 20, False),
             "pieces of 2 MB": (2 << 20, False), "pieces of 6 MB": (VALUE, False),
             "extend in 1 MB, then 6 MB writes": (VALUE, True)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="bench-pagecache-", dir=args.dir) as tmp:
        for r in range(args.repeats):
            for name, (piece, extend) in cases.items():
                time.sleep(args.pause_s)
                times[name].append(write_file(f"{tmp}/f", data, piece, extend))
                print(f"# repeat {r + 1}: {name}: {args.mib / times[name][-1]:.0f} MiB/s", file=sys.stderr)
        fs = os.statvfs(tmp)
    rows = [{"case": name, "mib_per_s": args.mib / statistics.median(t), "seconds_all": t} for name, t in times.items()]
    report = {"bench": "page_cache_write", "hardware": environment(), "kernel": os.uname().release,
              "config": {"mib": args.mib, "repeats": args.repeats, "pause_s": args.pause_s,
                         "filesystem_block_size": fs.f_bsize},
              "inputs": {"data_sha256": hashlib.sha256(data).hexdigest()}, "rows": rows}
    write_report(args.out, report, print_json=args.json)
    for row in rows:
        print(f"{row['case']:<36} {row['mib_per_s']:8.0f} MiB/s", file=sys.stderr if args.json else sys.stdout)


if __name__ == "__main__":
    main()
