"""The fault suite: every fault a page store must survive, injected many times, outcomes counted.

    python -m bench.fault_suite                  # full sweep (~10 min on 2 cores), JSON + docs/RELIABILITY.md
    python -m bench.fault_suite --quick          # a smoke run with small counts
    python -m bench.fault_suite --render-only    # re-render the markdown from the JSON
    python -m bench.fault_suite --recheck-only   # the recheck recipe's steps, hashes printed (`tieredkv recheck`)

The script writes bench/results/fault_suite.json and renders docs/RELIABILITY.md from it: the
Reliability table is the suite's own output, never typed by hand. The fast versions of the same
checks are tests (tests/faults/); the fault logic lives in testkit/faults.py and
is shared by both.

Columns: tries (injections), ok (detected with a typed error, or survived with every invariant
intact), lost (tries after which committed data was damaged, or corrupt bytes were served or
imported: must be 0).

The report's `tieredkv recheck` recipe re-runs RECHECK_STEPS (seeded, none bounded by time; under a
minute) on fixtures made afresh: the fixture texts' hash must be equal on any machine, the exported
fixture artifacts and each step's outcomes (tries, detected or survived, lost, the error counts)
hash-equal in the same determinism domain (a store's data.mdb differs run to run: not hashed), and
every step must detect or survive every fault, losing nothing, anywhere.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.lib.common import environment, markdown_table, write_report
from bench.lib.report import print_recheck, recheck_block, sha256_json
from testkit import faults as fc
from testkit import trust_faults as tf

REPO = Path(__file__).resolve().parents[1]

TYPED = {"ArtifactFormatError", "ArtifactTruncatedError", "ArtifactVersionError", "ArtifactIntegrityError"}
FULL = dict(deposit_kills=120, export_kills=60, payload_flips=2000, lmdb_flips=300, data_truncations=500,
            fsize_limits=4, concurrency_rounds=3, stale_readers=5, index_rounds=2, mutation_seconds=60,
            random_files=3000, store_truncations=30, lock_rounds=3, key_damages=30, forgery_seeds=5,
            meta_flip_step=1, tree_flips=400)
QUICK = dict(deposit_kills=6, export_kills=4, payload_flips=50, lmdb_flips=10, data_truncations=20,
             fsize_limits=1, concurrency_rounds=1, stale_readers=1, index_rounds=1, mutation_seconds=3,
             random_files=100, store_truncations=3, lock_rounds=1, key_damages=3, forgery_seeds=1,
             meta_flip_step=8, tree_flips=10)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    p.add_argument("--out", help="JSON (default bench/results/fault_suite.json; with --quick a temp file)")
    p.add_argument("--doc", help="markdown (default docs/RELIABILITY.md; with --quick a temp file)")
    p.add_argument("--render-only", action="store_true", help="only re-render --doc from --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", help="comma-separated step names to run (a partial run; its JSON says so)")
    p.add_argument("--recheck-only", action="store_true",
                   help="run the recipe's steps (RECHECK_STEPS, or --only) and print {outputs, inputs, relations, "
                        "domain} without writing (`tieredkv recheck`)")
    a = p.parse_args(argv)
    scratch = Path(tempfile.gettempdir())
    a.out = a.out or str(scratch / "fault_suite.quick.json" if a.quick
                         else REPO / "bench" / "results" / "fault_suite.json")
    a.doc = a.doc or str(scratch / "RELIABILITY.quick.md" if a.quick else REPO / "docs" / "RELIABILITY.md")
    return a


def row(fault: str, tries: int, ok: int, lost: int, notes: str, **details) -> dict[str, Any]:
    return {"fault": fault, "tries": tries, "ok": ok, "lost": lost, "notes": notes, "details": details}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- fixtures
class World:
    """Stores and files the faults are injected into (in a temp dir, made once)."""

    def __init__(self, root: Path) -> None:
        from paging import PageStore
        from tieredkv.artifacts.portable import export_artifact
        from tieredkv.models.loading import load_model

        torch.set_num_threads(1)  # NOTE: the box is shared; one thread is much faster for tiny models
        self.root = root
        self.lm = load_model(fc.MODEL)
        texts = [fc.corpus_text(5 * fc.PAGE_SIZE, seed=101), fc.corpus_text(8 * fc.PAGE_SIZE - 3, seed=102),
                 fc.corpus_text(4000, seed=103)]
        self.texts_sha256 = sha256_json(texts)  # what the fixtures are made from
        self.template = root / "template"  # a store holding one artifact that no fault may damage
        self.base_ids = fc.make_store(self.template, [texts[0]], self.lm)
        self.small_store = root / "small"  # 8 pages: every header bit is flipped in its file
        self.small_id = fc.make_store(self.small_store, [texts[1]], self.lm)[0]
        self.big_store = root / "big"  # 125 pages (~2 MB file): the export under SIGKILL
        self.big_id = fc.make_store(self.big_store, [texts[2]], self.lm)[0]
        with PageStore(self.template, fc.store_config()) as s:
            export_artifact(s, self.base_ids[0], root / "base.tkva")
        with PageStore(self.small_store, fc.store_config()) as s:
            export_artifact(s, self.small_id, root / "small.tkva")
        with PageStore(self.big_store, fc.store_config()) as s:
            self.big_sha = export_artifact(s, self.big_id, root / "big.tkva")["file_sha256"]
        self.base_file = (root / "base.tkva").read_bytes()
        self.small_file = (root / "small.tkva").read_bytes()
        self.big_file = root / "big.tkva"
        self.runner = fc.ForkRunner()
        # the fixtures every row starts from, by SHA-256 (each is made from seeded text by tiny-llama)
        self.inputs = {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in FIXTURES}


FIXTURES = ("template/data.mdb", "small/data.mdb", "big/data.mdb", "base.tkva", "small.tkva", "big.tkva")
# which fixtures each step reads (the rest build their own inputs from seeded text inside the step)
STEP_INPUTS = {
    "kill deposit": ["template/data.mdb"], "kill export": ["big/data.mdb", "base.tkva", "big.tkva"],
    "header flips": ["small.tkva", "big.tkva"], "payload flips": ["small.tkva"], "lmdb flips": ["small/data.mdb"],
    "truncation": ["small.tkva"], "hostile headers": ["small.tkva"], "identity": ["small.tkva"],
    "disk full": ["template/data.mdb", "big/data.mdb", "big.tkva"], "map full": ["template/data.mdb", "big.tkva"],
    "stale readers": ["template/data.mdb"], "fuzz": ["small.tkva"], "meta flips": ["template/data.mdb"],
    "tree flips": ["template/data.mdb"], "store truncations": ["template/data.mdb"],
    "lock deleted": ["template/data.mdb"], "damaged keys": ["template/data.mdb"],
    "forgeries": ["small/data.mdb", "small.tkva"],
    "export targets": ["small/data.mdb"], "bad input": ["small/data.mdb"],
}


def audit_ok(world: World, path: Path) -> bool:
    a = fc.audit_store(path)
    return a["corrupt"] == 0 and not a["partial"] and set(world.base_ids) <= set(a["artifacts"])


# ----------------------------------------------------------------------------- sections
def kill_deposit(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    text = fc.corpus_text(2000, seed=104)
    work = world.root / "kill-deposit"
    full = [fc.deposit_kill_run(world.runner, world.template, work, text, None, world.base_ids) for _ in range(3)]
    span = statistics.median(r["elapsed"] for r in full)
    delays = [1.2 * span * i / (n // 2 - 1) for i in range(n // 2)]  # swept
    delays += [rng.uniform(0, 1.2 * span) for _ in range(n - n // 2)]  # random
    runs = [fc.deposit_kill_run(world.runner, world.template, work, text, d, world.base_ids) for d in delays]
    states = {s: sum(r["state"] == s for r in runs) for s in ("nothing", "pages only", "complete")}
    return row("SIGKILL during deposit", len(runs), sum(r["survived"] for r in runs), sum(r["lost"] for r in runs),
               f"delays 0..{1.2 * span:.2f} s after the model is loaded (half swept, half random); left behind: "
               f"{states['nothing']} nothing, {states['pages only']} verified pages without a manifest, "
               f"{states['complete']} the complete artifact; never a partial artifact, every page verified",
               deposit_seconds=span, states=states, killed=sum(r["killed"] for r in runs),
               runs=[{k: r[k] for k in ("delay", "killed", "state", "survived")} for r in runs])


def kill_export(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    out = world.root / "kill-export"
    out.mkdir(exist_ok=True)
    path = out / "context.tkva"
    full = [fc.export_kill_run(world.runner, world.big_store, world.big_id, path, world.base_file, world.big_sha,
                               None) for _ in range(3)]
    assert all(r["state"] == "new" for r in full), full
    span = statistics.median(r["elapsed"] for r in full)
    delays = [1.3 * span * i / (n // 2 - 1) for i in range(n // 2)]
    delays += [rng.uniform(0, 1.3 * span) for _ in range(n - n // 2)]
    runs = [fc.export_kill_run(world.runner, world.big_store, world.big_id, path, world.base_file, world.big_sha, d)
            for d in delays]
    states = {s: sum(r["state"] == s for r in runs) for s in ("old", "new", "torn")}
    temps = sum(r["temps_left_by_kill"] for r in runs)
    ok = sum(r["survived"] and r["temps_after_cleanup"] == 0 for r in runs)
    return row("SIGKILL during export", len(runs), ok, states["torn"],
               f"over an existing file, delays 0..{1.3 * span:.3f} s; the file was the old one {states['old']}x, "
               f"the new one {states['new']}x, torn {states['torn']}x; {temps} temp files left by kills, all "
               "removed by the next export", export_seconds=span, states=states, temps_left=temps,
               runs=[{k: r[k] for k in ("delay", "killed", "state")} for r in runs])


def header_flips(world: World) -> list[dict[str, Any]]:
    small = fc.header_flip_outcomes(world.small_file, all_bits=True)
    big_data = world.big_file.read_bytes()
    big = fc.header_flip_outcomes(big_data, all_bits=False)
    rows = []
    for name, outcomes, what in (("bit flip, artifact header (every bit)", small, "every bit of every header byte "
                                  "of an 8-page file"),
                                 ("bit flip, artifact header (every byte)", big, "one bit of every header byte of "
                                  "a 125-page file")):
        counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
        detected = sum(o in TYPED for o in outcomes)
        rows.append(row(name, len(outcomes), detected, len(outcomes) - detected,
                        f"{what}; typed errors: " + ", ".join(f"{k} {v}" for k, v in counts.items()), errors=counts))
    return rows


def payload_flips(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    outcomes = fc.payload_flip_outcomes(world.small_file, n, seed=rng.randrange(1 << 30))
    counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
    detected = sum(o in TYPED for o in outcomes)
    return row("bit flip, artifact data", len(outcomes), detected, len(outcomes) - detected,
               "random bits of the token ids and pages; all caught by a section or page SHA-256 "
               f"({', '.join(f'{k} {v}' for k, v in counts.items())})", errors=counts)


def lmdb_flips(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    from paging import PageStore

    with PageStore(world.small_store, fc.store_config()) as s:
        sizes = {k: len(s.lmdb_tier.get_raw(k)) for k in s.lmdb_tier.keys()}
    keys = sorted(sizes)
    results = []
    for i in range(n):
        key = keys[i % len(keys)]
        bit = rng.randrange(8 * 700) if i % 3 == 0 else rng.randrange(8 * sizes[key])  # framing/header, or anywhere
        results.append(fc.lmdb_flip_outcome(world.small_store, world.root / "lmdb-flip", key, bit))
    ok = sum(r["detected"] and r["quarantined"] and not r["served"] for r in results)
    return row("bit flip, stored LMDB value", n, ok, sum(r["served"] for r in results),
               "one bit of a stored page (framing, header or payload); found by a read (even bits) or by "
               "`check` (odd bits), quarantined, never served")


def truncations(world: World, n_data: int, rng: random.Random) -> dict[str, Any]:
    from tieredkv.artifacts.file_format import PREFIX

    data = world.small_file
    end = PREFIX.size + PREFIX.unpack_from(data)[2]
    offsets = list(range(end + 1)) + rng.sample(range(end + 1, len(data)), min(n_data, len(data) - end - 1))
    outcomes = fc.truncation_outcomes(data, offsets)
    counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
    typed = sum(o in TYPED for o in outcomes)
    return row("truncation", len(outcomes), typed, len(outcomes) - typed,
               f"at every offset 0..{end} of the prefix and header, and {len(offsets) - end - 1} random data offsets "
               f"({', '.join(f'{k} {v}' for k, v in counts.items())})", errors=counts)


def hostile(world: World) -> dict[str, Any]:
    results = fc.hostile_outcomes(world.small_file)
    ok = sum(r["outcome"] in TYPED and r["bounded"] for r in results)
    worst = max(r["peak_bytes"] for r in results)
    return row("hostile header", len(results), ok, sum(r["outcome"] == "ok" for r in results),
               f"huge lengths, overlapping / out-of-range / negative offsets, unknown dtypes, deep nesting, invalid "
               f"UTF-8, NaN, duplicate keys, bombs; typed error before any large allocation (peak {worst:,} B, "
               "tracemalloc; bound 64 KiB + 4x the header bytes present)", cases=results)


def identity(world: World) -> dict[str, Any]:
    """Wrong model, wrong format versions, wrong determinism domain: refused, with the reason."""
    from paging import PageStore
    from tieredkv.artifacts.file_format import FILE_VERSION, PREFIX
    from tieredkv.artifacts.portable import import_artifact
    from tieredkv.models.loading import load_model
    from tieredkv.provenance.domain import determinism_domain

    data = world.small_file
    other = load_model("tiny-qwen2")
    here = determinism_domain(world.lm.model, world.lm.fingerprint, fc.PAGE_SIZE)
    f = world.root / "identity.tkva"
    cases: list[tuple[str, bytes, dict, str]] = [
        ("store bound to another model", data, {"bind": other.fingerprint}, "ModelMismatchError"),
        ("expected another model", data, {"expected_fingerprint": other.fingerprint}, "ModelMismatchError"),
        ("another determinism domain", data, {"expected_domain": {**here, "torch": "0.0", "num_threads": 64}},
         "DomainMismatchError"),
        ("file format version + 1", PREFIX.pack(b"TKVA", FILE_VERSION + 1, PREFIX.unpack_from(data)[2])
         + data[PREFIX.size:], {}, "ArtifactVersionError"),
        ("header format_version + 1", fc.rewrite_header(data, lambda h: h.update(format_version=FILE_VERSION + 1)),
         {}, "ArtifactVersionError"),
        ("manifest format 99", fc.rewrite_header(data, lambda h: h["manifest"].update(format=99)), {},
         "ArtifactVersionError"),
        ("domain names another page size",
         fc.rewrite_header(data, lambda h: h["manifest"]["domain"].update(page_size=64)), {},
         "ArtifactIntegrityError"),
    ]
    results = []
    for name, blob, kw, want in cases:
        f.write_bytes(blob)
        store_path = world.root / "identity-store"
        shutil.rmtree(store_path, ignore_errors=True)
        with PageStore(store_path, fc.store_config()) as s:
            if "bind" in kw:
                s.set_meta("model_fingerprint", kw.pop("bind"))
            try:
                import_artifact(f, s, **kw)
                got, reason = "imported", ""
            except Exception as exc:  # noqa: BLE001 - classified below
                got, reason = type(exc).__name__, str(exc)
            untouched = s.lmdb_tier.num_pages == 0 and s.list_manifests() == []
        results.append({"case": name, "expected": want, "got": got, "untouched": untouched, "reason": reason[:300]})
    ok = sum(r["got"] == r["expected"] and r["untouched"] for r in results)
    return row("wrong model / format version / domain", len(results), ok,
               sum(r["got"] == "imported" for r in results),
               "refused before a byte is written, with the reason (expected and actual fingerprint, version, "
               "or the differing domain fields)", cases=results)


def disk_full(world: World, n_limits: int) -> dict[str, Any]:
    results = []
    big_nbytes = world.big_file.stat().st_size
    out = world.root / "full-out"
    for i in range(n_limits):
        frac = (i + 1) / (n_limits + 1)
        # export: a file size limit below the artifact size
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        (out / "ctx.tkva").write_bytes(b"previous")
        r = world.runner.call(fc.fsize_target, ("export", int(frac * big_nbytes), str(world.big_store), world.big_id,
                                                 str(out / "ctx.tkva")))
        kept = os.listdir(out) == ["ctx.tkva"] and (out / "ctx.tkva").read_bytes() == b"previous"
        results.append({"case": f"export, RLIMIT_FSIZE {frac:.0%} of the file", "error": r.get("error"),
                        "clean": not r["ok"] and r["error"] == "ArtifactWriteError" and kept, "lost": not kept})
        for what, arg in (("import", str(world.big_file)), ("deposit", fc.corpus_text(1500, seed=105 + i))):
            store = world.root / "full-store"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(world.template, store)
            limit = os.path.getsize(store / "data.mdb") + int(frac * 512 * 1024)
            r = world.runner.call(fc.fsize_target, (what, limit, str(store), arg, None))
            intact = audit_ok(world, store)
            results.append({"case": f"{what}, RLIMIT_FSIZE data.mdb + {int(frac * 512)} KiB", "error": r.get("error"),
                            "clean": not r["ok"] and r["error"] in ("StoreFullError", "PagingError") and intact,
                            "lost": not intact})
    results += tmpfs_cases(world)
    ok = sum(r["clean"] for r in results)
    return row("disk full", len(results), ok, sum(r["lost"] for r in results),
               "RLIMIT_FSIZE in a child (EFBIG) and a tiny tmpfs (ENOSPC): export, import, deposit end in a typed "
               "error; the previous file or store content is intact; no temp file is left", cases=results)


def tmpfs_cases(world: World) -> list[dict[str, Any]]:
    from paging import PageStore
    from tieredkv.artifacts.portable import export_artifact, import_artifact

    mnt = world.root / "tmpfs"
    mnt.mkdir(exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        return [{"case": "tmpfs", "error": "mount not permitted: skipped", "clean": True, "lost": False,
                 "skipped": True}]
    out = []
    try:
        (mnt / "ctx.tkva").write_bytes(b"previous")
        with PageStore(world.big_store, fc.store_config()) as s:
            try:
                export_artifact(s, world.big_id, mnt / "ctx.tkva")
                err = None
            except Exception as exc:  # noqa: BLE001
                err = type(exc).__name__
        kept = os.listdir(mnt) == ["ctx.tkva"] and (mnt / "ctx.tkva").read_bytes() == b"previous"
        out.append({"case": "export to a full 1 MiB tmpfs", "error": err, "clean": err == "ArtifactWriteError" and kept,
                    "lost": not kept})
        (mnt / "ctx.tkva").unlink()
        shutil.copytree(world.template, mnt / "store")
        try:
            with PageStore(mnt / "store", fc.store_config(lmdb_map_size=8 << 20)) as s:
                import_artifact(world.big_file, s)
            err = None
        except Exception as exc:  # noqa: BLE001
            err = type(exc).__name__
        intact = audit_ok(world, mnt / "store")
        out.append({"case": "import into a store on a full 1 MiB tmpfs", "error": err,
                    "clean": err in ("StoreFullError", "PagingError") and intact, "lost": not intact})
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    return out


def map_full(world: World) -> dict[str, Any]:
    from paging import PageStore
    from tieredkv.artifacts.portable import import_artifact

    results = []
    store = world.root / "map-store"
    for headroom_kib in (16, 64, 256, 512):
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(world.template, store)
        size = os.path.getsize(store / "data.mdb")
        cap = size + headroom_kib * 1024
        try:
            with PageStore(store, fc.store_config(lmdb_map_size=cap, lmdb_max_map_size=cap)) as s:
                import_artifact(world.big_file, s)
            err = None
        except Exception as exc:  # noqa: BLE001
            err = type(exc).__name__
        a = fc.audit_store(store)
        intact = a["corrupt"] == 0 and not a["partial"] and a["artifacts"] == world.base_ids
        results.append({"case": f"map capped at data + {headroom_kib} KiB", "error": err,
                        "clean": err == "StoreFullError" and intact and a["orphan_pages"] == 0, "lost": not intact})
        with PageStore(store, fc.store_config(lmdb_map_size=cap)) as s:  # allowed to grow
            import_artifact(world.big_file, s)
            grown = s.lmdb_tier.map_size
        a = fc.audit_store(store)
        results.append({"case": f"map of data + {headroom_kib} KiB, growth allowed", "error": None,
                        "clean": len(a["artifacts"]) == 2 and a["corrupt"] == 0 and grown > cap, "lost": False,
                        "grown_to": grown})
    ok = sum(r["clean"] for r in results)
    return row("LMDB map full", len(results), ok, sum(r["lost"] for r in results),
               "at max_map_size: StoreFullError, the import's batch rolled back, nothing lost; below it: the map "
               "grows and the import completes", cases=results)


def concurrency(world: World, rounds: int) -> dict[str, Any]:
    results = []
    for i in range(rounds):
        store = world.root / f"conc-{i}"
        shutil.rmtree(store, ignore_errors=True)
        r = fc.run_readers_and_writer(str(store), num_readers=4, num_artifacts=12, seed=i)
        a = fc.audit_store(store)
        r["clean"] = (not r["errors"] and r["exit_codes"] == [0] * 5 and r["seen_at_end"] == [12] * 4
                      and a["corrupt"] == 0)
        results.append(r)
    reads = sum(r["reads"] for r in results)
    return row("4 readers + 1 writer (spawn)", rounds, sum(r["clean"] for r in results),
               sum(len(r["errors"]) for r in results),
               f"{reads:,} page reads, each BLAKE3-verified from LMDB, chain re-checked, while 12 artifacts per "
               "round were written; no read error, no half-written artifact seen",
               rounds=[{k: r[k] for k in ("written", "reads", "passes", "errors", "exit_codes")} for r in results])


def stale_readers(world: World, n: int) -> dict[str, Any]:
    results = []
    for _ in range(n):
        store = world.root / "stale"
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(world.template, store)
        results.append(fc.stale_reader_reclaimed(str(store)))
    ok = sum(r["exitcode"] == -9 and r["freed"] >= 1 and r["store_ok"] for r in results)
    return row("stale reader after SIGKILL", n, ok, 0,
               "a process killed inside a read transaction; `reader_check` frees its slot, the store verifies",
               runs=results)


def faiss_index(world: World, rounds: int) -> dict[str, Any]:
    rows = []
    for i in range(rounds):
        store = world.root / f"index-{i}"
        shutil.rmtree(store, ignore_errors=True)
        # TieredModel mutates it
        lm = __import__("tieredkv.models.loading", fromlist=["load_model"]).load_model(fc.MODEL)
        r = fc.index_fault_run(lm, store, fc.corpus_text(12 * fc.PAGE_SIZE + 9 * i, seed=110 + i),
                               fc.corpus_text(9 * fc.PAGE_SIZE, seed=120 + i))
        rows += r["rows"]
    ok = sum(r["rebuilt"] and r["same_search"] and r["same_logits"] for r in rows)
    return row("faiss index deleted / corrupted / stale", len(rows), ok, len(rows) - ok,
               "deleted, sidecar deleted, bytes flipped, truncated, another artifact's index: rebuilt from the "
               "store on graft (files restored byte for byte), same top-k pages and scores as the original and "
               "as an index built from the stored pages, same logits after the graft", rows=rows)


def fuzz(world: World, seconds: float, n_random: int, rng: random.Random) -> dict[str, Any]:
    data = world.small_file
    kinds = ["flip", "set", "insert", "delete", "truncate", "splice"]
    n = ok = crashes = 0
    accepted_changed = 0
    examples: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = data
        for _ in range(rng.randint(1, 3)):
            kind, pos = rng.choice(kinds), rng.randrange(len(data))
            arg = {"flip": rng.randrange(8), "set": rng.randrange(256),
                   "insert": rng.randbytes(rng.randint(1, 16)), "delete": rng.randint(1, 64),
                   "truncate": None, "splice": rng.randrange(len(data))}[kind]
            m = fc.mutate(m, (kind, pos, arg))
        n += 1
        try:
            outcome = fc.parse_outcome(m)
        except Exception as exc:  # noqa: BLE001 - a crash: the thing this looks for
            crashes += 1
            examples.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        if outcome == "ok" and m != data:
            accepted_changed += 1
        else:
            ok += 1
    for _ in range(n_random):
        n += 1
        try:
            fc.parse_outcome(rng.randbytes(rng.randint(0, 4096)))
            ok += 1
        except Exception as exc:  # noqa: BLE001
            crashes += 1
            examples.append(f"{type(exc).__name__}: {exc}"[:200])
    return row("fuzzed files (mutations, random bytes)", n, ok, accepted_changed,
               f"{seconds:.0f} s of 1-3 random mutations (flip, set, insert, delete, truncate, splice) of a valid "
               f"file plus {n_random} random files: {crashes} untyped exceptions, {accepted_changed} changed files "
               "accepted (hypothesis runs the same property in tests/faults/test_fuzz.py)",
               crashes=crashes, examples=examples[:5])


# ----------------------------------------------------------------------------- report
# ----------------------------------------------------------------------------- trust (the store on disk)
def _outcomes(results: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        key = r["outcome"] if r["outcome"] != "detected" else f"detected ({r.get('error')})"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _outcome_row(fault: str, results: list[dict[str, Any]], notes: str, **details) -> dict[str, Any]:
    ok = sum(r["outcome"] in ("survived", "detected") for r in results)
    counts = _outcomes(results)
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    return row(fault, len(results), ok, sum(r["outcome"] == "lost" for r in results), f"{notes}; {text}",
               outcomes=counts, **details)


def meta_flips(world: World, step: int) -> dict[str, Any]:
    """Every bit of the fields of the current meta page that locate the trees (free and main roots and records,
    last page, transaction id): LMDB trusts them without a checksum."""
    from paging import PageStore

    template = world.root / "meta-template"
    shutil.copytree(world.template, template)
    with PageStore(template, fc.store_config()) as s:  # a second commit after the first
        s.set_meta("meta-flip", "1")
    expected = tf.artifact_roots(template)
    off = tf.current_meta_offset(template)
    work = world.root / "meta-work"
    results = [tf.damaged_store_run(world.runner, template, work,
                                    lambda w, b=byte, i=bit: tf.flip_byte_bit(w / "data.mdb", off + b, i), expected)
               for byte in range(80, tf.META_NBYTES, step) for bit in range(8)]
    return _outcome_row("bit flip, LMDB meta page (every bit)", results,
                        f"bytes 80..{tf.META_NBYTES - 1}{'' if step == 1 else f' (every {step}th)'}"
                        " of the current meta page (the free tree's root, the main "
                        "tree's record, last page, transaction id), opened, every artifact loaded and `check`ed "
                        "in a child: refused, reported, or unchanged; never another snapshot called healthy")


def tree_flips(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    """One bit of LMDB's tree pages (every page after the two meta pages: branch, leaf, overflow, free):
    half in a page's header and first nodes, half anywhere in it. LMDB checksums none of it."""
    template = world.root / "tree-template"
    shutil.copytree(world.template, template)
    fc.make_store(template, [fc.corpus_text(9 * fc.PAGE_SIZE, seed=104)], world.lm)  # a second artifact
    expected = tf.artifact_roots(template)
    last = fc.lmdb_used_nbytes(template) // tf.PAGE
    work = world.root / "tree-work"
    data_sha256 = hashlib.sha256((template / "data.mdb").read_bytes()).hexdigest()  # the input, to re-check by
    results, flips = [], []
    for i in range(n):
        page = rng.randrange(2, last)
        flips.append((page * tf.PAGE + (rng.randrange(64) if i % 2 else rng.randrange(tf.PAGE)), rng.randrange(8)))
        results.append(tf.tree_flip_run(
            world.runner, template, work,
            lambda w, o=flips[-1][0], b=flips[-1][1]: tf.flip_byte_bit(w / "data.mdb", o, b),
            expected))
    loads: dict[str, int] = {}
    for r in results:
        loads[r.get("loads", "?")] = loads.get(r.get("loads", "?"), 0) + 1
    text = ", ".join(f"{k} {v}" for k, v in sorted(loads.items()))
    return _outcome_row("bit flip, LMDB tree pages", results,
                        f"{n} random bits of pages 2..{last - 1} of data.mdb (half in a page's first 64 bytes), then "
                        f"`check` as the CLI runs it (a crash inside liblmdb is reported, exit 1) and every artifact "
                        f"loaded in another child; the loads: {text}", loads=loads,
                        data_mdb_sha256=data_sha256, flips=flips, outcomes_by_flip=[r["outcome"] for r in results])


