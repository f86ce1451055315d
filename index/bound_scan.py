"""Exact Quest top-k over many pages: a half-precision faiss pass picks candidates, the exact score ranks them.

    page bounds [H, N, D] max, [H, N, D] min      (float64, as PageIndex scores them)
          |  rows [max | min] per head, rounded to float16 (2 bytes a value), in one faiss index per head
          v
    faiss inner product per head: the `want` best rows by  x . [max | min],  x = [mean relu(q) | mean min(q, 0)]
          |  widened until the last row returned is certainly below the cut (see `candidates`)
          v
    quest_bound on those rows only -> the same float32 scores, hence the same top-k, as the flat scan

The Quest bound of a page is an inner product: ``mean_q sum_d max(q_d u_d, q_d l_d) = [mean relu(q) | mean
min(q, 0)] . [u | l]``. faiss computes it from the rows rounded to float16, in float32 with its own summation
order, so its value ``s`` differs from the exact one by at most ``enc + err``:
``enc = sum_d |x_d| (2^-11 max_n |row_nd| + 2^-25)`` (numpy's round-to-nearest to float16: half an ulp, 2^-25
below the normal range) and ``err = (2D + 2) * 2^-24 * sum_d |x_d| * max_n |row_nd|`` (rounding of the query
to float32 and of 2D products and sums). If the `want`-th best ``s`` is ``c``, the exact `want`-th best is at
least ``c - enc - err``, so a row of the exact top-`want` has ``s >= c - 2 (enc + err)``; the candidates are
every row with ``s >= c - 2 enc - 3 err`` (the third ``err`` covers the final cast of exact scores to float32)
and their exact scores decide. Nothing here is approximate: the scan is still linear in the pages, but reads
2 bytes a value where float32 rows read 4 and the float64 bounds 8: at a million tokens and more the rows no
longer stay in cache between decode steps, so the pass is bound by memory (lab/2026-12-07-half-rows).
Rows whose magnitude float16 cannot hold (above 65,504) are kept in float32 (`BoundRows.half` False).
(tests/index/test_bound_scan.py)
"""

from __future__ import annotations

import faiss
import numpy as np

_UNIT = 2.0 ** -24  # float32 unit roundoff
_HALF_UNIT, _HALF_TINY = 2.0 ** -11, 2.0 ** -25  # float16: relative error of rounding, absolute below normal
HALF_MAX = 65504.0  # the largest finite float16
_SAFETY = 2.0  # the error bound is rigorous; the factor covers faiss accumulating in a different order


def fits_half(*arrays: np.ndarray) -> bool:
    """Whether every value rounds to a finite float16."""
    return all(a.size == 0 or float(np.abs(a).max()) <= HALF_MAX for a in arrays)


class BoundRows:
    """[max | min] rows of every page of one layer, per head, in one faiss inner-product index per head:
    float16 codes when `half` (the rows must fit, `fits_half`), else float32. Grows in place."""

    def __init__(self, num_heads: int, dim: int, half: bool = True) -> None:
        self.num_heads, self.dim, self.half = num_heads, dim, half
        if half:
            self._index = [faiss.IndexScalarQuantizer(2 * dim, faiss.ScalarQuantizer.QT_fp16,
                                                      faiss.METRIC_INNER_PRODUCT) for _ in range(num_heads)]
        else:
            self._index = [faiss.IndexFlatIP(2 * dim) for _ in range(num_heads)]
        self._abs_max = np.zeros((num_heads, 2 * dim), dtype=np.float64)  # [H, 2D]: max_n |row_nd|
        self.num_rows = 0

    def extend(self, upper: np.ndarray, lower: np.ndarray) -> None:
        """Append pages: upper, lower [H, M, D] (their max and min rows, in page order). ValueError, adding
        nothing, when the rows are half and these values do not fit a float16 (rebuild with half=False)."""
        if self.half and not fits_half(upper, lower):
            raise ValueError(f"page bounds above {HALF_MAX} do not fit float16 rows; build BoundRows(half=False)")
        m = upper.shape[1]
        rows = np.concatenate([upper, lower], axis=2)  # [H, M, 2D]
        for h in range(self.num_heads):
            if self.half:  # NOTE: numpy rounds to nearest (even); the margin in `candidates` assumes it
                self._index[h].add_sa_codes(np.ascontiguousarray(rows[h], dtype=np.float16).view(np.uint8))
            else:
                self._index[h].add(np.ascontiguousarray(rows[h], dtype=np.float32))
        np.maximum(self._abs_max, np.abs(rows).max(axis=1), out=self._abs_max)
        self.num_rows += m

    def candidates(self, head: int, pos: np.ndarray, neg: np.ndarray, want: int) -> np.ndarray:
        """Rows that may hold the `want` best exact Quest bounds of `head`, ascending; pos, neg: [D] float64
        (the queries' mean relu and mean negative part). Every row whose exact score ties or beats the
        `want`-th best is among them."""
        n = self.num_rows
        if want >= n:
            return np.arange(n)
        x = np.concatenate([pos, neg])  # [2D] float64
        weight = np.abs(x) @ self._abs_max[head]
        err = _SAFETY * (2 * self.dim + 2) * _UNIT * float(weight)
        enc = (_HALF_UNIT * float(weight) + _HALF_TINY * float(np.abs(x).sum())) if self.half else 0.0
        x32 = x.astype(np.float32)[None]  # [1, 2D]
        index = self._index[head]
        k = min(n, 2 * want)
        while True:
            scores, found = index.search(x32, k)  # best first
            cut = float(scores[0, want - 1]) - 2 * enc - 3 * err
            # NOTE: every row faiss left out scores <= its last returned row; below the cut, none can win
            if k == n or float(scores[0, k - 1]) < cut:
                return np.sort(found[0][scores[0] >= cut])
            k = min(n, 2 * k)
