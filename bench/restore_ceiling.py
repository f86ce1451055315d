"""Restore and deposit against their ceilings, each ratio measured in one run (interleaved repeats, medians).

    graft from LMDB (verified)   graft() of a deposited artifact from a store whose host tier is
                                 empty: every page read zero-copy and SHA-256-verified
                                 vs  SHA-256 of the same bytes on all cores (hashlib threads)
                                 vs  the bare SHA-256 of the LMDB values themselves: the same
                                     bytes where the restore reads them. Hashing speed depends on
                                     where an allocation lands (the same bytes in a numpy array and
                                     an anonymous mmap are timed too), so the target holds against
                                     the fastest of the four, per repeat
                                 vs  SHA-256, then copying each page into a preallocated buffer, on
                                     all cores: the two passes a verified restore cannot skip
    graft from the host tier     the pages already in the host tier (verified when admitted)
                                 vs  copying the same bytes into a preallocated buffer
    ... restore split            the restore alone (`restore_pages` into the reused buffer, no graft
                                 around it), the same pages verified in place with nothing copied
                                 (`verify_stored`: framing, header, SHA-256), and the bare SHA-256
                                 of each LMDB value (no header parsed), each vs SHA-256 on all cores;
                                 restore minus verify-in-place is what the copy costs, and SHA-256
                                 plus that copy bounds any verified restore that copies
    ... into fresh memory        the same grafts without a reusable buffer (new pages faulted in)
                                 vs  allocating and copying the same bytes (clone)
    deposit                      deposit() of N tokens (canonical 128-token chunks, pages sealed
                                 and written) vs plain prefill of the same tokens (512-token chunks,
                                 and the canonical 128-token chunks); deposit() with 512-token
                                 pages (the ceiling's own chunks) vs plain prefill in 512-token
                                 chunks; and the canonical chunks' plain prefill vs 512-token
                                 chunks: what the schedule alone costs
    ... split                    deposit()'s own forward alone (`deposit_forward`, nothing sealed or
                                 written) vs plain prefill, and each deposit vs its forward alone:
                                 what sealing and writing the pages cost; beside them the first
                                 write of the same bytes into fresh memory and into the page cache
                                 vs the same writes into memory written before; and the thread CPU
                                 time of each deposit's page writes (LMDB) against its wall time

Every graft's first-token logits are checked SHA-256-equal to a fresh prefill's. Each repeat runs
every measurement once, in the same order, so a busy neighbour slows ceilings and restores alike.

    python -m bench.restore_ceiling --json                # smollm2, 4,096 tokens
    python -m bench.restore_ceiling --tokens 2048 --repeats 3 --skip-deposit

The report's `tieredkv recheck` recipe (`--recheck-only`) re-runs what the hashes cover, nothing timed:
the recompute reference, one deposit and each graft once. The token ids' hashes must be equal on any
machine, the logits and the artifact's root hash-equal in the same determinism domain, and every graft's
logits equal to the recompute's anywhere.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from bench.lib.common import environment, markdown_table, sha256_ids, timed, write_report
from bench.lib.report import print_recheck, recheck_block
from paging import PageLayout, PageStore, StoreConfig
from paging.restore import restore_nbytes, restore_pages, verify_stored
from tieredkv.artifacts.artifact import deposit, deposit_forward, graft, prefill
from tieredkv.artifacts.capture import CaptureCache
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_tensor
from tieredkv.question.corpus import python_reference, text_sha256

if TYPE_CHECKING:
    from transformers import DynamicCache

PROMPT = "\n\nQuestion: which statement does the text above describe first?\nAnswer:"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "restore_ceiling.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=4096, help="context length N")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats of every restore figure")
    p.add_argument("--deposit-repeats", type=int, default=5, help="interleaved repeats of deposit vs prefill")
    p.add_argument("--skip-deposit", action="store_true")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="restore threads = SHA-256 ceiling threads")
    p.add_argument("--device", default="cpu", help="the model's device: grafts install the restored K/V there")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--json", action="store_true", help="also print the JSON report on stdout")
    p.add_argument("--threads", type=int, help="torch threads (recorded in the environment and the recipe)")
    p.add_argument("--recheck-only", action="store_true",
                   help="the recompute reference, one deposit and each graft once, nothing timed: print {outputs, "
                        "inputs, relations, domain} without writing (`tieredkv recheck`)")
    return p


# ----------------------------------------------------------------------------- ceilings
def sha256_each(pool: ThreadPoolExecutor, pieces) -> list[bytes]:
    """hashlib over each piece, on the pool's threads (hashlib releases the GIL on large buffers)."""
    return list(pool.map(lambda b: hashlib.sha256(b).digest(), pieces))


