"""Payload digests against a memory copy, over real page payloads, side by side in one run.

The payloads are the K/V pages of a deposit (smollm2, its 128-token pages: 5.9 MB each). Each repeat
times every method once, in a rotated order, so a busy neighbour slows them alike:

    sha256            hashlib.sha256, page by page, one thread
    sha256_pool       the same, one page per task on a pool of one thread per core
    blake3            blake3, page by page, one thread
    blake3_auto       blake3(max_threads=AUTO): its own threads inside each page
    blake3_pool       blake3 one thread per page, on the pool
    memcpy            np.copyto of every page into a preallocated, touched buffer, one thread
    memcpy_torch      torch Tensor.copy_ of the same, page by page, torch on one thread
    memcpy_pool       np.copyto, one page per task on the pool
    <digest>_copy_pool  digest a page, then copy it (what a verified restore does), on the pool

    python -m bench.digest                  # table; JSON to bench/results/digest.json

The report's `tieredkv recheck` recipe (`--recheck-only`) deposits the same pages and runs every method
once, nothing timed: the token ids, the root page key and the pages' count and sizes must hash equal on any
machine, the payloads and their SHA-256 and BLAKE3 digests hash-equal in the same determinism domain, and
every method must give what its one-thread reference gives (the same digests, the same bytes copied) anywhere.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import blake3
import numpy as np
import torch

from bench.lib.common import environment, markdown_table, sha256_ids, write_report
from bench.lib.report import print_recheck, recheck_block, sha256_json
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain
from tieredkv.question.corpus import python_reference

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "digest.json"
BASELINE = "sha256"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=3072, help="tokens deposited (their pages are the payloads)")
    p.add_argument("--page-size", type=int, default=None, help="tokens per page (default: the model's)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--threads", type=int, help="torch threads of the deposit (recorded in the recipe); the methods "
                                               "run torch on one")
    p.add_argument("--recheck-only", action="store_true",
                   help="deposit the pages and run every method once, untimed, and print {outputs, inputs, "
                        "relations, domain} without writing (`tieredkv recheck`)")
    return p.parse_args(argv)


def real_payloads(model: str, num_tokens: int, page_size: int | None) -> tuple[list[bytes], dict, dict]:
    """Payloads of the pages a deposit of `num_tokens` corpus tokens writes, what identifies them, and the
    deposit's determinism domain."""
    lm = load_model(model)
    page_size = page_size or lm.default_page_size
    ids = lm.codec.encode(python_reference())[:num_tokens]
    with tempfile.TemporaryDirectory(prefix="bench-digest-") as tmp:
        store = PageStore(tmp + "/store", StoreConfig(host_budget_bytes=1 << 30, lmdb_map_size=2 << 30))
        try:
            art = deposit(lm, ids, store, page_size=page_size)
            payloads = [store.get(k).payload for k in art.page_keys]
        finally:
            store.close()
    nbytes = sum(map(len, payloads))
    return payloads, {"model": model, "model_fingerprint": lm.fingerprint, "token_ids_sha256": sha256_ids(ids),
                      "num_tokens": len(ids), "page_size": page_size, "root_sha256": art.root_sha256,
                      "num_pages": len(payloads), "page_nbytes": len(payloads[0]), "nbytes": nbytes,
                      "payloads_sha256": hashlib.sha256(b"".join(payloads)).hexdigest()
                      }, determinism_domain(lm.model, lm.fingerprint, page_size)


def methods(payloads: list[bytes], pool: ThreadPoolExecutor) -> dict[str, Callable[[], object]]:
    """Every method as a call that processes all payloads once; digests return their hex list."""
    srcs = [np.frombuffer(p, dtype=np.uint8) for p in payloads]
    dst = np.ones(sum(len(p) for p in payloads), dtype=np.uint8)  # touched: no page faults in the timing
    at = np.cumsum([0, *map(len, payloads)]).tolist()
    dsts = [dst[a:b] for a, b in zip(at, at[1:])]
    t_srcs, t_dsts = [torch.from_numpy(s.copy()) for s in srcs], [torch.from_numpy(d) for d in dsts]

    def sha(p):
        return hashlib.sha256(p).hexdigest()

    def b3(p):
        return blake3.blake3(p).hexdigest()

    def b3_auto(p):
        return blake3.blake3(p, max_threads=blake3.blake3.AUTO).hexdigest()

    def copy(i):
        np.copyto(dsts[i], srcs[i])

    def then_copy(digest):
        return lambda i: (digest(payloads[i]), copy(i))[0]

    idx = range(len(payloads))
    return {"sha256": lambda: list(map(sha, payloads)),
            "sha256_pool": lambda: list(pool.map(sha, payloads)),
            "blake3": lambda: list(map(b3, payloads)),
            "blake3_auto": lambda: list(map(b3_auto, payloads)),
            "blake3_pool": lambda: list(pool.map(b3, payloads)),
            "memcpy": lambda: [copy(i) for i in idx] and dst,
            "memcpy_torch": lambda: [d.copy_(s) for d, s in zip(t_dsts, t_srcs)] and dst,
            "memcpy_pool": lambda: list(pool.map(copy, idx)) and dst,
            "sha256_copy_pool": lambda: list(pool.map(then_copy(sha), idx)),
            "blake3_copy_pool": lambda: list(pool.map(then_copy(b3), idx))}