def store_truncations(world: World, n_random: int, rng: random.Random) -> dict[str, Any]:
    expected = tf.artifact_roots(world.template)
    size = (world.template / "data.mdb").stat().st_size
    cuts = sorted(set(range(0, size, tf.PAGE)) | {rng.randrange(size) for _ in range(n_random)})
    work = world.root / "trunc-work"
    results = [tf.damaged_store_run(world.runner, world.template, work,
                                    lambda w, c=cut: os.truncate(w / "data.mdb", c), expected) for cut in cuts]
    return _outcome_row("data.mdb truncated", results,
                        f"to every 4 KiB boundary below its {size:,} bytes and {n_random} random lengths; refused at "
                        "open before the map is read (was SIGBUS, or 'an empty store' at 0 bytes)")


def rollbacks(world: World) -> dict[str, Any]:
    """An older copy of data.mdb put back, data.mdb deleted: the commit record names what is gone."""
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit

    base = world.root / "rollback-template"
    snapshots = []
    with PageStore(base, fc.store_config()) as s:
        for seed in (201, 202, 203):
            deposit(world.lm, fc.corpus_text(3 * fc.PAGE_SIZE, seed=seed), s, page_size=fc.PAGE_SIZE)
            snapshots.append((base / "data.mdb").read_bytes())
    expected = tf.artifact_roots(base)
    work = world.root / "rollback-work"
    damages = [lambda w, d=snap: (w / "data.mdb").write_bytes(d) for snap in snapshots[:-1]]
    damages.append(lambda w: (w / "data.mdb").unlink())
    damages.append(lambda w: (w / "data.mdb").write_bytes(b""))
    results = [tf.damaged_store_run(world.runner, base, work, d, expected) for d in damages]
    return _outcome_row("older data.mdb put back / deleted / emptied", results,
                        "the copies after the first and second of three deposits, the file deleted, the file "
                        "emptied; the commit record (last transaction, entry counts, artifact list) says so")


