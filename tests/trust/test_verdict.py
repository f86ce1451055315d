"""`check --recompute` says what it verified: an artifact it could not recompute is "not verified", with the
reason, and the store is not called healthy (exit 1)."""
from __future__ import annotations

import json

from paging import PageStore, StoreConfig
from testkit.trust_faults import cli_many
from tieredkv.artifacts.artifact import deposit
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.question.corpus import python_reference


def _text(offset: int, n: int = 600) -> str:
    return python_reference().encode("ascii", "ignore").decode()[offset:offset + n]


def test_an_artifact_that_cannot_be_recomputed_is_not_verified_and_not_healthy(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    mixed, plain = tmp_path / "mixed", tmp_path / "plain"
    with PageStore(mixed, StoreConfig()) as store:
        with TieredModel(lm, store, TieredConfig(local_pages=2, topk_pages=2)) as tm:
            context = tm.ingest(_text(0))  # sealed under retrieval attention, as `qa` ingests a document
        deposited = deposit(lm, _text(9000, 200), store, page_size=8)
    with PageStore(plain, StoreConfig()) as store:
        deposit(lm, _text(9000, 200), store, page_size=8)
    first, second = cli_many(["check", "--store", str(mixed), "--recompute", "1", "--model", "tiny-llama"],
                             ["check", "--store", str(plain), "--recompute", "1", "--model", "tiny-llama"])
    report = json.loads(first["out"])
    # was: exit 0, healthy, "every checked page and manifest verified"
    assert first["rc"] == 1 and not report["healthy"], report
    assert list(report["not_verified"]) == [context.artifact_id], report
    assert "retrieval attention" in report["not_verified"][context.artifact_id]
    assert report["hint"].startswith("1 artifacts were NOT verified: they could not be recomputed here")
    assert report["recompute"]["artifacts_recomputed"] == 1 and not report["recompute"]["forged_artifacts"]
    assert deposited.artifact_id not in report["not_verified"]
    sound = json.loads(second["out"])
    assert second["rc"] == 0 and sound["healthy"] and sound["not_verified"] == {}, sound