def output_sha256(result: object) -> str:
    """What a method produced: its digests, or the bytes it copied."""
    if isinstance(result, np.ndarray):
        return hashlib.sha256(result.data).hexdigest()
    return hashlib.sha256("".join(result).encode()).hexdigest()


def method_outputs(fns: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Every method once: the SHA-256 of what it produced."""
    return {name: output_sha256(fn()) for name, fn in fns.items()}


def measure(fns: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Seconds per repeat for every method (one warm-up call each; the order rotates per repeat)."""
    outputs = method_outputs(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times, outputs


def rows_of(times: dict[str, list[float]], nbytes: int) -> list[dict]:
    base = statistics.median(times[BASELINE])
    memcpy = statistics.median(times["memcpy"])
    return [{"method": name, "median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "all_s": ts,
             "gb_per_s": nbytes / statistics.median(ts) / 1e9, "vs_sha256": base / statistics.median(ts),
             "vs_memcpy": memcpy / statistics.median(ts)} for name, ts in times.items()]


# ----------------------------------------------------------------------------- the recheck recipe
LAYOUT = ("num_tokens", "page_size", "num_pages", "page_nbytes", "nbytes")


def reference_of(method: str) -> str:
    """The method whose output `method` must equal: one-thread SHA-256 or BLAKE3, or the payloads (a copy)."""
    return "sha256" if method.startswith("sha256") else "blake3" if method.startswith("blake3") else "payloads"


def recipe_hashes(inputs: dict[str, Any], outputs: dict[str, str]) -> tuple[dict[str, str], list[str],
                                                                           dict[str, bool]]:
    """The recipe's outputs from a report's `inputs` and `outputs`, the names that hash inputs, and relations."""
    hashes = {"token ids": inputs["token_ids_sha256"], "root page key": inputs["root_sha256"],
              "page count and sizes": sha256_json({k: inputs[k] for k in LAYOUT})}
    names = sorted(hashes)
    hashes |= {"page payloads": inputs["payloads_sha256"], "sha256 digests": outputs["sha256"],
               "blake3 digests": outputs["blake3"]}
    expected = {"sha256": outputs["sha256"], "blake3": outputs["blake3"], "payloads": inputs["payloads_sha256"]}
    relations = {f"{name} = {reference_of(name)}": sha == expected[reference_of(name)]
                 for name, sha in outputs.items() if name != reference_of(name)}
    return hashes, names, relations


def recipe_args(model: str, tokens: int, page_size: int | None, threads: int) -> list[str]:
    return ["--model", model, "--tokens", str(tokens), *(["--page-size", str(page_size)] if page_size else []),
            "--threads", str(threads), "--recheck-only"]


def recipe_for_report(report: dict[str, Any], threads: int) -> list[str]:
    inputs = report["inputs"]
    return recipe_args(inputs["model"], inputs["num_tokens"], inputs["page_size"], threads)


def report_hashes(report: dict[str, Any]) -> dict[str, str]:
    return recipe_hashes(report["inputs"], report["outputs"])[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()  # the deposit's: its payloads' bytes are of this domain
    print("# depositing the pages ...", file=sys.stderr)
    payloads, inputs, domain = real_payloads(args.model, args.tokens, args.page_size)
    nbytes = inputs["nbytes"]
    load_before = os.getloadavg()
    torch.set_num_threads(1)  # NOTE: torch's own threads in copy_ stall behind a busy neighbour; one copy, one thread
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        if args.recheck_only:
            hashes, names, relations = recipe_hashes(inputs, method_outputs(methods(payloads, pool)))
            print_recheck(hashes, domain, names, relations)
            return 0
        times, outputs = measure(methods(payloads, pool), args.repeats)
    rows = rows_of(times, nbytes)
    hashes, names, relations = recipe_hashes(inputs, outputs)
    report = {"bench": "digest", "hardware": environment(), "inputs": inputs, "outputs": outputs, "rows": rows,
              "config": {"repeats": args.repeats, "pool_threads": os.cpu_count(), "blake3": blake3.__version__,
                         "order": "every repeat runs each method once, the order rotated by one per repeat"},
              "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
              "recheck": recheck_block("bench.digest", recipe_for_report({"inputs": inputs}, threads), hashes,
                                       inputs=names, relations=relations, domain=domain)}
    write_report(args.out, report)
    env = report["hardware"]
    print(f"# {env['cpu']}, {env['cores']} cores; {len(payloads)} pages of {len(payloads[0]) / 1e6:.2f} MB "
          f"({nbytes / 1e6:.0f} MB), median of {args.repeats}")
    print(markdown_table(rows, [("method", "method", "s"), ("median s", "median_s", ".4f"), ("GB/s", "gb_per_s", ".2f"),
                                ("x sha256", "vs_sha256", ".2f"), ("/ memcpy", "vs_memcpy", ".2f")]))
    print(f"# JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
