"""summarize(): shapes, determinism, the repr choice, and the Quest bound property."""

import numpy as np
import pytest

from index import SUMMARY_METHODS, quest_bound, summarize

H, T, D = 2, 16, 8


def _keys(seed: int = 0, t: int = T) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, t, D)).astype(np.float32)


@pytest.mark.parametrize("method,num_repr,t,r", [
    ("mean", 4, T, 1), ("repr", 4, T, 4), ("repr", 4, 3, 3), ("repr", 1, T, 1),
    ("minmax", 4, T, 2), ("minmax", 4, 1, 2),
])
def test_shape_and_dtype(method, num_repr, t, r):
    out = summarize(_keys(t=t), method, num_repr)
    assert out.shape == (H, r, D)
    assert out.dtype == np.float32 and out.flags.c_contiguous


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_deterministic_bytes(method):
    a = summarize(_keys(1), method)
    b = summarize(_keys(1).copy(), method)
    assert a.tobytes() == b.tobytes()


def test_mean_and_minmax_values():
    k = _keys(2)
    np.testing.assert_allclose(summarize(k, "mean")[:, 0], k.mean(axis=1), rtol=1e-6, atol=1e-6)
    mm = summarize(k, "minmax")
    assert np.array_equal(mm[:, 0], k.max(axis=1)) and np.array_equal(mm[:, 1], k.min(axis=1))


def test_repr_picks_keys_most_aligned_with_mean_in_position_order():
    k = _keys(3)
    out = summarize(k, "repr", num_repr=4)
    for h in range(H):
        centrality = k[h].astype(np.float64) @ k[h].astype(np.float64).mean(axis=0)
        expected = np.sort(np.argsort(-centrality, kind="stable")[:4])
        assert np.array_equal(out[h], k[h, expected])  # exact copies, position order


def test_repr_ties_break_by_earlier_position():
    k = np.ones((1, 6, 4), dtype=np.float32)  # keys 0..4 identical, so equally central
    k[0, 5] = 0.0  # one clearly off-centre key
    out = summarize(k, "repr", num_repr=3)
    assert np.array_equal(out[0], k[0, :3])


@pytest.mark.parametrize("bad", [np.zeros((2, 0, 4)), np.zeros((4, 4)), np.zeros((1, 2, 2), int)])
def test_rejects_bad_keys(bad):
    with pytest.raises(ValueError):
        summarize(bad, "mean")


def test_rejects_nan_and_unknown_method():
    k = _keys()
    with pytest.raises(ValueError, match="unknown summary method"):
        summarize(k, "max")
    k[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        summarize(k, "repr")


def test_quest_bound_is_upper_bound_of_true_max():
    rng = np.random.default_rng(4)
    for trial in range(50):
        n, t, q_len = 20, int(rng.integers(1, 40)), int(rng.integers(1, 6))
        scale = rng.uniform(0.1, 10)
        keys = (rng.standard_normal((n, t, D)) * scale).astype(np.float32)  # [N, T, D]
        queries = rng.standard_normal((q_len, D)).astype(np.float32)  # [Q, D]
        mm = np.stack([summarize(keys[i][None], "minmax")[0] for i in range(n)])  # [N, 2, D]
        bound = quest_bound(queries, mm[:, 0], mm[:, 1])  # [N]
        true = np.einsum("qd,ntd->nqt", queries.astype(np.float64), keys.astype(np.float64))
        true_max = true.mean(axis=1).max(axis=1)  # max_t mean_q q.k
        tol = 1e-5 * (1 + np.abs(true_max))
        assert (bound >= true_max - tol).all(), trial
        # with one query the bound is sum_d max(q_d*max_d, q_d*min_d) exactly
        if q_len == 1:
            q = queries[0].astype(np.float64)
            ref = np.maximum(q * mm[:, 0], q * mm[:, 1]).sum(axis=1)
            np.testing.assert_allclose(bound, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_len", [1, 3, 1536])
def test_quest_bound_batched_over_heads_equals_one_call_per_head(q_len):
    # PageIndex scores every KV head in one call; the bytes must be those of one call per head.
    rng = np.random.default_rng(q_len)
    heads, n = 3, 1027
    upper = rng.standard_normal((heads, n, D)) * 3  # [H, N, D] float64, as PageIndex caches them
    lower = upper - np.abs(rng.standard_normal((heads, n, D)))
    queries = rng.standard_normal((heads, q_len, D)).astype(np.float32)  # [H, Q, D]
    batched = quest_bound(queries, upper, lower)  # [H, N]
    for h in range(heads):
        assert np.array_equal(batched[h], quest_bound(queries[h], upper[h], lower[h]))
