"""Exact page scores that are not a plain inner product."""

from __future__ import annotations

import numpy as np


def quest_bound(queries: np.ndarray, upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Quest upper bound of each page's attention logit, averaged over the queries.

    queries: [..., Q, D]; upper, lower: [..., N, D] (elementwise max / min of each page's keys;
    leading dims, e.g. KV heads, are batched). Returns [..., N] float32:
    ``mean_q sum_d max(q_d * upper_d, q_d * lower_d)``.

    For every page and query this is >= ``max_t q . k_t`` over the page's keys, so the mean
    over queries is >= ``max_t mean_q q . k_t``. Since ``max(q*u, q*l) = relu(q)*u +
    min(q, 0)*l`` when ``u >= l``, the mean over queries is two matrix-vector products over
    all N pages: brute force, exact, O(N * D). Computed in float64 so rounding cannot break
    the bound by more than the final cast to float32.
    """
    q = np.asarray(queries, dtype=np.float64)  # [..., Q, D]
    pos = np.maximum(q, 0.0).mean(axis=-2)  # [..., D]
    neg = np.minimum(q, 0.0).mean(axis=-2)  # [..., D]
    upper = np.asarray(upper, dtype=np.float64)  # [..., N, D]
    lower = np.asarray(lower, dtype=np.float64)  # [..., N, D]
    # NOTE: einsum's own loop rather than BLAS gemv keeps the bytes independent of BLAS threads
    # (and is 4x faster than multiply-and-sum, which materialises [N, D] temporaries). Batching
    # the leading dims runs the same inner loop per row: the bytes equal one call per head
    # (tests/index/test_summary.py).
    return (np.einsum("...nd,...d->...n", upper, pos)
            + np.einsum("...nd,...d->...n", lower, neg)).astype(np.float32)
