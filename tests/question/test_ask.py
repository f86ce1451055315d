"""One call per question (`TieredModel.open` / `.ask` / `.chat`): questions from the document's sealed state,
documents found by their tokens (never by a label), the README's recipe run verbatim."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from pathlib import Path
from typing import Iterator

import pytest

from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import Artifact, deposit
from tieredkv.engine.tiered_config import ReadingConfig, TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.errors import StoreNotGivenError, TokenIdsError
from tieredkv.provenance.domain import sha256_ids
from tieredkv.question.ask import Answer, Document

README = Path(__file__).resolve().parents[2] / "README.md"
DOC = "Alpha. " * 150 + "The secret colour is teal. " + "Beta. " * 150
OTHER = DOC.replace("teal", "gold")  # as long as DOC: a forged manifest can claim its token count too
# beyond the window, as tiny documents: fixed distances and a question-time reading of one 64-token passage
READING = dict(position="fixed", local_pages=2, topk_pages=2,
               reading=ReadingConfig(passages=1, passage_tokens=64, signal="lexical"))


@contextlib.contextmanager
def _tm(lm, path) -> Iterator[TieredModel]:
    with PageStore(path, StoreConfig()) as store, TieredModel(lm, store, TieredConfig()) as tm:
        yield tm


def test_readme_recipe_runs_verbatim(smollm2, tmp_path, monkeypatch):
    """The README's Python recipe, as printed, over a small document (the embedded model)."""
    section = README.read_text().split("## Using it from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 5 and "+ 48" not in code and "working_set_bytes" not in code
    monkeypatch.chdir(tmp_path)
    Path("book.txt").write_text("Dear Ann, the garden is in bloom. Yours, Tom. " * 4)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the recipe is the test
    answer = namespace["answer"]
    assert isinstance(answer, Answer) and answer.text and answer.context == "ingested"
    assert answer.attended == "whole document" and answer.passages == []
    assert Path("kv-store", "data.mdb").is_file()


def test_questions_never_see_each_other_and_each_reads(tiny_model, tmp_path):
    """Two questions on one TieredModel: the second reads at question time too, and answers as it does
    alone (it used to skip the reading and see question 1 and its answer in its context)."""
    lm = tiny_model("tiny-llama")
    with _tm(lm, tmp_path / "s") as tm:
        doc = tm.open(DOC, name="colours", **READING)
        first = tm.ask(doc, "What colour is the secret?", max_new_tokens=4)
        second = tm.ask(doc, "Which animal?", max_new_tokens=4)
        again = tm.ask(doc, "What colour is the secret?", max_new_tokens=4)
    with _tm(lm, tmp_path / "s") as tm:
        doc2 = tm.open(DOC, name="colours", **READING)
        alone = tm.ask(doc2, "Which animal?", max_new_tokens=4)
    assert doc.context == "ingested" and doc2.context == "grafted"
    assert first.attended == second.attended == "read" and len(second.passages) == 1
    assert "The secret colour is teal." in first.passages[0]["text"]
    assert second.token_ids == alone.token_ids and again.token_ids == first.token_ids
    assert first.timings["attach_s"] == 0.0 and second.timings["attach_s"] > 0.0  # re-attached, measured
    assert second.tiers["lmdb"]["pages"] == first.tiers["lmdb"]["pages"]  # questions are never written
    assert "integrity" in second.store_stats


def test_a_document_is_found_by_its_tokens_not_its_name(tiny_model, tmp_path):
    """The same text under two names is one artifact (no PageConflictError); another text under a
    stored name is a new document."""
    lm = tiny_model("tiny-llama")
    with _tm(lm, tmp_path / "s") as tm:
        a = tm.open(DOC, name="first")
        b = tm.open(DOC, name="second")
        c = tm.open(OTHER, name="first")
        assert (a.context, b.context, c.context) == ("ingested", "grafted", "ingested")
        assert a.artifact == b.artifact and b.name == "second" and c.artifact != a.artifact
        ids = tm.lm.codec.encode("Document:\n" + DOC)
        assert c.artifact.token_ids_sha256 != sha256_ids(ids) == a.artifact.token_ids_sha256
        again = tm.open(DOC, name="third", reingest=True)  # ingested again: the stored manifest, its first label
        assert again.context == "ingested" and again.artifact == a.artifact and again.artifact.name == "first"
        first = deposit(lm, DOC, tm.store, name="one")  # a deposit under a second name: the same artifact
        assert deposit(lm, DOC, tm.store, name="two") == first and first.name == "one"


def _relabel(store, art: Artifact, **fields) -> Artifact:
    """Rewrite `art`'s manifest in `store` with `fields` changed, re-sealed (canonical bytes, the same id)."""
    import dataclasses

    forged = dataclasses.replace(art, **fields)
    store.delete_manifest(art.artifact_id)
    store.put_manifest(forged.artifact_id, forged.to_json())
    return forged


@pytest.mark.parametrize("forge", ["name", "name and token hash"])
def test_a_tampered_manifest_never_answers_for_another_document(tiny_model, tmp_path, forge):
    """A manifest of document B relabelled as document A (its name, and even its token_ids_sha256) is not
    grafted for A: A is ingested again and its answer attends to A's own pages."""
    lm = tiny_model("tiny-llama")
    with _tm(lm, tmp_path / "s") as tm:
        a, b = tm.open(DOC, name="a", **READING), tm.open(OTHER, name="b", **READING)
        fields = {"name": "a"}
        if forge != "name":
            fields["token_ids_sha256"] = a.artifact.token_ids_sha256
        tm.store.delete_manifest(a.artifact.artifact_id)  # only the forged manifest claims A now
        _relabel(tm.store, b.artifact, **fields)
        reopened = tm.open(DOC, name="a", **READING)
        ans = tm.ask(reopened, "What colour is the secret?", max_new_tokens=2)
        assert reopened.context == "ingested" and reopened.artifact.page_keys == a.artifact.page_keys
        assert "teal" in ans.passages[0]["text"] and "gold" not in ans.passages[0]["text"]


def test_sampling_passes_through_reproduces_with_a_seed_and_changes_no_page(tiny_model, tmp_path):
    import torch
    from transformers import GenerationConfig

    from tieredkv.engine.generation import GenerationOptionError

    lm = tiny_model("tiny-llama")
    with _tm(lm, tmp_path / "s") as tm:
        doc = tm.open(DOC, name="colours")
        keys = doc.artifact.page_keys
        before = [hashlib.sha256(tm.store.get(k).payload).hexdigest() for k in keys]
        runs = [tm.ask(doc, "What colour?", max_new_tokens=8, do_sample=True, temperature=1.5, seed=s).token_ids
                for s in (1, 1, 2)]
        assert runs[0] == runs[1] != runs[2]
        greedy = tm.ask(doc, "What colour?", max_new_tokens=8)
        cfg = tm.ask(doc, "What colour?", max_new_tokens=8,
                     generation_config=GenerationConfig(do_sample=True, temperature=1.5),
                     seed=2)
        assert cfg.token_ids == runs[2] and greedy.token_ids != runs[2]
        for bad, match in (({"temperature": 0.7}, "do_sample=True"), ({"num_beams": 2}, "num_beams=1"),
                           ({"num_return_sequences": 2}, "once per sequence")):
            with pytest.raises(GenerationOptionError, match=match):
                tm.ask(doc, "What colour?", **bad)
        assert [hashlib.sha256(tm.store.get(k).payload).hexdigest() for k in keys] == before
        assert torch.equal(torch.tensor(greedy.token_ids), torch.tensor(tm.ask(doc, "What colour?",
                                                                             max_new_tokens=8).token_ids))


def test_open_and_ask_log_to_the_tieredkv_logger(tiny_model, tmp_path, caplog):
    lm = tiny_model("tiny-llama")
    assert not logging.getLogger("tieredkv").handlers  # the library adds none
    with caplog.at_level(logging.INFO, logger="tieredkv"), _tm(lm, tmp_path / "s") as tm:
        tm.ask(tm.open(DOC, name="colours"), "What colour?", max_new_tokens=2)
    text = " ".join(r.getMessage() for r in caplog.records if r.name.startswith("tieredkv"))
    assert "ingested" in text and "opened 'colours'" in text and "asked 'What colour?'" in text


def test_from_pretrained_opens_the_store_named_by_tieredkv_store(tmp_path, monkeypatch):
    monkeypatch.delenv("TIEREDKV_STORE", raising=False)
    with pytest.raises(StoreNotGivenError, match="TIEREDKV_STORE"):
        TieredModel.from_pretrained("tiny-llama")
    monkeypatch.setenv("TIEREDKV_STORE", str(tmp_path / "env-store"))
    with TieredModel.from_pretrained("tiny-llama") as tm:
        doc = tm.open(DOC)
        assert isinstance(doc, Document) and tm.store.path == str(tmp_path / "env-store")
    assert tm.store.closed  # a store it opened is closed with it


def test_own_positions_past_the_window_warn(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    window = lm.model.config.max_position_embeddings
    with PageStore(tmp_path / "s", StoreConfig()) as store, TieredModel(lm, store, TieredConfig()) as tm:
        tm.prefill(list(range(5, 45)))
        with pytest.warns(UserWarning, match=f"past the model's trained window of {window:,}"):
            tm._check_positions(window)


def test_a_tampered_remote_manifest_never_answers_for_another_document(tiny_model, tmp_path, redis_server):
    """Anyone who can write the shared server relabels document B's manifest as A's (name and token hash,
    re-sealed): a reader on another machine that opens A ingests it; it never attends to B's pages."""
    import dataclasses

    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "writer", StoreConfig(remote=redis_server.url)) as store, \
            TieredModel(lm, store, TieredConfig()) as tm:
        a, b = tm.open(DOC, name="a", **READING), tm.open(OTHER, name="b", **READING)
        forged = dataclasses.replace(b.artifact, name="a", token_ids_sha256=a.artifact.token_ids_sha256)
        for art in (a.artifact, b.artifact):
            store.delete_manifest(art.artifact_id)
        store.put_manifest(forged.artifact_id, forged.to_json())
        store.flush_remote()
    with PageStore(tmp_path / "reader", StoreConfig(remote=redis_server.url)) as store, \
            TieredModel(lm, store, TieredConfig()) as tm:
        assert store.list_manifests() == [forged.artifact_id]
        doc = tm.open(DOC, name="a", **READING)
        ans = tm.ask(doc, "What colour is the secret?", max_new_tokens=2)
    assert doc.context == "ingested" and doc.artifact.artifact_id == a.artifact.artifact_id
    assert "teal" in ans.passages[0]["text"] and "gold" not in ans.passages[0]["text"]


def _relabelled_file(genuine: Path, out: Path, **fields) -> None:
    """`genuine` (a .tkv file) with its artifact's `fields` changed and every hash of the file recomputed."""
    import dataclasses

    from tieredkv.artifacts.file_format import encode_header
    from tieredkv.artifacts.portable import read_header

    raw, header = genuine.read_bytes(), read_header(genuine)
    base = header.data_offset
    tokens = raw[base + header.token_ids.begin:base + header.token_ids.end]
    blobs = [raw[base + s.begin:base + s.end] for s in header.pages]
    sections = [(len(b), hashlib.sha256(b).hexdigest()) for b in blobs]
    artifact = dataclasses.replace(header.artifact, **fields)
    out.write_bytes(encode_header(artifact, hashlib.sha256(tokens).hexdigest(), sections) + tokens + b"".join(blobs))


@pytest.mark.parametrize("forge", ["name", "name and token hash"])
def test_a_renamed_imported_file_never_answers_for_another_document(tiny_model, tmp_path, forge):
    from tieredkv.artifacts.portable import export_artifact, import_artifact
    from tieredkv.errors import TieredKVError

    lm = tiny_model("tiny-llama")
    with _tm(lm, tmp_path / "s") as tm:
        a, b = tm.open(DOC, name="a", **READING), tm.open(OTHER, name="b", **READING)
        export_artifact(tm.store, b.artifact.artifact_id, tmp_path / "b.tkv")
    fields = {"name": "a"} if forge == "name" else {"name": "a", "token_ids_sha256": a.artifact.token_ids_sha256}
    _relabelled_file(tmp_path / "b.tkv", tmp_path / "a.tkv", **fields)
    with _tm(lm, tmp_path / "t") as tm:
        try:
            import_artifact(tmp_path / "a.tkv", tm.store)
        except TieredKVError:
            pass  # refused at import: nothing of it in the store
        doc = tm.open(DOC, name="a", **READING)
        ans = tm.ask(doc, "What colour is the secret?", max_new_tokens=2)
    assert doc.context == "ingested" and doc.artifact.artifact_id == a.artifact.artifact_id
    assert "teal" in ans.passages[0]["text"] and "gold" not in ans.passages[0]["text"]


def test_chat_over_a_document_applies_the_template_and_keeps_turns(smollm2, tmp_path):
    """A one-turn chat is the question asked; a later turn sees the earlier turns (kept by the caller, as
    with HF) and, like every call, starts from the document alone."""
    with _tm(smollm2, tmp_path / "s") as tm:
        doc = tm.open("Dear Ann, the garden is in bloom. Yours, Tom.", name="letter")
        asked = tm.ask(doc, "Who wrote the letter?", max_new_tokens=4)
        turns = [{"role": "user", "content": "Who wrote the letter?"}]
        first = tm.chat(doc, turns, max_new_tokens=4)
        turns += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "To whom?"}]
        second = tm.chat(doc, turns, max_new_tokens=4)
        again = tm.chat(doc, turns, max_new_tokens=4)
        with pytest.raises(TokenIdsError, match="starts and ends with a user turn"):
            tm.chat(doc, turns[:2], max_new_tokens=4)
    assert first.token_ids == asked.token_ids and second.question == "To whom?"
    assert second.token_ids == again.token_ids and second.timings["attach_s"] > 0
