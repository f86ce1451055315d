"""Helpers of the fault tests and of bench/fault_suite.py: child processes, audits, corruptions.

Child processes come in three kinds:
  * `python testkit/faults.py CMD ...` — fresh interpreters (cross-machine, RLIMIT_FSIZE);
  * multiprocessing `spawn` targets (`reader_main`, `writer_main`, `hold_reader_main`);
  * `ForkRunner`: a forkserver that has imported torch and transformers but run nothing, so
    a child that is killed with SIGKILL costs a fork, not an interpreter start.

Only light imports at module level: spawn children import this module first.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE_SIZE = 32
MODEL = "tiny-llama"


def store_config(**kw):
    from paging import StoreConfig

    return StoreConfig(**{"host_budget_bytes": 32 << 20, "lmdb_map_size": 64 << 20, **kw})


def corpus_text(num_chars: int, seed: int = 0) -> str:
    """Deterministic ASCII-ish text (Python's own reference docs); `seed` picks the offset."""
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics))
    off = (seed * 7919) % (len(text) - num_chars)
    return text[off:off + num_chars]


# ----------------------------------------------------------------------------- audits
def audit_store(path: str | os.PathLike) -> dict[str, Any]:
    """Reopen a store and verify everything: every page re-hashed, every artifact's chain loaded.

    `partial` lists manifests whose pages do not all load (must never happen).
    """
    from paging import PageStore
    from tieredkv.artifacts.artifact import load_artifact, load_pages

    with PageStore(path, store_config()) as store:
        report = store.check()
        complete, partial, referenced = [], [], set()
        for artifact_id in store.list_manifests():
            try:
                art = load_artifact(store, artifact_id)
                load_pages(store, art)
                complete.append(artifact_id)
                referenced.update(art.page_keys)
            except Exception as exc:  # noqa: BLE001 - reported, the caller asserts on it
                partial.append(f"{artifact_id}: {type(exc).__name__}: {exc}")
        pages = set(store.lmdb_tier.keys())
    return {"pages": len(pages), "checked": report["checked"], "corrupt": report["corrupt"],
            "artifacts": complete, "partial": partial, "orphan_pages": len(pages - referenced)}


def lmdb_used_nbytes(path: str | os.PathLike) -> int:
    """Where the last committed page of the store at `path` ends in data.mdb. The file may be longer:
    writers extend it ahead of LMDB (paging/lmdb_tier.py `_extend_file`)."""
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_dbs=4)
    try:
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()


def sha256_file(path: str | os.PathLike) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def flip_file_bit(path: str | os.PathLike, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        b = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([b ^ (1 << (bit % 8))]))


