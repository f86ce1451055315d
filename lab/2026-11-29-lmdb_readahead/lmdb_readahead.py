"""Cold LMDB reads of page-sized values with OS read-ahead off and on (`StoreConfig.lmdb_readahead`).

Writes `--values` random values of `--mib` MiB, then, alternating off/on for `--rounds` rounds,
evicts the file from the OS page cache (POSIX_FADV_DONTNEED) and reads every third value whole.

    python bench/lmdb_readahead.py --json
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import lmdb

from bench.common import drop_file_cache, environment, resident_fraction, write_report  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--values", type=int, default=120)
    ap.add_argument("--mib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/results/lmdb_readahead.json")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tkv-ra-") as d:
        env = lmdb.open(d, map_size=(a.values + 8) * a.mib << 20)
        written = hashlib.sha256()
        with env.begin(write=True) as txn:
            for i in range(a.values):
                value = os.urandom(a.mib << 20)
                written.update(value)
                txn.put(b"%06d" % i, value)
        env.close()
        data = Path(d) / "data.mdb"
        for rnd in range(a.rounds):
            for readahead in (False, True):
                method = drop_file_cache([data])
                resident = resident_fraction(data)
                env = lmdb.open(d, map_size=(a.values + 8) * a.mib << 20, readahead=readahead, readonly=True,
                                lock=False)
                read, total = hashlib.sha256(), 0
                t0 = time.perf_counter()
                with env.begin(buffers=True) as txn:
                    for i in range(0, a.values, 3):
                        value = bytes(txn.get(b"%06d" % i))
                        read.update(value)
                        total += len(value)
                seconds = time.perf_counter() - t0
                env.close()
                rows.append({"round": rnd, "readahead": readahead, "bytes": total, "seconds": seconds,
                             "mib_per_s": total / seconds / 2**20, "page_cache": method,
                             "resident_fraction_before": resident, "read_sha256": read.hexdigest()})
                print(rows[-1], file=sys.stderr)
    best = {ra: max(r["mib_per_s"] for r in rows if r["readahead"] == ra) for ra in (False, True)}
    write_report(a.out, {"bench": "lmdb_readahead", "environment": environment(), "config": vars(a),
                         "written_sha256": written.hexdigest(), "rows": rows,
                         "summary": {"best_mib_per_s_off": best[False], "best_mib_per_s_on": best[True],
                                     "ratio": best[True] / best[False]}}, print_json=a.json)
    print(f"\ncold reads of {a.mib} MiB values: read-ahead off {best[False]:.0f} MiB/s, on {best[True]:.0f} MiB/s "
          f"({best[True] / best[False]:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
