"""tieredkv: a long-context memory tier for Hugging Face causal LMs, with byte-exact grafts.

    from tieredkv import TieredModel, PageStore, deposit, graft, verify, load_model

Names resolve lazily so `import tieredkv` stays cheap until a model is needed.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "TieredModel": "tieredkv.tiered_model",
    "TieredConfig": "tieredkv.tiered_config",
    "working_set_bytes": "tieredkv.tiered_model",
    "deposit": "tieredkv.artifact",
    "graft": "tieredkv.artifact",
    "load_artifact": "tieredkv.artifact",
    "Artifact": "tieredkv.artifact",
    "verify": "tieredkv.verify",
    "VerifySpec": "tieredkv.verify",
    "load_model": "tieredkv.models",
    "LoadedModel": "tieredkv.models",
    "PageStore": "paging",
    "StoreConfig": "paging",
    "Library": "tieredkv.library",
    "export_artifact": "tieredkv.portable",
    "import_artifact": "tieredkv.portable",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tieredkv' has no attribute {name!r}")
