"""Remote tier throughput and graft time, against a real redis-server.

1. Transfer: pages/s and bytes/s of RemoteTier.put_many / get_many (framing + SHA-256
   verification included) against raw pipelined SET / GET of the very same byte strings, in
   the same run, on the same server, with the same pipeline batches.
2. Graft: time to graft an artifact into a fresh cache from the remote (empty local LMDB),
   from LMDB (cold host tier) and to recompute it (canonical prefill), with the SHA-256 of
   the continuation logits after each (they must be equal).

    python -m bench.remote_tier                       # markdown table
    python -m bench.remote_tier --json --out bench/results/remote_tier.json
    python -m bench.remote_tier --url redis://host:6379/0 --models tiny-llama

Without --url a redis-server (or valkey-server) is started on a free loopback port in a temp
dir and stopped afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis
import torch

from paging import ROOT_KEY, Page, PageLayout, PageStore, RemoteTier, StoreConfig

REPO = Path(__file__).resolve().parents[1]

# name -> (layers, kv heads, head_dim, page tokens): the page geometries of the models here
GEOMETRIES = {"tiny-llama": (2, 2, 16, 32), "smollm2": (30, 3, 64, 128)}
FP = "5e" * 32


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an existing server (default: start one locally)")
    p.add_argument("--transfer-mib", type=int, default=64, help="MiB moved per geometry and op")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--models", default="tiny-llama,smollm2")
    p.add_argument("--tokens", default="tiny-llama=4096,smollm2=1024",
                   help="prefix tokens per model (smollm2 prefill is slow on a small CPU)")
    p.add_argument("--continuation", type=int, default=16)
    p.add_argument("--batch", type=int, default=32, help="pages per pipeline")
    p.add_argument("--json", action="store_true", help="JSON on stdout, table on stderr")
    p.add_argument("--out", help="also write the JSON here")
    return p.parse_args()


def sha256_bytes(chunks) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


# -- 1. transfer ----------------------------------------------------------------------
def make_pages(geometry: tuple[int, int, int, int], n: int) -> list[Page]:
    layers, heads, dim, tokens = geometry
    layout = PageLayout(layers, heads, dim, "float32", tokens)
    g = torch.Generator().manual_seed(0)
    pages, parent = [], ROOT_KEY
    for i in range(n):
        kv = torch.randn(layers, 2, heads, tokens, dim, generator=g)  # [L, 2, Hkv, T, D]
        ids = [(i + t) % 256 for t in range(tokens)]
        pages.append(Page.seal(layout, FP, parent, i * tokens, ids, list(kv[:, 0]), list(kv[:, 1])))
        parent = pages[-1].key
    return pages


def timed(fn, repeats: int, reset=None) -> float:
    """Median seconds of `repeats` runs after one warm-up; `reset()` runs untimed before each."""
    times = []
    for i in range(repeats + 1):
        if reset is not None:
            reset()
        t = time.perf_counter()
        fn()
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def transfer_rows(url: str, args: argparse.Namespace) -> list[dict]:
    rows = []
    client = redis.Redis.from_url(url)
    for name, geometry in GEOMETRIES.items():
        page_nbytes = PageLayout(*geometry[:3], "float32", geometry[3]).payload_nbytes(geometry[3])
        n = max(4, (args.transfer_mib << 20) // page_nbytes)
        pages = make_pages(geometry, n)
        wire = [p.to_bytes() for p in pages]
        tier = RemoteTier(f"{url}?batch={args.batch}", fingerprints=[FP])
        names = [tier.page_name(FP, p.key) for p in pages]
        batches = [list(range(i, min(n, i + args.batch))) for i in range(0, n, args.batch)]
        batches = [b2 for b in batches for b2 in _split_bytes(b, wire)]

        def raw_set():
            for b in batches:
                pipe = client.pipeline(transaction=False)
                for i in b:
                    pipe.set(names[i], wire[i])
                pipe.execute()

        got: list = []

        def raw_get():
            got.clear()
            for b in batches:
                pipe = client.pipeline(transaction=False)
                for i in b:
                    pipe.get(names[i])
                got.extend(pipe.execute())

        fetched: list = []

        def tier_get():
            fetched[:] = tier.get_many(p.key for p in pages)

        flush = client.flushall
        t_raw_set = timed(raw_set, args.repeats, flush)
        t_tier_put = timed(lambda: tier.put_many(pages), args.repeats, flush)
        t_raw_get = timed(raw_get, args.repeats)
        t_tier_get = timed(tier_get, args.repeats)
        t_verify = timed(lambda: [Page.from_bytes(w, expected_key=p.key)
                                  for w, p in zip(wire, pages)], args.repeats)
        assert got == wire and fetched == pages, "bytes changed in transit"
        nbytes = sum(len(w) for w in wire)
        for op, seconds in (("put", t_tier_put), ("raw SET", t_raw_set),
                            ("get (verified)", t_tier_get), ("raw GET", t_raw_get),
                            ("verify only (no I/O)", t_verify)):
            rows.append({"geometry": name, "op": op, "pages": n, "page_bytes": len(wire[0]),
                         "seconds": round(seconds, 4), "pages_per_s": round(n / seconds, 1),
                         "MiB_per_s": round(nbytes / seconds / 2**20, 1)})
        rows[-5]["input_sha256"] = sha256_bytes(wire)
        rows[-3]["output_sha256"] = sha256_bytes(p.to_bytes() for p in fetched)
        tier.close()
        client.flushall()
    client.close()
    return rows


def _split_bytes(batch: list[int], wire: list[bytes], cap: int = 64 << 20):
    """Split like RemoteTier does (at most 64 MiB of payload per pipeline)."""
    out, cur, size = [], [], 0
    for i in batch:
        if cur and size + len(wire[i]) > cap:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += len(wire[i])
    return out + [cur] if cur else out


# -- 2. graft -------------------------------------------------------------------------
def graft_rows(url: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import deposit, graft, prefill
    from tieredkv.models.loading import load_model
    from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_ids, sha256_tensor
    from tieredkv.question.corpus import python_reference, text_sha256

    tokens = dict(kv.split("=") for kv in args.tokens.split(","))
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        lm = load_model(model)
        ps = lm.default_page_size
        ids = lm.codec.encode(python_reference())
        n = int(tokens.get(model, 2048))
        assert len(ids) >= n + args.continuation, "corpus too short"
        prefix, cont = ids[:n], ids[n:n + args.continuation]

        def continuation_sha(cache) -> str:
            logits = []
            prefill(lm, cont, cache, start=n, page_size=ps, logits_to_keep=0,
                    on_chunk=lambda s, e, out: logits.append(out.logits[0]))
            return sha256_tensor(torch.cat(logits))

        base = {"model": model, "model_fingerprint": lm.fingerprint, "tokens": n,
                "page_size": ps, "input_sha256": sha256_ids(prefix + cont),
                "corpus_sha256": text_sha256(python_reference()),
                "domain_id": domain_id(determinism_domain(lm.model, lm.fingerprint, ps))}
        redis.Redis.from_url(url).flushall()
        cfg = dict(host_budget_bytes=4 << 30, lmdb_map_size=4 << 30)
        t = time.perf_counter()
        with PageStore(tmp / f"{model}-a", StoreConfig(remote=url, **cfg)) as a:
            art = deposit(lm, prefix, a, page_size=ps)
            nbytes = sum(a.get(k).nbytes for k in art.page_keys)
        t_deposit = time.perf_counter() - t

        def measure(how: str, fn) -> None:
            t = time.perf_counter()
            cache = fn()
            seconds = time.perf_counter() - t
            rows.append({**base, "source": how, "pages": len(art.page_keys),
                         "payload_MiB": round(nbytes / 2**20, 2), "seconds": round(seconds, 4),
                         "tokens_per_s": round(n / seconds, 1),
                         "continuation_logits_sha256": continuation_sha(cache)})

        def from_remote(prefetch: bool):
            d = tmp / f"{model}-remote-{prefetch}"
            with PageStore(d, StoreConfig(remote=url, **cfg)) as b:
                if prefetch:
                    b.prefetch(art.page_keys)  # one pipelined read of every page
                return graft(lm, art.artifact_id, b)

        def from_lmdb():
            with PageStore(tmp / f"{model}-a", StoreConfig(**cfg)) as a:  # host tier cold
                return graft(lm, art.artifact_id, a)

        def recompute():
            cache = DynamicCache(config=lm.model.config)
            prefill(lm, prefix, cache, page_size=ps)
            return cache

        measure("remote (page by page)", lambda: from_remote(False))
        measure("remote (prefetch, pipelined)", lambda: from_remote(True))
        measure("LMDB", from_lmdb)
        measure("recompute (prefill)", recompute)
        rows.append({**base, "source": "deposit (prefill + seal + LMDB + remote)",
                     "pages": len(art.page_keys), "payload_MiB": round(nbytes / 2**20, 2),
                     "seconds": round(t_deposit, 4), "tokens_per_s": round(n / t_deposit, 1),
                     "continuation_logits_sha256": None})
    return rows


# -- report ---------------------------------------------------------------------------
def hardware() -> dict:
    from bench.report import environment

    return {**environment(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
            "redis_py": redis.__version__}


def markdown(report: dict) -> str:
    lines = [f"hardware: {report['hardware']}", f"server: {report['server']}", "",
             "| geometry | op | pages | bytes/page | pages/s | MiB/s |",
             "|---|---|---:|---:|---:|---:|"]
    for r in report["transfer"]:
        lines.append(f"| {r['geometry']} | {r['op']} | {r['pages']} | {r['page_bytes']} | "
                     f"{r['pages_per_s']} | {r['MiB_per_s']} |")
    lines += ["", "| model | tokens | pages | MiB | graft source | seconds | tokens/s | "
              "continuation logits sha256 |", "|---|---:|---:|---:|---|---:|---:|---|"]
    for r in report["graft"]:
        sha = (r["continuation_logits_sha256"] or "-")[:16]
        lines.append(f"| {r['model']} | {r['tokens']} | {r['pages']} | {r['payload_MiB']} | "
                     f"{r['source']} | {r['seconds']} | {r['tokens_per_s']} | {sha} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    hw = hardware()
    with tempfile.TemporaryDirectory(prefix="tieredkv-bench-remote-") as tmp:
        server = None
        if args.url is None:
            from testkit.redis_server import RedisServer

            server = RedisServer(Path(tmp) / "redis").start()
            url = server.url
        else:
            url = args.url
        try:
            tier = RemoteTier(url)
            server_info = {**tier.server_info(), "rtt_ms": round(1e3 * min(
                tier.ping() for _ in range(20)), 3), "started_here": server is not None}
            tier.close()
            transfer = transfer_rows(url, args)
            graft = graft_rows(url, args, Path(tmp))
        finally:
            if server is not None:
                server.stop()
    for model in {r["model"] for r in graft}:
        shas = {r["continuation_logits_sha256"] for r in graft
                if r["model"] == model and r["continuation_logits_sha256"]}
        assert len(shas) == 1, f"{model}: graft and recompute logits differ: {shas}"
    config = {k: v for k, v in vars(args).items() if k not in ("json", "out", "url")}
    report = {"hardware": hw, "server": server_info, "config": config,
              "transfer": transfer, "graft": graft,
              "seconds": round(time.perf_counter() - start, 1)}
    table = markdown(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(table, file=sys.stderr)
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(table)


if __name__ == "__main__":
    main()