def lock_deleted(world: World, rounds: int) -> dict[str, Any]:
    work = world.root / "lock-work"
    results = [tf.lock_deleted_run(world.runner, world.lm, world.template, work,
                                   (fc.corpus_text(12 * fc.PAGE_SIZE, seed=300 + i),
                                    fc.corpus_text(6 * fc.PAGE_SIZE, seed=400 + i))) for i in range(rounds)]
    return row("lock.mdb deleted during a deposit", rounds, sum(r["ok"] for r in results),
               sum(r["lost"] for r in results),
               "a deposit paused half-way, lock.mdb deleted, a second deposit run to the end, the first resumed: "
               "the first stopped with StoreLockError "
               f"{sum(r['first'].get('error') == 'StoreLockError' for r in results)}"
               f"x, the store healthy with the second artifact complete {sum(r['healthy'] for r in results)}x "
               "(was: both 'succeeded', one artifact gone)", runs=results)


def damaged_keys(world: World, n: int, rng: random.Random) -> dict[str, Any]:
    from paging import PageStore
    from tieredkv.artifacts.artifact import load_artifact

    with PageStore(world.template, fc.store_config()) as s:
        art = load_artifact(s, world.base_ids[0])
    keys = [k.encode() for k in art.page_keys] + [art.artifact_id.encode()]
    work = world.root / "key-work"
    results = []
    for _ in range(n):
        key = rng.choice(keys)

        def damage(w: Path, key=key, pos=rng.randrange(len(key)), value=rng.randrange(0x80, 0x100)) -> None:
            data = bytearray((w / "data.mdb").read_bytes())
            for i in tf.key_offsets(bytes(data), key):
                data[i + pos] = value
            (w / "data.mdb").write_bytes(bytes(data))
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(world.template, work)
        damage(work)
        results.append(tf.call(world.runner, tf.damaged_key_target, (str(work),)))
    shutil.rmtree(work, ignore_errors=True)
    return _outcome_row("damaged byte in a stored key", results,
                        "a page key or the artifact id, one byte set to a non-ASCII value where LMDB keeps it as a "
                        "key; `check` twice in a child: reported both times (was: UnicodeDecodeError every time)")


