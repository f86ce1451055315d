"""Does a verified restore's time go to page faults? `restore_pages()` from LMDB, three ways, interleaved:

    fresh map         a store opened just before: this process has not touched its LMDB map yet, so
                      every page of the values faults in (minor faults: the file is in the page cache)
    mapped            the same store after one untimed restore: the map already faulted in
    page cache dropped  a store opened after data.mdb was evicted from the OS page cache
                      (posix_fadvise DONTNEED): the values are read from disk (major faults)

Faults are counted with getrusage over the whole process (the restore's worker threads included), and
each restore's bytes are hashed: every restore must give the same K/V as the deposit put in (output
hash). The host tier is empty in every case (budget 0), so every page is read from LMDB and verified.

    python bench/restore_faults.py --json          # smollm2, 4,096 tokens, 8 repeats
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import drop_file_cache, environment, markdown_table, resident_fraction, sha256_ids, timed, \
    write_report  # noqa: E402

from paging import PageLayout, PageStore, StoreConfig  # noqa: E402
from paging.restore import restore_nbytes, restore_pages  # noqa: E402
from tieredkv.artifacts.artifact import deposit  # noqa: E402
from tieredkv.question.corpus import python_reference, text_sha256  # noqa: E402
from tieredkv.provenance.domain import sha256_tensor  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "restore_faults.json"
CASES = ("fresh_map", "mapped", "page_cache_dropped")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=4096, help="context length N")
    p.add_argument("--repeats", type=int, default=8, help="interleaved repeats of each case")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="restore threads")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--json", action="store_true", help="also print the JSON report on stdout")
    a = p.parse_args()
    for flag in ("tokens", "repeats", "workers"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1")
    return a


def faults() -> tuple[int, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_majflt


def one_restore(path: str, keys: list[str], buffer: torch.Tensor, workers: int, case: str) -> dict:
    """Seconds, faults and the restored bytes' SHA-256 of one restore in `case`."""
    if case == "page_cache_dropped":
        drop_file_cache([f"{path}/data.mdb"])
    resident = resident_fraction(f"{path}/data.mdb")
    store = PageStore(path, StoreConfig(host_budget_bytes=0, lmdb_map_size=4 << 30))
    try:
        if case == "mapped":
            restore_pages(store, keys, buffer=buffer, workers=workers)  # untimed: the map faulted in
        minor, major = faults()
        with timed() as t:
            restored = restore_pages(store, keys, buffer=buffer, workers=workers)
        minor2, major2 = faults()
        assert restored.stats.verified_pages == len(keys), restored.stats
        del restored
    finally:
        store.close()
    return {"seconds": t["s"], "minor_faults": minor2 - minor, "major_faults": major2 - major,
            "resident_before": resident, "restored_sha256": sha256_tensor(buffer)}


def main() -> None:
    args = parse_args()
    env = environment()
    load_start = os.getloadavg()
    started = time.perf_counter()
    lm = load_model(args.model)
    ids = (lm.codec.encode(python_reference()) * 4)[:args.tokens]
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory(prefix="bench-faults-", dir=os.environ.get("TMPDIR")) as tmp:
        path = f"{tmp}/store"
        with PageStore(path, StoreConfig(host_budget_bytes=0, lmdb_map_size=4 << 30)) as store:
            art = deposit(lm, ids, store, page_size=lm.default_page_size)
        keys = list(art.page_keys)
        kv_bytes = restore_nbytes(art.num_tokens, PageLayout.from_dict(art.layout))
        buffer = torch.zeros(kv_bytes, dtype=torch.uint8)  # reused by every restore, touched once
        one_restore(path, keys, buffer, args.workers, "mapped")  # warm-up, not kept
        for r in range(args.repeats):
            order = CASES if r % 2 == 0 else CASES[::-1]  # NOTE: alternate, so no case always runs first
            print(f"# repeat {r + 1}/{args.repeats} ...", file=sys.stderr)
            for case in order:
                runs[case].append(one_restore(path, keys, buffer, args.workers, case))
    hashes = {x["restored_sha256"] for v in runs.values() for x in v}
    assert len(hashes) == 1, f"restores gave different bytes: {sorted(hashes)}"
    base = statistics.median(x["seconds"] for x in runs["mapped"])
    rows = []
    for case in CASES:
        med = lambda k: statistics.median(x[k] for x in runs[case])  # noqa: E731
        rows.append({"case": case, "median_ms": 1e3 * med("seconds"), "gb_s": kv_bytes / med("seconds") / 1e9,
                     "vs_mapped": med("seconds") / base, "minor_faults": med("minor_faults"),
                     "major_faults": med("major_faults"),
                     "resident_before": None if runs[case][0]["resident_before"] is None else med("resident_before"),
                     "runs": runs[case]})
    report = {
        "bench": "restore_faults", "hardware": env,
        "config": {"model": args.model, "tokens": args.tokens, "page_size": lm.default_page_size, "pages": len(keys),
                   "repeats": args.repeats, "workers": args.workers, "kv_bytes": kv_bytes,
                   "torch_threads": torch.get_num_threads(), "drop_method": drop_file_cache.__doc__.split("\n")[0],
                   "method": "each repeat runs the three cases once, the order reversed every other repeat; "
                             "medians; faults from getrusage(RUSAGE_SELF) around restore_pages alone"},
        "model_fingerprint": lm.fingerprint,
        "inputs": {"corpus": "python_reference()", "corpus_sha256": text_sha256(python_reference()),
                   "token_ids_sha256": sha256_ids(ids), "artifact": art.artifact_id, "root_sha256": art.root_sha256},
        "outputs": {"restored_kv_sha256": hashes.pop()}, "rows": rows, "seconds": round(time.perf_counter() - started, 1),
        "load_average_1_5_15": {"start": load_start, "end": os.getloadavg()},
    }
    write_report(args.out, report, print_json=args.json)
    out = sys.stderr if args.json else sys.stdout
    print(f"# {env['cpu']}, {env['cores']} cores, load {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{args.model}, {args.tokens} tokens, {kv_bytes / 2**20:.0f} MiB of KV in {len(keys)} pages", file=out)
    print(markdown_table(rows, [("case", "case", "s"), ("median ms", "median_ms", ".1f"), ("GB/s", "gb_s", ".2f"),
                                ("/ mapped", "vs_mapped", ".2f"), ("minor faults", "minor_faults", ".0f"),
                                ("major faults", "major_faults", ".0f"),
                                ("resident before", "resident_before", ".2f")]), file=out)
    print(f"# JSON: {args.out}", file=out)


if __name__ == "__main__":
    main()