def flip_lmdb_value_bit(store_path: str | os.PathLike, key: str, bit: int, db: str = "pages") -> int:
    """Flip one bit of the value stored under `key` (store closed); returns the value's length."""
    import lmdb

    env = lmdb.open(str(store_path), max_dbs=4, subdir=True)
    try:
        handle = env.open_db(db.encode(), create=False)
        with env.begin(write=True, db=handle) as txn:
            raw = bytearray(txn.get(key.encode()))
            raw[bit // 8 % len(raw)] ^= 1 << (bit % 8)
            txn.put(key.encode(), bytes(raw))
        return len(raw)
    finally:
        env.close()


def rewrite_header(data: bytes, mutate, *, version: int | None = None) -> bytes:
    """An artifact file whose header `mutate(dict)` changed, re-hashed so only the change is wrong."""
    from tieredkv.artifacts.file_format import PREFIX, canonical_json

    magic, file_version, n = PREFIX.unpack_from(data)
    hdr = json.loads(data[PREFIX.size:PREFIX.size + n])
    hdr.pop("header_sha256")
    mutate(hdr)
    hdr["header_sha256"] = hashlib.sha256(canonical_json(hdr)).hexdigest()
    raw = canonical_json(hdr)
    return PREFIX.pack(magic, file_version if version is None else version, len(raw)) + raw + data[PREFIX.size + n:]


def synthetic_chain(num_pages: int, seed: int, *, fp: str = "ab" * 32, page_size: int = 8, layout=None,
                    token_ids=None):
    """A valid chain of pages from random K/V (no model): for writers that only test the store.

    `layout` defaults to 2 layers, 2 KV heads, head_dim 8, float32, `page_size` tokens a page; every page is
    full. Page i holds `token_ids(i)`, or (None) random ids drawn after its K/V."""
    import torch

    from paging import ROOT_KEY, Page, PageLayout

    layout = layout or PageLayout(2, 2, 8, "float32", page_size)
    num_layers, shape = layout.num_layers, (layout.num_kv_heads, layout.page_size, layout.head_dim)  # [Hkv, T, D]
    g = torch.Generator().manual_seed(seed)
    pages, parent = [], ROOT_KEY
    for i in range(num_pages):
        kv = [torch.randn(*shape, generator=g) for _ in range(2 * num_layers)]
        if token_ids is None:
            ids = [int(t) for t in torch.randint(0, 256, (layout.page_size,), generator=g)]
        else:
            ids = token_ids(i)
        page = Page.seal(layout, fp, parent, i * layout.page_size, ids, kv[:num_layers], kv[num_layers:])
        pages.append(page)
        parent = page.key
    return pages


def make_chain(num_pages: int, seed: int = 0, *, fp: str = "ab" * 32, layout=None, token_ids=None):
    """The unit tests' chain: pages of 4 tokens of a tiny layout (2 layers, `layout` defaults to 1 KV head,
    head_dim 4, float32), page i holding token ids [i] * 4 unless `token_ids(i)` says otherwise."""
    from paging import PageLayout

    return synthetic_chain(num_pages, seed, fp=fp, layout=layout or PageLayout(2, 1, 4, "float32", 4),
                           token_ids=token_ids or (lambda i: [i] * 4))


# ----------------------------------------------------------------------------- corruption cases
class Spliced:
    """A read-only file: `head` over the start of `data`, without copying `data` (header sweeps
    flip tens of thousands of bits of multi-MB files)."""

    def __init__(self, head: bytes, data: bytes) -> None:
        self.head, self.data, self.pos = head, data, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos + (0 if whence == 0 else self.pos if whence == 1 else len(self.data))
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(len(self.data), self.pos + n)
        h, start = len(self.head), self.pos
        self.pos = max(start, end)
        if start >= h:
            return self.data[start:end]
        return self.head[start:min(end, h)] + (self.data[h:end] if end > h else b"")


def parse_outcome(data, *, header_only: bool = False) -> str:
    """"ok", or the name of the typed error the artifact parser raised (anything else propagates).

    `data`: the file's bytes, or a seekable binary file."""
    import io

    from tieredkv.artifacts.file_format import ArtifactFormatError
    from tieredkv.artifacts.portable import read_header, verify_file

    try:
        (read_header if header_only else verify_file)(io.BytesIO(data) if isinstance(data, bytes) else data)
        return "ok"
    except ArtifactFormatError as exc:
        return type(exc).__name__


def flipped(data: bytes, bit: int) -> bytes:
    b = bytearray(data)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def mutate(data: bytes, m: tuple[str, int, Any]) -> bytes:
    """Apply one (kind, position, argument) mutation: flip, set, insert, delete, truncate, splice."""
    kind, pos, arg = m
    b = bytearray(data)
    if not b:
        return data
    pos %= len(b)  # earlier mutations may have shortened the file
    if kind == "flip":
        b[pos] ^= 1 << arg
    elif kind == "set":
        b[pos] = arg
    elif kind == "insert":
        b[pos:pos] = arg
    elif kind == "delete":
        del b[pos:pos + arg]
    elif kind == "truncate":
        del b[pos:]
    else:
        b[pos:pos + 32] = data[arg:arg + 32]
    return bytes(b)


def header_flip_outcomes(data: bytes, *, all_bits: bool) -> list[str]:
    """Flip each header byte (one bit of it, or each of its 8 bits): one outcome per flip."""
    from tieredkv.artifacts.file_format import PREFIX

    end = PREFIX.size + PREFIX.unpack_from(data)[2]
    bits = range(8 * end) if all_bits else [8 * i + i % 8 for i in range(end)]
    head = data[:end]
    return [parse_outcome(Spliced(flipped(head, bit), data), header_only=True) for bit in bits]


def payload_flip_outcomes(data: bytes, num: int, seed: int) -> list[str]:
    """Flip `num` random bits of the data section (token ids and pages), one file per flip."""
    from tieredkv.artifacts.file_format import PREFIX

    start = PREFIX.size + PREFIX.unpack_from(data)[2]
    rng = random.Random(seed)
    return [parse_outcome(flipped(data, rng.randrange(8 * start, 8 * len(data)))) for _ in range(num)]


def truncation_outcomes(data: bytes, offsets) -> list[str]:
    return [parse_outcome(data[:n], header_only=True) for n in offsets]


def hostile_headers(valid: bytes) -> dict[str, bytes]:
    """Crafted files whose header lies; each must be refused with a typed error, cheaply."""
    from tieredkv.artifacts.file_format import MAGIC, MAX_HEADER_NBYTES, PREFIX

    def framed(raw: bytes, claimed: int | None = None) -> bytes:
        return PREFIX.pack(MAGIC, 1, len(raw) if claimed is None else claimed) + raw

    def pages(fn):
        return rewrite_header(valid, lambda h: fn(h["pages"]))

    deep = 200_000
    return {
        "huge length (2^63)": framed(b"{}", 1 << 63),
        "length over the cap": framed(b"{}", MAX_HEADER_NBYTES + 1),
        "length past the end of the file": framed(b"{}", 1 << 20),
        "overlapping offsets": pages(lambda p: p[1].update(data_offsets=[p[0]["data_offsets"][0] + 8,
                                                                          p[1]["data_offsets"][1]])),
        "out-of-range offsets": pages(lambda p: p[-1].update(data_offsets=[p[-1]["data_offsets"][0], 1 << 40])),
        "negative offset": pages(lambda p: p[0].update(data_offsets=[-16, p[0]["data_offsets"][1]])),
        "reversed offsets": pages(lambda p: p[0].update(data_offsets=p[0]["data_offsets"][::-1])),
        "a page claiming 1 TiB": rewrite_header(valid, lambda h: (
            h["pages"][-1].update(data_offsets=[h["pages"][-1]["data_offsets"][0], 1 << 40]),
            h.update(data_nbytes=1 << 40))),
        "data_nbytes 2^62": rewrite_header(valid, lambda h: h.update(data_nbytes=1 << 62)),
        "unknown token dtype": rewrite_header(valid, lambda h: h["token_ids"].update(dtype="F64")),
        "unknown KV dtype": rewrite_header(valid, lambda h: h["manifest"]["layout"].update(dtype="complex128")),
        "deep nesting (top level)": framed(b"[" * deep + b"]" * deep),
        "deep nesting (in a field)": framed(b'{"data_nbytes":0,"format":' + b"[" * deep + b"]" * deep + b"}"),
        "invalid UTF-8": framed(b'{"format":"\xff\xfe"}'),
        "NaN": framed(b'{"data_nbytes":NaN}'),
        "duplicate keys": framed(b'{"format":"tieredkv.artifacts.artifact","format":"x"}'),
        "100,000-digit integer": framed(b'{"data_nbytes":' + b"9" * 100_000 + b"}"),
        "more pages than the manifest": pages(lambda p: p.append(dict(p[-1]))),
        "a million-entry list": framed(b'{"pages":[' + b",".join([b"0"] * 1_000_000) + b"]}"),
    }


def hostile_outcomes(valid: bytes) -> list[dict[str, Any]]:
    """Each hostile header: the typed error it got and the peak Python memory of the refusal
    (bounded: at most a few times the header bytes actually present, never the claimed sizes)."""
    import tracemalloc

    from tieredkv.artifacts.file_format import PREFIX

    parse_outcome(b"")  # NOTE: lazy imports happen outside the measurement
    out = []
    for name, data in hostile_headers(valid).items():
        tracemalloc.start()
        try:
            outcome = parse_outcome(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        header_bytes = min(PREFIX.unpack_from(data)[2], len(data) - PREFIX.size)  # what is there to read
        out.append({"case": name, "outcome": outcome, "file_bytes": len(data), "header_bytes": header_bytes,
                    "peak_bytes": peak, "bounded": peak <= 64 * 1024 + 4 * header_bytes})
    return out


def lmdb_flip_outcome(pristine: Path, work: Path, key: str, bit: int) -> dict[str, Any]:
    """Flip one bit of a stored page value in a copy of `pristine`; is it caught, never served?

    Even bits are found by a read (`get`), odd ones by `check()`; both quarantine the bytes.
    """
    import shutil

    from paging import PageStore
    from paging.errors import CorruptPageError, PageNotFoundError

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work)
    flip_lmdb_value_bit(work, key, bit)
    with PageStore(work, store_config()) as store:
        if bit % 2 == 0:
            try:
                store.get(key)
                detected = False
            except CorruptPageError:
                detected = True
        else:
            detected = store.check()["quarantined_keys"] == [key]
        try:
            store.get(key)
            served = True
        except (CorruptPageError, PageNotFoundError):
            served = False
        quarantined = store.lmdb_tier.num_quarantined == 1
    shutil.rmtree(work, ignore_errors=True)
    return {"detected": detected, "served": served, "quarantined": quarantined}


# ----------------------------------------------------------------------------- the faiss index
INDEX_DAMAGES = ("deleted", "sidecar deleted", "bytes flipped", "truncated", "other artifact's index")


def tiered_config(position: str = "own"):
    from tieredkv.engine.tiered_config import TieredConfig

    return TieredConfig(page_size=PAGE_SIZE, local_pages=2, topk_pages=2, sink_pages=1, position=position)


def search_results(index, seed: int = 0, num_queries: int = 4) -> list[tuple[bytes, bytes]]:
    """(ids, scores) bytes of a top-3 search per layer for fixed random queries [H, Q, D]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for layer in range(index.num_layers):
        q = rng.standard_normal((index.num_heads, num_queries, index.dim)).astype(np.float32)
        ids, scores = index.search(layer, q, 3)
        out.append((ids.tobytes(), scores.tobytes()))
    return out


def index_from_store(store, art, config, model) -> Any:
    """The reference: a PageIndex built here from the stored pages' summaries."""
    from index import PageIndex
    from paging import PageLayout
    from tieredkv.engine.tiered_cache import page_summaries

    layout = PageLayout.from_dict(art.layout)
    index = PageIndex(layout.num_layers, layout.num_kv_heads, layout.head_dim, config.summary, config.num_repr)
    for i, key in enumerate(art.page_keys):
        page = store.get(key)
        index.add(i, page_summaries(model, config, [page.layer_kv(layer)[0] for layer in range(layout.num_layers)],
                                    i * art.page_size))
    return index


def damage_index(path: Path, how: str, other: Path | None = None) -> None:
    sidecar = path.with_name(path.name + ".json")
    if how == "deleted":
        path.unlink()
    elif how == "sidecar deleted":
        sidecar.unlink()
    elif how == "bytes flipped":
        data = bytearray(path.read_bytes())
        for i in range(0, len(data), max(1, len(data) // 16)):
            data[i] ^= 0x5A
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "other artifact's index":
        import shutil

        shutil.copyfile(other, path)
        shutil.copyfile(other.with_name(other.name + ".json"), sidecar)
    else:
        raise ValueError(how)


def index_fault_run(lm, store_path: Path, text: str, other_text: str, damages=INDEX_DAMAGES,
                    position: str = "own") -> dict[str, Any]:
    """Ingest with TieredModel, then damage the saved faiss index each way and graft again.

    For each damage: the graft must rebuild the index from the store (the saved files come back
    byte for byte) with the same search results as the original index and as one built from the pages here,
    and the logits that follow the graft must be the same bytes.
    """
    from paging import PageStore
    from tieredkv.engine.tiered_model import TieredModel
    from tieredkv.provenance.domain import sha256_tensor

    cont = lm.codec.encode(" What follows?")
    with PageStore(store_path, store_config()) as store:
        tm = TieredModel(lm, store, tiered_config(position))
        try:
            art = tm.ingest(text)
            other = tm.ingest(other_text)
            path, other_path = tm._index_path(art), tm._index_path(other)

            def graft_and_probe() -> tuple[list, str]:
                tm.graft(art)
                return search_results(tm.cache.index), sha256_tensor(tm.prefill(cont, logits_to_keep=0))

            want_search, want_logits = graft_and_probe()
            sidecar = path.with_name(path.name + ".json")
            pristine = (path.read_bytes(), sidecar.read_bytes())
            reference = search_results(index_from_store(store, art, tm.config, tm.model))
            rows = []
            for how in damages:
                damage_index(path, how, other_path)
                got_search, got_logits = graft_and_probe()
                restored = (path.is_file() and sidecar.is_file()
                            and (path.read_bytes(), sidecar.read_bytes()) == pristine)
                rows.append({"damage": how, "rebuilt": restored,
                             "same_search": got_search == want_search == reference,
                             "same_logits": got_logits == want_logits})
        finally:
            tm.close()
    return {"artifact": art.artifact_id, "pages": len(art.page_keys), "rows": rows}


# ----------------------------------------------------------------------------- spawn targets
def writer_main(store_path: str, num_artifacts: int, seed: int, start, done, out) -> None:
    """Write `num_artifacts` synthetic artifacts: pages in small batches, then the manifest."""
    from paging import PageStore

    rng = random.Random(seed)
    written = 0
    with PageStore(store_path, store_config()) as store:
        start.wait(120)  # start writing once every reader has the store open
        for a in range(num_artifacts):
            pages = synthetic_chain(rng.randint(2, 12), seed * 1000 + a)
            for i in range(0, len(pages), 3):
                store.put_many(pages[i:i + 3])
                time.sleep(rng.random() * 0.01)
            store.put_manifest(f"w{seed}-{a}", json.dumps({"pages": [p.key for p in pages]}).encode())
            written += 1
    done.set()
    out.put(("writer", {"written": written}, []))


def reader_main(store_path: str, start, writer_done, reader_id: int, out) -> None:
    """Until the writer is done (then one more pass): read every visible artifact, every page
    SHA-256-verified from LMDB (no host cache), the chain re-checked."""
    from paging import ROOT_KEY, PageStore

    reads, passes, seen, errors = 0, 0, 0, []
    with PageStore(store_path, store_config(host_budget_bytes=0)) as store:
        start.wait(120)  # everyone open: the writer starts now
        while True:
            last = writer_done.is_set()
            ids = store.list_manifests()
            for artifact_id in ids:
                try:
                    keys = json.loads(store.get_manifest(artifact_id))["pages"]
                    parent = ROOT_KEY
                    for key in keys:
                        page = store.get(key)  # from LMDB, SHA-256-verified
                        assert page.parent_key == parent, "chain broken"
                        parent = key
                        reads += 1
                except Exception as exc:  # noqa: BLE001 - reported to the parent
                    errors.append(f"{artifact_id}: {type(exc).__name__}: {exc}")
            passes += 1
            if last:
                seen = len(ids)
                break
    out.put((f"reader{reader_id}", {"reads": reads, "passes": passes, "seen": seen}, errors[:5]))


def hold_reader_main(store_path: str, ready) -> None:
    """Open a read transaction and hold it until killed (leaves a stale reader slot)."""
    import lmdb

    env = lmdb.open(store_path, max_dbs=4, subdir=True, readonly=True, lock=True)
    txn = env.begin()
    txn.stat(env.open_db(b"pages", txn=txn, create=False))
    ready.set()
    time.sleep(600)


def run_readers_and_writer(store_path: str, *, num_readers: int = 4, num_artifacts: int = 12,
                           seed: int = 0, timeout: float = 180.0) -> dict[str, Any]:
    """1 writer + `num_readers` readers in `spawn` processes; returns reads, errors, artifacts."""
    import multiprocessing as mp

    from paging import PageStore

    with PageStore(store_path, store_config()):
        pass  # create it, so readers can open it before the writer writes
    ctx = mp.get_context("spawn")
    out, done, start = ctx.Queue(), ctx.Event(), ctx.Barrier(num_readers + 1)
    writer = ctx.Process(target=writer_main, args=(store_path, num_artifacts, seed, start, done, out))
    readers = [ctx.Process(target=reader_main, args=(store_path, start, done, r, out)) for r in range(num_readers)]
    for p in [*readers, writer]:
        p.start()
    results = [out.get(timeout=timeout) for _ in range(1 + num_readers)]
    for p in [writer, *readers]:
        p.join(timeout=30)
    by_name = {name: (info, errors) for name, info, errors in results}
    readers_info = [info for name, (info, _) in by_name.items() if name != "writer"]
    return {"written": by_name["writer"][0]["written"],
            "reads": sum(i["reads"] for i in readers_info),
            "passes": sum(i["passes"] for i in readers_info),
            "seen_at_end": [i["seen"] for i in readers_info],
            "errors": [e for _, (_, errs) in by_name.items() for e in errs],
            "exit_codes": [p.exitcode for p in [writer, *readers]]}


def stale_reader_reclaimed(store_path: str) -> dict[str, Any]:
    """A reader killed with SIGKILL inside a read transaction; the store reclaims its slot."""
    import multiprocessing as mp

    from paging import PageStore

    ctx = mp.get_context("spawn")
    with PageStore(store_path, store_config()) as store:
        ready = ctx.Event()
        holder = ctx.Process(target=hold_reader_main, args=(store_path, ready))
        holder.start()
        assert ready.wait(60), "holder did not start"
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        freed = store.lmdb_tier.reader_check()
        still_reads = store.check()["corrupt"] == 0
    return {"freed": freed, "store_ok": still_reads, "exitcode": holder.exitcode}


# ----------------------------------------------------------------------------- SIGKILL sweeps
class ForkRunner:
    """Run a target in a forked child and SIGKILL it `delay` seconds after it says "go".

    The forkserver has imported torch/transformers/tieredkv (nothing executed), so each child
    starts in milliseconds. Children load the tiny model themselves before signalling.
    """

    PRELOAD = ["torch", "transformers", "transformers.models.llama.modeling_llama", "tieredkv.artifacts.artifact",
               "tieredkv.models.loading", "tieredkv.artifacts.portable", "testkit.faults"]

    def __init__(self) -> None:
        import multiprocessing as mp

        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(self.PRELOAD)

    def run(self, target, args: tuple, delay: float | None, timeout: float = 120.0) -> dict[str, Any]:
        go = self.ctx.Event()
        p = self.ctx.Process(target=target, args=(*args, go))
        p.start()
        deadline = time.monotonic() + timeout
        while not go.wait(0.05):
            if p.exitcode is not None or time.monotonic() > deadline:
                p.kill()
                p.join()
                raise RuntimeError(f"child {target.__name__} never got ready (exit {p.exitcode})")
        t0 = time.monotonic()
        if delay is None:
            p.join(timeout)
        else:
            time.sleep(delay)
            p.kill()  # SIGKILL
            p.join(timeout)
        return {"exitcode": p.exitcode, "killed": p.exitcode == -signal.SIGKILL,
                "elapsed": time.monotonic() - t0}

    def call(self, target, args: tuple, timeout: float = 120.0) -> dict[str, Any]:
        """Run `target(*args, out)` in a forked child to completion; what it put on `out`."""
        out = self.ctx.Queue()
        p = self.ctx.Process(target=target, args=(*args, out))
        p.start()
        try:
            return out.get(timeout=timeout)
        finally:
            p.join(30)


def deposit_target(store_path: str, text: str, go) -> None:
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model

    lm = load_model(MODEL)
    warm_up(lm)
    with PageStore(store_path, store_config()) as store:
        go.set()
        deposit(lm, text, store, page_size=PAGE_SIZE)


def warm_up(lm) -> None:
    """One thread (robust timing on a shared machine) and one small prefill: the first forward of
    a process pays for lazy initialisation."""
    import torch
    from transformers import DynamicCache

    torch.set_num_threads(1)

    from tieredkv.artifacts.artifact import prefill

    prefill(lm, list(range(2 * PAGE_SIZE)), DynamicCache(config=lm.model.config), page_size=PAGE_SIZE)


def export_target(store_path: str, artifact_id: str, path: str, go) -> None:
    from paging import PageStore
    from tieredkv.artifacts.portable import export_artifact

    with PageStore(store_path, store_config()) as store:
        go.set()
        export_artifact(store, artifact_id, path)


def deposit_kill_run(runner: ForkRunner, template: Path, work: Path, text: str, delay: float | None,
                     base_ids: list[str]) -> dict[str, Any]:
    """Deposit `text` into a copy of `template` in a child, SIGKILL it after `delay`, audit the store.

    survived: every page verifies, no artifact is partial, the artifacts already there are intact.
    state: what the kill left of the new deposit — "nothing", "pages only" (invisible) or "complete".
    """
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    run = runner.run(deposit_target, (str(work), text), delay)
    audit = audit_store(work)
    new = set(audit["artifacts"]) - set(base_ids)
    state = "complete" if new else ("pages only" if audit["orphan_pages"] else "nothing")
    survived = (audit["corrupt"] == 0 and not audit["partial"] and set(base_ids) <= set(audit["artifacts"])
                and len(new) <= 1)
    shutil.rmtree(work, ignore_errors=True)
    return {**run, "delay": delay, "state": state, "survived": survived,
            "lost": not set(base_ids) <= set(audit["artifacts"]), "audit": audit}


def export_kill_run(runner: ForkRunner, store_path: Path, artifact_id: str, path: Path, old: bytes, new_sha: str,
                    delay: float | None) -> dict[str, Any]:
    """Export over an existing file in a child, SIGKILL it after `delay`: old file or new, never torn."""
    from safefiles import remove_stale_temps

    path.write_bytes(old)
    run = runner.run(export_target, (str(store_path), artifact_id, str(path)), delay)
    sha = sha256_file(path)
    state = {hashlib.sha256(old).hexdigest(): "old", new_sha: "new"}.get(sha, "torn")
    temps = [n for n in os.listdir(path.parent) if n.startswith(f".{path.name}.")]
    cleaned = remove_stale_temps(path)
    left = [n for n in os.listdir(path.parent) if n.startswith(f".{path.name}.")]
    return {**run, "delay": delay, "state": state, "survived": state != "torn", "temps_left_by_kill": len(temps),
            "temps_after_cleanup": len(left), "cleaned": len(cleaned)}


def make_store(path: str | os.PathLike, texts: list[str], lm=None) -> list[str]:
    """A store holding one deposit per text; returns the artifact ids."""
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model

    lm = lm or load_model(MODEL)
    with PageStore(path, store_config()) as store:
        return [deposit(lm, t, store, page_size=PAGE_SIZE).artifact_id for t in texts]


# ----------------------------------------------------------------------------- resource limits
def fsize_target(what: str, limit: int, store_path: str, arg: str, out_path: str | None, out) -> None:
    """Under RLIMIT_FSIZE=`limit`: export `arg` to `out_path`, import file `arg`, or deposit text `arg`."""
    from paging import PageStore
    from tieredkv.artifacts.portable import export_artifact, import_artifact

    if what == "deposit":
        from tieredkv.artifacts.artifact import deposit
        from tieredkv.models.loading import load_model

        lm = load_model(MODEL)
        warm_up(lm)
    with_fsize_limit(limit)
    with PageStore(store_path, store_config()) as store:
        if what == "export":
            out.put(_outcome(lambda: export_artifact(store, arg, out_path)["file_bytes"]))
        elif what == "import":
            out.put(_outcome(lambda: import_artifact(arg, store).artifact_id))
        else:
            out.put(_outcome(lambda: deposit(lm, arg, store, page_size=PAGE_SIZE).artifact_id))


def with_fsize_limit(limit: int) -> None:
    """Cap the size of files this process writes; writes past it fail with EFBIG (no SIGXFSZ)."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _outcome(fn) -> dict[str, Any]:
    try:
        result = fn()
        return {"ok": True, "result": result}
    except Exception as exc:  # noqa: BLE001 - the parent classifies it
        return {"ok": False, "error": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc)[:500]}


# ----------------------------------------------------------------------------- CLI children
def _cmd_cross_export(a) -> dict[str, Any]:
    """Process 1: deposit, export, and compute the fresh continuation logits here."""
    import torch

    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.artifacts.portable import export_artifact
    from tieredkv.models.loading import load_model
    from tieredkv.provenance.domain import sha256_tensor

    lm = load_model(a.model)
    prefix, cont = lm.codec.encode(a.prefix), lm.codec.encode(a.continuation)
    with PageStore(a.store, store_config()) as store:
        art = deposit(lm, prefix, store, page_size=a.page_size)
        summary = export_artifact(store, art.artifact_id, a.out)
    fresh = fresh_continuation_logits(lm, prefix, cont, a.page_size)
    return {"artifact": art.artifact_id, "file_sha256": summary["file_sha256"], "fresh_sha256": sha256_tensor(fresh),
            "num_threads": torch.get_num_threads(), "cwd": os.getcwd(), "fingerprint": lm.fingerprint}


def _cmd_cross_import(a) -> dict[str, Any]:
    """Process 2: import into a fresh store, graft, continue, hash the continuation's logits."""
    import torch

    from paging import PageStore
    from tieredkv.artifacts.artifact import graft
    from tieredkv.artifacts.portable import import_artifact
    from tieredkv.models.loading import load_model
    from tieredkv.provenance.domain import sha256_tensor

    lm = load_model(a.model)
    cont = lm.codec.encode(a.continuation)
    with PageStore(a.store, store_config()) as store:
        art = import_artifact(a.file, store, expected_fingerprint=lm.fingerprint)
    with PageStore(a.store, store_config()) as store:  # reopened: the graft reads verified bytes from disk
        cache = graft(lm, art, store)
        logits = continuation_logits(lm, cache, cont, art.num_tokens, art.page_size)
        reads = store.stats()["integrity"]["verified_reads"]
    return {"artifact": art.artifact_id, "grafted_sha256": sha256_tensor(logits), "verified_reads": reads,
            "num_threads": torch.get_num_threads(), "cwd": os.getcwd(), "fingerprint": lm.fingerprint}


def continuation_logits(lm, cache, cont: list[int], start: int, page_size: int):
    """Logits [C, vocab] of `cont` prefilled (canonical schedule) at [start, start + C) after `cache`."""
    import torch

    from tieredkv.artifacts.artifact import prefill

    chunks = []
    prefill(lm, cont, cache, start=start, page_size=page_size,
            on_chunk=lambda _s, _e, out: chunks.append(out.logits[0]), logits_to_keep=0)
    return torch.cat(chunks, 0)


def fresh_continuation_logits(lm, prefix: list[int], cont: list[int], page_size: int):
    """The baseline: prefix then continuation prefilled fresh on a DynamicCache, same schedule
    (the schedule stops at the prefix end, as a graft does; see tieredkv.provenance.verify)."""
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill

    cache = DynamicCache(config=lm.model.config)
    prefill(lm, prefix, cache, page_size=page_size)
    return continuation_logits(lm, cache, cont, len(prefix), page_size)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("cross-export")
    e.add_argument("--model", default=MODEL)
    e.add_argument("--store", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--prefix", required=True)
    e.add_argument("--continuation", required=True)
    e.add_argument("--page-size", type=int, default=PAGE_SIZE)
    e.set_defaults(fn=_cmd_cross_export)
    i = sub.add_parser("cross-import")
    i.add_argument("--model", default=MODEL)
    i.add_argument("--store", required=True)
    i.add_argument("--file", required=True)
    i.add_argument("--continuation", required=True)
    i.set_defaults(fn=_cmd_cross_import)
    a = p.parse_args(argv)
    print(json.dumps(a.fn(a)))
    return 0


def run_child(args: list[str], *, cwd: str | os.PathLike, env: dict[str, str] | None = None,
              timeout: float = 300) -> dict[str, Any]:
    """Run `python testkit/faults.py ARGS` in a fresh interpreter; its JSON result."""
    import subprocess

    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, str(REPO / "testkit" / "faults.py"), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