def tampered_manifests(world: World) -> dict[str, Any]:
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit

    store = world.root / "manifest-store"
    with PageStore(store, fc.store_config()) as s:
        a = deposit(world.lm, fc.corpus_text(6 * fc.PAGE_SIZE, seed=501), s, page_size=fc.PAGE_SIZE)
        b = deposit(world.lm, fc.corpus_text(6 * fc.PAGE_SIZE, seed=502), s, page_size=fc.PAGE_SIZE)
    cases = tf.tampered_manifests(a, b)
    results = [{"case": name, **tf.manifest_run(world.lm, store, stored_as, data)}
               for name, (stored_as, data) in cases.items()]
    remote = _remote_tampering(world, store, a, b, cases)
    ok = sum(r["detected"] for r in results) + sum(r["detected"] for r in remote)
    return row("tampered manifest (LMDB, remote)", len(results) + len(remote), ok,
               len(results) + len(remote) - ok,
               f"{len(results)} in LMDB (another document's renamed, cut to 1..{len(a.page_keys) - 1} pages, other "
               "id, edited domain or tokens, reversed pages, not canonical, not JSON): graft and export refuse, "
               f"check reports; {len(remote)} on a real redis-server, through `remote pull`: refused before a "
               "byte is written" + ("" if remote else " (no redis-server here: remote cases not run)"),
               cases=results, remote=remote)


