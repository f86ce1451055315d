"""Page summaries: a few vectors per KV head that stand in for a page's keys at retrieval.

    keys [H, T, D] --summarize(method)--> summary [H, R, D]

    method  R                 the R vectors                           scored by (PageIndex)
    ------  ----------------  --------------------------------------  ----------------------------
    mean    1                 mean key per head                       inner product (faiss, exact)
    repr    min(num_repr, T)  the keys closest in direction to the    max inner product over R
                              page's mean key (see below)             (faiss, exact)
    minmax  2                 elementwise max, then min, over T       Quest upper bound (numpy,
                                                                      brute force; see scoring.py)

``repr`` follows InfLLM's representative tokens. InfLLM picks the tokens of a block that
receive the most attention from the block itself; we summarise pages without attention
scores, so we pick the ``R`` keys with the largest inner product with the page's mean key:
the most typical keys of the page. Ties break by position (earlier first) and the chosen keys
are returned in position order, copied bit-for-bit from the input. NOTE: this proxy favours
keys that look like the rest of the page; a single outlier token (a "needle") is not
guaranteed to be chosen. ``lab/2026-11-29-index_summary/`` measured what that costs in recall.

Every method is deterministic: the same input bytes give the same output bytes.
"""

from __future__ import annotations

import numpy as np

SUMMARY_METHODS = ("mean", "repr", "minmax")


def check_method(method: str, num_repr: int) -> None:
    """Raise ``ValueError`` unless ``method`` is known and ``num_repr`` is a positive int."""
    if method not in SUMMARY_METHODS:
        raise ValueError(f"unknown summary method {method!r}; use one of {SUMMARY_METHODS}")
    if isinstance(num_repr, bool) or not isinstance(num_repr, (int, np.integer)) or num_repr < 1:
        raise ValueError(f"num_repr must be a positive int, got {num_repr!r}")


def max_summary_vectors(method: str, num_repr: int) -> int:
    """The largest ``R`` that ``summarize(..., method, num_repr)`` can return."""
    check_method(method, num_repr)
    return {"mean": 1, "repr": int(num_repr), "minmax": 2}[method]


def summarize(keys: np.ndarray, method: str = "repr", num_repr: int = 4) -> np.ndarray:
    """Summarise the post-rotary keys of one page of one layer.

    keys: [H, T, D], any float dtype (cast to float32; torch callers pass ``k.float().numpy()``).
    Returns [H, R, D] float32, C-contiguous; R as in the module table.
    """
    check_method(method, num_repr)
    keys = np.asarray(keys)
    if keys.ndim != 3 or 0 in keys.shape:
        raise ValueError(f"keys must be a non-empty [H, T, D] array, got shape {keys.shape}")
    if not np.issubdtype(keys.dtype, np.floating):
        raise ValueError(f"keys must be floating point, got {keys.dtype}")
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    if not np.isfinite(keys).all():
        raise ValueError("keys contain NaN or inf; summarise only pages with finite keys")

    if method == "mean":
        out = keys.mean(axis=1, dtype=np.float64)[:, None, :]  # [H, 1, D]
    elif method == "minmax":
        out = np.stack([keys.max(axis=1), keys.min(axis=1)], axis=1)  # [H, 2, D]
    else:
        out = _representative_keys(keys, min(int(num_repr), keys.shape[1]))
    return np.ascontiguousarray(out, dtype=np.float32)


def _representative_keys(keys: np.ndarray, num_repr: int) -> np.ndarray:
    # keys: [H, T, D] float32 -> [H, R, D], the R keys per head most aligned with the mean key.
    num_heads, num_tokens, _ = keys.shape
    keys64 = keys.astype(np.float64)
    mean = keys64.mean(axis=1)  # [H, D]
    # NOTE: an explicit multiply-and-sum, not BLAS, so the scores (and thus the choice) do
    # not depend on the BLAS build or thread count.
    centrality = (keys64 * mean[:, None, :]).sum(axis=-1)  # [H, T]
    positions = np.arange(num_tokens)
    chosen = np.empty((num_heads, num_repr), dtype=np.int64)
    for h in range(num_heads):
        order = np.lexsort((positions, -centrality[h]))  # best first, earlier position on ties
        chosen[h] = np.sort(order[:num_repr])  # back to position order
    return np.take_along_axis(keys, chosen[:, :, None], axis=1)  # [H, R, D]
