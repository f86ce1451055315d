"""Documents in a store: list, remove with shared pages kept, gc, pins, stale Artifact objects, a disk cap.

Real LMDB and a tiny random model: three documents share their first pages (one prefix, three endings).
"""
from __future__ import annotations

import logging

import pytest
import torch

from paging import PageStore, PagingError, StoreFullError
from paging.documents import DocumentInUseError, DocumentNotFoundError
from testkit.faults import PAGE_SIZE, corpus_text, flip_lmdb_value_bit, store_config
from testkit.graft_child import continuation_logits
from tieredkv.artifacts.artifact import deposit, graft, grafted_token_ids
from tieredkv.artifacts.check import check_store
from tieredkv.errors import ArtifactNotFoundError
from tieredkv.provenance.domain import sha256_tensor

MODEL = "tiny-llama"


def ascii_ids(num: int, seed: int) -> list[int]:
    """`num` token ids of tiny-llama (byte tokens: one ASCII character, one id)."""
    ids = list(corpus_text(2 * num, seed=seed).encode("ascii", "ignore"))[:num]
    assert len(ids) == num
    return ids


PREFIX = ascii_ids(2 * PAGE_SIZE, seed=1)  # two shared pages
ENDINGS = [ascii_ids(2 * PAGE_SIZE, seed=s) for s in (2, 3, 4)]
CONT = list(b" and then?")


