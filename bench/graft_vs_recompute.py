"""Time to first token: recompute a prefix, or graft its deposited KV pages from each tier.

For each model and prefix length N (tokens of the Python language reference, repeated if short),
from one page up, every path ends with the same prompt prefilled after the prefix:

    recompute     canonical prefill of the N tokens, then the prompt                  -> first token
    host          graft from the host tier (verified when admitted)
    lmdb          store reopened (host tier empty): graft from LMDB, every page's digest verified,
                  with data.mdb in the OS page cache
    lmdb_cold     the same, data.mdb evicted from the OS page cache first (read from disk)
    redis         an empty local store backed by a real redis-server: pages fetched (one pipelined
                  read), verified, then grafted

Grafts restore into a preallocated buffer (`graft(buffer=)`, as a session that grafts often does).
Each repeat runs every path once, interleaved; medians are reported with every repeat. Grafted
first-token logits must be SHA-256-equal to the recompute's. Per tier the report gives the speedup
at each N and the crossover (the shortest N from which the graft is faster at every longer N).
`restore` rows time `restore_pages` from LMDB (digest-verified) against `np.copyto` of the same
bytes into a preallocated buffer, interleaved: the verified restore as a fraction of memcpy.

    python -m bench.graft_vs_recompute                                  # table; JSON to --out
    python -m bench.graft_vs_recompute --models tiny-llama=32,1024 --repeats 2

The report's `tieredkv recheck` recipe re-runs the last model at its shortest prefix, every path once
(`--models smollm2=128 --recheck-only`, seconds): the token ids' hashes must be equal on any machine,
each path's first-token logits hash-equal in the same determinism domain, and every graft's logits
equal to the recompute's anywhere.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bench.lib.common import drop_file_cache, environment, markdown_table, sha256_ids, timed, write_report
from bench.lib.report import print_recheck, recheck_block
from paging import PageLayout, PageStore, StoreConfig
from paging.restore import restore_nbytes
from testkit.redis_server import RedisServer
from tieredkv.artifacts.artifact import deposit, graft, prefill
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_tensor
from tieredkv.question.corpus import python_reference, text_sha256

PROMPT = "\n\nQuestion: which statement does the text above describe first?\nAnswer:"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "graft_vs_recompute.json"
DEFAULT_MODELS = "tiny-llama=32,128,512,2048,8192,32768;smollm2=128,512,2048,4096"
TIERS = ("host", "lmdb", "lmdb_cold", "redis")
STORE = dict(host_budget_bytes=8 << 30, lmdb_map_size=8 << 30)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS, help="model=N,N,...;model=N,... (prefix lengths in tokens)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every path (median reported)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--threads", type=int, help="torch threads (recorded in the environment and the recipe)")
    p.add_argument("--recheck-only", action="store_true",
                   help="run the recipe's subset (the last model's shortest prefix, every path once) and print "
                        "{outputs, inputs, relations, domain} without writing (`tieredkv recheck`)")
    return p


def parse_models(spec: str) -> list[tuple[str, list[int]]]:
    out = []
    for part in filter(None, spec.split(";")):
        model, _, lengths = part.partition("=")
        out.append((model.strip(), sorted(int(n) for n in lengths.split(","))))
    return out


# ----------------------------------------------------------------------------- one path, one repeat
@torch.inference_mode()
def recompute(lm, ids, prompt, page_size) -> tuple[float, torch.Tensor]:
    """(seconds, first-token logits [vocab]) of a canonical prefill of `ids`, then the prompt."""
    from transformers import DynamicCache

    with timed() as t:
        cache = DynamicCache(config=lm.model.config)
        prefill(lm, ids, cache, page_size=page_size)
        logits = prefill(lm, prompt, cache, start=len(ids), page_size=page_size)[0, -1]
    return t["s"], logits


class Paths:
    """The graft paths of one prefix; each returns (seconds, first-token logits). Only the hit is timed:
    a store is opened (and data.mdb evicted from the OS page cache) before the clock starts."""

    def __init__(self, lm, art, prompt, page_size, store_dir: Path, redis_url: str, tmp: Path):
        self.lm, self.art, self.prompt, self.ps = lm, art, prompt, page_size
        self.store_dir, self.redis_url, self.tmp = store_dir, redis_url, tmp
        layout = PageLayout.from_dict(art.layout)
        self.buffer = torch.ones(restore_nbytes(art.num_tokens, layout), dtype=torch.uint8)  # touched

    @torch.inference_mode()
    def _graft(self, store, before: Callable[[], Any] = lambda: None) -> tuple[float, torch.Tensor]:
        with timed() as t:
            before()
            cache = graft(self.lm, self.art, store, buffer=self.buffer)
            logits = prefill(self.lm, self.prompt, cache, start=self.art.num_tokens, page_size=self.ps)[0, -1]
        return t["s"], logits

    def host(self, warm_store) -> tuple[float, torch.Tensor]:
        return self._graft(warm_store)

    def lmdb(self, cold: bool) -> tuple[float, torch.Tensor]:
        with PageStore(self.store_dir, StoreConfig(**STORE)) as store:  # a fresh store: its host tier is empty
            if cold:
                drop_file_cache([self.store_dir / "data.mdb"])
            return self._graft(store)

    def redis(self) -> tuple[float, torch.Tensor]:
        with tempfile.TemporaryDirectory(dir=self.tmp) as d, \
                PageStore(Path(d) / "s", StoreConfig(remote=self.redis_url, **STORE)) as store:
            # one pipelined read; every page verified before it is kept
            return self._graft(store, before=lambda: store.prefetch(self.art.page_keys))


def interleave(fns: dict[str, Callable[[], tuple[float, Any]]], repeats: int) -> dict[str, list[tuple[float, Any]]]:
    """Each call once per repeat, the order rotated by one per repeat; each returns (seconds, result)."""
    out: dict[str, list[tuple[float, Any]]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out[name].append(fns[name]())
    return out


def measure_prefix(lm, ids, prompt, page_size, store_dir: Path, redis_url: str, tmp: Path,
                   repeats: int) -> list[dict[str, Any]]:
    """Deposit the prefix (extending the store's earlier ones), then every path interleaved: one row each."""
    with PageStore(store_dir, StoreConfig(remote=redis_url, **STORE)) as store:
        with timed() as t_dep:
            art = deposit(lm, ids, store, page_size=page_size)  # write-through: the redis server holds it too
        kv_bytes = sum(store.get(k).nbytes for k in art.page_keys)  # warms the host tier
        paths = Paths(lm, art, prompt, page_size, store_dir, redis_url, tmp)
        fns = {"recompute": lambda: recompute(lm, ids, prompt, page_size), "host": lambda: paths.host(store)}
        fns["host"]()  # warm up
        runs = interleave(fns, repeats)
    runs |= interleave({"lmdb": lambda: paths.lmdb(False), "lmdb_cold": lambda: paths.lmdb(True),
                        "redis": paths.redis}, repeats)
    ref = sha256_tensor(runs["recompute"][0][1])
    base = {"context_tokens": len(ids), "kv_bytes": kv_bytes, "pages": len(art.page_keys),
            "artifact": art.artifact_id, "root_sha256": art.root_sha256, "deposit_s": t_dep["s"]}
    return [summarize(name, runs[name], ref, base) for name in ("recompute", *TIERS)]


def summarize(path: str, runs: list[tuple[float, Any]], ref_sha: str, base: dict[str, Any]) -> dict[str, Any]:
    shas = {sha256_tensor(logits) for _, logits in runs}
    sha = shas.pop() if len(shas) == 1 else "differs between repeats"
    secs = [s for s, _ in runs]
    return {**base, "path": path, "ttft_s": statistics.median(secs), "ttft_s_all": secs,
            "first_token_logits_sha256": sha, "logits_sha256_equal_recompute": sha == ref_sha}


def restore_vs_memcpy(store_dir: Path, keys: list[str], repeats: int) -> dict[str, Any]:
    """restore_pages from LMDB (verified, into a preallocated buffer) against np.copyto of the same bytes."""
    with PageStore(store_dir, StoreConfig(**STORE)) as store:
        payloads = np.frombuffer(b"".join(store.lmdb_tier.get(k).payload for k in keys), dtype=np.uint8)
    dst = np.ones_like(payloads)
    buffer = torch.ones(len(payloads), dtype=torch.uint8)

    def restore():
        with PageStore(store_dir, StoreConfig(**STORE)) as store:
            with timed() as t:  # the store's open is not the restore's
                store.restore(keys, buffer=buffer)
        return t["s"], None

    def memcpy():
        with timed() as t:
            np.copyto(dst, payloads)
        return t["s"], None

    runs = interleave({"restore": restore, "memcpy": memcpy}, repeats + 1)
    restore_s = [s for s, _ in runs["restore"][1:]]  # the first is a warm-up
    memcpy_s = [s for s, _ in runs["memcpy"][1:]]
    return {"pages": len(keys), "nbytes": len(payloads), "restore_s_all": restore_s, "memcpy_s_all": memcpy_s,
            "restore_gb_per_s": len(payloads) / statistics.median(restore_s) / 1e9,
            "memcpy_gb_per_s": len(payloads) / statistics.median(memcpy_s) / 1e9,
            "restore_vs_memcpy": statistics.median(memcpy_s) / statistics.median(restore_s)}


# ----------------------------------------------------------------------------- per model, crossover
def run_model(model: str, lengths: list[int], repeats: int, redis_url: str, tmp: Path) -> dict[str, Any]:
    lm = load_model(model)
    page_size = lm.default_page_size
    corpus = lm.codec.encode(python_reference())
    ids_all = (corpus * (max(lengths) // len(corpus) + 1))[:max(lengths)]
    prompt = lm.codec.encode(PROMPT)
    recompute(lm, ids_all[:2 * page_size], prompt, page_size)  # warm up: fault the weights in
    store_dir = tmp / f"{model}-store"
    rows = []
    for n in lengths:
        print(f"# {model} N={n} ...", file=sys.stderr)
        rows += measure_prefix(lm, ids_all[:n], prompt, page_size, store_dir, redis_url, tmp, repeats)
    restore = restore_vs_memcpy(store_dir, load_keys(store_dir, rows[-1]["artifact"]), repeats)
    add_speedups(rows)
    domain = determinism_domain(lm.model, lm.fingerprint, page_size)
    return {"model": model, "model_fingerprint": lm.fingerprint, "page_size": page_size, "domain": domain,
            "domain_id": domain_id(domain),
            "inputs": {str(n): sha256_ids(ids_all[:n]) for n in lengths}, "prompt_token_ids_sha256": sha256_ids(prompt),
            "rows": rows, "crossover_tokens": crossover(rows), "restore": restore}


def load_keys(store_dir: Path, artifact_id: str) -> list[str]:
    from tieredkv.artifacts.artifact import load_artifact

    with PageStore(store_dir, StoreConfig(**STORE)) as store:
        return list(load_artifact(store, artifact_id).page_keys)


def add_speedups(rows: list[dict[str, Any]]) -> None:
    base = {r["context_tokens"]: r["ttft_s"] for r in rows if r["path"] == "recompute"}
    for r in rows:
        r["speedup_vs_recompute"] = base[r["context_tokens"]] / r["ttft_s"]


def crossover(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Per tier: the shortest N from which its graft beats recompute at every measured N (None: never)."""
    out = {}
    for tier in TIERS:
        wins = sorted((r["context_tokens"], r["speedup_vs_recompute"] > 1) for r in rows if r["path"] == tier)
        losing = [n for n, win in wins if not win]
        later = [n for n, _ in wins if not losing or n > max(losing)]
        out[tier] = later[0] if later else None
    return out


# ----------------------------------------------------------------------------- the recheck recipe
def recipe_model(models_spec: str) -> tuple[str, int]:
    """The recipe's model and prefix: the last model of the run, at its shortest prefix."""
    model, lengths = parse_models(models_spec)[-1]
    return model, lengths[0]


def recipe_args(models_spec: str, threads: int) -> list[str]:
    model, n = recipe_model(models_spec)
    return ["--models", f"{model}={n}", "--threads", str(threads), "--recheck-only"]


def recipe_hashes(corpus_sha: str, m: dict[str, Any]) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from a model's entry (its shortest prefix), the names that hash inputs, and relations."""
    n = min(r["context_tokens"] for r in m["rows"])
    name = f"{m['model']} {n}"
    outputs = {"corpus": corpus_sha, f"{name} token ids": m["inputs"][str(n)],
               f"{m['model']} prompt token ids": m["prompt_token_ids_sha256"]}
    inputs = sorted(outputs)
    relations = {}
    for r in m["rows"]:
        if r["context_tokens"] == n:
            outputs[f"{name} {r['path']} first-token logits"] = r["first_token_logits_sha256"]
            if r["path"] != "recompute":
                relations[f"{name} {r['path']} logits = recompute"] = r["logits_sha256_equal_recompute"]
    return outputs, inputs, relations


def recipe_for_report(report: dict[str, Any], threads: int) -> list[str]:
    return recipe_args(report["config"]["models"], threads)


def report_hashes(report: dict[str, Any]) -> dict[str, str]:
    model, _ = recipe_model(report["config"]["models"])
    m = next(m for m in report["models"] if m["model"] == model)
    return recipe_hashes(report["inputs"]["corpus_sha256"], m)[0]


def recheck_block_of(args: argparse.Namespace, models: list[dict[str, Any]]) -> dict[str, Any]:
    model, _ = recipe_model(args.models)
    m = next(m for m in models if m["model"] == model)
    outputs, inputs, relations = recipe_hashes(text_sha256(python_reference()), m)
    return recheck_block("bench.graft_vs_recompute", recipe_args(args.models, torch.get_num_threads()), outputs,
                         inputs=inputs, relations=relations, domain=m["domain"])


def recheck_only(args: argparse.Namespace) -> int:
    model, n = recipe_model(args.models)
    with tempfile.TemporaryDirectory(prefix="bench-graft-") as tmp, RedisServer(Path(tmp) / "redis") as server:
        m = run_model(model, [n], 1, server.url, Path(tmp))
    outputs, inputs, relations = recipe_hashes(text_sha256(python_reference()), m)
    print_recheck(outputs, m["domain"], inputs, relations)
    return 0


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.recheck_only:
        return recheck_only(args)
    env, started, load_before = environment(), time.perf_counter(), os.getloadavg()
    models = []
    with tempfile.TemporaryDirectory(prefix="bench-graft-") as tmp, RedisServer(Path(tmp) / "redis") as server:
        for model, lengths in parse_models(args.models):
            models.append(run_model(model, lengths, args.repeats, server.url, Path(tmp)))
    report = {"bench": "graft_vs_recompute", "hardware": env, "models": models,
              "config": {"models": args.models, "repeats": args.repeats, "prompt": PROMPT, "store": STORE,
                         "ttft": "wall seconds from an empty cache to the first token's logits (prompt included)",
                         "graft_buffer": "preallocated, touched restore buffer (graft(buffer=))"},
              "inputs": {"corpus": "python_reference()", "corpus_sha256": text_sha256(python_reference())},
              "outputs": {f"{m['model']} {r['context_tokens']} {r['path']}": r["first_token_logits_sha256"]
                          for m in models for r in m["rows"]},
              "all_logits_sha256_equal_recompute": all(r["logits_sha256_equal_recompute"]
                                                       for m in models for r in m["rows"]),
              "seconds": round(time.perf_counter() - started, 1),
              "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
              "recheck": recheck_block_of(args, models)}
    write_report(args.out, report)
    print(f"# {env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}; median of {args.repeats}")
    for m in models:
        print(f"\n## {m['model']} (page {m['page_size']} tokens); crossover: {m['crossover_tokens']}")
        print(markdown_table(m["rows"], [("N", "context_tokens", "d"), ("path", "path", "s"),
                                         ("TTFT s", "ttft_s", ".4f"), ("x recompute", "speedup_vs_recompute", ".1f"),
                                         ("logits = recompute", "logits_sha256_equal_recompute", "")]))
        print(f"restore from LMDB, verified: {m['restore']['restore_gb_per_s']:.2f} GB/s = "
              f"{m['restore']['restore_vs_memcpy']:.2f} of memcpy ({m['restore']['memcpy_gb_per_s']:.2f} GB/s)")
    print(f"# {report['seconds']:.0f} s; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
