"""Loading a local model directory: the weights hashed on every load (the baseline) against the fingerprint
taken from the file-identity cache (tieredkv/models/fingerprint_cache.py), cold (no entry yet) and cached.

Directories: tiny-llama saved with smollm2's tokenizer, and smollm2's converted copy loaded as a plain
directory. The three ways alternate `--rounds` times; the OS page cache is warm for all of them (the load
reads the files either way; only the hashing of the loaded weights differs). Entries go to a temporary
$TIEREDKV_CACHE.

    python -m bench.model_load --json

The report's `tieredkv recheck` recipe (`--recheck-only`, seconds) loads each directory once each way,
nothing timed: each directory's fingerprint must hash equal on any machine (another fingerprint is another
model), and the cold and cached loads must give the fingerprint that hashing the loaded weights gives.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.common import environment, write_report
from bench.lib.report import print_recheck, recheck_block
from tieredkv.models import fingerprint_cache, loading
from tieredkv.models.loading import fingerprint_model, load_model
from tieredkv.provenance.domain import determinism_domain

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _seconds(fn) -> tuple[float, str]:
    t0 = time.perf_counter()
    fingerprint = fn()
    return time.perf_counter() - t0, fingerprint


def hash_every_load(path: Path) -> str:
    """The loader before the cache: load the directory, hash every loaded weight."""
    model, codec = loading._load_dir(path, torch.float32)
    return fingerprint_model(model, codec)


def cold(path: Path) -> str:
    shutil.rmtree(loading.cache_dir() / "fingerprints", ignore_errors=True)
    return load_model(str(path), quiet=True).fingerprint


def cached(path: Path) -> str:
    return load_model(str(path), quiet=True).fingerprint


WAYS = (("hash_every_load", hash_every_load), ("cold", cold), ("cached", cached))


def once(path: Path) -> dict:
    """Each way once, untimed (the recipe): the fingerprint, and whether the three ways agree on it."""
    fingerprints = {fn(path) for _, fn in WAYS}
    return {"fingerprint": min(fingerprints), "ways_agree": len(fingerprints) == 1}


def measure(path: Path, rounds: int) -> dict:
    times: dict[str, list[float]] = {"hash_every_load": [], "cold": [], "cached": [], "hash_only": []}
    fingerprints = set()
    for _ in range(rounds):
        lm = load_model(str(path), quiet=True)
        lm.model._tieredkv_fingerprint = None
        times["hash_only"].append(_seconds(lambda lm=lm: fingerprint_model(lm.model, lm.codec))[0])
        for way, fn in WAYS:
            seconds, fingerprint = _seconds(lambda fn=fn: fn(path))
            times[way].append(seconds)
            fingerprints.add(fingerprint)
    assert len(fingerprints) == 1, "the three ways gave different fingerprints"
    stat_s, _ = _seconds(lambda: str(fingerprint_cache.directory_identity(path)))
    median = {way: statistics.median(t) for way, t in times.items()}
    best = {way: min(t) for way, t in times.items()}
    return {"directory": str(path), "weight_bytes": sum(p.stat().st_size for p in path.glob("*.safetensors")),
            "files": len(fingerprint_cache.directory_identity(path)), "fingerprint": fingerprints.pop(),
            "seconds": times, "median_s": median, "min_s": best, "identity_stat_s": stat_s,
            "cached_vs_hash_every_load_median": median["cached"] / median["hash_every_load"],
            "cached_vs_hash_every_load_min": best["cached"] / best["hash_every_load"]}


def tiny_directory(root: Path, converted: Path) -> Path:
    """tiny-llama saved as a local directory, with the tokenizer of smollm2's converted copy."""
    tiny = root / "tiny-llama"
    load_model("tiny-llama").model.save_pretrained(tiny)
    for name in TOKENIZER_FILES:
        if (converted / name).is_file():
            shutil.copyfile(converted / name, tiny / name)
    return tiny


# ----------------------------------------------------------------------------- the recheck recipe
def recipe_args(threads: int) -> list[str]:
    return ["--threads", str(threads), "--recheck-only"]


def recipe_hashes(rows: dict[str, dict]) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from the rows per directory (all of them hash inputs), and relations."""
    outputs = {f"{name} fingerprint": row["fingerprint"] for name, row in rows.items()}
    relations = {f"{name}: cold and cached loads = the weights hashed": row.get("ways_agree", True)
                 for name, row in rows.items()}  # a timed run's rows: measure() asserted it
    return outputs, sorted(outputs), relations


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(threads)


def report_hashes(report: dict) -> dict[str, str]:
    return recipe_hashes(report["directories"])[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/model_load.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment and the recipe)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="each directory loaded once each way, untimed: print {outputs, inputs, relations, domain} "
                         "without writing (`tieredkv recheck`)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model("smollm2", quiet=True)  # converts the GGUF if this cache has no copy yet
    domain = determinism_domain(lm.model, lm.fingerprint, lm.default_page_size)
    gguf_sha = loading._file_sha256(loading.smollm2_gguf_path())
    converted = loading.cache_dir() / "models" / f"smollm2-{gguf_sha[:16]}"  # where the loader keeps it
    with tempfile.TemporaryDirectory(prefix="tkv-load-") as d:
        dirs = {"tiny-llama": tiny_directory(Path(d), converted), "smollm2-converted": converted}
        os.environ["TIEREDKV_CACHE"] = str(Path(d) / "cache")
        rows = {name: once(path) if a.recheck_only else measure(path, a.rounds) for name, path in dirs.items()}
    outputs, inputs, relations = recipe_hashes(rows)
    if a.recheck_only:
        print_recheck(outputs, domain, inputs, relations)
        return 0
    report = {"benchmark": "model_load", "environment": environment(), "rounds": a.rounds, "dtype": "float32",
              "page_cache": "warm", "directories": rows,
              "recheck": recheck_block("bench.model_load", recipe_args(torch.get_num_threads()), outputs,
                                       inputs=inputs, relations=relations, domain=domain)}
    write_report(a.out, report, print_json=a.json)
    print("directory          weights  seconds (min / median): hash every load | cold | cached | hashing alone",
          file=sys.stderr)
    for name, row in rows.items():
        cells = " | ".join(f"{row['min_s'][w]:.2f} / {row['median_s'][w]:.2f}"
                           for w in ("hash_every_load", "cold", "cached", "hash_only"))
        print(f"{name:18s} {row['weight_bytes'] / 2**20:5.1f} MiB  {cells}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
