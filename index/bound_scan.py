"""Exact Quest top-k over many pages: a float32 faiss pass picks candidates, the exact score ranks them.

    page bounds [H, N, D] max, [H, N, D] min      (float64, as PageIndex scores them)
          |  rows [max | min]: [H, N, 2D] float32, kept beside them
          v
    faiss.knn(inner product) per head: the `want` best rows by  x . [max | min],  x = [mean relu(q) | mean min(q, 0)]
          |  widened until the last row returned is certainly below the cut (see `candidates`)
          v
    quest_bound on those rows only -> the same float32 scores, hence the same top-k, as the flat scan

The Quest bound of a page is an inner product: ``mean_q sum_d max(q_d u_d, q_d l_d) = [mean relu(q) | mean
min(q, 0)] . [u | l]``. faiss computes it in float32 with its own summation order, so its value ``s32`` differs
from the exact one by at most ``err = (2D + 2) * 2^-24 * sum_d |x_d| * max_n |row_nd|`` (rounding of the query
to float32 and of 2D products and sums). A page outside faiss's best rows can only belong to the exact top-k if
its ``s32`` is within ``3 * err`` of the best rows' cut (twice the error, plus the final cast of exact scores
to float32, bounded by the same margin), so the candidates are every row with ``s32 >= cut - 3 * err``; the
exact scores of those rows decide. Nothing here is approximate: the scan is still linear in the pages, but in
float32 SIMD without materialising or sorting all N exact scores (tests/index/test_bound_scan.py).
"""

from __future__ import annotations

import faiss
import numpy as np

_UNIT = 2.0 ** -24  # float32 unit roundoff
_SAFETY = 2.0  # the error bound is rigorous; the factor covers faiss accumulating in a different order


class BoundRows:
    """[max | min] rows of every page of one layer, per head, float32, growable in place."""

    def __init__(self, num_heads: int, dim: int) -> None:
        self.num_heads, self.dim = num_heads, dim
        self._rows = np.empty((num_heads, 64, 2 * dim), dtype=np.float32)  # [H, capacity, 2D]
        self._abs_max = np.zeros((num_heads, 2 * dim), dtype=np.float64)  # [H, 2D]: max_n |row_nd|
        self.num_rows = 0

    def extend(self, upper: np.ndarray, lower: np.ndarray) -> None:
        """Append pages: upper, lower [H, M, D] (their max and min rows, in page order)."""
        n, m = self.num_rows, upper.shape[1]
        if n + m > self._rows.shape[1]:
            grown = np.empty((self.num_heads, max(2 * self._rows.shape[1], n + m), 2 * self.dim), dtype=np.float32)
            grown[:, :n] = self._rows[:, :n]
            self._rows = grown
        self._rows[:, n:n + m, :self.dim] = upper
        self._rows[:, n:n + m, self.dim:] = lower
        np.maximum(self._abs_max, np.abs(self._rows[:, n:n + m]).max(axis=1), out=self._abs_max)
        self.num_rows = n + m

    def candidates(self, head: int, pos: np.ndarray, neg: np.ndarray, want: int) -> np.ndarray:
        """Rows that may hold the `want` best exact Quest bounds of `head`, ascending; pos, neg: [D] float64
        (the queries' mean relu and mean negative part). Every row whose exact score ties or beats the
        `want`-th best is among them."""
        n = self.num_rows
        if want >= n:
            return np.arange(n)
        x = np.concatenate([pos, neg])  # [2D] float64
        err = _SAFETY * (2 * self.dim + 2) * _UNIT * float(np.abs(x) @ self._abs_max[head])
        rows = self._rows[head, :n]  # [N, 2D], contiguous
        x32 = x.astype(np.float32)[None]  # [1, 2D]
        k = min(n, 2 * want)
        while True:
            scores, found = faiss.knn(x32, rows, k, metric=faiss.METRIC_INNER_PRODUCT)  # best first
            cut = float(scores[0, want - 1]) - 3 * err
            # NOTE: every row faiss left out scores <= its last returned row; below the cut, none can win
            if k == n or float(scores[0, k - 1]) < cut:
                return np.sort(found[0][scores[0] >= cut])
            k = min(n, 2 * k)
