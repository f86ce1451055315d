"""Accelerator (device-tier) memory, host RSS, disk and decode latency against context length.

One TieredModel context grows from 0 to the largest context; at each checkpoint we record the
device tier's bytes (and peak CUDA memory when present), host RSS, LMDB bytes on disk and
decode ms/token. The plain HF model with its DynamicCache grows alongside as the peer until it
exceeds its time or memory budget (attention over the whole context is quadratic).

    python bench/memory_vs_context.py --model tiny-llama --contexts 8192,...,1048576 --json
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import environment, sha256_ids, write_report  # noqa: E402

from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.artifacts.artifact import prefill  # noqa: E402
from tieredkv.corpus import python_reference  # noqa: E402
from tieredkv.models import load_model  # noqa: E402
from tieredkv.tiered_config import TieredConfig  # noqa: E402
from tieredkv.tiered_model import TieredModel, working_set_bytes  # noqa: E402

DEFAULT_CONTEXTS = "8192,16384,32768,65536,131072,262144,524288,1048576"


def corpus_ids(lm, n: int) -> list[int]:
    base = lm.codec.encode(python_reference())
    reps = n // len(base) + 1
    return (base * reps)[:n]


def rss() -> int:
    return psutil.Process().memory_info().rss


def cuda_peak() -> int | None:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None


@torch.inference_mode()
def decode_ms(step, num_tokens: int) -> tuple[float, list[int]]:
    """Median ms/token over `num_tokens` greedy steps of `step(token) -> next token`."""
    times, out, tok = [], [], 0
    for _ in range(num_tokens):
        t0 = time.perf_counter()
        tok = step(tok)
        times.append(time.perf_counter() - t0)
        out.append(tok)
    times.sort()
    return 1000 * times[len(times) // 2], out


def tiered_rows(lm, ids, contexts, cfg, store_dir, decode_tokens, log, host_budget=None):
    # NOTE: the device tier is sized to the largest working set (all layers), so it cannot grow
    # with context, and sink and local pages stay resident while retrieved pages change.
    store = PageStore(store_dir, StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                             host_budget_bytes=host_budget))
    tm = TieredModel(lm, store, cfg)
    rows, pos, t_ingest = [], 0, 0.0
    for n in contexts:
        t0 = time.perf_counter()
        need = n - tm.num_tokens  # decode steps of earlier checkpoints count towards the context
        tm.prefill(ids[pos:pos + need])
        pos += need
        t_ingest += time.perf_counter() - t0

        def step(_tok, _tm=tm):
            logits = _tm.forward(torch.tensor([[int(_tok) % 200 + 32]]), logits_to_keep=1).logits
            return int(logits[0, -1].argmax())

        ms, out = decode_ms(step, decode_tokens)
        st = store.stats()
        row = {"system": "tiered", "context_tokens": n, "device_tier_bytes": st["device"]["bytes"],
               "device_budget_bytes": st["device"]["budget_bytes"], "cuda_peak_bytes": cuda_peak(),
               "host_tier_bytes": st["host"]["bytes"], "host_budget_bytes": st["host"]["budget_bytes"],
               "host_rss_bytes": rss(),
               "disk_bytes": st["lmdb"]["disk_bytes"], "decode_ms_per_token": ms,
               "ingest_tokens_per_s": n / t_ingest, "pages": len(tm.cache.spans),
               "input_sha256": sha256_ids(ids[:pos]), "output_ids_sha256": sha256_ids(out)}
        rows.append(row)
        log(row)
    tm.close()
    store.close()
    return rows


def plain_rows(lm, ids, contexts, decode_tokens, budget_s, log):
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    rows, pos, t_total = [], 0, 0.0
    for n in contexts:
        t0 = time.perf_counter()
        need = n - cache.get_seq_length()
        prefill(lm, ids[pos:pos + need], cache, start=cache.get_seq_length(), page_size=512)
        pos += need

        def step(tok, _c=cache):
            out = lm.model(input_ids=torch.tensor([[int(tok) % 200 + 32]]), past_key_values=_c, use_cache=True,
                           logits_to_keep=1)
            return int(out.logits[0, -1].argmax())

        ms, out = decode_ms(step, decode_tokens)
        t_total += time.perf_counter() - t0
        kv = sum(l.keys.numel() * l.keys.element_size() * 2 for l in cache.layers if l.keys is not None)
        row = {"system": "hf-dynamiccache", "context_tokens": n, "device_tier_bytes": kv, "cuda_peak_bytes": cuda_peak(),
               "host_rss_bytes": rss(), "disk_bytes": 0, "decode_ms_per_token": ms,
               "input_sha256": sha256_ids(ids[:pos]), "output_ids_sha256": sha256_ids(out)}
        rows.append(row)
        log(row)
        if t_total * 4.5 > budget_s:  # the next doubling costs about 4x (quadratic attention)
            rows.append({"system": "hf-dynamiccache", "stopped_after": n,
                         "reason": f"next context exceeds {budget_s}s budget"})
            log(rows[-1])
            break
    del cache
    gc.collect()
    return rows


def plot(rows, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system, style in (("tiered", "o-"), ("hf-dynamiccache", "s--")):
        rs = [r for r in rows if r.get("system") == system and "context_tokens" in r]
        if not rs:
            continue
        x = [r["context_tokens"] for r in rs]
        label = "device KV (tiered)" if system == "tiered" else "KV (HF DynamicCache)"
        ax1.plot(x, [r["device_tier_bytes"] / 2**20 for r in rs], style, label=label)
        if system == "tiered":
            ax1.plot(x, [r["disk_bytes"] / 2**20 for r in rs], "^:", label="LMDB on disk (tiered)")
        ax2.plot(x, [r["decode_ms_per_token"] for r in rs], style, label=system)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    ax1.set_yscale("log")
    ax1.set_ylabel("MiB")
    ax1.set_title(f"memory vs context ({model})")
    ax2.set_ylabel("decode ms / token")
    ax2.set_title("decode latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--contexts", default=DEFAULT_CONTEXTS)
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--chunk-pages", type=int, default=1, help="TieredConfig.chunk_pages (prefill chunk)")
    ap.add_argument("--position", choices=("own", "fixed"), default="own",
                    help="TieredConfig.position (fixed: the policy beyond the model's window, with its own top-k)")
    ap.add_argument("--host-budget-gib", type=float,
                    help="host tier budget (default: 25%% of available RAM); pages beyond it are read from LMDB")
    ap.add_argument("--decode-tokens", type=int, default=9)
    ap.add_argument("--plain-budget-s", type=float, default=300.0)
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--store", help="store directory (default: a temporary one)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out or f"bench/results/memory_vs_context.{a.model}.json")
    lm = load_model(a.model)
    contexts = sorted(int(x) for x in a.contexts.split(","))
    ids = corpus_ids(lm, contexts[-1] + 64 * len(contexts) * a.decode_tokens)
    cfg = TieredConfig(page_size=a.page_size, chunk_pages=a.chunk_pages, position=a.position)
    log = lambda r: print({k: v for k, v in r.items() if "sha" not in k}, file=sys.stderr, flush=True)  # noqa
    rows = []
    with tempfile.TemporaryDirectory(prefix="tkv-mem-") as tmp:
        host = int(a.host_budget_gib * 2**30) if a.host_budget_gib else None
        rows += tiered_rows(lm, ids, contexts, cfg, a.store or tmp, a.decode_tokens, log, host)
    if not a.no_plain:
        rows += plain_rows(lm, ids, contexts, a.decode_tokens, a.plain_budget_s, log)
    tiered = [r for r in rows if r.get("system") == "tiered"]
    checks = {
        "device_bytes_largest_over_smallest": tiered[-1]["device_tier_bytes"] / tiered[0]["device_tier_bytes"],
        "decode_ms_largest_over_smallest": tiered[-1]["decode_ms_per_token"] / tiered[0]["decode_ms_per_token"],
    }
    report = {"bench": "memory_vs_context", "model": lm.name, "model_fingerprint": lm.fingerprint,
              "config": {"tiered": cfg.regime(a.page_size), "args": vars(a)}, "environment": environment(),
              "rows": rows, "checks": checks}
    png = out.with_suffix(".png")
    plot(rows, png, lm.name)
    report["plot"] = str(png)
    write_report(out, report, print_json=a.json)
    print("\n| system | context | device bytes | host RSS | disk | decode ms/tok |\n|---|---|---|---|---|---|")
    for r in rows:
        if "context_tokens" in r:
            print(f"| {r['system']} | {r['context_tokens']:,} | {r['device_tier_bytes']/2**20:.1f} MiB | "
                  f"{r['host_rss_bytes']/2**30:.2f} GiB | {r['disk_bytes']/2**30:.2f} GiB | "
                  f"{r['decode_ms_per_token']:.1f} |")
    print(f"\nchecks: {checks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
