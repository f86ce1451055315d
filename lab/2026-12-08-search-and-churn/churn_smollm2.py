"""The churn of a real model's working set: smollm2 decoding over real prose, union retrieval, 128-token pages.

    env PYTHONPATH=. .venv/bin/python lab/2026-12-08-search-and-churn/churn_smollm2.py --contexts 8192,32768 \
        --steps 48 --out lab/2026-12-08-search-and-churn/churn_smollm2.json

The context is the Python language reference (what `tieredkv qa` ingests in the demo) repeated to the length; at
each length the model decodes greedily from the end of it. For each layer and step: the pages retrieved, the share
kept from the step before, and the share of joined pages seen within the last 2 and 8 steps.
"""
import argparse
import hashlib
import json
import tempfile
import warnings
from pathlib import Path

import torch

from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.models.loading import load_model
from tieredkv.question.corpus import python_reference


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    lm = load_model("smollm2")
    cfg = TieredConfig(retrieval="union", page_size=128, chunk_pages=1, position="own")
    base = lm.codec.encode(python_reference())
    rows = []
    for n in [int(x) for x in args.contexts.split(",")]:
        ids = (base * (n // len(base) + 1))[:n]
        tm = TieredModel(lm, PageStore(tempfile.mkdtemp(prefix="churn-smol-"), StoreConfig(
            device_budget_bytes=working_set_bytes(lm, cfg), device="cpu")), cfg)
        with torch.inference_mode():
            for pos in range(0, n - 1, 2048):
                tm.prefill(ids[pos:min(pos + 2048, n - 1)], logits_to_keep=None)
            logits = tm.forward(torch.tensor([[ids[-1]]]), logits_to_keep=1).logits
            tm.cache.retrieval_log.clear()
            out = []
            for _ in range(args.steps):
                tok = int(logits[0, -1].argmax())
                out.append(tok)
                logits = tm.forward(torch.tensor([[tok]]), logits_to_keep=1).logits
            log = [set(x) for x in tm.cache.retrieval_log]
        layers = len(log) // args.steps
        kept, back2, back8, joined, sizes = [], [], [], [], []
        for layer in range(layers):
            seq = log[layer::layers]
            for t in range(1, len(seq)):
                fresh = seq[t] - seq[t - 1]
                sizes.append(len(seq[t]))
                kept.append(len(seq[t] & seq[t - 1]) / max(1, len(seq[t])))
                joined.append(len(fresh))
                if t >= 8 and fresh:
                    back2.append(len(fresh & set().union(*seq[t - 2:t])) / len(fresh))
                    back8.append(len(fresh & set().union(*seq[t - 8:t])) / len(fresh))
        mean = lambda xs: round(sum(xs) / max(1, len(xs)), 3)  # noqa: E731
        row = {"context_tokens": n, "pages": len(tm.cache.spans), "layers_logged": layers,
               "retrieved_pages_mean": mean(sizes), "kept_from_step_before": mean(kept),
               "joined_per_layer_step": mean(joined), "joined_seen_within_2_steps": mean(back2),
               "joined_seen_within_8_steps": mean(back8),
               "input_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
               "output_ids_sha256": hashlib.sha256(json.dumps(out).encode()).hexdigest(),
               "output_text": lm.codec.decode(out)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        tm.close()
        tm.store.close()
    Path(args.out).write_text(json.dumps({"study": "churn_smollm2", "config": vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
