"""The faiss index is derived data: deleted, corrupted or stale, it is rebuilt from the store."""
from __future__ import annotations

from paging import PageStore
from testkit.faults import (
    INDEX_DAMAGES,
    PAGE_SIZE,
    corpus_text,
    index_fault_run,
    search_results,
    store_config,
    tiered_config,
)
from tieredkv.artifacts.portable import export_artifact, import_artifact
from tieredkv.engine.tiered_model import TieredModel


def test_damaged_index_is_rebuilt_with_the_same_results(lm, tmp_path):
    r = index_fault_run(lm, tmp_path / "s", corpus_text(12 * PAGE_SIZE, seed=31), corpus_text(9 * PAGE_SIZE, seed=32))
    assert [row["damage"] for row in r["rows"]] == list(INDEX_DAMAGES)
    assert all(row["rebuilt"] and row["same_search"] and row["same_logits"] for row in r["rows"]), r


def test_fixed_policy_index_is_rebuilt_in_its_scoring_frame(lm, tmp_path):
    """Under the fixed policy pages are summarised over page-relative keys: a rebuilt index must
    be built in that frame too, or retrieval (and the logits) would change after a graft."""
    r = index_fault_run(lm, tmp_path / "s", corpus_text(12 * PAGE_SIZE, seed=34), corpus_text(9 * PAGE_SIZE, seed=35),
                        damages=("deleted",), position="fixed")
    assert all(row["rebuilt"] and row["same_search"] and row["same_logits"] for row in r["rows"]), r


def test_a_tiered_context_moves_between_stores_and_its_index_is_rebuilt(lm, tmp_path):
    """TieredModel contexts key pages by a regime fingerprint; export/import checks that chain too."""
    text = corpus_text(10 * PAGE_SIZE + 5, seed=33)
    with PageStore(tmp_path / "a", store_config()) as store:
        tm = TieredModel(lm, store, tiered_config())
        art = tm.ingest(text)
        tm.graft(art)
        want = search_results(tm.cache.index)
        tm.close()
        export_artifact(store, art.artifact_id, tmp_path / "ctx.tkva")
    with PageStore(tmp_path / "b", store_config()) as store:
        assert import_artifact(tmp_path / "ctx.tkva", store) == art
        tm = TieredModel(lm, store, tiered_config())
        tm.graft(art.artifact_id)  # no index file in this store: built from the imported pages
        assert search_results(tm.cache.index) == want
        tm.close()
