"""How often a page that joins a layer's working set was in it a few decode steps before (tiny-llama, union, 1M tokens).

    taskset -c 1 env PYTHONPATH=. .venv/bin/python lab/2026-12-08-search-and-churn/churn.py --tokens 1048576 --steps 120 \
        --out lab/2026-12-08-search-and-churn/churn.json
"""
import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07-flat-decode"))
import flat_decode as fd  # noqa: E402
from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1048576)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    lm = load_model("tiny-llama")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    ids = fd.corpus_ids(lm, args.tokens)
    tm = TieredModel(lm, PageStore(tempfile.mkdtemp(prefix="churn-"), StoreConfig(
        device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")), cfg)
    with torch.inference_mode():
        for pos in range(0, args.tokens, 8192):
            tm.prefill(ids[pos:pos + 8192], logits_to_keep=None)
        step, tok = fd.greedy_step(tm), 0
        for _ in range(3):
            tok = step(tok)
        tm.cache.retrieval_log.clear()
        out_ids = []
        for _ in range(args.steps):
            tok = step(tok)
            out_ids.append(tok)
        log = [sorted(x) for x in tm.cache.retrieval_log]
    layers = lm.model.config.num_hidden_layers
    rows = []
    for layer in range(layers):
        seq = [set(x) for x in log[layer::layers]]
        for window in (1, 2, 4, 8, 16, 32):
            new = back = 0
            for t in range(window, len(seq)):
                fresh = seq[t] - seq[t - 1]
                new += len(fresh)
                back += len(fresh & set().union(*seq[t - window:t]))
            rows.append({"layer": layer, "window_steps": window, "joined_per_step": round(new / (len(seq) - window), 2),
                         "joined_seen_in_window": round(back / max(1, new), 3)})
        rows.append({"layer": layer, "distinct_pages": len(set().union(*seq)), "steps": len(seq)})
    report = {"study": "churn", "config": vars(args), "input_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
              "output_ids_sha256": hashlib.sha256(json.dumps(out_ids).encode()).hexdigest(), "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
