"""Typed errors of the model-integration layer. Each message says what to do next."""
from __future__ import annotations

from paging.errors import PagingError


class TieredKVError(Exception):
    """Base class for errors raised by tieredkv (model integration, artifacts, CLI)."""


class ModelNotFoundError(TieredKVError):
    """The model name is neither a built-in name nor a local directory."""


class ModelCacheError(TieredKVError):
    """$TIEREDKV_CACHE cannot hold the converted embedded model (not a directory, not writable, full)."""


class ModelMismatchError(TieredKVError):
    """An artifact or store was made by another model (fingerprints differ)."""

    def __init__(self, what: str, expected: str, actual: str):
        self.expected, self.actual = expected, actual
        super().__init__(
            f"{what} was made by model {expected[:16]}…; this model is {actual[:16]}… "
            f"(full: {expected} vs {actual}). Load the matching model or re-deposit."
        )


class DomainMismatchError(TieredKVError):
    """Grafting across determinism domains: the byte-exact guarantee does not hold."""


class ArtifactNotFoundError(TieredKVError, KeyError):
    """No artifact with that id in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class EmptyInputError(TieredKVError, ValueError):
    """Empty text, document or question."""


class UnsupportedModelError(TieredKVError):
    """The model lacks something an operation needs (rotary embeddings for --shift, say)."""


__all__ = [
    "TieredKVError", "ModelNotFoundError", "ModelMismatchError", "DomainMismatchError",
    "ArtifactNotFoundError", "EmptyInputError", "UnsupportedModelError", "PagingError",
]


class DiskBudgetError(TieredKVError):
    """A context would not fit the store's disk budget; raised before any work is done."""


class TornContextError(TieredKVError):
    """A forward failed part-way; the context it was extending cannot be used any more."""


class StoredContextDamagedError(TieredKVError):
    """A stored document's pages failed verification or are gone; re-ingest it."""


class ClosedError(TieredKVError):
    """A TieredModel (or the store under it) was used after close()."""


class TokenIdsError(TieredKVError, ValueError):
    """Token ids that are not ints of the model's vocabulary (a string, floats, an id out of range)."""


class CacheNotActiveError(TieredKVError):
    """A TieredCache used by a plain model call, outside its TieredModel (the tiered attention is not active)."""

    def __init__(self, message: str = "this TieredCache was passed to the model without its TieredModel: call "
                                      "tm.generate(...) (or tm(...)), which runs the model's generate() over it"):
        super().__init__(message)


class DocumentLookupError(TieredKVError):
    """A stored document does not match the document asked about (its tokens or page chain differ)."""


class StoreNotGivenError(TieredKVError):
    """No store directory given and none named by $TIEREDKV_STORE."""
