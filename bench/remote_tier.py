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

The report's `tieredkv recheck` recipe (`--recheck-only`, about a minute) moves the same pages once,
untimed, and grafts the last model's prefix from every source: the token ids' hash must be equal on
any machine, the pages' and the logits' hashes in the same determinism domain, and anywhere the pages
must come back unchanged and every graft's continuation logits equal the recompute's.
"""

from __future__ import annotations

import argparse
import contextlib
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

from bench.lib.report import print_recheck, recheck_block
from paging import ROOT_KEY, Page, PageLayout, PageStore, RemoteTier, StoreConfig

REPO = Path(__file__).resolve().parents[1]

# name -> (layers, kv heads, head_dim, page tokens): the page geometries of the models here
GEOMETRIES = {"tiny-llama": (2, 2, 16, 32), "smollm2": (30, 3, 64, 128)}
FP = "5e" * 32


def parser() -> argparse.ArgumentParser:
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
    p.add_argument("--threads", type=int, help="torch threads (recorded in the hardware and the recipe)")
    p.add_argument("--recheck-only", action="store_true",
                   help="the pages moved once and the last model's grafts, untimed: print {outputs, inputs, "
                        "relations, domain} without writing (`tieredkv recheck`)")
    return p


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
def graft_rows(url: str, args: argparse.Namespace, tmp: Path, domains: dict | None = None) -> list[dict]:
    """The graft rows of every model in args.models; `domains` (if given) gets each model's determinism domain."""
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

        domain = determinism_domain(lm.model, lm.fingerprint, ps)
        if domains is not None:
            domains[model] = domain
        base = {"model": model, "model_fingerprint": lm.fingerprint, "tokens": n,
                "page_size": ps, "input_sha256": sha256_ids(prefix + cont),
                "corpus_sha256": text_sha256(python_reference()), "domain_id": domain_id(domain)}
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


# -- the recheck recipe -----------------------------------------------------------------
def transfer_hashes(url: str, args: argparse.Namespace) -> list[dict]:
    """The pages of every geometry put and fetched once, untimed: the hashes of transfer_rows' "put" and
    "get (verified)" rows."""
    rows = []
    for name, geometry in GEOMETRIES.items():
        page_nbytes = PageLayout(*geometry[:3], "float32", geometry[3]).payload_nbytes(geometry[3])
        pages = make_pages(geometry, max(4, (args.transfer_mib << 20) // page_nbytes))
        tier = RemoteTier(f"{url}?batch={args.batch}", fingerprints=[FP])
        tier.put_many(pages)
        fetched = tier.get_many(p.key for p in pages)
        tier.close()
        redis.Redis.from_url(url).flushall()
        rows += [{"geometry": name, "op": "put", "input_sha256": sha256_bytes(p.to_bytes() for p in pages)},
                 {"geometry": name, "op": "get (verified)",
                  "output_sha256": sha256_bytes(p.to_bytes() for p in fetched)}]
    return rows


def recipe_model(models: str) -> str:
    return [m for m in models.split(",") if m][-1]


def recipe_hashes(transfer: list[dict], graft: list[dict], model: str
                  ) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from the transfer rows and `model`'s graft rows, the names that hash inputs, and
    the relations (pages back unchanged, every graft's logits equal to the recompute's)."""
    outputs, relations = {}, {}
    for r in transfer:
        if r["op"] == "put":
            outputs[f"transfer {r['geometry']} pages"] = r["input_sha256"]
        elif r["op"] == "get (verified)":
            outputs[f"transfer {r['geometry']} fetched"] = r["output_sha256"]
            relations[f"transfer {r['geometry']}: fetched = put"] = (
                r["output_sha256"] == outputs.get(f"transfer {r['geometry']} pages"))
    rows = [r for r in graft if r["model"] == model]
    name = f"{model} {rows[0]['tokens']}"
    inputs = {"corpus": rows[0]["corpus_sha256"], f"{name} token ids": rows[0]["input_sha256"]}
    ref = next(r["continuation_logits_sha256"] for r in rows if r["source"].startswith("recompute"))
    for r in rows:
        if r["continuation_logits_sha256"]:
            outputs[f"{name} {r['source']} continuation logits"] = r["continuation_logits_sha256"]
            if not r["source"].startswith("recompute"):
                relations[f"{name} {r['source']} = recompute"] = r["continuation_logits_sha256"] == ref
    return {**inputs, **outputs}, sorted(inputs), relations


def recipe_args(config: dict, threads: int) -> list[str]:
    """`--recheck-only` with the run's pages and the last model's prefix."""
    model = recipe_model(config["models"])
    tokens = dict(kv.split("=") for kv in config["tokens"].split(","))
    return ["--models", model, "--tokens", f"{model}={tokens.get(model, 2048)}", "--transfer-mib",
            str(config["transfer_mib"]), "--batch", str(config["batch"]), "--continuation", str(config["continuation"]),
            "--threads", str(threads), "--recheck-only"]


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(report["config"], threads)


def report_hashes(report: dict) -> dict[str, str]:
    return recipe_hashes(report["transfer"], report["graft"], recipe_model(report["config"]["models"]))[0]


# -- report ---------------------------------------------------------------------------
def hardware() -> dict:
    from bench.lib.report import environment

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


@contextlib.contextmanager
def redis_url(url: str | None, tmp: str):
    """`url`, else a redis-server started here for the run (stopped after it): (url, started here)."""
    if url is not None:
        yield url, False
        return
    from testkit.redis_server import RedisServer

    with RedisServer(Path(tmp) / "redis") as server:
        yield server.url, True


def measure(args, tmp: str, domains: dict) -> tuple[dict, list, list]:
    """(the server's info, the transfer rows or hashes, the graft rows) against `args.url` or a local server."""
    with redis_url(args.url, tmp) as (url, started_here):
        tier = RemoteTier(url)
        server_info = {**tier.server_info(), "rtt_ms": round(1e3 * min(tier.ping() for _ in range(20)), 3),
                       "started_here": started_here}
        tier.close()
        if args.recheck_only:
            args.models = recipe_model(args.models)
            transfer = transfer_hashes(url, args)
        else:
            transfer = transfer_rows(url, args)
        return server_info, transfer, graft_rows(url, args, Path(tmp), domains)


def check_grafts_equal(graft: list[dict]) -> None:
    for model in {r["model"] for r in graft}:
        shas = {r["continuation_logits_sha256"] for r in graft
                if r["model"] == model and r["continuation_logits_sha256"]}
        assert len(shas) == 1, f"{model}: graft and recompute logits differ: {shas}"


def emit(report: dict, args) -> None:
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


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    hw = hardware()
    domains: dict = {}
    with tempfile.TemporaryDirectory(prefix="tieredkv-bench-remote-") as tmp:
        server_info, transfer, graft = measure(args, tmp, domains)
    check_grafts_equal(graft)
    model = recipe_model(args.models)
    outputs, inputs, relations = recipe_hashes(transfer, graft, model)
    if args.recheck_only:
        print_recheck(outputs, domains[model], inputs, relations)
        return 0
    config = {k: v for k, v in vars(args).items() if k not in ("json", "out", "url", "recheck_only")}
    emit({"hardware": hw, "server": server_info, "config": config, "transfer": transfer, "graft": graft,
          "seconds": round(time.perf_counter() - start, 1),
          "recheck": recheck_block("bench.remote_tier", recipe_args(config, torch.get_num_threads()), outputs,
                                   inputs=inputs, relations=relations, domain=domains[model])}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