def _remote_tampering(world: World, store: Path, a, b, cases) -> list[dict[str, Any]]:
    from paging import FORMAT_VERSION
    from paging.framing import seal_value
    from testkit.redis_server import RedisServer, server_binary

    if server_binary() is None:
        return []
    import redis

    out = []
    with RedisServer(world.root / "redis") as server:
        (push,) = tf.cli_many(["remote", "push", "--store", str(store), "--remote", server.url])
        assert push["rc"] == 0, push
        client = redis.Redis.from_url(server.url)
        genuine = client.get(f"tkv:v{FORMAT_VERSION}:m:{a.artifact_id}")
        names = [n for n, (stored_as, _) in cases.items() if stored_as == a.artifact_id]
        for name in names:
            client.set(f"tkv:v{FORMAT_VERSION}:m:{a.artifact_id}", seal_value(cases[name][1]))
            pulled = world.root / "pulled"
            shutil.rmtree(pulled, ignore_errors=True)
            res = tf.cli_here(["remote", "pull", "--store", str(pulled), "--remote", server.url, "--artifact",
                             a.artifact_id])
            nothing = not pulled.exists() or tf.artifact_roots(pulled) == {} and _num_pages(pulled) == 0
            out.append({"case": name, "detected": tf.is_one_line_error(res) and nothing,
                        "line": res["err"].strip()[:200]})
        client.set(f"tkv:v{FORMAT_VERSION}:m:{a.artifact_id}", genuine)
    return out


