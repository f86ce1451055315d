"""Where a retrieving decode step spends its time: one context, grafted, every page in the host tier.

The context (the memory bench's corpus, `--tokens` long, under `--position`) is ingested into
`--store` once and kept there; later runs graft it. Then every page is read into the host tier (as
after a continuous ingest that fits it), `--warm` decode steps run untimed, `--steps` are timed, and
each alternating with a plain `DynamicCache` decode step at `--ref-context` (medians; the ratio is
the memory bench's, on a grafted context), and the same number again run under cProfile, whose self
time is summed into the groups below (the profiler slows Python-heavy parts more than torch
kernels: read the groups as shares).

    python bench/decode_profile.py --tokens 131072 --position fixed --store /tmp/ctx-131k --threads 2
    python bench/decode_profile.py ... --reuse-steps 4    # TieredConfig.reuse_steps (approximate)
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-01-reuse_selection"))  # a sibling study
from bench.memory_vs_context import PlainRef, corpus_ids, decode_ms  # noqa: E402
from bench.common import add_retrieval_args, retrieval_kwargs  # noqa: E402
from bench.report import environment, sha256_ids, write_report  # noqa: E402
from reuse_selection import reused_plan_share  # noqa: E402

from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.artifacts.artifact import load_artifact  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes  # noqa: E402

# profile group -> (file suffix, function name) pairs whose self time it sums; first match wins
GROUPS = {
    "sdpa": [("", "scaled_dot_product_attention")],
    "linear layers": [("", "linear")],
    "key re-rotation": [("tieredkv/engine/rotary.py", "")],
    "concatenate and write slots": [("", "cat"), ("tieredkv/engine/kv_buffer.py", "_write_slots")],
    "in-place bookkeeping": [("tieredkv/engine/kv_buffer.py", "")],
    "page index (scoring, top-k)": [("index/", ""), ("", "c_einsum")],
    "page fetches (tiers)": [("paging/", "")],
}


def group_of(path: str, func: str) -> str:
    for group, rules in GROUPS.items():
        for suffix, name in rules:
            if (not suffix or suffix in path) and (not name or name in func):
                return group
    return "other (model code, norms, activations, Python)"


def _variant(a) -> str:
    """What names the retrieval in file names: nothing for the uncapped union (the names runs had before)."""
    return (f"-{a.retrieval}" if a.retrieval != "union" else "") + (f"-union{a.union_pages}" if a.union_pages else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--position", choices=("own", "fixed"), default="fixed")
    ap.add_argument("--store", required=True, help="where the ingested context is kept (ingested if absent)")
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--ref-context", type=int, default=8192,
                    help="a plain DynamicCache decode step at this context alternates with each timed step (0: none)")
    ap.add_argument("--reuse-steps", type=int, default=0,
                    help="TieredConfig.reuse_steps (approximate; 0: search at every step, exact)")
    add_retrieval_args(ap)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    retrieval = retrieval_kwargs(ap, a)
    if a.tokens < 1 or a.steps < 1 or min(a.warm, a.ref_context, a.reuse_steps) < 0:
        ap.error("--tokens and --steps must be >= 1, --warm, --ref-context and --reuse-steps >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    cfg = TieredConfig(position=a.position, reuse_steps=a.reuse_steps, **retrieval)
    ids = corpus_ids(lm, max(a.tokens + 1, a.ref_context + 1))
    started, load_start = time.perf_counter(), os.getloadavg()
    with PageStore(a.store, StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg))) as store:
        marker = Path(a.store) / f"artifact-{a.position}{_variant(a)}-{a.tokens}"
        if not marker.exists():
            tm = TieredModel(lm, store, cfg)
            marker.write_text(tm.ingest(ids[:a.tokens]).artifact_id)
            tm.close()
        tm = TieredModel(lm, store, cfg)
        try:
            tm.graft(load_artifact(store, marker.read_text()))
            for key in tm.cache.page_keys:
                store.get(key)  # every page into the host tier (as far as it holds them)
            ref = PlainRef(lm, ids, [a.ref_context]) if a.ref_context else None

            def step(tok):
                logits = tm.forward(torch.tensor([[int(tok) % 200 + 32]]), logits_to_keep=1).logits
                return int(logits[0, -1].argmax())

            warm_ms, out, _ = decode_ms(step, a.warm + 1)  # the first step lays the working set out in order
            ms, timed, ref_ms = decode_ms(step, a.steps, ref.decode_step(a.ref_context) if ref else None)
            prof = cProfile.Profile()
            prof.enable()
            _, profiled_out, _ = decode_ms(step, a.steps)
            prof.disable()
            out += timed + profiled_out
            host, pages = store.stats()["host"], len(tm.cache.spans)
            reused = reused_plan_share(tm.cache, a.warm + 1 + 2 * a.steps)
        finally:
            tm.close()
    groups: dict[str, float] = {}
    for (path, _line, func), row in pstats.Stats(prof).stats.items():
        g = group_of(path, func)
        groups[g] = groups.get(g, 0.0) + row[2]  # self time
    profiled = sum(groups.values())
    report = {"bench": "decode_profile", "model": lm.name, "model_fingerprint": lm.fingerprint,
              "config": {**cfg.regime(lm.default_page_size), "args": vars(a)}, "environment": environment(),
              "load_average_1_5_15": {"start": load_start, "end": os.getloadavg()},
              "context_tokens": a.tokens, "pages": pages, "host_tier_pages": host["pages"],
              "decode_ms_per_step": round(ms, 1), "reused_plan_share": round(reused, 3),
              "plain_ref_context": a.ref_context or None, "plain_ref_decode_ms_per_step": ref_ms and round(ref_ms, 1),
              "decode_vs_plain_ref": ref_ms and round(ms / ref_ms, 3), "profiled_ms_per_step": round(1000 * profiled / a.steps, 1),
              "groups_ms_per_step_profiled": {g: round(1000 * s / a.steps, 1)
                                              for g, s in sorted(groups.items(), key=lambda x: -x[1])},
              "input_sha256": sha256_ids(ids[:a.tokens + 1]), "output_ids_sha256": sha256_ids(out),
              "seconds": round(time.perf_counter() - started, 1)}
    suffix = f".reuse-{a.reuse_steps}" if a.reuse_steps else ""
    suffix += _variant(a).replace("-", ".", 1)
    write_report(a.out or f"bench/results/decode_profile/{a.model}.{a.position}-{a.tokens}{suffix}.json", report)
    vs = f"; plain at {a.ref_context:,}: {ref_ms:.1f} ms ({ms / ref_ms:.2f}x)" if ref_ms else ""
    print(f"{a.position} at {a.tokens:,} tokens: {ms:.1f} ms per step (median){vs}; plans reused {reused:.0%}; "
          f"{report['profiled_ms_per_step']} ms under cProfile:")
    for g, v in report["groups_ms_per_step_profiled"].items():
        print(f"  {g:30s} {v:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
