"""Question-time re-encoding (TieredConfig.reencode_pages, fixed policy): which pages, computed how,
served where, and what it must never touch (the store, contexts that fit, sliding-window layers)."""
from __future__ import annotations

import hashlib

import pytest
import torch

from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.rotary import rerotate
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.working_set import fixed_positions
from tieredkv.question.reencode import probe, reencode

FIXED = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed")


def _store_digest(tm, keys) -> str:
    h = hashlib.sha256()
    for key in keys:
        h.update(tm.store.get(key).to_bytes())
    return h.hexdigest()


def test_reencoded_pages_are_the_model_over_the_packed_pages(tiny_model, tmp_path):
    """The sink and the chosen far pages are run together through the plain model, in position
    order, at the positions `fixed` packs them to; keys are kept moved back to their own positions.
    The stored pages are not touched."""
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, FIXED) as tm:
        art = tm.ingest(_ids(700, 4))
        before, n_pages = _store_digest(tm, art.page_keys), len(tm.cache.page_keys)
        spans, first = tm.cache.spans, tm.cache.local_first
        assert reencode(tm.cache, [9, 5, first]) == [0, 5, 9]  # sorted; a local page is not far
        shifts = fixed_positions(spans, [0, 5, 9], spans[first].start)
        ids = [t for p in (0, 5, 9) for t in tm.store.get(tm.cache.page_keys[p]).token_ids]
        start = spans[0].start + shifts[0]
        ref = lm.model(input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + len(ids))[None],
                       use_cache=True).past_key_values
        at = 0
        for p in (0, 5, 9):
            n = spans[p].end - spans[p].start
            for layer, (k, v) in enumerate(tm.cache.reencoded[p]):
                k_ref, v_ref = ref.layers[layer].keys[0, :, at:at + n], ref.layers[layer].values[0, :, at:at + n]
                assert torch.equal(v, v_ref)
                assert torch.equal(k, rerotate(lm.model, k_ref, -shifts[p], layer))
            at += n
        # afresh, not the stored bytes: the last layer of page 9 attended to other pages when it was stored
        stored_v = tm.store.get(tm.cache.page_keys[9]).layer_kv(1)[1]
        assert not torch.equal(tm.cache.reencoded[9][1][1], stored_v)
        assert _store_digest(tm, art.page_keys) == before and len(tm.cache.page_keys) == n_pages