def sha256_all_cores(buf: memoryview, chunk: int, workers: int) -> Callable[[], None]:
    """hashlib over `buf` in `chunk`-byte pieces (one page each), `workers` threads."""
    pieces = [buf[i:i + chunk] for i in range(0, len(buf), chunk)]
    pool = ThreadPoolExecutor(max_workers=workers)
    return lambda: sha256_each(pool, pieces)


def sha256_then_copy(src: torch.Tensor, dst: torch.Tensor, layout, page_size: int, workers: int
                     ) -> Callable[[], None]:
    """Per page on `workers` threads: hashlib over its bytes, then a copy into its place in `dst`
    ([L, 2, Hkv, N, D * itemsize] bytes, as restore lays pages out). `src` holds the pages back to back."""
    n = dst.numel() // layout.payload_nbytes(1)
    out = dst.view(layout.num_layers, 2, layout.num_kv_heads, n, -1).numpy()
    page = layout.payload_nbytes(page_size)
    flat = src.numpy()

    def one(i: int) -> None:
        piece = flat[i * page:(i + 1) * page]
        hashlib.sha256(piece).digest()
        out[:, :, :, i * page_size:(i + 1) * page_size] = piece.reshape(out[:, :, :, :page_size].shape)

    pool = ThreadPoolExecutor(max_workers=workers)
    return lambda: list(pool.map(one, range(n // page_size)))


def restore_split(path: str, keys: list[str], buffer: torch.Tensor, workers: int, pool: ThreadPoolExecutor
                  ) -> dict[str, float]:
    """Seconds of the restore alone, of verifying the same LMDB values in place with nothing copied,
    and of hashing each value bare (no header parsed, on `pool`), from one store whose host tier is empty."""
    out = {}
    store = open_store(path, host=False)
    try:
        verify_stored(store, keys, workers=workers)  # untimed: the map touched, the store's hash threads started,
        # so the timed calls below differ only in what they do (the copy), not in which one ran first
        with timed() as t:
            restored = restore_pages(store, keys, buffer=buffer, workers=workers)
        out["restore_alone"] = t["s"]
        assert restored.stats.verified_pages == len(keys), restored.stats
        del restored
        with timed() as t:
            verify_stored(store, keys, workers=workers)
        out["verify_in_place"] = t["s"]
        with timed() as t, store.lmdb_tier.views(keys) as raws:
            sha256_each(pool, raws)
            del raws  # NOTE: no view of the map outlives the read transaction
        out["bare_hash_lmdb"] = t["s"]
    finally:
        store.close()
    return out


def fresh_memory(nbytes: int, tmp: str) -> dict[str, float]:
    """Seconds to write `nbytes` into fresh memory and again into the same memory; and into a new file
    (the page cache's first write, in 6 MB pieces as LMDB commits a page) and again over its cached pages.
    A deposit writes its pages into both kinds of fresh memory: a VM that hands free memory back to its
    host pays a host fault there on every first write (lab/NOTEBOOK.md, "Where a deposit's time goes")."""
    out = {}
    with timed() as t:
        buf = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    out["first_touch"] = t["s"]
    with timed() as t:
        buf.fill_(2)
    out["touched"] = t["s"]
    data, piece = memoryview(buf.numpy()), 6 << 20
    path = os.path.join(tmp, "page-cache-probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for name in ("page_cache_new", "page_cache_cached"):
            with timed() as t:
                for off in range(0, nbytes, piece):
                    os.pwrite(fd, data[off:off + piece], off)
            out[name] = t["s"]
    finally:
        os.close(fd)
        os.unlink(path)
    return out


# ----------------------------------------------------------------------------- runs
@torch.inference_mode()
def first_token(lm, cache, prompt: list[int], start: int, page_size: int) -> torch.Tensor:
    return prefill(lm, prompt, cache, start=start, page_size=page_size)[0, -1]


def open_store(path: str, *, host: bool) -> PageStore:
    """A fresh store on `path`: host tier empty (budget 0), or holding every page (read once, untimed)."""
    return PageStore(path, StoreConfig(host_budget_bytes=(16 << 30) if host else 0, lmdb_map_size=4 << 30))


def timed_graft(lm, art, path: str, *, host: bool, buffer: torch.Tensor | None) -> tuple[float, Any, dict]:
    store = open_store(path, host=host)
    try:
        if host:
            for key in art.page_keys:
                store.get(key)  # verified once, admitted to the host tier
        before = store.stats()["integrity"]["verified_reads"]
        with timed() as t:
            cache = graft(lm, art, store, buffer=buffer)
        verified = store.stats()["integrity"]["verified_reads"] - before
    finally:
        store.close()
    return t["s"], cache, {"verified_pages": verified}


class WriteTimedStore(PageStore):
    """A PageStore that adds up the thread CPU time of its batched page writes (`put_many`: the LMDB
    transaction, its file extension and commit), whichever thread runs them."""

    write_cpu_s = 0.0

    def put_many(self, pages, **kw) -> None:
        t = time.thread_time()
        try:
            super().put_many(pages, **kw)
        finally:
            self.write_cpu_s += time.thread_time() - t


SHA_PLACES = ("sha256_all_cores", "sha256_numpy_copy", "sha256_mmap_copy", "bare_hash_lmdb")
LABELS = {
    "lmdb": "graft from LMDB, SHA-256-verified", "host": "graft from the host tier",
    "lmdb_fresh": "graft from LMDB, SHA-256-verified, fresh memory",
    "host_fresh": "graft from the host tier, fresh memory",
    "restore_alone": "restore_pages alone from LMDB, reused buffer (no graft around it)",
    "verify_in_place": "the same pages verified in place, nothing copied (verify_stored)",
    "sha256_all_cores": "SHA-256 on all cores ({w} threads), the bytes in a torch tensor",
    "sha256_numpy_copy": "SHA-256 on all cores, the same bytes in a numpy array",
    "sha256_mmap_copy": "SHA-256 on all cores, the same bytes in an anonymous mmap",
    "bare_hash_lmdb": "bare SHA-256 of each LMDB value (no header parsed, nothing copied)",
    "sha256_fastest": "the fastest of the four SHA-256s of these bytes, per repeat ({w} threads)",
    "sha256_then_copy": "SHA-256, then copy into place, per page ({w} threads)",
    "memcpy_prealloc": "copy into a preallocated buffer", "memcpy_fresh": "allocate and copy (clone)",
}


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# ----------------------------------------------------------------------------- the plan and the reference
@dataclass
class Plan:
    """What every step measures: the model (on its device), its page size, the context and the prompt."""

    lm: Any
    page_size: int
    ids: list[int]
    prompt: list[int]


def build_plan(args: argparse.Namespace) -> Plan:
    lm = load_model(args.model)
    lm.model.to(args.device)
    page_size = lm.default_page_size
    return Plan(lm, page_size, (lm.codec.encode(python_reference()) * 4)[:args.tokens], lm.codec.encode(PROMPT))


def plain_prefill(plan: Plan, chunk: int) -> tuple[float, DynamicCache]:
    from transformers import DynamicCache

    cache = DynamicCache(config=plan.lm.model.config)
    with timed() as t, torch.inference_mode():
        prefill(plan.lm, plan.ids, cache, page_size=chunk)
    return t["s"], cache


def forward_alone(plan: Plan, chunk: int) -> float:
    """deposit()'s own forward (`deposit_forward`) of the same tokens: nothing sealed or written."""
    cache = CaptureCache(plan.lm.model.config, capacity=len(plan.ids))  # as deposit() makes it
    with timed() as t, torch.inference_mode():
        deposit_forward(plan.lm, plan.ids, cache, page_size=chunk, on_chunk=lambda _s, _e, _out: cache.take())
    return t["s"]


def recompute_reference(plan: Plan) -> str:
    """Warm the model up; then the SHA-256 of a plain prefill's first-token logits, which every graft must equal."""
    from transformers import DynamicCache

    print("# warm-up and recompute reference ...", file=sys.stderr)
    with torch.inference_mode():
        prefill(plan.lm, plan.ids[:2 * plan.page_size], DynamicCache(config=plan.lm.model.config),
                page_size=plan.page_size)
    _, ref_cache = plain_prefill(plan, plan.page_size)
    return sha256_tensor(first_token(plan.lm, ref_cache, plan.prompt, len(plan.ids), plan.page_size))


# ----------------------------------------------------------------------------- deposit vs plain prefill
@dataclass
class DepositTimes:
    """Seconds per repeat: each deposit, plain prefill and forward alone (`seconds`), the thread CPU time of each
    deposit's page writes (`write_cpu`), and the writes of the deposit's `nbytes` of K/V into memory (`memory`)."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in (
        "deposit", "deposit_wide", "prefill_512", "prefill_canonical", "forward_canonical", "forward_wide")})
    write_cpu: dict[str, list[float]] = field(default_factory=lambda: {"deposit": [], "deposit_wide": []})
    memory: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in (
        "first_touch", "touched", "page_cache_new", "page_cache_cached")})
    nbytes: int = 0


def time_deposits(args: argparse.Namespace, plan: Plan, tmp: str, store_dir: str) -> tuple[Any, DepositTimes]:
    """Every repeat, in one order: plain prefill (512-token, then canonical chunks), deposit()'s forward alone
    (canonical, then 512-token chunks), deposit() with canonical, then 512-token pages, and the fresh-memory writes.
    The artifact is the first canonical deposit, in `store_dir` (deposited once, untimed, under --skip-deposit)."""
    page_size, wide = plan.page_size, 4 * plan.page_size  # pages of 512 tokens: the ceiling's own chunk schedule
    times, art = DepositTimes(), None
    dep = times.seconds
    for r in range(0 if args.skip_deposit else args.deposit_repeats):
        print(f"# deposit vs prefill, repeat {r + 1}/{args.deposit_repeats} ...", file=sys.stderr)
        dep["prefill_512"].append(plain_prefill(plan, 512)[0])
        dep["prefill_canonical"].append(plain_prefill(plan, page_size)[0])
        dep["forward_canonical"].append(forward_alone(plan, page_size))
        dep["forward_wide"].append(forward_alone(plan, wide))
        for name, size in (("deposit", page_size), ("deposit_wide", wide)):
            path = store_dir if (r == 0 and name == "deposit") else f"{tmp}/{name}{r}"
            with WriteTimedStore(path, StoreConfig(host_budget_bytes=16 << 30, lmdb_map_size=4 << 30)) as store:
                with timed() as t:
                    a = deposit(plan.lm, plan.ids, store, page_size=size)
            dep[name].append(t["s"])
            times.write_cpu[name].append(store.write_cpu_s)
            if name == "deposit":
                art = art or a
            else:
                shutil.rmtree(path, ignore_errors=True)
        if r:
            shutil.rmtree(f"{tmp}/deposit{r}", ignore_errors=True)
        times.nbytes = restore_nbytes(len(plan.ids), PageLayout.from_dict(art.layout))  # the bytes a deposit writes
        for k, secs in fresh_memory(times.nbytes, tmp).items():
            times.memory[k].append(secs)
    if art is None:
        with PageStore(store_dir, StoreConfig(lmdb_map_size=4 << 30)) as store:
            art = deposit(plan.lm, plan.ids, store, page_size=page_size)
    return art, times


def deposit_rows(plan: Plan, times: DepositTimes) -> list[dict[str, Any]]:
    """Each deposit vs plain prefill and vs its own forward, the canonical schedule's own price, each deposit's page
    writes vs its wall time, and first writes vs the same writes into memory written before (none if not timed)."""
    dep, page_size, wide = times.seconds, plan.page_size, 4 * plan.page_size
    if not dep["deposit"]:
        return []
    tok_s = {k: len(plan.ids) / median(v) for k, v in dep.items()}

    def row(figure, value, ceiling, ceiling_value, target=None):
        return {"figure": figure, "value": tok_s[value], "unit": "tok/s", "ceiling": ceiling,
                "ceiling_value": tok_s[ceiling_value], "ratio": tok_s[value] / tok_s[ceiling_value],
                "target": target, "seconds_all": dep[value], "ceiling_seconds_all": dep[ceiling_value]}
    rows = [
        row(f"deposit, {page_size}-token pages (canonical chunks)", "deposit",
            "plain prefill, 512-token chunks", "prefill_512", 0.95),
        row(f"deposit, {page_size}-token pages (canonical chunks)", "deposit",
            f"plain prefill, the same {page_size}-token chunks", "prefill_canonical"),
        row(f"deposit, {wide}-token pages (--page-size {wide})", "deposit_wide",
            "plain prefill, 512-token chunks", "prefill_512", 0.95),
        row(f"plain prefill, {page_size}-token chunks (the schedule's own price)", "prefill_canonical",
            "plain prefill, 512-token chunks", "prefill_512"),
        row(f"deposit's forward alone, {page_size}-token chunks (nothing sealed or written)",
            "forward_canonical", "plain prefill, 512-token chunks", "prefill_512"),
        row(f"deposit, {page_size}-token pages (canonical chunks)", "deposit",
            f"deposit's forward alone, {page_size}-token chunks", "forward_canonical"),
        row(f"deposit, {wide}-token pages (--page-size {wide})", "deposit_wide",
            f"deposit's forward alone, {wide}-token chunks", "forward_wide"),
    ]
    write_cpu, mem = times.write_cpu, times.memory
    for name, size in (("deposit", page_size), ("deposit_wide", wide)):
        rows.append({"figure": f"page writes of a {size}-token-page deposit (thread CPU, LMDB)",
                     "value": median(write_cpu[name]), "unit": "s", "ceiling": "that deposit's wall time",
                     "ceiling_value": median(dep[name]), "ratio": median(write_cpu[name]) / median(dep[name]),
                     "target": None, "seconds_all": write_cpu[name], "ceiling_seconds_all": dep[name]})
    gb = {k: times.nbytes / median(v) / 1e9 for k, v in mem.items()}
    for fig, val, ceil, ceil_val in (
            ("first write of fresh memory (the deposit's K/V bytes)", "first_touch",
             "the same write into memory written before", "touched"),
            ("first write into the page cache (a new file, 6 MB pieces)", "page_cache_new",
             "the same write over the file's cached pages", "page_cache_cached")):
        rows.append({"figure": fig, "value": gb[val], "unit": "GB/s", "ceiling": ceil,
                     "ceiling_value": gb[ceil_val], "ratio": gb[val] / gb[ceil_val], "target": None,
                     "seconds_all": mem[val], "ceiling_seconds_all": mem[ceil_val]})
    return rows


# ----------------------------------------------------------------------------- restore vs ceilings
def sha256_ceilings(src: torch.Tensor, dst: torch.Tensor, layout, page_size: int, workers: int
                    ) -> dict[str, Callable[[], None]]:
    """SHA-256 over `src`'s bytes, a page a piece on `workers` threads: in the tensor itself, then the same bytes
    in a numpy array and in an anonymous mmap (hashing speed depends on where memory lands); then SHA-256 and a
    copy of each page into its place in `dst`."""
    page_bytes = layout.payload_nbytes(page_size)
    sha = sha256_all_cores(memoryview(src.numpy()), page_bytes, workers)
    other = {"sha256_numpy_copy": np.array(src.numpy()), "sha256_mmap_copy": mmap.mmap(-1, src.numel())}
    other["sha256_mmap_copy"][:] = src.numpy().tobytes()
    other = {k: sha256_all_cores(memoryview(v).cast("B"), page_bytes, workers) for k, v in other.items()}
    sha_copy = sha256_then_copy(src, dst, layout, page_size, workers)
    return {"sha256_all_cores": sha, **other, "sha256_then_copy": sha_copy}


def time_ceilings(times: dict[str, list[float]], ceilings: dict[str, Callable[[], None]], src: torch.Tensor,
                  dst: torch.Tensor) -> None:
    """Each SHA-256 ceiling once, then copying `src` into `dst` and into fresh memory (clone)."""
    for name, fn in ceilings.items():
        with timed() as s:
            fn()
        times[name].append(s["s"])
    with timed() as s:
        dst.copy_(src)
    times["memcpy_prealloc"].append(s["s"])
    with timed() as s:
        fresh = src.clone()
    times["memcpy_fresh"].append(s["s"])
    del fresh


def time_grafts(times: dict[str, list[float]], plan: Plan, art, store_dir: str, buffer: torch.Tensor,
                outputs: dict[str, str], ref_sha: str | None) -> dict[str, dict]:
    """Each graft once: from LMDB and from the host tier, into `buffer`, then into fresh memory. Given the
    recompute reference, also each graft's first-token logits (into `outputs`): {graft: its checks}."""
    checks = {}
    for name, host, buf in (("lmdb", False, buffer), ("host", True, buffer),
                            ("lmdb_fresh", False, None), ("host_fresh", True, None)):
        secs, cache, info = timed_graft(plan.lm, art, store_dir, host=host, buffer=buf)
        times[name].append(secs)
        if ref_sha is not None:
            logits = first_token(plan.lm, cache, plan.prompt, art.num_tokens, plan.page_size)
            outputs[f"graft ({name}) first-token logits"] = got = sha256_tensor(logits)
            checks[name] = {"logits_sha256_equal_recompute": got == ref_sha, **info}
        del cache
    return checks


def time_restores(args: argparse.Namespace, plan: Plan, art, store_dir: str, ref_sha: str, outputs: dict[str, str]
                  ) -> tuple[int, dict[str, list[float]], dict[str, dict]]:
    """The K/V bytes, then seconds per timed repeat of every ceiling, graft and restore split, and the grafts'
    checks. Each repeat runs them all once, in one order; repeat 0 warms up and checks the logits, not timed."""
    layout = PageLayout.from_dict(art.layout)
    kv_bytes = restore_nbytes(art.num_tokens, layout)
    src = torch.randint(0, 256, (kv_bytes,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    buffer = torch.zeros(kv_bytes, dtype=torch.uint8)  # the reusable restore memory, touched once
    ceilings = sha256_ceilings(src, dst, layout, plan.page_size, args.workers)
    times: dict[str, list[float]] = collections.defaultdict(list)  # figure -> seconds, one per repeat
    split_pool = ThreadPoolExecutor(max_workers=args.workers)
    checks: dict[str, Any] = {}
    for r in range(args.repeats + 1):
        print(f"# restore repeat {r}/{args.repeats} ...", file=sys.stderr)
        time_ceilings(times, ceilings, src, dst)
        checks.update(time_grafts(times, plan, art, store_dir, buffer, outputs, ref_sha if r == 0 else None))
        for name, secs in restore_split(store_dir, list(art.page_keys), buffer, args.workers, split_pool).items():
            times[name].append(secs)
    return kv_bytes, {k: v[1:] for k, v in times.items()}, checks


def restore_rows(times: dict[str, list[float]], checks: dict[str, dict], kv_bytes: int, workers: int
                 ) -> list[dict[str, Any]]:
    """Each graft, restore split and SHA-256 against its ceiling, and the bound of a copying restore."""
    # the ceiling the targets hold against: per repeat, the fastest SHA-256 of these bytes, in any of
    # the four places timed (hashing speed depends on where an allocation lands)
    fastest = "sha256_fastest"
    t = {**times, fastest: [min(x) for x in zip(*(times[k] for k in SHA_PLACES))]}
    gbs = {k: kv_bytes / median(v) / 1e9 for k, v in t.items()}
    rows = []
    for name, ceiling, target in (("lmdb", fastest, 0.80), ("lmdb", "sha256_all_cores", None),
                                  ("lmdb", "sha256_then_copy", None),
                                  ("host", "memcpy_prealloc", 0.50),
                                  ("lmdb_fresh", fastest, None),
                                  ("host_fresh", "memcpy_fresh", None),
                                  ("restore_alone", fastest, None),
                                  ("verify_in_place", fastest, None),
                                  *((k, fastest, None) for k in SHA_PLACES)):
        rows.append({"figure": LABELS[name].format(w=workers), "value": gbs[name], "unit": "GB/s",
                     "ceiling": LABELS[ceiling].format(w=workers), "ceiling_value": gbs[ceiling],
                     "ratio": gbs[name] / gbs[ceiling], "target": target,
                     "seconds_all": t[name], "ceiling_seconds_all": t[ceiling], **checks.get(name, {})})
    # what the copy costs (restore minus the same verification with nothing copied), and the bound it
    # puts on any verified restore that copies: the fastest SHA-256 plus that copy
    copy_s = median(t["restore_alone"]) - median(t["verify_in_place"])
    bound_s = median(t[fastest]) + copy_s
    rows.append({"figure": "bound of a copying restore: the fastest SHA-256 + the copy "
                           "(restore alone - verify in place)", "value": kv_bytes / bound_s / 1e9, "unit": "GB/s",
                 "ceiling": LABELS[fastest].format(w=workers), "ceiling_value": gbs[fastest],
                 "ratio": median(t[fastest]) / bound_s, "target": None, "copy_seconds": copy_s,
                 "copy_gb_s": kv_bytes / copy_s / 1e9 if copy_s > 0 else None,
                 "seconds_all": None, "ceiling_seconds_all": t[fastest]})
    return rows


# ----------------------------------------------------------------------------- report
def build_report(args: argparse.Namespace, env: dict, plan: Plan, art, kv_bytes: int, outputs: dict[str, str],
                 rows: list[dict[str, Any]], elapsed: float, load_start: tuple[float, float, float]) -> dict:
    domain = determinism_domain(plan.lm.model, plan.lm.fingerprint, plan.page_size)
    return {
        "bench": "restore_ceiling", "hardware": env,
        "config": {"model": args.model, "tokens": args.tokens, "page_size": plan.page_size, "repeats": args.repeats,
                   "deposit_repeats": args.deposit_repeats, "workers": args.workers, "kv_bytes": kv_bytes,
                   "device": args.device, "prompt": PROMPT, "torch_threads": torch.get_num_threads(),
                   "method": "each repeat runs every ceiling and every graft once, in one order; medians; "
                             "graft = graft() wall time (domain check, restore, chain check, install)"},
        "model_fingerprint": plan.lm.fingerprint, "domain": domain, "domain_id": domain_id(domain),
        "inputs": {"corpus": "python_reference()", "corpus_sha256": text_sha256(python_reference()),
                   "token_ids_sha256": sha256_ids(plan.ids), "prompt_token_ids_sha256": sha256_ids(plan.prompt),
                   "artifact": art.artifact_id, "root_sha256": art.root_sha256},
        "outputs": outputs, "rows": rows, "seconds": round(elapsed, 1),
        "load_average_1_5_15": {"start": load_start, "end": os.getloadavg()},
    }


def print_table(args: argparse.Namespace, env: dict, load_start: tuple[float, float, float], kv_bytes: int,
                rows: list[dict[str, Any]], elapsed: float) -> None:
    out = sys.stderr if args.json else sys.stdout
    print(f"# {env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}, load "
          f"{load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}; {args.model}, {args.tokens} tokens, "
          f"{kv_bytes / 2**20:.0f} MiB of KV", file=out)
    table = [{**r, "ok": {None: "-", True: "yes", False: "NO"}[r["meets_target"]],
              "exact": {None: "-", True: "yes", False: "NO"}[r.get("logits_sha256_equal_recompute")]} for r in rows]
    print(markdown_table(table, [("figure", "figure", "s"), ("value", "value", ".2f"), ("unit", "unit", "s"),
                                 ("ceiling in the same run", "ceiling", "s"), ("ceiling", "ceiling_value", ".2f"),
                                 ("ratio", "ratio", ".2f"), ("target", "target", ".2f"), ("met", "ok", "s"),
                                 ("logits = recompute", "exact", "s")]), file=out)
    print(f"# {elapsed:.0f} s; JSON: {args.out}", file=out)


# ----------------------------------------------------------------------------- the recheck recipe
def recipe_args(model: str, tokens: int, device: str, threads: int) -> list[str]:
    return ["--model", model, "--tokens", str(tokens), *(["--device", device] if device != "cpu" else []),
            "--threads", str(threads), "--recheck-only"]


def recipe_hashes(inputs: dict[str, str], outputs: dict[str, str]) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from a report's `inputs` and `outputs`, the names that hash inputs, and relations."""
    given = {"corpus": inputs["corpus_sha256"], "token ids": inputs["token_ids_sha256"],
             "prompt token ids": inputs["prompt_token_ids_sha256"]}
    ref = outputs["recompute first-token logits"]
    relations = {f"{name} = recompute": sha == ref for name, sha in outputs.items() if name.startswith("graft")}
    return {**given, "artifact root": inputs["root_sha256"], **outputs}, sorted(given), relations


def recipe_for_report(report: dict[str, Any], threads: int) -> list[str]:
    config = report["config"]
    return recipe_args(config["model"], config["tokens"], config.get("device", "cpu"), threads)


def report_hashes(report: dict[str, Any]) -> dict[str, str]:
    return recipe_hashes(report["inputs"], report["outputs"])[0]


def recheck_only(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    outputs = {"recompute first-token logits": recompute_reference(plan)}
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        store_dir = f"{tmp}/store"
        with PageStore(store_dir, StoreConfig(lmdb_map_size=4 << 30)) as store:
            art = deposit(plan.lm, plan.ids, store, page_size=plan.page_size)
        layout = PageLayout.from_dict(art.layout)
        buffer = torch.zeros(restore_nbytes(art.num_tokens, layout), dtype=torch.uint8)
        time_grafts(collections.defaultdict(list), plan, art, store_dir, buffer, outputs,
                    outputs["recompute first-token logits"])
    inputs = {"corpus_sha256": text_sha256(python_reference()), "token_ids_sha256": sha256_ids(plan.ids),
              "prompt_token_ids_sha256": sha256_ids(plan.prompt), "root_sha256": art.root_sha256}
    domain = determinism_domain(plan.lm.model, plan.lm.fingerprint, plan.page_size)
    block_outputs, block_inputs, relations = recipe_hashes(inputs, outputs)
    print_recheck(block_outputs, domain, block_inputs, relations)
    return 0


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.recheck_only:
        return recheck_only(args)
    env = environment()
    load_start = os.getloadavg()
    started = time.perf_counter()
    plan = build_plan(args)
    ref_sha = recompute_reference(plan)
    outputs: dict[str, str] = {"recompute first-token logits": ref_sha}
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        store_dir = f"{tmp}/store"
        art, deposits = time_deposits(args, plan, tmp, store_dir)
        rows = deposit_rows(plan, deposits)
        kv_bytes, times, checks = time_restores(args, plan, art, store_dir, ref_sha, outputs)
        rows += restore_rows(times, checks, kv_bytes, args.workers)
    elapsed = time.perf_counter() - started
    for r in rows:
        r["meets_target"] = None if r.get("target") is None else r["ratio"] >= r["target"]
    report = build_report(args, env, plan, art, kv_bytes, outputs, rows, elapsed, load_start)
    block_outputs, block_inputs, relations = recipe_hashes(report["inputs"], outputs)
    report["recheck"] = recheck_block(
        "bench.restore_ceiling", recipe_args(args.model, args.tokens, args.device, torch.get_num_threads()),
        block_outputs, inputs=block_inputs, relations=relations)
    write_report(args.out, report, print_json=args.json)
    print_table(args, env, load_start, kv_bytes, rows, elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