@pytest.fixture(scope="module")
def lm(tiny_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_model(MODEL)
    torch.set_num_threads(threads)


def answer_sha(lm, store, art) -> str:
    """SHA-256 of the logits of a continuation after grafting `art` (what a question about it would see)."""
    cache = graft(lm, art, store)
    return sha256_tensor(continuation_logits(lm, cache, CONT, art.num_tokens, PAGE_SIZE))


def three_documents(lm, store):
    return [deposit(lm, PREFIX + end, store, page_size=PAGE_SIZE, name=f"doc{i}") for i, end in enumerate(ENDINGS)]


def test_list_documents_reports_shared_and_own_bytes(lm, tmp_path):
    with PageStore(tmp_path / "s", store_config()) as store:
        arts = three_documents(lm, store)
        docs = {d.name: d for d in store.list_documents()}
        page_nb = store.lmdb_tier.nbytes // 8  # 2 shared + 3 x 2 own pages, all full
        assert store.lmdb_tier.num_pages == 8
        for i, art in enumerate(arts):
            d = docs[f"doc{i}"]
            assert (d.artifact_id, d.num_tokens, d.num_pages, d.fingerprint) == (
                art.artifact_id, 4 * PAGE_SIZE, 4, lm.fingerprint)
            assert (d.num_bytes, d.own_bytes, d.num_missing) == (4 * page_nb, 2 * page_nb, 0)
            assert d.created is not None and d.last_used == d.created and not d.is_in_use


def test_removing_one_of_three_sharing_documents_keeps_the_others_exact(lm, tmp_path):
    with PageStore(tmp_path / "s", store_config()) as store:
        arts = three_documents(lm, store)
        before = [answer_sha(lm, store, a) for a in arts]
        own = {d.artifact_id: d.own_bytes for d in store.list_documents()}
        index_dir = tmp_path / "s" / "indexes"
        index_dir.mkdir()
        for a in arts:  # derived files as TieredModel writes them
            for suffix in ("minmax.faiss", "minmax.faiss.json", "token_ids"):
                (index_dir / f"{a.artifact_id}.{suffix}").write_bytes(b"x")
        held = store.lmdb_tier.nbytes

        removal = store.delete_document(arts[1].artifact_id)

        assert removal.num_pages == 2 and removal.nbytes == own[arts[1].artifact_id]
        assert store.lmdb_tier.nbytes == held - removal.nbytes and store.lmdb_tier.num_pages == 6
        assert sorted(p.name for p in index_dir.iterdir()) == sorted(
            f"{a.artifact_id}.{s}" for a in (arts[0], arts[2]) for s in ("minmax.faiss", "minmax.faiss.json",
                                                                          "token_ids"))
        for a in arts[1].page_keys[:2]:  # the shared prefix stays
            assert store.lmdb_tier.contains(a)
        for i in (0, 2):
            assert answer_sha(lm, store, arts[i]) == before[i]
            assert grafted_token_ids(store, arts[i]) == PREFIX + ENDINGS[i]
        report = check_store(store)
        assert report["healthy"] and report["artifacts"] == 2, report
        assert store.check()["healthy"]
        # the Artifact object kept from before is refused, though its shared pages are still stored
        with pytest.raises(ArtifactNotFoundError, match="no longer in store"):
            graft(lm, arts[1], store)
        with pytest.raises(DocumentNotFoundError):
            store.delete_document(arts[1].artifact_id)


def test_remove_by_name_prefix_and_in_use_refusal(lm, tmp_path):
    with PageStore(tmp_path / "s", store_config()) as store:
        arts = three_documents(lm, store)
        assert store.find_document("doc2") == arts[2].artifact_id
        assert store.find_document(arts[0].artifact_id[:8]) == arts[0].artifact_id
        with pytest.raises(DocumentNotFoundError, match="no document matches"):
            store.find_document("nope")
        with store.in_use(arts[0].artifact_id):
            assert store.is_in_use(arts[0].artifact_id)
            with pytest.raises(DocumentInUseError):
                store.delete_document(arts[0].artifact_id)
        holder = type("Cache", (), {})()  # what a live cache would be
        store.pin(arts[0].artifact_id, holder=holder)
        assert store.is_in_use(arts[0].artifact_id)
        del holder  # the pin ends with the object that held it
        assert not store.is_in_use(arts[0].artifact_id)
        assert store.delete_document(arts[0].artifact_id).num_pages == 2


def test_gc_frees_only_pages_no_document_lists(lm, tmp_path):
    path = tmp_path / "s"
    with PageStore(path, store_config()) as store:
        arts = three_documents(lm, store)
        held = store.lmdb_tier.nbytes
    with PageStore(path, store_config()) as store:  # a new process: nothing pending
        # a crash between pages and manifest: the manifest of doc1 is gone, its pages are not
        store.delete_manifest(arts[1].artifact_id)
        dry = store.gc(dry_run=True)
        assert dry.dry_run and dry.num_pages == 2 and store.lmdb_tier.nbytes == held
        done = store.gc()
        assert (done.num_pages, done.nbytes) == (2, dry.nbytes) and store.lmdb_tier.nbytes == held - done.nbytes
        assert store.gc().num_pages == 0
        for i in (0, 2):
            graft(lm, arts[i], store)
        assert check_store(store)["healthy"]


def test_a_missing_page_is_reported_as_missing_not_corrupt(lm, tmp_path):
    with PageStore(tmp_path / "s", store_config()) as store:
        arts = three_documents(lm, store)
        store.remove(arts[0].page_keys[0])  # freed by hand: all three documents lose their first page
        py = store.check()
        assert not py["healthy"] and sorted(py["incomplete_artifacts"]) == sorted(a.artifact_id for a in arts)
        assert "missing" in py["hint"] and "corrupt" not in py["hint"]
        cli = check_store(store)
        assert not cli["healthy"] and cli["incomplete_artifacts"] == py["incomplete_artifacts"]
        assert cli["hint"] == py["hint"]


def test_while_a_manifest_does_not_read_no_page_is_freed(lm, tmp_path):
    path = tmp_path / "s"
    with PageStore(path, store_config()) as store:
        arts = three_documents(lm, store)
        held = store.lmdb_tier.nbytes
    flip_lmdb_value_bit(path, arts[0].artifact_id, 8 * 100, db="manifests")  # which pages doc0 lists is unknown
    with PageStore(path, store_config()) as store:
        with pytest.raises(PagingError, match="nothing was collected"):
            store.gc()
        removal = store.delete_document(arts[1].artifact_id)  # the manifest goes, every page stays
        assert removal.num_pages == 0 and store.lmdb_tier.nbytes == held
        assert store.list_manifests() == sorted([arts[0].artifact_id, arts[2].artifact_id])
        store.delete_document(arts[0].artifact_id)  # the damaged one can be removed; then gc frees what is free
        assert store.gc().num_pages == 4 and check_store(store)["healthy"]


def test_disk_cap_evicts_the_least_recently_used_document(lm, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tieredkv")
    path = tmp_path / "s"
    with PageStore(path, store_config()) as store:
        arts = three_documents(lm, store)
        page_nb = store.lmdb_tier.nbytes // 8
    cap = 6 * page_nb  # two documents: 2 shared + 2 x 2 own pages
    with PageStore(path, store_config(max_disk_bytes=cap)) as store:
        store.delete_document(arts[2].artifact_id)
        before = {i: answer_sha(lm, store, arts[i]) for i in (1, 0)}  # doc0 used last
        with store.in_use(arts[0].artifact_id):  # and in use: never evicted
            again = deposit(lm, PREFIX + ENDINGS[2], store, page_size=PAGE_SIZE, name="doc2")
        assert again.artifact_id == arts[2].artifact_id
        assert [d.name for d in store.list_documents()] == ["doc0", "doc2"]
        assert store.lmdb_tier.nbytes <= cap
        assert store.stats()["disk_cap"]["documents_evicted"] == 1 and store.stats()["tiers"]["lmdb"]["evictions"] == 1
        assert f"evicted document {arts[1].artifact_id} ('doc1'" in caplog.text
        assert answer_sha(lm, store, arts[0]) == before[0]
        with pytest.raises(ArtifactNotFoundError):
            graft(lm, arts[1], store)  # a clean miss, nothing wrong served
        # the evicted one re-ingests on its next use, evicting the least recently used (doc0 now)
        graft(lm, arts[2], store)
        back = deposit(lm, PREFIX + ENDINGS[1], store, page_size=PAGE_SIZE, name="doc1")
        assert back.artifact_id == arts[1].artifact_id and answer_sha(lm, store, back) == before[1]
        assert [d.name for d in store.list_documents()] == ["doc2", "doc1"]
        assert check_store(store)["healthy"]
        # everything in use: a document that cannot fit is refused, nothing written
        with store.in_use(arts[1].artifact_id), store.in_use(arts[2].artifact_id):
            held = store.lmdb_tier.nbytes
            with pytest.raises(StoreFullError, match="max_disk_bytes"):
                deposit(lm, PREFIX + ENDINGS[0], store, page_size=PAGE_SIZE, name="doc0")
            assert store.lmdb_tier.nbytes == held


def graft_and_answer(tm, art) -> list[int]:
    tm.graft(art)
    return tm.generate(CONT, max_new_tokens=4)


def test_tiered_model_ingest_under_a_disk_cap_evicts_the_lru_document_not_in_use(lm, tmp_path):
    from tieredkv.engine.tiered_config import TieredConfig
    from tieredkv.engine.tiered_model import TieredModel

    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)
    docs = [PREFIX + end for end in ENDINGS]
    path = tmp_path / "s"
    with PageStore(path, store_config()) as store:
        tm = TieredModel(lm, store, cfg)
        arts = [tm.ingest(docs[i], name=f"doc{i}") for i in (0, 1)]
        answers = {i: graft_and_answer(tm, arts[i]) for i in (0, 1)}
        page_nb = store.lmdb_tier.nbytes // 6  # 2 shared + 2 x 2 own pages
        tm.close()
    indexes = path / "indexes"
    with PageStore(path, store_config(max_disk_bytes=6 * page_nb)) as store:
        tm = TieredModel(lm, store, cfg)
        store.mark_used(arts[0].artifact_id)
        store.mark_used(arts[1].artifact_id)  # doc0 is the least recently used, but in use
        with store.in_use(arts[0].artifact_id):
            third = tm.ingest(docs[2], name="doc2")
        assert [d.name for d in store.list_documents()] == ["doc0", "doc2"]
        assert store.lmdb_tier.nbytes <= 6 * page_nb and store.stats()["disk_cap"]["documents_evicted"] == 1
        assert not list(indexes.glob(f"{arts[1].artifact_id}.*")) and list(indexes.glob(f"{third.artifact_id}.*"))
        assert graft_and_answer(tm, arts[0]) == answers[0]
        assert check_store(store)["healthy"]
        # doc1 is a clean miss: ingested again (evicting doc0, now the least recently used), same pages, same answer
        store.mark_used(third.artifact_id)
        again = tm.ingest(docs[1], name="doc1")
        assert again.artifact_id == arts[1].artifact_id
        assert [d.name for d in store.list_documents()] == ["doc2", "doc1"]
        assert graft_and_answer(tm, again) == answers[1]
        tm.close()
