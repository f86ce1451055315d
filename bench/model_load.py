"""Loading a local model directory: the weights hashed on every load (the baseline) against the fingerprint
taken from the file-identity cache (tieredkv/models/fingerprint_cache.py), cold (no entry yet) and cached.

Directories: tiny-llama saved with smollm2's tokenizer, and smollm2's converted copy loaded as a plain
directory. The three ways alternate `--rounds` times; the OS page cache is warm for all of them (the load
reads the files either way; only the hashing of the loaded weights differs). Entries go to a temporary
$TIEREDKV_CACHE.

    python -m bench.model_load --json
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

from bench.common import environment, write_report
from tieredkv.models import fingerprint_cache, loading
from tieredkv.models.loading import fingerprint_model, load_model

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


def measure(path: Path, rounds: int) -> dict:
    times: dict[str, list[float]] = {"hash_every_load": [], "cold": [], "cached": [], "hash_only": []}
    fingerprints = set()
    for _ in range(rounds):
        lm = load_model(str(path), quiet=True)
        lm.model._tieredkv_fingerprint = None
        times["hash_only"].append(_seconds(lambda lm=lm: fingerprint_model(lm.model, lm.codec))[0])
        for way, fn in (("hash_every_load", hash_every_load), ("cold", cold), ("cached", cached)):
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/model_load.json")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    load_model("smollm2", quiet=True)  # converts the GGUF if this cache has no copy yet
    gguf_sha = loading._file_sha256(loading.smollm2_gguf_path())
    converted = loading.cache_dir() / "models" / f"smollm2-{gguf_sha[:16]}"  # where the loader keeps it
    with tempfile.TemporaryDirectory(prefix="tkv-load-") as d:
        tiny = Path(d) / "tiny-llama"
        load_model("tiny-llama").model.save_pretrained(tiny)
        for name in TOKENIZER_FILES:
            if (converted / name).is_file():
                shutil.copyfile(converted / name, tiny / name)
        os.environ["TIEREDKV_CACHE"] = str(Path(d) / "cache")
        rows = {"tiny-llama": measure(tiny, a.rounds), "smollm2-converted": measure(converted, a.rounds)}
    report = {"benchmark": "model_load", "environment": environment(), "rounds": a.rounds, "dtype": "float32",
              "page_cache": "warm", "directories": rows}
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
