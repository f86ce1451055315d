"""The CUDA checks that a CPU machine cannot run: exactness on the GPU, and pinned host -> device throughput.

    exactness   verify() on CUDA (graft vs fresh prefill: SHA-256 of the continuation's logits), and a
                TieredModel whose context fits its working set against the plain HF model (logits
                torch.equal, chunk by chunk and for decode steps), model and device tier on CUDA
    h2d         pages in the host tier (pinned, as HostTier keeps them under CUDA) copied to the device:
                - per (page, layer), through PageStore.fetch_layer: what decode's working set does
                - per page (one copy of its whole payload)
                vs one cudaMemcpyAsync of the same bytes from one pinned buffer (`Tensor.copy_`)

Run by scripts/gpu_check.sh; `--allow-cpu` runs the same code on CPU (the pinned path with plain
memory) so the script itself is exercised where there is no GPU.

    python -m bench.gpu_check --json --out bench/results/gpu_check.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.common import environment, sha256_ids, write_report
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit, prefill
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.provenance.verify import VerifySpec, verify
from tieredkv.question.corpus import python_reference


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def exactness(lm, device: str, tokens: int) -> dict:
    rep = verify(lm, VerifySpec(tokens=tokens, samples=3, continuation=8, seed=0))
    ids = lm.codec.encode(python_reference())[:tokens]
    cfg = TieredConfig(chunk_pages=2)  # capacity 33 pages: `tokens` must fit
    from transformers import DynamicCache

    plain_cache, plain = DynamicCache(config=lm.model.config), []
    prefill(lm, ids, plain_cache, page_size=lm.default_page_size * cfg.chunk_pages,
            on_chunk=lambda s, e, o: plain.append(o.logits[0]), logits_to_keep=0)
    with tempfile.TemporaryDirectory() as tmp, PageStore(tmp, StoreConfig(
            device=device, device_budget_bytes=working_set_bytes(lm, cfg))) as store:
        tm = TieredModel(lm, store, cfg)
        try:
            chunk = tm.page_size * cfg.chunk_pages
            tiered = [tm.forward(torch.tensor([ids[s:s + chunk]], device=device), logits_to_keep=0).logits[0]
                      for s in range(0, tokens, chunk)]
            steps_equal = True
            for tok in (5, 6, 7):
                x = torch.tensor([[tok]], device=device)
                a = tm.forward(x, logits_to_keep=1).logits
                with torch.inference_mode():
                    b = lm.model(input_ids=x, past_key_values=plain_cache, use_cache=True, logits_to_keep=1).logits
                steps_equal &= torch.equal(a, b)
            retrieving = tm.cache.retrieving
        finally:
            tm.close()
    fits_equal = torch.equal(torch.cat(tiered), torch.cat(plain))
    return {"verify_samples": rep["samples"], "verify_sha256_equal": rep["sha256_equal"],
            "verify_kl_max": rep.get("kl_max"), "tiered_fits_equals_plain_prefill": fits_equal,
            "tiered_fits_equals_plain_decode": steps_equal, "tiered_retrieving": retrieving,
            "ok": rep["sha256_equal"] == rep["samples"] and fits_equal and steps_equal,
            "input_token_ids_sha256": sha256_ids(ids),
            "plain_logits_sha256": sha256_tensor(torch.cat(plain))}


def h2d(lm, device: str, tokens: int, repeats: int) -> dict:
    ids = lm.codec.encode(python_reference())[:tokens]
    with tempfile.TemporaryDirectory() as tmp:
        with PageStore(tmp, StoreConfig(host_budget_bytes=16 << 30, device_budget_bytes=0, device=device)) as store:
            art = deposit(lm, ids, store)
            for key in art.page_keys:
                store.get(key)  # in the host tier: pinned under CUDA
            host = store.host_tier
            layout = store.get(art.page_keys[0]).layout
            bufs = [host.get_pinned(k) for k in art.page_keys]
            pinned = all(b is not None for b in bufs)
            if not pinned:  # CPU: the same path over plain memory
                bufs = [torch.frombuffer(bytearray(store.get(k).payload), dtype=torch.uint8) for k in art.page_keys]
            nbytes = sum(b.numel() for b in bufs)
            src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            src.fill_(1)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            stage = [torch.empty(b.numel(), dtype=torch.uint8, device=device) for b in bufs]

            def one_memcpy():
                dst.copy_(src, non_blocking=True)

            def per_page():
                for d, b in zip(stage, bufs):
                    d.copy_(b, non_blocking=True)

            def per_page_layer():  # decode's path: device budget 0, so every call copies
                return [store.fetch_layer(k, layer) for k in art.page_keys for layer in range(layout.num_layers)]

            times = {"one_memcpy": [], "per_page": [], "per_page_layer": []}
            for r in range(repeats + 1):
                for name, fn in (("one_memcpy", one_memcpy), ("per_page", per_page),
                                 ("per_page_layer", per_page_layer)):
                    sync()
                    t0 = time.perf_counter()
                    out = fn()
                    sync()
                    if r:
                        times[name].append(time.perf_counter() - t0)
                    del out
    gbs = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    return {"bytes": nbytes, "pinned": pinned, "device": device, "gb_per_s": gbs, "seconds_all": times,
            "per_page_vs_memcpy": gbs["per_page"] / gbs["one_memcpy"],
            "per_page_layer_vs_memcpy": gbs["per_page_layer"] / gbs["one_memcpy"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=2048, help="exactness context (must fit one working set)")
    ap.add_argument("--h2d-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--allow-cpu", action="store_true", help="run on CPU when there is no GPU (tests the script)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "gpu_check.json"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available() and not a.allow_cpu:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); --allow-cpu to run on CPU",
              file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    lm = load_model(a.model)
    lm.model.to(device)
    report = {"bench": "gpu_check", "hardware": environment(), "model": a.model,
              "model_fingerprint": lm.fingerprint, "device": device,
              "load_average_1_5_15": os.getloadavg()}
    report["exactness"] = exactness(lm, device, a.tokens)
    print(f"# exactness: {report['exactness']}", file=sys.stderr)
    report["h2d"] = h2d(lm, device, a.h2d_tokens, a.repeats)
    print(f"# h2d: {report['h2d']['gb_per_s']}", file=sys.stderr)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_report(a.out, report, print_json=a.json)
    return 0 if report["exactness"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