def test_generate_reencodes_once_and_every_full_layer_holds_the_pages(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed", reencode_pages=3)
    question = _ids(40, 5)
    with tiered(lm, tmp_path, cfg) as tm:
        art = tm.ingest(_ids(700, 4))
        before = _store_digest(tm, art.page_keys)
        chosen = probe(tm.cache, question, 3)
        assert len(chosen) == 3 and all(cfg.sink_pages <= p < tm.cache.local_first for p in chosen)
        assert tm.num_tokens == 700 and tm.cache.layers[0].keys.shape[1] == 0  # the probe left no trace
        tm.generate(question, max_new_tokens=3)
        assert sorted(tm.cache.reencoded) == [0, *chosen]
        for layer in range(len(tm.cache.layers)):
            assert set(chosen) <= set(tm.cache.last_selection(layer))
        first = dict(tm.cache.reencoded)
        tm.generate(_ids(10, 6), max_new_tokens=2)  # a follow-up turn: the context is no longer sealed
        assert tm.cache.reencoded.keys() == first.keys()
        assert all(tm.cache.reencoded[p] is first[p] for p in first)
        assert _store_digest(tm, art.page_keys) == before  # the document's pages are untouched
    # The stored context grafts with its own bytes under either setting. The question's pages written
    # above attended to re-encoded pages: the same tokens without re-encoding are other bytes under
    # other keys (a shared key would raise PageConflictError when they are written at close).
    off = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed")
    with tiered(lm, tmp_path, off) as tm:
        tm.graft(art.artifact_id)
        tm.generate(question, max_new_tokens=3)
        assert not tm.cache.reencoded


def test_a_context_that_fits_is_never_reencoded(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc, question = _ids(300, 1), _ids(20, 2)
    outs = []
    for i, n in enumerate((0, 4)):
        cfg = TieredConfig(chunk_pages=1, local_pages=8, topk_pages=4, position="fixed", reencode_pages=n)
        with tiered(lm, tmp_path / str(i), cfg) as tm:
            tm.ingest(doc)
            assert not tm.cache.retrieving
            outs.append(tm(torch.tensor([question])).logits)
            assert not tm.cache.reencoded
    assert torch.equal(*outs)


def test_sliding_window_layers_keep_the_stored_page(tiny_model, tmp_path):
    lm = tiny_model("tiny-gemma3")  # layers 0-1 slide, layer 2 is full attention
    with tiered(lm, tmp_path, FIXED) as tm:
        tm.ingest(_ids(700, 4))
        reencode(tm.cache, [5])
        stored = tm.store.get(tm.cache.page_keys[5])
        for layer in range(3):
            k, _ = tm.cache.page_kv(5, layer)
            if tm.cache.layers[layer].is_sliding:
                assert torch.equal(k, stored.layer_kv(layer)[0])
            else:
                assert k is tm.cache.reencoded[5][layer][0]


@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma3"])
def test_reencoding_more_than_a_sliding_window(name, tiny_model, tmp_path):
    """Re-encoded tokens beyond the sliding window (4 pages of 32 > 64): the fresh run's sliding layers
    keep only their window, and need nothing (they read stored pages). This raised before."""
    lm = tiny_model(name)
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed", reencode_pages=3)
    with tiered(lm, tmp_path, cfg) as tm:
        tm.ingest(_ids(700, 4))
        out = tm.generate(_ids(13, 5), max_new_tokens=4)
        assert len(out) == 4 and len(tm.cache.reencoded) == 4
        for layers in tm.cache.reencoded.values():
            assert [kv is None for kv in layers] == [layer.is_sliding for layer in tm.cache.layers]


def test_reencode_is_for_fixed_and_not_part_of_the_regime():
    with pytest.raises(ValueError, match="reencode_pages"):
        TieredConfig(reencode_pages=8)  # own positions
    with pytest.raises(ValueError, match="reencode_pages"):
        TieredConfig(position="fixed", reencode_pages=-1)
    on, off = TieredConfig(position="fixed", reencode_pages=8), TieredConfig(position="fixed")
    assert on.regime_fingerprint("m", 32) == off.regime_fingerprint("m", 32)  # the same stored bytes


def test_qa_reads_under_fixed_by_default_and_grafts_its_artifact(tmp_path, capsys):
    import json

    from tieredkv.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 150 + "The secret colour is teal. " + "Beta. " * 150)
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What colour is the secret?", "--store",
            str(tmp_path / "s"), "--local-pages", "2", "--topk-pages", "2", "--max-new-tokens", "4", "--json",
            "--quiet", "--position", "fixed", "--read-tokens", "64"]
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert on["context"] == "ingested" and on["attended"] == "read" and on["reading"]["passage_tokens"] == 64
    (passage,) = on["shown"]  # one passage, centred on the question's words
    assert "The secret colour is teal." in passage["text"] and passage["tokens"][1] - passage["tokens"][0] == 64
    assert on["reencoded_pages"][0] == 0 and on["reading"]["frame_tokens"] == len("Document:\n")
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["context"].startswith("grafted")
    # no reading: attention retrieves from the stored pages, which a reading ingests per head (qa_config);
    # without one the document is stored once more, under the union of the heads' pages, then grafted
    assert main([*args, "--read-passages", "0"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["context"] == "ingested" and off["artifact"] != on["artifact"]
    assert off["reencoded_pages"] == [] and off["attended"] == "retrieved" and off["reading"] is None
    assert main([*args, "--read-passages", "0"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["context"].startswith("grafted") and again["artifact"] == off["artifact"]
    assert main([*args, "--read-passages", "0", "--reencode-pages", "3"]) == 0  # the earlier question-time step
    beside = json.loads(capsys.readouterr().out)
    assert (beside["attended"] == "retrieved" and beside["reencoded_pages"][0] == 0
            and len(beside["reencoded_pages"]) <= 4)


def test_qa_refuses_reencoding_under_own_positions(tmp_path, capsys):
    from tieredkv.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 50)
    base = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What?", "--store", str(tmp_path / "s"),
            "--quiet"]
    assert main([*base, "--position", "own", "--reencode-pages", "4"]) == 2
    assert "--position" in capsys.readouterr().err
    assert main([*base, "--position", "fixed", "--reencode-pages", "-1"]) == 2
    assert main([*base, "--position", "fixed", "--read-tokens", "0"]) == 2
    assert not (tmp_path / "s").exists()  # refused before any store or model work
