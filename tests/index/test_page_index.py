"""PageIndex: ranking, exclude, padding, union, duplicates, removal."""

import numpy as np
import pytest

from index import SUMMARY_METHODS, PageIndex, summarize

L, H, T, D = 2, 2, 16, 8


def _build(method: str, num_pages: int = 40, seed: int = 0, planted=None, num_repr: int = 4):
    """Random pages; if planted=(page_id, q [H, D]) that page's keys are ~ 10 * q."""
    rng = np.random.default_rng(seed)
    index = PageIndex(L, H, D, method, num_repr)
    for page_id in range(num_pages):
        keys = rng.standard_normal((L, H, T, D)).astype(np.float32)  # [L, H, T, D]
        if planted is not None and page_id == planted[0]:
            keys = (10 * planted[1][None, :, None, :]
                    + 0.1 * rng.standard_normal((L, H, T, D))).astype(np.float32)
        index.add(page_id, np.stack([summarize(keys[l], method, num_repr) for l in range(L)]))
    return index


def _queries(seed: int = 1, q_len: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, q_len, D)).astype(np.float32)


def _coherent_chunk(seed: int = 1, q_len: int = 3) -> np.ndarray:
    """Queries of one chunk pointing roughly the same way: [H, Q, D]."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((H, 1, D))
    return (base + 0.1 * rng.standard_normal((H, q_len, D))).astype(np.float32)


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_planted_page_ranks_first(method):
    q = _coherent_chunk()
    index = _build(method, planted=(17, q.mean(axis=1)))
    for layer in range(L):
        ids, scores = index.search(layer, q, 5)
        assert ids.shape == (H, 5) and scores.shape == (H, 5)
        assert ids.dtype == np.int64 and scores.dtype == np.float32
        assert (ids[:, 0] == 17).all()
        assert (np.diff(scores, axis=1) <= 0).all()  # descending


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_exclude_is_honoured(method):
    q = _queries()
    index = _build(method, planted=(17, q.mean(axis=1)))
    full, _ = index.search(0, q, 10)
    excluded = {17, int(full[0, 1]), int(full[1, 2])}
    ids, _ = index.search(0, q, 10, exclude=excluded)
    assert not (np.isin(ids, list(excluded))).any()
    assert (ids >= 0).all()  # still k results: 40 pages, 3 excluded
    # the remaining pages keep their relative order
    for h in range(H):
        kept = [p for p in full[h].tolist() if p not in excluded]
        assert ids[h].tolist()[:len(kept)] == kept


@pytest.mark.parametrize("method", ["mean", "repr"])
def test_flat_search_matches_brute_force(method):
    rng = np.random.default_rng(5)
    index = PageIndex(1, H, D, method, num_repr=3)
    summaries = {}
    for page_id in rng.choice(10_000, size=60, replace=False).tolist():
        keys = rng.standard_normal((H, int(rng.integers(1, 20)), D)).astype(np.float32)
        summaries[page_id] = summarize(keys, method, 3)  # [H, R, D], R varies for repr
        index.add(page_id, summaries[page_id][None])
    q = _queries(6, q_len=4)
    exclude = set(list(summaries)[:7])
    ids, scores = index.search(0, q, 12, exclude=exclude)
    q_mean = q.astype(np.float64).mean(axis=1)  # [H, D]
    for h in range(H):
        ref = {p: float((s[h].astype(np.float64) @ q_mean[h]).max())
               for p, s in summaries.items() if p not in exclude}
        ranked = sorted(ref, key=lambda p: (-ref[p], p))[:12]
        assert ids[h].tolist() == ranked
        np.testing.assert_allclose(scores[h], [ref[p] for p in ranked], rtol=1e-5, atol=1e-5)


def test_exclude_without_len_still_fills_k():
    class Evens:
        def __contains__(self, x):
            return x % 2 == 0

    index = _build("repr", num_pages=30)
    ids, _ = index.search(0, _queries(), 8, exclude=Evens())
    assert (ids % 2 == 1).all() and len(set(ids[0].tolist())) == 8


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_padding_when_k_exceeds_pages(method):
    index = _build(method, num_pages=3)
    ids, scores = index.search(1, _queries(), 6, exclude={1})
    assert (ids[:, :2] >= 0).all() and (ids[:, 2:] == -1).all()
    assert np.isfinite(scores[:, :2]).all() and np.isneginf(scores[:, 2:]).all()
    empty = PageIndex(L, H, D, method)
    ids, scores = empty.search(0, _queries(), 2)
    assert (ids == -1).all() and np.isneginf(scores).all()
    assert empty.union_topk(0, _queries(), 2) == []


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_union_topk_sorted_unique(method):
    index = _build(method)
    q = _queries(7)
    ids, _ = index.search(0, q, 6)
    union = index.union_topk(0, q, 6)
    assert union == sorted(set(ids.ravel().tolist()))
    assert all(isinstance(p, int) for p in union)
    assert 6 <= len(union) <= H * 6


def test_duplicate_and_bad_ids_raise():
    index = _build("mean", num_pages=2)
    s = np.zeros((L, H, 1, D), np.float32)
    with pytest.raises(ValueError, match="already indexed"):
        index.add(1, s)
    for bad in (-1, 2**63, 1.0, True):
        with pytest.raises(ValueError, match="non-negative int64"):
            index.add(bad, s)
    with pytest.raises(ValueError, match="duplicates"):
        index.add_many([5, 5], np.zeros((2, L, H, 1, D), np.float32))
    assert len(index) == 2


def test_bad_shapes_raise():
    index = PageIndex(L, H, D, "minmax")
    with pytest.raises(ValueError, match="does not fit method"):
        index.add(0, np.zeros((L, H, 3, D), np.float32))
    with pytest.raises(ValueError, match=r"\[N=1, L=2"):
        index.add(0, np.zeros((H, 2, D), np.float32))
    with pytest.raises(ValueError, match="queries must be"):
        index.search(0, np.zeros((H, D), np.float32), 1)
    with pytest.raises(ValueError, match="layer must be"):
        index.search(L, _queries(), 1)
    with pytest.raises(ValueError, match="unknown summary method"):
        PageIndex(L, H, D, "quest")


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_remove_reset_and_ids(method):
    index = _build(method, num_pages=5)
    assert len(index) == 5 and index.page_ids() == [0, 1, 2, 3, 4] and 3 in index
    index.remove(3)
    assert index.page_ids() == [0, 1, 2, 4]
    ids, _ = index.search(0, _queries(), 5)
    assert 3 not in ids and (ids[:, 4] == -1).all()
    with pytest.raises(KeyError):
        index.remove(3)
    index.reset()
    assert len(index) == 0 and index.page_ids() == []


def test_add_many_equals_repeated_add():
    rng = np.random.default_rng(8)
    s = rng.standard_normal((6, L, H, 2, D)).astype(np.float32)
    one, many = PageIndex(L, H, D, "minmax"), PageIndex(L, H, D, "minmax")
    for i in range(6):
        one.add(10 + i, s[i])
    many.add_many(range(10, 16), s)
    q = _queries()
    for a, b in zip(one.search(1, q, 4), many.search(1, q, 4)):
        assert a.tobytes() == b.tobytes()


def test_minmax_bounds_grow_incrementally_like_a_rebuild():
    """Searching between adds (as TieredModel does while ingesting) gives the same pages as an
    index built in one batch: the cached bounds are extended in place, never stale."""
    rng = np.random.default_rng(3)
    s = rng.standard_normal((300, 2, 2, 2, 8)).astype(np.float32)
    s[:, :, :, 0] = np.abs(s[:, :, :, 0])
    s[:, :, :, 1] = -np.abs(s[:, :, :, 1])
    q = rng.standard_normal((2, 3, 8)).astype(np.float32)
    grown = PageIndex(2, 2, 8, method="minmax")
    for i in range(300):
        grown.add(i, s[i])
        got = grown.union_topk(i % 2, q, 4, exclude={0})
        batch = PageIndex(2, 2, 8, method="minmax")
        batch.add_many(list(range(i + 1)), s[: i + 1])
        assert got == batch.union_topk(i % 2, q, 4, exclude={0})


def test_top_pages_vectorised_exclusion_equals_the_loop():
    # _top_pages drops excluded ids with np.isin for sets; any other Container takes the loop
    from index.page_index import _top_pages

    class Opaque:  # a Container with no len() and no iteration: the loop path
        def __init__(self, items):
            self.items = set(items)

        def __contains__(self, x):
            return x in self.items

    rng = np.random.default_rng(7)
    for trial in range(40):
        n = int(rng.integers(1, 300))
        ids = rng.permutation(1000)[:n].astype(np.int64)
        scores = rng.integers(-5, 5, n).astype(np.float32)  # many ties
        excl = set(rng.choice(1000, int(rng.integers(0, 40)), replace=False).tolist())
        k = int(rng.integers(1, 30))  # (search() answers k = 0 itself)
        a_ids, a_best = _top_pages(ids, scores, k, excl)
        b_ids, b_best = _top_pages(ids, scores, k, Opaque(excl))
        assert a_ids.tolist() == b_ids.tolist() and a_best.tolist() == b_best.tolist(), trial
        assert a_ids.dtype == np.int64 and a_best.dtype == np.float32