def _num_pages(path: Path) -> int:
    from paging import PageStore

    with PageStore(path, fc.store_config()) as s:
        return s.lmdb_tier.num_pages


def forgeries(world: World, seeds: int) -> dict[str, Any]:
    from paging import PageStore
    from tieredkv.artifacts.artifact import load_artifact
    from tieredkv.artifacts.recompute import sample_pages

    with PageStore(world.small_store, fc.store_config()) as s:
        num_pages = len(load_artifact(s, world.small_id).page_keys)
    genuine, forged, store = world.root / "small.tkva", world.root / "forged.tkva", world.root / "forged-store"
    full, partial = [], []
    for i in range(num_pages):
        tf.forge_file(genuine, forged, i, lm=world.lm)  # consistent: every later page recomputed on top of it
        full.append(tf.forged_import_run(world.lm, forged, store, 1.0, 0))
        partial += [{**tf.forged_import_run(world.lm, forged, store, 0.25, seed), "page": i,
                     "sampled": i in sample_pages(num_pages, 0.25, seed)} for seed in range(seeds)]
    caught = sum(r["caught"] and r["written_when_caught"] == 0 for r in full)
    p_caught = sum(r["caught"] for r in partial)
    as_sampled = sum(r["caught"] == r["sampled"] for r in partial)
    p_frac = sum(r["fraction_recomputed"] for r in partial) / len(partial)
    return row("forged page K/V (every hash recomputed)", len(full), caught, len(full) - caught,
               f"one number changed in page i (each of the {num_pages}) and every later page recomputed on top of "
               f"it, every hash and the header recomputed: the id and root do not move, so hashes pass; `import "
               f"--verify-recompute 1` refused {caught}/{len(full)} before writing. At 0.25 ({seeds} seeds per page, "
               f"{p_frac:.0%} of pages recomputed on average) {p_caught}/{len(partial)} were caught, exactly those "
               f"whose forged page was in the sample ({as_sampled}/{len(partial)} as predicted; not counted above)",
               partial_caught=p_caught, partial_tries=len(partial), partial_fraction=p_frac,
               partial_as_predicted=as_sampled)


def export_targets(world: World) -> dict[str, Any]:
    targets = tf.special_targets(world.root / "export-targets")
    kinds = {name: tf.node_kind(path) for name, path in targets.items()}
    results = tf.cli_many(*[["export", "--store", str(world.small_store), "--artifact", world.small_id, "-o",
                             str(path), "--quiet"] for path in targets.values()])
    ok = [tf.is_one_line_error(r) and tf.node_kind(p) == kinds[n] for (n, p), r in zip(targets.items(), results)]
    return row("export onto a FIFO / symlink / directory / device", len(ok), sum(ok), len(ok) - sum(ok),
               f"{', '.join(targets)}: refused with one line, the node left as it was (was: replaced by the file)")


def bad_cli_input(world: World) -> dict[str, Any]:
    root = world.root / "bad-input"
    root.mkdir()
    cases = tf.bad_cli_inputs(root, world.small_store, world.small_id)
    results = tf.cli_many(*[argv for argv, _, _ in cases.values()])
    ok = [tf.is_one_line_error(r) and words in r["err"] for (argv, _, words), r in zip(cases.values(), results)]
    return row("bad command-line input", len(ok), sum(ok), 0,
               "binary / non-UTF-8 / directory files, zero and negative numbers, model directories without "
               "config or tokenizer, a store path that is a file or mistyped, bad remote URLs, recheck of a list "
               "or a directory, a window overrun: one line, exit 2 each (was: tracebacks, or an empty store)",
               cases=[n for n, good in zip(cases, ok) if not good])


def store_files(world: World) -> dict[str, Any]:
    """Files of a store that are not the files they should be (a FIFO, a symlink, a directory), and a symlink
    where the commit record's temporary file goes."""
    cases = tf.store_file_cases(world.template, world.root / "store-files")
    try:
        results = tf.cli_many(*[["check", "--store", str(store)] for store in cases.values()], timeout=300)
        ok = [tf.refused_or_reported(r) for r in results]
    except subprocess.TimeoutExpired:  # a FIFO read without O_NONBLOCK hangs every command
        ok = [False] * len(cases)
    ok.append(tf.commit_temp_symlink_run(world.lm, world.template, world.root / "store-files"))
    names = [*cases, "commit record's temp file is a symlink (deposit)"]
    return row("store files that are not regular files", len(ok), sum(ok), len(ok) - sum(ok),
               f"{', '.join(names)}: `check` names the file and exits 1 or 2 in one line, never hangs; the deposit "
               "leaves the symlink's target as it was (was: check and stats hung on the FIFO; the deposit "
               "overwrote the target)", cases=[n for n, good in zip(names, ok) if not good])


