"""cProfile of a retrieving decode step at one context (tiny-llama, union, 128-token pages), no interleaved pair:
ms/step, the output ids' hash, the top functions by own time.

    taskset -c 1 python lab/2026-12-06-batched-fetch/profile_step.py 131072 60
"""
import cProfile, pstats, sys, tempfile, time, warnings, hashlib, json
import torch
from bench.memory_vs_context import corpus_ids, greedy_step
from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model

n = int(sys.argv[1]); steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
warnings.filterwarnings("ignore", message="own positions reach")
torch.set_num_threads(1)
lm = load_model("tiny-llama")
cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
ids = corpus_ids(lm, n)
tmp = tempfile.mkdtemp()
tm = TieredModel(lm, PageStore(f"{tmp}/m", StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")), cfg)
out = []
with torch.inference_mode():
    for p in range(0, n, 8192):
        tm.prefill(ids[p:p + 8192], logits_to_keep=None)
    step = greedy_step(tm)
    a = 0
    for _ in range(3):
        a = step(a)
    t0 = time.perf_counter()
    for _ in range(steps):
        a = step(a); out.append(a)
    print("ms/step", 1000 * (time.perf_counter() - t0) / steps)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(steps):
        a = step(a); out.append(a)
    pr.disable()
print("out sha", hashlib.sha256(json.dumps(out).encode()).hexdigest())
pstats.Stats(pr).sort_stats("tottime").print_stats(35)
