"""A torch runtime hazard to exactness: the first forward after a thread-count change.

Each child process runs attention at one torch thread, switches to `--threads`, loads the model and
runs the same 128-token prefill twice, recording the rotary's cos each time. Mode `switch` does that
in a fresh process; `warm` runs one prefill before the switch. Reported per mode: in how many
processes the first prefill's cos differed from the second's, the largest difference, and the
SHA-256 of every distinct cos seen (docs/DESIGN.md, "Set the thread count once").

    python bench/thread_switch_hazard.py --processes 20
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.report import environment, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXT = "Grouped heads read one copy of the working set. " * 40


def child(mode: str, model: str, threads: int) -> dict:
    import torch
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill
    from tieredkv.provenance.domain import sha256_tensor
    from tieredkv.models.loading import load_model

    lm, cos = None, []

    def run():
        prefill(lm, ids, DynamicCache(config=lm.model.config), page_size=128, logits_to_keep=0)

    if mode == "warm":
        lm = load_model(model)
        ids = lm.codec.encode(TEXT)[:128]
        run()
    torch.set_num_threads(1)
    q, k = torch.randn(1, 9, 128, 64), torch.randn(1, 3, 3000, 64)
    torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=torch.rand(1, 1, 128, 3000) > 0.3,
                                                     enable_gqa=True)
    torch.set_num_threads(threads)
    if lm is None:
        lm = load_model(model)
        ids = lm.codec.encode(TEXT)[:128]
    hook = lm.model.model.rotary_emb.register_forward_hook(lambda _m, _a, out: cos.append(out[0].clone()))
    run()
    run()
    hook.remove()
    return {"differs": not torch.equal(cos[0], cos[1]), "max_abs_diff": float((cos[0] - cos[1]).abs().max()),
            "cos_sha256": [sha256_tensor(c) for c in cos]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--processes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="the thread count switched to")
    ap.add_argument("--modes", default="switch,warm")
    ap.add_argument("--out", default="bench/results/thread_switch_hazard.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.model, a.threads)))
        return 0
    if a.processes < 1 or a.threads < 1:
        ap.error("--processes and --threads must be >= 1")
    started, summary, rows = time.perf_counter(), [], []
    for mode in a.modes.split(","):
        runs = []
        for i in range(a.processes):
            done = subprocess.run([sys.executable, __file__, "--child", mode, "--model", a.model,
                                   "--threads", str(a.threads)], capture_output=True, text=True, cwd=ROOT,
                                  timeout=600)
            if done.returncode:
                sys.exit(f"thread_switch_hazard: child failed: {done.stderr.strip().splitlines()[-1:]}")
            runs.append({"mode": mode, "process": i, **json.loads(done.stdout.strip().splitlines()[-1])})
        rows += runs
        summary.append({"mode": mode, "processes": len(runs), "differed": sum(r["differs"] for r in runs),
                        "max_abs_diff": max(r["max_abs_diff"] for r in runs),
                        "distinct_cos_sha256": sorted({h for r in runs for h in r["cos_sha256"]})})
        print(summary[-1], file=sys.stderr, flush=True)
    write_report(a.out, {"bench": "thread_switch_hazard", "args": vars(a), "environment": environment(),
                         "load_average_1_5_15_end": os.getloadavg(), "seconds": round(time.perf_counter() - started, 1),
                         "summary": summary, "rows": rows})
    for s in summary:
        print(f"{s['mode']}: first forward differed in {s['differed']} of {s['processes']} processes "
              f"(max |diff| {s['max_abs_diff']:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
