"""Accelerator (device-tier) memory, host RSS, disk and decode latency against context length.

One TieredModel context grows from 0 to the largest context; at each checkpoint we record the
device tier's bytes (and peak CUDA memory when present), host RSS, LMDB bytes on disk and
decode ms/token. The plain HF model with its DynamicCache grows alongside as the peer until it
exceeds its time or memory budget (attention over the whole context is quadratic).

Ratios against the plain model are measured in the same time window, so that a busy neighbour on
a shared machine slows both sides alike: plain reference caches at `--ref-contexts` are built
first, and at each checkpoint every tiered decode step alternates with a plain step at the
reference context (largest one <= the checkpoint), which is then rolled back; the last
`--rate-window` ingest tokens before a checkpoint alternate chunk by chunk with a plain prefill
chunk at the reference context (rolled back too). Ingest is reported both cumulative (tokens over
all ingest seconds so far) and over that window (the rate at this context length). With
`--pair-context 8192` a second context of other text is ingested to 8,192 tokens in a store of its
own, and in every later window each timed chunk alternates with one of its chunks: ingest at the
checkpoint against ingest near 8K, in one time window (`ingest_window_vs_pair`). With `--decode-pair 8192`
every decode step alternates with one of a second context of 8,192 tokens (`decode_vs_pair`).

Each checkpoint also reports the page search (bench/lib/search_probe.py): ms per decode step inside the timed
steps, and over a few more steps the flat scan's ms on the same queries and the recall of its top-k (the search
is exact: recall 1.0 and identical selections, checked, not assumed).

The report (bench/results/memory_vs_context.json) holds one run per model and configuration: a run writes its
`--run` (default: the model's name) and leaves the others; `--plot` draws the run's figure.

    python -m bench.memory_vs_context --model tiny-llama --contexts 8192,...,1048576 --json
    python -m bench.memory_vs_context --model tiny-llama --contexts 8192,131072,1048576 --no-plain --decode-pair 8192
    python -m bench.memory_vs_context --model smollm2 --contexts 4096,8192,...,131072 --chunk-pages 4 \
        --ref-contexts 4096,8192 --no-plain

The report's `tieredkv recheck` recipe (`--recheck-only`) re-runs the smallest context alone, with the
run's configuration and without the timing references (--ref-contexts, --pair-context, --decode-pair):
the token ids' hash must be equal on any machine, the decoded ids and the device bytes hash-equal in
the same determinism domain, and the page search must equal the flat scan anywhere.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from bench.lib.common import add_retrieval_args, retrieval_kwargs
from bench.lib.report import environment, print_recheck, recheck_block, recipe_argv, sha256_json, write_run
from bench.lib.search_probe import SearchProbe
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, sha256_ids
from tieredkv.question.corpus import python_reference

DEFAULT_CONTEXTS = "8192,16384,32768,65536,131072,262144,524288,1048576"


def corpus_ids(lm, n: int) -> list[int]:
    base = lm.codec.encode(python_reference())
    reps = n // len(base) + 1
    return (base * reps)[:n]


def rss() -> int:
    return psutil.Process().memory_info().rss


def cuda_peak() -> int | None:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None


def sync() -> None:
    """Wait for queued device work, so a timer measures it (no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.inference_mode()
def decode_ms(step, num_tokens: int, *ref_steps) -> tuple[float, list[int], list[float]]:
    """Median ms/token over `num_tokens` greedy steps of `step(token) -> next token`; each step alternates
    with one of every `ref_steps` (a plain reference step rolled back, a second context's step), so a busy
    machine slows them alike: (ms, ids, each reference's ms)."""
    times, ref_times, out, tok = [], [[] for _ in ref_steps], [], 0
    for _ in range(num_tokens):
        t0 = time.perf_counter()
        tok = step(tok)
        times.append(time.perf_counter() - t0)
        out.append(tok)
        for ref_step, ts in zip(ref_steps, ref_times):
            t0 = time.perf_counter()
            ref_step(tok)
            ts.append(time.perf_counter() - t0)
    med = lambda xs: 1000 * sorted(xs)[len(xs) // 2]  # noqa: E731
    return med(times), out, [med(ts) for ts in ref_times]


def greedy_step(tm):
    """One tiered decode step: token in (a printable byte of it), greedy next token out."""

    def step(tok):
        logits = tm.forward(torch.tensor([[int(tok) % 200 + 32]], device=tm.model.device), logits_to_keep=1).logits
        return int(logits[0, -1].argmax())

    return step


class PlainRef:
    """Plain HF model + DynamicCache at fixed context lengths: decode steps and prefill chunks that
    are rolled back after timing, so the reference stays at its context length."""

    def __init__(self, lm, ids, contexts: list[int]):
        from transformers import DynamicCache

        self.lm, self.caches = lm, {}
        for n in sorted(contexts):
            cache = DynamicCache(config=lm.model.config)
            prefill(lm, ids[:n], cache, page_size=512)
            self.caches[n] = cache
        self.ids = ids

    def context_for(self, n: int) -> int | None:
        fits = [c for c in self.caches if c <= n]
        return max(fits) if fits else (min(self.caches) if self.caches else None)

    @torch.inference_mode()
    def _rolled_back(self, n: int, input_ids: torch.Tensor) -> None:
        cache = self.caches[n]
        saved = [(layer.keys, layer.values) for layer in cache.layers]
        self.lm.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        sync()
        for layer, (k, v) in zip(cache.layers, saved):
            layer.keys, layer.values = k, v

    def decode_step(self, n: int):
        return lambda tok: self._rolled_back(n, torch.tensor([[int(tok) % 200 + 32]], device=self.lm.model.device))

    def prefill_chunk_s(self, n: int, size: int = 512) -> float:
        t0 = time.perf_counter()
        self._rolled_back(n, torch.tensor([self.ids[n:n + size]], device=self.lm.model.device))
        return time.perf_counter() - t0


def timed_decode(tm, decode_tokens: int, ref_steps=(), check_tokens: int = 4):
    """`decode_ms` of the tiered model's greedy steps, with the page search timed inside them; then
    `check_tokens` more steps whose every search is also run as the flat scan and compared (timed apart,
    so the comparison never slows the timed steps). -> (ms, ids, ref ms list, the row's search fields)."""
    step = greedy_step(tm)
    if tm.cache.index is None:  # nothing sealed yet: no search
        return (*decode_ms(step, decode_tokens, *ref_steps), {})
    with SearchProbe(tm.cache, compare=False) as timing:
        ms, out, ref_ms = decode_ms(step, decode_tokens, *ref_steps)
    with SearchProbe(tm.cache, compare=True) as check:
        decode_ms(step, check_tokens)
    flat = len(tm.cache.index) < tm.cache.index.flat_scan_below
    search = {"search": "flat" if flat else "bound_scan", "search_ms_per_step": timing.ms_per_step(decode_tokens),
              "search_flat_ms_per_step": check.flat_ms_per_step(check_tokens),
              "search_check_ms_per_step": check.ms_per_step(check_tokens), "search_recall": check.recall(),
              "search_identical": f"{check.identical}/{check.searches}"}
    return ms, out, ref_ms, search


def mean_retrieved(log) -> float | None:
    return round(sum(map(len, log)) / len(log), 2) if log else None


def kept_from_step_before(log, num_layers: int) -> float | None:
    """The mean share of a layer's retrieved pages that it retrieved at the step before too, over decode steps
    whose forwards each logged one retrieval per full-attention layer (`log`: those retrievals in order, layer by
    layer within a step; a list or the cache's deque); None when there are not two steps of them. What a step
    copies grows with 1 - this."""
    log = list(log)
    if num_layers < 1 or len(log) < 2 * num_layers or len(log) % num_layers:
        return None
    shares = []
    for layer in range(num_layers):
        steps = [set(found) for found in log[layer::num_layers]]
        shares += [len(now & before) / len(now) for before, now in zip(steps, steps[1:]) if now]
    return round(sum(shares) / len(shares), 3) if shares else None


class PairContext:
    """A second context in a store of its own (as a user with an 8K context has), ingested to `n` tokens
    of other text (the corpus shifted by one token), that ingests a chunk after each of the main context's
    timed chunks: the ingest rate at its length measured in the same time window as the rate at the
    checkpoint's. NOTE: a store of its own, so that what grows with the main store (its host tier, its
    LMDB file) slows the main context only, as it would a user's."""

    def __init__(self, lm, store_dir: str, cfg, ids, n: int):
        self.store = PageStore(store_dir, StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                                      device=str(lm.model.device)))
        self.tm, self.ids = TieredModel(lm, self.store, cfg), ids[1:]
        self.tm.prefill(self.ids[:n], logits_to_keep=None)
        self.chunk = self.tm.page_size * cfg.chunk_pages

    def chunk_s(self) -> tuple[float, int]:
        tm = self.tm
        k = (tm.num_tokens // self.chunk + 1) * self.chunk - tm.num_tokens
        t0 = time.perf_counter()
        tm.prefill(self.ids[tm.num_tokens:tm.num_tokens + k], logits_to_keep=None)
        sync()
        return time.perf_counter() - t0, k


def tiered_rows(lm, ids, contexts, cfg, store_dir, decode_tokens, log, host_budget=None, ref=None, rate_window=0,
                pair_context=0, decode_pair=0):
    # NOTE: the device tier is sized to the largest working set (all layers), so it cannot grow
    # with context, and sink and local pages stay resident while retrieved pages change.
    store = PageStore(store_dir, StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg),
                                             device=str(lm.model.device), host_budget_bytes=host_budget))
    tm = TieredModel(lm, store, cfg)
    chunk = tm.page_size * cfg.chunk_pages
    pair = PairContext(lm, f"{store_dir}.pair", cfg, ids, pair_context) if pair_context else None
    # a context of `decode_pair` tokens whose decode steps alternate with every checkpoint's (--decode-pair)
    dpair = PairContext(lm, f"{store_dir}.dpair", cfg, ids, decode_pair) if decode_pair else None
    rows, pos, t_ingest = [], 0, 0.0
    for n in contexts:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # cuda_peak_bytes: the peak while reaching this checkpoint
        ref_n = ref.context_for(n) if ref is not None else None
        # decode steps of earlier checkpoints count towards the context; the last `rate_window` tokens
        # (whole chunks, on the canonical schedule) are timed chunk by chunk
        window_start = max(tm.num_tokens, (n - rate_window) // chunk * chunk) if rate_window else n
        t0 = time.perf_counter()
        if window_start > tm.num_tokens:
            k = window_start - tm.num_tokens
            tm.prefill(ids[pos:pos + k], logits_to_keep=None)
            sync()
            pos += k
        t_ingest += time.perf_counter() - t0
        win_s, ref_s, pair_s, pair_tokens = 0.0, [], 0.0, 0
        pairing = pair is not None and n > pair_context
        pair_start = pair.tm.num_tokens if pairing else None
        reads_before = store.stats()["integrity"]["verified_reads"]
        tm.cache.retrieval_log.clear()  # what the window's forwards retrieve, per (layer, forward)
        while tm.num_tokens < n:
            k = min(n, (tm.num_tokens // chunk + 1) * chunk) - tm.num_tokens
            t0 = time.perf_counter()
            tm.prefill(ids[pos:pos + k], logits_to_keep=None)  # as TieredModel.ingest: no LM head
            sync()
            dt = time.perf_counter() - t0
            pos += k
            t_ingest += dt
            win_s += dt
            if ref_n is not None:
                ref_s.append(ref.prefill_chunk_s(ref_n, chunk))
            if pairing:
                dt, k = pair.chunk_s()
                pair_s, pair_tokens = pair_s + dt, pair_tokens + k
        window_reads = store.stats()["integrity"]["verified_reads"] - reads_before
        window_retrieved = mean_retrieved(tm.cache.retrieval_log)
        tm.cache.retrieval_log.clear()

        refs = ([ref.decode_step(ref_n)] if ref_n is not None else []) + ([greedy_step(dpair.tm)] if dpair else [])
        ms, out, ref_ms, search = timed_decode(tm, decode_tokens, refs)
        decode_retrieved = mean_retrieved(tm.cache.retrieval_log)
        decode_kept = kept_from_step_before(tm.cache.retrieval_log,
                                            sum(1 for layer in tm.cache.layers if not layer.is_sliding))
        st = store.stats()
        buffers = sum(layer.buffer.nbytes for layer in tm.cache.layers if layer.buffer is not None)
        window = n - window_start
        # device bytes: the working-set buffers (what attention reads) + the device tier (pages cached
        # for them; only pages that changed are fetched, so it can be empty while everything fits)
        row = {"system": "tiered", "context_tokens": n, "device_bytes": st["device"]["bytes"] + buffers,
               "device_tier_bytes": st["device"]["bytes"],
               "device_budget_bytes": st["device"]["budget_bytes"], "working_set_buffer_bytes": buffers,
               "cuda_peak_bytes": cuda_peak(),
               "host_tier_bytes": st["host"]["bytes"], "host_budget_bytes": st["host"]["budget_bytes"],
               "host_rss_bytes": rss(),
               "disk_bytes": st["lmdb"]["disk_bytes"], "decode_ms_per_token": ms,
               "ingest_tokens_per_s": n / t_ingest, "pages": len(tm.cache.spans),
               "retrieving": tm.cache.retrieving, "load_avg_1": round(os.getloadavg()[0], 2),
               "input_sha256": sha256_ids(ids[:pos]), "output_ids_sha256": sha256_ids(out)}
        row["lmdb_reads"] = st["integrity"]["verified_reads"]  # pages read from LMDB (verified), so far
        # retrieved far pages per full-attention layer and forward (the union over KV heads); None: no retrieval
        row["decode_retrieved_pages_mean"] = decode_retrieved
        row["decode_retrieved_kept_from_step_before"] = decode_kept
        row.update(search)
        if window:
            row.update({"ingest_window_tokens": window, "ingest_window_tokens_per_s": window / win_s,
                        "ingest_window_lmdb_reads": window_reads,
                        "ingest_window_retrieved_pages_mean": window_retrieved})
        if pairing and pair_tokens:
            row.update({"pair_context_tokens": pair_start, "pair_ingest_window_tokens_per_s": pair_tokens / pair_s,
                        "ingest_window_vs_pair": (window / win_s) / (pair_tokens / pair_s)})
        if dpair is not None:
            row.update({"decode_pair_context": decode_pair, "decode_pair_ms_per_token": ref_ms[-1],
                        "decode_vs_pair": ms / ref_ms[-1]})
        if ref_n is not None:
            row.update({"plain_ref_context": ref_n, "plain_ref_decode_ms_per_token": ref_ms[0],
                        "decode_vs_plain_ref": ms / ref_ms[0]})
            if ref_s:
                row["plain_ref_prefill_tokens_per_s"] = chunk * len(ref_s) / sum(ref_s)
        rows.append(row)
        log(row)
    tm.close()
    if pair is not None:
        pair.tm.close()
        pair.store.close()
        shutil.rmtree(f"{store_dir}.pair", ignore_errors=True)
    if dpair is not None:
        dpair.tm.close()
        dpair.store.close()
        shutil.rmtree(f"{store_dir}.dpair", ignore_errors=True)
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
            out = lm.model(input_ids=torch.tensor([[int(tok) % 200 + 32]], device=lm.model.device), past_key_values=_c,
                           use_cache=True,
                           logits_to_keep=1)
            return int(out.logits[0, -1].argmax())

        ms, out, _ = decode_ms(step, decode_tokens)
        t_total += time.perf_counter() - t0
        kv = sum(l.keys.numel() * l.keys.element_size() * 2 for l in cache.layers if l.keys is not None)
        row = {"system": "hf-dynamiccache", "context_tokens": n, "device_bytes": kv, "device_tier_bytes": kv,
               "cuda_peak_bytes": cuda_peak(), "host_rss_bytes": rss(), "disk_bytes": 0, "decode_ms_per_token": ms,
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


def ratio_checks(tiered: list[dict], cfg: TieredConfig) -> dict:
    """The issue's ratios: decode against the plain model measured alongside, ingest at the largest
    context against ingest at 8K (raw, and each normalised by the plain prefill reference rate)."""
    out = {}
    fits = [r for r in tiered if not r["retrieving"] and r.get("decode_vs_plain_ref")]
    if fits:
        r = fits[-1]
        out["decode_fits_working_set_vs_plain"] = {"context": r["context_tokens"], "ratio": r["decode_vs_plain_ref"],
                                                   "target_max": 1.10}
    last = tiered[-1]
    if last.get("decode_vs_plain_ref"):
        out["decode_at_largest_vs_plain_ref"] = {"context": last["context_tokens"], "ref_context":
                                                 last["plain_ref_context"], "ratio": last["decode_vs_plain_ref"],
                                                 "target_max": 1.25 if last["plain_ref_context"] == 8192 else None}
    at8k = next((r for r in tiered if r["context_tokens"] == 8192), None)
    if at8k and at8k is not last and last.get("ingest_window_tokens_per_s") and at8k.get("ingest_window_tokens_per_s"):
        raw = last["ingest_window_tokens_per_s"] / at8k["ingest_window_tokens_per_s"]
        entry = {"context": last["context_tokens"], "ratio_window": raw, "target_min": 0.85,
                 "ratio_cumulative": last["ingest_tokens_per_s"] / at8k["ingest_tokens_per_s"]}
        if last.get("plain_ref_prefill_tokens_per_s") and at8k.get("plain_ref_prefill_tokens_per_s"):
            entry["ratio_window_normalised"] = raw * (at8k["plain_ref_prefill_tokens_per_s"]
                                                      / last["plain_ref_prefill_tokens_per_s"])
        out["ingest_largest_vs_8k"] = entry
    if last.get("ingest_window_vs_pair"):
        # the same window: each timed chunk of the largest context alternated with one of a context of
        # pair_context_tokens (--pair-context), so a busy machine slows both alike
        out["ingest_largest_vs_pair"] = {"context": last["context_tokens"], "pair_context": last["pair_context_tokens"],
                                         "ratio": last["ingest_window_vs_pair"], "target_min": 0.85}
    return out


def plot(rows, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.2))
    for system, style in (("tiered", "o-"), ("hf-dynamiccache", "s--")):
        rs = [r for r in rows if r.get("system") == system and "context_tokens" in r]
        if not rs:
            continue
        x = [r["context_tokens"] for r in rs]
        label = "device KV (tiered)" if system == "tiered" else "KV (HF DynamicCache)"
        ax1.plot(x, [r.get("device_bytes", r["device_tier_bytes"]) / 2**20 for r in rs], style, label=label)
        if system == "tiered":
            ax1.plot(x, [r["disk_bytes"] / 2**20 for r in rs], "^:", label="LMDB on disk (tiered)")
        ax2.plot(x, [r["decode_ms_per_token"] for r in rs], style, label=system)
        paired = [r for r in rs if "decode_pair_ms_per_token" in r]
        if paired:  # --decode-pair: the second context's steps, alternated with these
            ax2.plot([r["context_tokens"] for r in paired], [r["decode_pair_ms_per_token"] for r in paired], "x:",
                     label=f"{system}, {paired[0]['decode_pair_context']:,}-token context alongside")
    plot_search(ax3, [r for r in rows if r.get("system") == "tiered" and "search_ms_per_step" in r])
    for ax in (ax1, ax2, ax3):
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


def plot_search(ax, rs: list[dict]) -> None:
    """Page search ms per decode step (all layers): the search decode uses and the flat scan it equals."""
    x = [r["context_tokens"] for r in rs]
    ax.plot(x, [r["search_ms_per_step"] for r in rs], "o-", label="page search (decode)")
    ax.plot(x, [r["search_flat_ms_per_step"] for r in rs], "x--", label="flat scan (reference)")
    recalls = [r["search_recall"] for r in rs if r.get("search_recall") is not None]
    ax.set_ylabel("search ms / decode step")
    ax.set_title(f"page search (recall of the flat top-k: min {min(recalls):.3f})" if recalls else "page search")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--contexts", default=DEFAULT_CONTEXTS)
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--chunk-pages", type=int, default=1, help="TieredConfig.chunk_pages (prefill chunk)")
    ap.add_argument("--position", choices=("own", "fixed"), default="own",
                    help="TieredConfig.position (fixed: the policy beyond the model's window, with its own top-k)")
    add_retrieval_args(ap)
    ap.add_argument("--host-budget-gib", type=float,
                    help="host tier budget (default: 25%% of available RAM); pages beyond it are read from LMDB")
    ap.add_argument("--decode-tokens", type=int, default=9)
    ap.add_argument("--plain-budget-s", type=float, default=300.0)
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--store", help="store directory (default: a temporary one)")
    ap.add_argument("--out", default="bench/results/memory_vs_context.json", help="the report; a run writes its --run")
    ap.add_argument("--run", help="the run of --out to write (default: the model's name)")
    ap.add_argument("--plot", help="draw the run's figure here (png)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment)")
    ap.add_argument("--device", default="cpu", help="model and device tier (cuda: peak CUDA memory per checkpoint)")
    ap.add_argument("--ref-contexts", default="",
                    help="plain reference contexts (e.g. 4096,8192): decode and ingest ratios measured alongside")
    ap.add_argument("--rate-window", type=int, default=0,
                    help="ingest tokens before each checkpoint timed chunk by chunk (the rate at that context)")
    ap.add_argument("--pair-context", type=int, default=0,
                    help="a second context of this many tokens (e.g. 8192) whose chunks alternate with the rate "
                         "window's at every larger checkpoint: ingest at both lengths in one time window")
    ap.add_argument("--decode-pair", type=int, default=0,
                    help="a second context of this many tokens (e.g. 8192) whose decode steps alternate with every "
                         "checkpoint's: decode at both lengths in one time window (decode_vs_pair)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="the smallest context alone, without the timing references: print {outputs, inputs, "
                         "relations, domain} without writing (`tieredkv recheck`)")
    return ap


def parse_args(argv):
    ap = parser()
    a = ap.parse_args(argv)
    retrieval = retrieval_kwargs(ap, a)
    if a.rate_window < 0 or a.pair_context < 0 or (a.pair_context and not a.rate_window):
        ap.error("--rate-window and --pair-context must be >= 0, and --pair-context times the chunks of a rate "
                 "window: give --rate-window too")
    return a, retrieval


def measure(lm, a, cfg: TieredConfig, contexts: list[int], log) -> list[dict]:
    """Every row: the tiered context at each checkpoint, then (unless --no-plain) the plain model."""
    ids = corpus_ids(lm, contexts[-1] + 64 * len(contexts) * a.decode_tokens)
    ref_contexts = sorted(int(x) for x in a.ref_contexts.split(",") if x)
    ref = PlainRef(lm, ids, ref_contexts) if ref_contexts else None
    with tempfile.TemporaryDirectory(prefix="tkv-mem-") as tmp:
        host = int(a.host_budget_gib * 2**30) if a.host_budget_gib else None
        rows = tiered_rows(lm, ids, contexts, cfg, a.store or tmp, a.decode_tokens, log, host, ref=ref,
                           rate_window=a.rate_window, pair_context=a.pair_context, decode_pair=a.decode_pair)
    del ref
    gc.collect()
    if not a.no_plain:
        rows += plain_rows(lm, ids, contexts, a.decode_tokens, a.plain_budget_s, log)
    return rows


# decode ms/token at a context against 8,192 tokens in the same run: the most it may grow
DECODE_VS_8K_TARGETS = ((1_048_576, 1.3), (2_854_766, 1.5))


def search_checks(tiered: list[dict]) -> dict:
    """Decode at each larger context against 8K (same run), and the search's recall of the flat scan."""
    at8k = next((r for r in tiered if r["context_tokens"] == 8192), None)
    out = {}
    def target(n: int) -> float | None:
        return next((t for most, t in DECODE_VS_8K_TARGETS if n <= most), None)

    if at8k:  # the checkpoints one after the other: a neighbour's load in between skews it
        out["decode_vs_8k"] = [{"context": r["context_tokens"], "target_max": target(r["context_tokens"]),
                                "ratio": r["decode_ms_per_token"] / at8k["decode_ms_per_token"]}
                               for r in tiered if r["context_tokens"] > 8192]
    if any(r.get("decode_pair_context") == 8192 for r in tiered):  # step by step in one time window
        out["decode_vs_pair_8k"] = [{"context": r["context_tokens"], "target_max": target(r["context_tokens"]),
                                     "ratio": r["decode_vs_pair"]} for r in tiered if r["context_tokens"] > 8192]
    recalls = [r["search_recall"] for r in tiered if r.get("search_recall") is not None]
    if recalls:
        out["search_recall_min"] = {"value": min(recalls), "target_min": 0.95}
    return out


def print_table(rows: list[dict], checks: dict) -> None:
    print("\n| system | context | device bytes | host RSS | disk | decode ms/tok | search ms/step (flat scan) "
          "| recall | retrieved pages kept from the step before | plain ref ms/tok (context) "
          "| ingest tok/s (cumulative) | ingest tok/s (window) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "context_tokens" in r:
            refd = (f"{r['plain_ref_decode_ms_per_token']:.1f} ({r['plain_ref_context']:,})"
                    if r.get("plain_ref_decode_ms_per_token") else "-")
            search = (f"{r['search_ms_per_step']:.2f} ({r['search_flat_ms_per_step']:.2f})"
                      if "search_ms_per_step" in r else "-")
            recall = f"{r['search_recall']:.3f}" if r.get("search_recall") is not None else "-"
            kept = r.get("decode_retrieved_kept_from_step_before")
            print(f"| {r['system']} | {r['context_tokens']:,} | {r['device_bytes']/2**20:.1f} MiB | "
                  f"{r['host_rss_bytes']/2**30:.2f} GiB | {r['disk_bytes']/2**30:.2f} GiB | "
                  f"{r['decode_ms_per_token']:.2f} | {search} | {recall} | {'-' if kept is None else kept} | {refd} | "
                  f"{r.get('ingest_tokens_per_s', 0):.1f} | {r.get('ingest_window_tokens_per_s', 0):.1f} |")
    print(f"\nchecks: {checks}")


# ----------------------------------------------------------------------------- the recheck recipe
TIMING_ONLY = ("ref_contexts", "pair_context", "decode_pair", "plain_budget_s")  # the recipe runs without them
DEVICE_FIELDS = ("device_bytes", "device_tier_bytes", "working_set_buffer_bytes", "pages")


def recipe_args(values: dict, threads: int) -> list[str]:
    """`--recheck-only` with a run's arguments (its report's config.args): the smallest context alone."""
    smallest = min(int(x) for x in str(values["contexts"]).split(","))
    return recipe_argv(parser(), values, drop=("out", "run", "plot", "json", "store", *TIMING_ONLY),
                       contexts=str(smallest), threads=threads, recheck_only=True)


def recipe_hashes(rows: list[dict]) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from the rows at the smallest context, the names that hash inputs, and relations."""
    n = min(r["context_tokens"] for r in rows if "context_tokens" in r)
    outputs, inputs, relations = {}, [], {}
    for r in rows:
        if r.get("context_tokens") != n:
            continue
        name = f"{r['system']} {n}"
        outputs[f"{name} token ids"] = r["input_sha256"]
        inputs.append(f"{name} token ids")
        outputs[f"{name} output ids"] = r["output_ids_sha256"]
        if r["system"] == "tiered":
            outputs[f"{name} device bytes"] = sha256_json({k: r.get(k) for k in DEVICE_FIELDS})
        same, _, searches = (r.get("search_identical") or "0/0").partition("/")
        if searches != "0":  # the decode searched pages: every search equal to the flat scan's
            relations[f"{name} page search = flat scan"] = same == searches and r.get("search_recall") == 1.0
    return outputs, inputs, relations


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(report["config"]["args"], threads)


def report_hashes(report: dict) -> dict[str, str]:
    return recipe_hashes(report["rows"])[0]


def main(argv=None) -> int:
    a, retrieval = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.recheck_only:
        a.contexts = str(min(int(x) for x in a.contexts.split(",")))
        a.ref_contexts, a.pair_context, a.decode_pair = "", 0, 0
    lm = load_model(a.model)
    lm.model.to(a.device)
    contexts = sorted(int(x) for x in a.contexts.split(","))
    cfg = TieredConfig(page_size=a.page_size, chunk_pages=a.chunk_pages, position=a.position, **retrieval)
    log = lambda r: print({k: v for k, v in r.items() if "sha" not in k}, file=sys.stderr, flush=True)  # noqa
    load_start, started = os.getloadavg(), time.perf_counter()
    rows = measure(lm, a, cfg, contexts, log)
    domain = determinism_domain(lm.model, lm.fingerprint, a.page_size)
    outputs, inputs, relations = recipe_hashes(rows)
    if a.recheck_only:
        print_recheck(outputs, domain, inputs, relations)
        return 0
    tiered = [r for r in rows if r.get("system") == "tiered"]
    checks = {
        "device_bytes_largest_over_smallest": tiered[-1]["device_bytes"] / tiered[0]["device_bytes"],
        "decode_ms_largest_over_smallest": tiered[-1]["decode_ms_per_token"] / tiered[0]["decode_ms_per_token"],
        **ratio_checks(tiered, cfg), **search_checks(tiered),
    }
    report = {"bench": "memory_vs_context", "model": lm.name, "model_fingerprint": lm.fingerprint,
              "config": {"tiered": cfg.regime(a.page_size), "args": vars(a)}, "environment": environment(),
              "load_average_1_5_15": {"start": load_start, "end": os.getloadavg()},
              "seconds": round(time.perf_counter() - started, 1), "rows": rows, "checks": checks,
              "recheck": recheck_block("bench.memory_vs_context", recipe_args(vars(a), torch.get_num_threads()),
                                       outputs, inputs=inputs, relations=relations, domain=domain)}
    if a.plot:
        plot(rows, Path(a.plot), lm.name)
        report["plot"] = a.plot
    write_run(a.out, "memory_vs_context", a.run or lm.name, report, print_json=a.json)
    print_table(rows, checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
