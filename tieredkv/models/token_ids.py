"""One check for token ids given to the model, shared by `TieredModel` (ingest, prefill, generate) and
`deposit`: ints (not bools, floats or strings) in a flat sequence, inside the model's vocabulary."""
from __future__ import annotations

import operator
from typing import Any

from tieredkv.errors import EmptyInputError, TokenIdsError


def _as_id(i: Any) -> int:
    if isinstance(i, bool):
        raise TypeError("a bool is not a token id")
    return operator.index(i)  # an int, numpy int or 0-d integer tensor; floats and strings raise TypeError


def check_token_ids(ids: Any, model: Any, what: str, encode: str) -> list[int]:
    """`ids` as a list of ints of `model`'s vocabulary; else TokenIdsError (EmptyInputError when there are
    none) that says what to pass. `encode` names the call that turns text into ids for this caller."""
    if isinstance(ids, (str, bytes, bytearray)):
        raise TokenIdsError(f"{what} takes token ids, got {type(ids).__name__}: encode text first ({encode})")
    try:
        out = [_as_id(i) for i in ids]
    except TypeError as exc:
        raise TokenIdsError(f"{what} takes a flat sequence of int token ids ({exc}); encode text with "
                            f"{encode}") from None
    if not out:
        raise EmptyInputError(f"nothing to {what}: no token ids")
    vocab = model.get_input_embeddings().num_embeddings
    lo, hi = min(out), max(out)
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise TokenIdsError(f"{what}: token id {bad} is outside this model's vocabulary (0..{vocab - 1}); "
                            f"encode text with this model's tokenizer ({encode})")
    return out