def render(report: dict[str, Any]) -> str:
    env, cfg = report["environment"], report["config"]
    rows = [{"fault": r["fault"], "tries": r["tries"], "ok": f"{r['ok']}/{r['tries']}", "lost": r["lost"],
             "notes": r["notes"]} for r in report["rows"]]
    table = markdown_table(rows, [("fault", "fault", ""), ("tries", "tries", ","), ("detected / survived", "ok", ""),
                                  ("data lost", "lost", ","), ("notes", "notes", "")])
    hostile_rows = next((r["details"]["cases"] for r in report["rows"] if r["fault"] == "hostile header"), [])
    hostile_table = markdown_table(hostile_rows, [("case", "case", ""), ("typed error", "outcome", ""),
                                                  ("header bytes present", "header_bytes", ","),
                                                  ("peak Python memory (B)", "peak_bytes", ",")])
    all_ok = all(r["ok"] == r["tries"] and r["lost"] == 0 for r in report["rows"])
    inputs = report.get("inputs")
    inputs_text = ("Inputs: the fixtures are made from seeded text by the model (two runs on this machine made "
                   "the same bytes): " + ", ".join(f"`{k}` {v[:12]}…" for k, v in inputs.items()) +
                   " (SHA-256; in full in the JSON, where each row also names the fixtures it read). "
                   "Each step draws its injections from its own "
                   "seeded stream (`seed:step`), so a row repeats run to run; the fuzz step's count is bounded by "
                   "time." if inputs else "Inputs: this run recorded no fixture hashes.")
    verdict = ('Every injected fault was detected or survived, and no data was lost.' if all_ok
               else '**Some faults were not handled: see the rows whose counts differ.**')
    return f"""# Reliability

Generated by `python -m bench.fault_suite` from `bench/results/fault_suite.json`; do not edit by
hand (re-render with `--render-only`). {verdict}

Machine: {env['cpu']}, {env['cores']} cores, torch {env['torch']}, transformers {env['transformers']}, Python
{env['python']}. Model {cfg['model']}, page size {cfg['page_size']}, one torch thread. Run took
{report['duration_s'] / 60:.1f} min{' (quick smoke counts)' if cfg['quick'] else ''}.

{inputs_text}

"detected / survived" counts injections that ended in a typed error, or after which every
invariant held (the store reopens, every page verifies, no partial artifact is visible, the
old file or the new one is in place). "data lost" counts injections after which committed data
was damaged, or corrupt bytes were served or imported.

## Reliability

{table}

## Hostile headers

Each crafted header is refused with a typed error before anything of the claimed size is
allocated (peak Python memory of the refusal, measured with tracemalloc):

{hostile_table}

## What is injected, and how

- **SIGKILL** lands at swept and random delays after the child has loaded the model (deposit)
  or opened the store (export). Children fork from a server that imported torch and
  transformers but ran nothing, so a kill costs milliseconds. After each kill the store is
  reopened and audited: `check()` re-hashes every page, every manifest's chain is loaded.
- **Bit flips** in an exported file's header go through `read_header` (bounded parse, header
  SHA-256); in its data through `verify_file` (token ids, every page, the chain). In LMDB
  values they are flipped in place with py-lmdb, then found by a read or by `check`.
- **Truncations** go through `read_header`; **hostile headers** and **fuzzed files** through
  `verify_file`.
- **Disk full** is RLIMIT_FSIZE in a forked child (writes past it fail with EFBIG; LMDB
  reports EIO) and a 1 MiB tmpfs (ENOSPC). **Map full** is a capped `lmdb_max_map_size`.
- **Readers and a writer** are five `spawn` processes on one store; readers bypass the host
  cache so every read is a verified LMDB read.
- **The faiss index** is damaged on disk, then the context is grafted again with TieredModel.
- **The store on disk**: bits of LMDB's current meta page are flipped, data.mdb is
  truncated, put back from an older copy, deleted or emptied, and a byte of a stored key is damaged;
  each copy is then opened, every artifact loaded and `check`ed in a forked child, so a SIGBUS or a
  crash is counted, not fatal. The commit record (`tieredkv.commit`, see docs/TRUST.md) is what
  tells an older snapshot from the committed one. **lock.mdb** is deleted while a deposit is paused
  half-way and a second deposit runs; the first must stop with StoreLockError. **Tree pages**
  (every page after the two meta pages) get one random bit flipped; `check` walks the copy in one
  child, as the CLI does (a crash inside liblmdb is reported, exit 1), and every artifact is
  loaded in another, whose crashes are counted in the row's notes.
- **Manifests** are tampered with in LMDB (graft, export, check) and on a real redis-server (`remote
  pull`); **forged artifacts** have one number of one page changed, every later page recomputed on
  top of it and every hash recomputed, then go through `import --verify-recompute`.
- **Export targets and command-line input** go through the real CLI entry point in a fresh
  interpreter: every failure must be one line on stderr with exit status 2. A reader that stops
  reading (`tieredkv stats | head`) is not a failure: the command stops quietly with status 141,
  as a process SIGPIPE ended (`tests/cli/test_commands.py`).

See docs/TRUST.md for what each of these guards and how `tieredkv recheck` treats another machine.
"""


def fault_steps(world: World, counts: dict[str, int]) -> list[tuple[str, Callable[[random.Random], Any]]]:
    """Every step of the suite, in order: (name, a function of its seeded random stream)."""
    return [
        ("kill deposit", lambda rng: kill_deposit(world, counts["deposit_kills"], rng)),
        ("kill export", lambda rng: kill_export(world, counts["export_kills"], rng)),
        ("header flips", lambda rng: header_flips(world)),
        ("payload flips", lambda rng: payload_flips(world, counts["payload_flips"], rng)),
        ("lmdb flips", lambda rng: lmdb_flips(world, counts["lmdb_flips"], rng)),
        ("truncation", lambda rng: truncations(world, counts["data_truncations"], rng)),
        ("hostile headers", lambda rng: hostile(world)),
        ("identity", lambda rng: identity(world)),
        ("disk full", lambda rng: disk_full(world, counts["fsize_limits"])),
        ("map full", lambda rng: map_full(world)),
        ("concurrency", lambda rng: concurrency(world, counts["concurrency_rounds"])),
        ("stale readers", lambda rng: stale_readers(world, counts["stale_readers"])),
        ("faiss index", lambda rng: faiss_index(world, counts["index_rounds"])),
        ("fuzz", lambda rng: fuzz(world, counts["mutation_seconds"], counts["random_files"], rng)),
        ("meta flips", lambda rng: meta_flips(world, counts["meta_flip_step"])),
        ("tree flips", lambda rng: tree_flips(world, counts["tree_flips"], rng)),
        ("store truncations", lambda rng: store_truncations(world, counts["store_truncations"], rng)),
        ("rollbacks", lambda rng: rollbacks(world)),
        ("lock deleted", lambda rng: lock_deleted(world, counts["lock_rounds"])),
        ("damaged keys", lambda rng: damaged_keys(world, counts["key_damages"], rng)),
        ("tampered manifests", lambda rng: tampered_manifests(world)),
        ("forgeries", lambda rng: forgeries(world, counts["forgery_seeds"])),
        ("export targets", lambda rng: export_targets(world)),
        ("bad input", lambda rng: bad_cli_input(world)),
        ("store files", lambda rng: store_files(world)),
    ]


