"""Helpers shared by the CLI command modules."""
from __future__ import annotations

import argparse
import json
from typing import Any


def model_arg(p: argparse.ArgumentParser, default: str = "smollm2") -> None:
    p.add_argument("--model", default=default, help="smollm2 (embedded), tiny-llama|tiny-qwen2|tiny-mistral|"
                   "tiny-gemma2|tiny-gemma3|tiny-gpt2, or a local HF model directory (default: %(default)s)")


def open_store(path: str, **kw):
    """A PageStore; a shared remote tier is used when $TIEREDKV_REMOTE names one (redis://host:port/db)."""
    from paging import PageStore, StoreConfig

    kw.setdefault("remote_from_env", True)
    return PageStore(path, StoreConfig(**kw))


def print_json(obj: Any, as_json: bool = True) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True) if as_json else obj)
