"""paging: byte-exact KV pages and the tiers that hold them (device, host, LMDB, remote).

Knows tensors and bytes, never models: it must not import tieredkv, transformers or index.
"""

import importlib
from typing import Any

# NOTE: names resolve on first use, so that `paging.errors` (all the CLI needs to build its parser) does not
# import torch; `from paging import PageStore` works as before
_EXPORTS = {
    "DeviceTier": "device_tier", "HostTier": "host_tier", "PageLayers": "page_layers", "PageLayout": "layout",
    "LMDBTier": "lmdb_tier",
    "FORMAT_VERSION": "page", "ROOT_KEY": "page", "Page": "page", "page_key": "page", "LRUPolicy": "policy",
    "RemoteConfig": "remote_tier", "RemoteError": "remote_tier", "RemoteTier": "remote_tier",
    "RemoteTierWarning": "remote_tier", "RemoteUnavailableError": "remote_tier", "PageStore": "store",
    "StoreConfig": "store", "Tier": "tier", "PageWriter": "writer",
    **{name: "errors" for name in ("CorruptPageError", "LayoutMismatchError", "ManifestNotFoundError",
                                   "PageConflictError", "PageNotFoundError", "PagingError", "StoreFullError")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
