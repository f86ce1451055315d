"""Foundation: grafted logits are byte-equal to a fresh computation, and off-position drift is reported.

Exactness is asserted with equality (SHA-256, KL == 0, agreement == 1), never with a tolerance.
"""
from __future__ import annotations

import pytest

from paging import PageStore, StoreConfig
from testkit.graft_child import fresh_logits, grafted_logits
from tieredkv.artifacts.artifact import deposit
from tieredkv.errors import UnsupportedModelError
from tieredkv.models.loading import TINY_MODELS
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.provenance.verify import VerifySpec, verify
from tieredkv.question.corpus import python_reference

SMALL = VerifySpec(tokens=80, samples=3, continuation=8)


def _assert_exact(report: dict, samples: int) -> None:
    assert report["samples"] == samples
    assert report["sha256_equal"] == samples
    assert report["kl_max"] == 0.0
    assert report["argmax_agreement"] == 1.0
    for row in report["rows"]:
        assert row["fresh_logits_sha256"] == row["grafted_logits_sha256"]


@pytest.mark.parametrize("name", TINY_MODELS)
def test_verify_is_exact_on_every_tiny_model(tiny_model, name):
    report = verify(tiny_model(name), SMALL)
    _assert_exact(report, SMALL.samples)
    assert report["shift"] == 0
    # the samples vary: not every prefix is page-aligned, so unaligned grafts are covered too
    assert len({r["prefix_tokens"] for r in report["rows"]}) > 1


def test_verify_is_exact_on_smollm2(smollm2):
    report = verify(smollm2, VerifySpec(tokens=160, samples=2))
    _assert_exact(report, 2)
    assert report["page_size"] == 128
    assert report["domain"]["fingerprint"] == smollm2.fingerprint


def test_shift_breaks_exactness_and_says_so(tiny_model):
    """Re-rotated keys (graft one position away) are not exact: the drift is reported, not hidden."""
    spec = VerifySpec(tokens=80, samples=3, continuation=8, shift=1)
    report = verify(tiny_model("tiny-llama"), spec)
    assert report["shift"] == 1
    assert report["samples"] == 3
    assert report["sha256_equal"] < report["samples"]
    assert report["kl_max"] > 0.0
    assert any(not r["sha256_equal"] and r["kl"] > 0 for r in report["rows"])


def test_shift_on_learned_positions_is_refused(tiny_model):
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        verify(tiny_model("tiny-gpt2"), VerifySpec(tokens=40, samples=1, continuation=4, shift=1))


def test_longer_deposit_reuses_the_shorter_ones_pages_and_stays_exact(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    page = lm.default_page_size
    ids = lm.codec.encode(python_reference()[:30 * page])
    long_ids, cont = ids[:20 * page], ids[20 * page:20 * page + 24]
    short_ids = long_ids[:3 * page + 5]
    with PageStore(tmp_path / "store", StoreConfig(host_budget_bytes=64 << 20)) as store:
        short = deposit(lm, short_ids, store)
        assert len(short.page_keys) == 4  # 3 full pages + a 5-token tail
        assert store.lmdb_tier.num_pages == 4

        sealed = []  # the end of every chunk the deposit had to compute
        long = deposit(lm, long_ids, store, progress=lambda done, total: sealed.append(done))

        # the full pages are the same chain, so they were grafted, not recomputed
        assert long.page_keys[:3] == short.page_keys[:3]
        assert long.page_keys[3] != short.page_keys[3]  # the tail page differs (more tokens)
        assert sealed == [page * (i + 1) for i in range(3, 20)]
        assert store.lmdb_tier.num_pages == 4 + len(long.page_keys) - 3
        assert store.host_tier.num_pages == 0  # deposited pages go to LMDB only

        fresh = fresh_logits(lm, long_ids, cont, page)
        before = store.stats()["integrity"]["verified_reads"]
        grafted = grafted_logits(lm, long.artifact_id, store, cont)
        assert sha256_tensor(grafted) == sha256_tensor(fresh)
        assert store.stats()["integrity"]["verified_reads"] - before == len(long.page_keys)  # from LMDB
        # the shorter one (unaligned: it ends in a partial page) still grafts exactly too
        assert sha256_tensor(grafted_logits(lm, short, store, cont)) == \
            sha256_tensor(fresh_logits(lm, short_ids, cont, page))


def test_a_nan_kl_is_reported_not_dropped(tiny_model, monkeypatch, capsys):
    """max() silently drops NaN; a sample whose KL is NaN must make kl_max None (JSON has no NaN)."""
    import tieredkv.provenance.verify as verify_mod
    from tieredkv.cli import main

    kls = iter([0.25, float("nan"), 0.5] * 2)
    monkeypatch.setattr(verify_mod, "_kl", lambda p, q: next(kls))
    report = verify(tiny_model("tiny-llama"), VerifySpec(tokens=16, samples=3, continuation=2))
    assert report["kl_max"] is None
    assert main(["verify", "--model", "tiny-llama", "--samples", "3", "--tokens", "16", "--continuation", "2",
                 "--quiet"]) == 0
    assert "kl_max            nan" in capsys.readouterr().out
