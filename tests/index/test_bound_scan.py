"""The half-precision candidate pass (bound_scan.py) gives the flat scan's top-k: same page ids, same score bytes."""

import faiss
import numpy as np
import pytest

from index import PageIndex
from index.bound_scan import BoundRows
from index.page_index import FLAT_SCAN_BELOW
from index.scoring import quest_bound

L, H, D = 2, 2, 8


def _bounds(rng, num_pages: int, *, num_distinct: int | None = None) -> np.ndarray:
    """Random minmax summaries [N, L, H, 2, D]; with num_distinct, pages repeat (exact score ties)."""
    n = num_distinct or num_pages
    keys = rng.standard_normal((n, L, H, 16, D)).astype(np.float32)  # [n, L, H, T, D]
    s = np.stack([keys.max(axis=3), keys.min(axis=3)], axis=3)  # [n, L, H, 2, D]
    return s[np.arange(num_pages) % n]


def _index(s: np.ndarray, ids=None) -> PageIndex:
    index = PageIndex(L, H, D, method="minmax")
    index.add_many(range(len(s)) if ids is None else ids, s)
    return index


def _assert_same(index: PageIndex, layer: int, q: np.ndarray, k: int, exclude) -> None:
    fast_ids, fast_scores = index.search(layer, q, k, exclude)
    flat_ids, flat_scores = index.search_flat(layer, q, k, exclude)
    np.testing.assert_array_equal(fast_ids, flat_ids)
    assert fast_scores.tobytes() == flat_scores.tobytes()


@pytest.mark.parametrize("seed", range(20))
def test_candidate_pass_equals_flat_scan(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(FLAT_SCAN_BELOW, 3 * FLAT_SCAN_BELOW))
    index = _index(_bounds(rng, n))
    for layer in range(L):
        for q_len in (1, 5):
            q = rng.standard_normal((H, q_len, D)).astype(np.float32)
            k = int(rng.integers(1, 40))
            exclude = set(range(int(rng.integers(0, 3)))) | set(range(n - int(rng.integers(1, 20)), n))
            _assert_same(index, layer, q, k, exclude)


@pytest.mark.parametrize("seed", range(8))
def test_ties_break_by_page_id_as_the_flat_scan(seed):
    # 40 distinct pages repeated: every score has ~20 exact ties, in shuffled page ids
    rng = np.random.default_rng(100 + seed)
    n = 800
    index = _index(_bounds(rng, n, num_distinct=40), ids=rng.permutation(10 * n)[:n].tolist())
    q = rng.standard_normal((H, 3, D)).astype(np.float32)
    for k in (1, 7, 16, 33):
        _assert_same(index, 0, q, k, set(index.page_ids()[:5]))


def test_near_ties_within_float32_rounding_are_kept():
    # pages whose exact scores differ by far less than float32 resolves: the candidate margin keeps them all
    rng = np.random.default_rng(7)
    s = np.repeat(_bounds(rng, 1), 2 * FLAT_SCAN_BELOW, axis=0).astype(np.float64)
    s[:, :, :, 0] += rng.integers(0, 4, size=s.shape[:3] + (D,))[:, :, :, :] * 2.0 ** -22
    index = _index(s.astype(np.float32))
    q = rng.standard_normal((H, 2, D)).astype(np.float32)
    for k in (1, 10, 100):
        _assert_same(index, 1, q, k, {0, 1})


def test_grows_and_rebuilds_like_the_flat_scan():
    # rows appended page by page after the candidate pass was built, then removal (a rebuild)
    rng = np.random.default_rng(3)
    s = _bounds(rng, FLAT_SCAN_BELOW + 300)
    index = _index(s[:FLAT_SCAN_BELOW])
    q = rng.standard_normal((H, 1, D)).astype(np.float32)
    index.search(0, q, 4)  # builds the float32 rows
    for page_id in range(FLAT_SCAN_BELOW, len(s)):
        index.add(page_id, s[page_id])
        if page_id % 97 == 0:
            _assert_same(index, 0, q, 16, {0, page_id})
    index.remove(5)
    _assert_same(index, 1, q, 16, {0})


@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("scale", [1.0, 1e-6, 5e3])  # float16: normal range, subnormal, coarse ulps
def test_candidates_cover_the_exact_top_rows(half, scale):
    rng = np.random.default_rng(11)
    rows = BoundRows(num_heads=1, dim=D, half=half)
    up = rng.standard_normal((1, 3000, D)) * scale
    low = up - np.abs(rng.standard_normal((1, 3000, D))) * scale
    rows.extend(up, low)
    q = rng.standard_normal((4, D))
    pos, neg = np.maximum(q, 0).mean(axis=0), np.minimum(q, 0).mean(axis=0)
    exact = quest_bound(q, up[0], low[0])  # [N]
    for want in (1, 17, 250):
        cand = rows.candidates(0, pos, neg, want)
        cut = np.sort(exact)[-want]
        assert set(np.flatnonzero(exact >= cut)) <= set(cand.tolist())
        assert len(cand) < 3000 // 2  # a pass that returned everything would prove nothing


def test_half_rows_hold_float16_codes_and_refuse_what_float16_cannot_hold():
    rows = BoundRows(num_heads=2, dim=D)
    up = np.random.default_rng(2).standard_normal((2, 5, D))
    rows.extend(up, up - 1)
    codes = faiss.vector_to_array(rows._index[1].codes).view(np.float16).reshape(5, 2 * D)
    assert codes.tobytes() == np.concatenate([up[1], up[1] - 1], axis=1).astype(np.float16).tobytes()
    with pytest.raises(ValueError, match="float16"):
        rows.extend(up * 1e5, up)
    assert rows.num_rows == 5 and all(index.ntotal == 5 for index in rows._index)


def test_bounds_beyond_float16_switch_the_pass_to_float32_rows():
    # the pass is built in float16; a page whose keys float16 cannot hold rebuilds it in float32, same answers
    rng = np.random.default_rng(9)
    s = _bounds(rng, FLAT_SCAN_BELOW + 2)
    index = _index(s[:FLAT_SCAN_BELOW])
    q = rng.standard_normal((H, 2, D)).astype(np.float32)
    index.search(0, q, 8)
    assert index._rows[0].half
    index.add(FLAT_SCAN_BELOW, s[FLAT_SCAN_BELOW] * 1e5)
    _assert_same(index, 0, q, 8, {0})
    assert not index._rows[0].half
    index.add(FLAT_SCAN_BELOW + 1, s[FLAT_SCAN_BELOW + 1])
    _assert_same(index, 1, q, 8, {0})


def test_small_indexes_take_the_flat_scan():
    rng = np.random.default_rng(5)
    index = _index(_bounds(rng, FLAT_SCAN_BELOW - 1))
    index.search(0, rng.standard_normal((H, 1, D)).astype(np.float32), 8)
    assert index._rows == [None] * L  # no candidate rows built below the switch
