"""Time to first token: recompute a long context, or graft its deposited KV pages.

For each context length N (tokens of the Python language reference, repeated if short):

    recompute    canonical prefill of the N tokens, then the prompt            -> first token
    graft_host   graft the deposited pages from the host tier, then the prompt -> first token
    graft_lmdb   store closed and reopened (host tier empty): graft from LMDB with SHA-256
                 verification of every page, then the prompt; once with data.mdb in the OS
                 page cache, once evicted from it first (cold: read from disk)

The deposit itself (once per N, reusing the pages of the shorter contexts) is timed separately.
Grafted first-token logits are checked SHA-256-equal to the recompute's. Restore throughput
(KV bytes / graft seconds) is reported against this machine's memcpy and SHA-256 throughput,
measured in the same run. A llama.cpp peer (state save/load on the same GGUF) is added when
llama-cpp-python is importable.

    python bench/graft_vs_recompute.py                         # table; JSON to --out
    python bench/graft_vs_recompute.py --contexts 512,2048 --json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import (drop_file_cache, environment, markdown_table, memcpy_bytes_per_s,
                    resident_fraction, sha256_bytes_per_s, sha256_ids, timed, write_report)

from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit, graft, prefill
from tieredkv.question.corpus import python_reference, text_sha256
from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_tensor
from tieredkv.models.loading import load_model

PROMPT = "\n\nQuestion: which statement does the text above describe first?\nAnswer:"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "graft_vs_recompute.json"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--contexts", default="2048,8192,32768", help="context lengths N in tokens, comma list")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each graft path (median reported)")
    p.add_argument("--page-size", type=int, help="tokens per page (default: the model's)")
    p.add_argument("--store", help="store directory (default: a temporary one); a kept store skips re-deposits")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp peer rows")
    p.add_argument("--note", action="append", default=[], help="a note to record in the report (repeatable)")
    p.add_argument("--json", action="store_true", help="also print the JSON report on stdout")
    return p.parse_args()


def corpus_ids(lm, n: int) -> list[int]:
    ids = lm.codec.encode(python_reference())
    return (ids * (n // len(ids) + 1))[:n]


@torch.inference_mode()
def first_token(lm, cache, prompt: list[int], start: int, page_size: int) -> torch.Tensor:
    """The prompt prefilled at [start, start+P) after `cache`; the logits of its last position [vocab]."""
    return prefill(lm, prompt, cache, start=start, page_size=page_size)[0, -1]


def run_recompute(lm, ids, prompt, page_size) -> dict[str, Any]:
    from transformers import DynamicCache

    with timed() as t:
        cache = DynamicCache(config=lm.model.config)
        prefill(lm, ids, cache, page_size=page_size)
        logits = first_token(lm, cache, prompt, len(ids), page_size)
    del cache
    return {"ttft_s": t["s"], "logits": logits}


def run_graft(lm, art, store, prompt, page_size) -> dict[str, Any]:
    with timed() as t_all:
        with timed() as t_graft:
            cache = graft(lm, art, store)
        logits = first_token(lm, cache, prompt, art.num_tokens, page_size)
    del cache
    return {"ttft_s": t_all["s"], "graft_s": t_graft["s"], "logits": logits}


def summarize(system: str, n: int, runs: list[dict[str, Any]], kv_bytes: int, ref_sha: str,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    shas = {sha256_tensor(r["logits"]) for r in runs}
    sha = shas.pop() if len(shas) == 1 else "differs between repeats"
    row = {"system": system, "context_tokens": n, "kv_bytes": kv_bytes,
           "ttft_s": statistics.median(r["ttft_s"] for r in runs), "ttft_s_all": [r["ttft_s"] for r in runs],
           "first_token_logits_sha256": sha, "logits_sha256_equal_recompute": sha == ref_sha,
           "first_token_id": int(runs[0]["logits"].argmax())}
    if "graft_s" in runs[0]:
        row["graft_s"] = statistics.median(r["graft_s"] for r in runs)
        row["restore_bytes_per_s"] = kv_bytes / row["graft_s"]
    return {**row, **(extra or {})}


# ----------------------------------------------------------------------------- llama.cpp peer
def llama_cpp_rows(contexts: list[int], ids_all: list[int], prompt: list[int], threads: int) -> tuple[list[dict[str, Any]], str]:
    """llama.cpp on the same GGUF (its own Q4_1 kernels, so other floats): eval vs state save/load.

    Uses only llama-cpp-python's stable `Llama.eval / save_state / load_state / reset`.
    """
    try:
        import llama_cpp
    except ImportError as exc:
        return [], f"llama-cpp-python not importable ({exc}); peer rows skipped"
    from tieredkv.models.loading import smollm2_gguf_path

    rows = []
    llm = llama_cpp.Llama(model_path=str(smollm2_gguf_path()), n_ctx=max(contexts) + len(prompt) + 64,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(ids_all[:64])  # warm up
    for n in contexts:
        ids = ids_all[:n]
        llm.reset()
        with timed() as t_prefix:
            llm.eval(ids)
        with timed() as t_save:
            state = llm.save_state()
        with timed() as t_prompt:
            llm.eval(prompt)
        rows.append({"system": "llama.cpp recompute", "context_tokens": n, "ttft_s": t_prefix["s"] + t_prompt["s"],
                     "state_save_s": t_save["s"], "kv_bytes": int(state.llama_state_size)})
        runs = []
        for _ in range(3):
            llm.reset()
            with timed() as t:
                llm.load_state(state)
                llm.eval(prompt)
            runs.append(t["s"])
        load_s = []
        for _ in range(3):
            llm.reset()
            with timed() as t_load:
                llm.load_state(state)
            load_s.append(t_load["s"])
        rows.append({"system": "llama.cpp state load (host)", "context_tokens": n,
                     "ttft_s": statistics.median(runs), "ttft_s_all": runs, "graft_s": statistics.median(load_s),
                     "kv_bytes": int(state.llama_state_size),
                     "restore_bytes_per_s": state.llama_state_size / statistics.median(load_s)})
        del state
    del llm
    return rows, f"llama-cpp-python {llama_cpp.__version__}, n_threads={threads}, default n_batch"


# ----------------------------------------------------------------------------- main
def main() -> None:
    args = parse_args()
    contexts = sorted(int(c) for c in args.contexts.split(","))
    env = environment()
    print("# measuring ceilings ...", file=sys.stderr)
    ceilings = {"memcpy_bytes_per_s": memcpy_bytes_per_s(),
                "memcpy_preallocated_bytes_per_s": memcpy_bytes_per_s(preallocated=True),
                "sha256_bytes_per_s": sha256_bytes_per_s(),
                "memcpy_method": "torch.Tensor.clone of 1 GiB uint8 (allocate + copy), best of 3; "
                                 "preallocated: Tensor.copy_ into a touched 1 GiB buffer",
                "sha256_method": "hashlib.sha256 over 256 MiB, one stream, best of 2"}

    lm = load_model(args.model)
    page_size = args.page_size or lm.default_page_size
    ids_all = corpus_ids(lm, max(contexts))
    prompt = lm.codec.encode(PROMPT)
    with torch.inference_mode():  # warm up: the first forwards fault the weights in
        run_recompute(lm, ids_all[:2 * page_size], prompt, page_size)

    tmp = None
    store_dir = args.store
    if store_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-graft-")
        store_dir = tmp.name + "/store"
    store_cfg = StoreConfig(host_budget_bytes=8 << 30, lmdb_map_size=4 << 30)
    rows, inputs, notes = [], {}, list(args.note)
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        for n in contexts:
            ids = ids_all[:n]
            inputs[str(n)] = {"token_ids_sha256": sha256_ids(ids)}
            print(f"# N={n}: recompute ...", file=sys.stderr)
            rec = run_recompute(lm, ids, prompt, page_size)
            ref_sha = sha256_tensor(rec["logits"])

            store = PageStore(store_dir, store_cfg)
            try:
                before = store.lmdb_tier.num_pages
                print(f"# N={n}: deposit ...", file=sys.stderr)
                with timed() as t_dep:
                    art = deposit(lm, ids, store, page_size=page_size)
                new_pages = store.lmdb_tier.num_pages - before
                kv_bytes = sum(store.get(k).nbytes for k in art.page_keys)
                rows.append(summarize("recompute", n, [rec], kv_bytes, ref_sha,
                                      {"deposit_s": t_dep["s"], "deposit_new_pages": new_pages,
                                       "artifact": art.artifact_id, "root_sha256": art.root_sha256}))
                print(f"# N={n}: graft from host ...", file=sys.stderr)
                run_graft(lm, art, store, prompt, page_size)  # warm
                runs = [run_graft(lm, art, store, prompt, page_size) for _ in range(args.repeats)]
                rows.append(summarize("graft (host tier)", n, runs, kv_bytes, ref_sha))
            finally:
                store.close()

            data_mdb = Path(store_dir) / "data.mdb"
            for cold in (False, True):
                print(f"# N={n}: graft from LMDB ({'cold' if cold else 'OS page cache warm'}) ...", file=sys.stderr)
                runs, resident, method = [], [], "not dropped"
                for _ in range(args.repeats):
                    if cold:
                        method = drop_file_cache([data_mdb])
                    resident.append(resident_fraction(data_mdb))
                    store = PageStore(store_dir, store_cfg)  # a fresh store: its host tier is empty
                    try:
                        runs.append(run_graft(lm, art, store, prompt, page_size))
                        verified = store.stats()["integrity"]["verified_reads"]
                    finally:
                        store.close()
                system = "graft (LMDB cold, SHA-256)" if cold else "graft (LMDB OS-cached, SHA-256)"
                rows.append(summarize(system, n, runs, kv_bytes, ref_sha,
                                      {"page_cache": method, "resident_fraction_before": resident,
                                       "verified_pages": verified}))
            del rec
    finally:
        if tmp is not None:
            tmp.cleanup()

    if not args.no_llama_cpp and args.model == "smollm2":
        peer, note = llama_cpp_rows(contexts, ids_all, prompt, torch.get_num_threads())
        rows += peer
        notes.append(note)
    elapsed = time.perf_counter() - started

    by = {(r["system"], r["context_tokens"]): r for r in rows}
    for r in rows:
        base_name = "llama.cpp recompute" if r["system"].startswith("llama.cpp") else "recompute"
        base = by.get((base_name, r["context_tokens"]))
        if base is not None:
            r["speedup_vs_recompute"] = base["ttft_s"] / r["ttft_s"]
        if "restore_bytes_per_s" in r:
            r["restore_vs_memcpy"] = r["restore_bytes_per_s"] / ceilings["memcpy_bytes_per_s"]

    domain = determinism_domain(lm.model, lm.fingerprint, page_size)
    report = {
        "bench": "graft_vs_recompute", "hardware": env, "ceilings": ceilings,
        "config": {"model": args.model, "contexts": contexts, "page_size": page_size, "repeats": args.repeats,
                   "prompt": PROMPT, "prompt_tokens": len(prompt), "store": store_cfg.__dict__,
                   "ttft": "wall seconds from an empty cache to the first token's logits (prompt included)"},
        "model_fingerprint": lm.fingerprint, "domain": domain, "domain_id": domain_id(domain),
        "inputs": {"corpus": "python_reference()", "corpus_sha256": text_sha256(python_reference()),
                   "prompt_token_ids_sha256": sha256_ids(prompt), "contexts": inputs},
        "outputs": {str(r["context_tokens"]) + " " + r["system"]: r.get("first_token_logits_sha256")
                    for r in rows if "first_token_logits_sha256" in r},
        "rows": rows, "notes": notes, "seconds": round(elapsed, 1),
        "load_average_1_5_15": {"start": load_before, "end": os.getloadavg()},
    }
    write_report(args.out, report, print_json=args.json)

    out = sys.stderr if args.json else sys.stdout
    print(f"# {env['cpu']}, {env['cores']} cores, torch threads {env['torch_threads']}, "
          f"torch {env['torch']}, transformers {env['transformers']}", file=out)
    print(f"# model {args.model} ({lm.fingerprint[:12]}), page {page_size} tokens; memcpy "
          f"{ceilings['memcpy_bytes_per_s'] / 1e9:.2f} GB/s, sha256 {ceilings['sha256_bytes_per_s'] / 1e9:.2f} GB/s",
          file=out)
    table = []
    for r in rows:
        eq = r.get("logits_sha256_equal_recompute")
        table.append({**r, "restore_gb_per_s": r["restore_bytes_per_s"] / 1e9 if "restore_bytes_per_s" in r else None,
                      "kv_mib": r["kv_bytes"] / (1 << 20) if r.get("kv_bytes") else None,
                      "exact": None if eq is None else ("yes" if eq else "NO")})
    print(markdown_table(table, [("N", "context_tokens", "d"), ("system", "system", "s"), ("TTFT s", "ttft_s", ".3f"),
                                ("graft s", "graft_s", ".3f"), ("speedup", "speedup_vs_recompute", ".1f"),
                                ("KV MiB", "kv_mib", ".1f"), ("restore GB/s", "restore_gb_per_s", ".2f"),
                                ("logits = recompute", "exact", "s")]), file=out)
    for note in notes:
        print(f"# note: {note}", file=out)
    print(f"# {elapsed:.0f} s; JSON: {args.out}", file=out)


if __name__ == "__main__":
    main()