def run_step(world: World, name: str, step: Callable[[random.Random], Any], seed: int) -> list[dict[str, Any]]:
    t = time.monotonic()
    out = step(random.Random(f"{seed}:{name}"))  # NOTE: each step its own stream: a timed step
    # (fuzz) draws a varying count, and the steps after it would otherwise differ from run to run
    rows = out if isinstance(out, list) else [out]
    for r in rows:
        r["inputs"] = {f: world.inputs[f] for f in STEP_INPUTS.get(name, [])}
        r["seed"] = f"{seed}:{name}"
    log(f"{name}: {time.monotonic() - t:.1f} s — " + "; ".join(
        f"{r['fault']}: {r['ok']}/{r['tries']} ok, {r['lost']} lost" for r in rows))
    return rows


# ----------------------------------------------------------------------------- the recheck recipe
# seeded steps whose outcomes repeat run to run (none bounded by time, none timing a kill); under a minute
RECHECK_STEPS = ("header flips", "payload flips", "lmdb flips", "truncation", "hostile headers", "identity",
                 "store truncations", "rollbacks", "damaged keys")
OUTCOME_KEYS = ("case", "outcome", "got", "expected", "untouched", "bounded")


def step_of(r: dict[str, Any]) -> str:
    return r["seed"].split(":", 1)[1]


def outcome(r: dict[str, Any]) -> dict[str, Any]:
    """What a row's injections came to, without paths, times or memory peaks."""
    d = r["details"]
    return {"fault": r["fault"], "tries": r["tries"], "ok": r["ok"], "lost": r["lost"],
            **{k: d[k] for k in ("errors", "outcomes") if k in d},
            **({"cases": [{k: c[k] for k in OUTCOME_KEYS if k in c} for c in d["cases"]]} if "cases" in d else {})}


def recipe_hashes(fixtures: dict[str, str], rows: list[dict[str, Any]], texts_sha256: str | None = None
                  ) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from the fixtures' hashes and the rows of RECHECK_STEPS, the names that hash inputs,
    and the relations (every fault detected or survived, nothing lost)."""
    # a store's data.mdb differs from run to run (LMDB leaves its free space as it finds it); the artifact files
    # exported from the stores do not
    outputs = {f"fixture {name}": sha for name, sha in fixtures.items() if not name.endswith("data.mdb")}
    inputs = []
    if texts_sha256 is not None:
        outputs["fixture texts"] = texts_sha256
        inputs.append("fixture texts")
    relations = {}
    for step in RECHECK_STEPS:
        mine = [r for r in rows if step_of(r) == step]
        if mine:
            outputs[f"{step} outcomes"] = sha256_json([outcome(r) for r in mine])
            relations[f"{step}: every fault detected or survived, none lost"] = all(
                r["ok"] == r["tries"] and r["lost"] == 0 for r in mine)
    return outputs, inputs, relations


def recipe_args(seed: int, quick: bool, steps: list[str]) -> list[str]:
    return ["--seed", str(seed), *(["--quick"] if quick else []), "--only", ",".join(steps), "--recheck-only"]


def recipe_for_report(report: dict[str, Any], threads: int) -> list[str]:
    ran = {step_of(r) for r in report["rows"]}
    return recipe_args(report["config"]["seed"], report["config"]["quick"], [s for s in RECHECK_STEPS if s in ran])


def report_hashes(report: dict[str, Any]) -> dict[str, str]:
    return recipe_hashes(report.get("inputs") or {}, report["rows"])[0]


def domain_of(world: World) -> dict[str, Any]:
    from tieredkv.provenance.domain import determinism_domain

    return determinism_domain(world.lm.model, world.lm.fingerprint, fc.PAGE_SIZE)


def recheck_block_of(a: argparse.Namespace, world: World, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ran = [s for s in RECHECK_STEPS if any(step_of(r) == s for r in rows)]
    if not ran:
        return None
    outputs, inputs, relations = recipe_hashes(world.inputs, rows, world.texts_sha256)
    return recheck_block("bench.fault_suite", recipe_args(a.seed, a.quick, ran), outputs, inputs=inputs,
                         relations=relations, domain=domain_of(world))


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.recheck_only and not a.only:
        a.only = ",".join(RECHECK_STEPS)
    if a.render_only:
        report = json.loads(Path(a.out).read_text())
        Path(a.doc).write_text(render(report))
        return 0
    counts = QUICK if a.quick else FULL
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tieredkv-faults-") as tmp:
        world = World(Path(tmp))
        steps = fault_steps(world, counts)
        if a.only:
            wanted = {w.strip() for w in a.only.split(",")}
            steps = [(n, f) for n, f in steps if n in wanted]
        rows: list[dict[str, Any]] = []
        for name, step in steps:
            rows += run_step(world, name, step, a.seed)
    if a.recheck_only:
        outputs, inputs, relations = recipe_hashes(world.inputs, rows, world.texts_sha256)
        print_recheck(outputs, domain_of(world), inputs, relations)
        return 0
    report = {"environment": environment(), "duration_s": time.monotonic() - t0,
              "config": {"model": fc.MODEL, "page_size": fc.PAGE_SIZE, "quick": a.quick, "seed": a.seed,
                         "counts": counts, "only": a.only},
              "inputs": world.inputs, "rows": rows}
    block = recheck_block_of(a, world, rows)
    if block is not None:
        report["recheck"] = block
    write_report(a.out, report)
    Path(a.doc).parent.mkdir(parents=True, exist_ok=True)
    Path(a.doc).write_text(render(report))
    print(render(report).split("## Reliability")[1].split("## Hostile")[0].strip())
    return 0 if all(r["ok"] == r["tries"] and r["lost"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
