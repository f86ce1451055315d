"""tieredkv: a long-context memory tier for Hugging Face causal LMs, with byte-exact grafts.

    from tieredkv import TieredModel, PageStore, deposit, graft, verify, load_model
    tm = TieredModel.from_pretrained("smollm2", store="kv-store"); tm.ask(tm.open(text), "...")

Names resolve lazily so `import tieredkv` stays cheap until a model is needed.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "TieredModel": "tieredkv.engine.tiered_model",
    "TieredConfig": "tieredkv.engine.tiered_config",
    "Answer": "tieredkv.question.ask",
    "Document": "tieredkv.question.ask",
    "GenerationOptionError": "tieredkv.engine.generation",
    "working_set_bytes": "tieredkv.engine.tiered_model",
    "deposit": "tieredkv.artifacts.artifact",
    "graft": "tieredkv.artifacts.artifact",
    "load_artifact": "tieredkv.artifacts.artifact",
    "Artifact": "tieredkv.artifacts.artifact",
    "verify": "tieredkv.provenance.verify",
    "VerifySpec": "tieredkv.provenance.verify",
    "load_model": "tieredkv.models.loading",
    "LoadedModel": "tieredkv.models.loading",
    "PageStore": "paging",
    "StoreConfig": "paging",
    "Library": "tieredkv.library.solutions",
    "export_artifact": "tieredkv.artifacts.portable",
    "import_artifact": "tieredkv.artifacts.portable",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tieredkv' has no attribute {name!r}")
