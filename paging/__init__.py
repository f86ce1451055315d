"""paging: byte-exact KV pages and the tiers that hold them (device, host, LMDB, remote).

Knows tensors and bytes, never models: it must not import tieredkv, transformers or index.
"""

from .device_tier import DeviceTier
from .errors import (CorruptPageError, LayoutMismatchError, ManifestNotFoundError,
                     PageConflictError, PageNotFoundError, PagingError, StoreFullError)
from .host_tier import HostTier
from .layout import PageLayout
from .lmdb_tier import LMDBTier
from .page import FORMAT_VERSION, ROOT_KEY, Page, page_key
from .policy import LRUPolicy
from .remote_tier import (RemoteConfig, RemoteError, RemoteTier, RemoteTierWarning,
                          RemoteUnavailableError)
from .store import PageStore, StoreConfig
from .tier import Tier
from .writer import PageWriter

__all__ = [
    "CorruptPageError", "DeviceTier", "FORMAT_VERSION", "HostTier", "LMDBTier",
    "LRUPolicy", "LayoutMismatchError", "ManifestNotFoundError", "Page", "PageConflictError",
    "PageLayout", "PageNotFoundError", "PageStore", "PageWriter", "PagingError", "ROOT_KEY",
    "RemoteConfig", "RemoteError", "RemoteTier", "RemoteTierWarning", "RemoteUnavailableError",
    "StoreConfig", "StoreFullError", "Tier", "page_key",
]
