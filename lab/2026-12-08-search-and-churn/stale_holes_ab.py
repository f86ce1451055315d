"""Stale holes (a page that leaves the working set keeps its bytes and is revived in place when it comes back)
against plain holes: four contexts of tiny-llama (8K and 1M, each way), one decode step of each in turn.

    git apply lab/2026-12-08-search-and-churn/stale_holes.patch    # the prototype, not on main
    taskset -c 1 env PYTHONPATH=. .venv/bin/python lab/2026-12-08-search-and-churn/stale_holes_ab.py 1048576 80 \
        lab/2026-12-08-search-and-churn/stale_holes_ab.json
    git checkout tieredkv/engine/kv_buffer.py
"""
import sys, time, tempfile, warnings, json, hashlib
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-flat-decode"))
import torch
import flat_decode as fd
from paging import PageStore, StoreConfig
from tieredkv.engine import kv_buffer as kb
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
stale_hole = kb._as_hole
plain_hole = lambda key: key if key.source < 0 else kb.SlotKey(0, key.end - key.start - key.offset, 0, 0, kb._HOLE)
lm = load_model("tiny-llama")
cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
tmp = tempfile.mkdtemp(prefix="stale-ab-")
big = int(sys.argv[1]); steps = int(sys.argv[2])
ids = fd.corpus_ids(lm, big + 8200)
models = {}
with torch.inference_mode():
    for mode in ("stale", "plain"):
        for n, shift in ((8192, 1), (big, 0)):
            kb._as_hole = stale_hole if mode == "stale" else plain_hole
            tm = TieredModel(lm, PageStore(f"{tmp}/{mode}{n}", StoreConfig(device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")), cfg)
            pos = shift
            while tm.num_tokens < n:
                k = min(8192, n - tm.num_tokens); tm.prefill(ids[pos:pos + k], logits_to_keep=None); pos += k
            models[(mode, n)] = [tm, fd.greedy_step(tm), 0, [], []]
            print("ingested", mode, n, flush=True)
    for _ in range(3):
        for key, m in models.items():
            kb._as_hole = stale_hole if key[0] == "stale" else plain_hole
            m[2] = m[1](m[2])
    base = {key: (sum(l.buffer.num_revived_tokens for l in m[0].cache.layers), m[0].cache.fetch_counts["fetches"]) for key, m in models.items()}
    for _ in range(steps):
        for key, m in models.items():
            kb._as_hole = stale_hole if key[0] == "stale" else plain_hole
            t0 = time.perf_counter(); m[2] = m[1](m[2]); m[3].append(time.perf_counter() - t0); m[4].append(m[2])
med = lambda xs: 1000 * sorted(xs)[len(xs) // 2]
out = {}
for key, m in models.items():
    tm = m[0]
    rv = (sum(l.buffer.num_revived_tokens for l in tm.cache.layers) - base[key][0]) / 128 / steps
    fe = (tm.cache.fetch_counts["fetches"] - base[key][1]) / steps
    out[f"{key[0]}_{key[1]}"] = {"decode_ms": med(m[3]), "revived_pages_per_step": rv, "fetches_per_step": fe,
        "slots": [len(l.buffer.slots) for l in tm.cache.layers], "hole_pages": [l.buffer.num_hole_tokens // 128 for l in tm.cache.layers],
        "output_ids_sha256": hashlib.sha256(json.dumps(m[4]).encode()).hexdigest()[:16]}
for mode in ("stale", "plain"):
    out[f"{mode}_ratio"] = out[f"{mode}_{big}"]["decode_ms"] / out[f"{mode}_8192"]["decode_ms"]
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[3], "w"), indent=1)
for m in models.values(): m[0].close(); m[0].store.close()
