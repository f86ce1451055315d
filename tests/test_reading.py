"""Question-time reading (TieredConfig.reading): ranking, choosing, and reading the chosen pages afresh."""
from __future__ import annotations

import pytest
import torch
from test_tiered_model import _ids, tiered

from index.lexical import BM25Index, words
from tieredkv.reading import CompactReading, choose, fuse, rank
from tieredkv.tiered_config import ReadingConfig, TieredConfig

READ = ReadingConfig(pages=3, signal="hybrid", neighbours=1)
FIXED = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed")


def test_words_drop_function_words_and_keep_identifiers():
    assert words("What does the __init_subclass__ hook of f_lineno do?") == ["__init_subclass__", "hook", "f_lineno"]


def test_bm25_prefers_the_rare_word_and_shorter_pages():
    texts = ["the tbreak command sets a temporary breakpoint", "break and continue in loops",
             "a breakpoint " * 20, "nothing relevant here at all"]
    scores = BM25Index(texts).scores("Which command sets a temporary breakpoint?")
    assert scores.argmax() == 0 and scores[3] == 0
    assert BM25Index(texts).scores("") .tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        BM25Index(texts, b=2)


def test_fusion_and_choice():
    assert fuse([[5, 1, 2], [2, 9]]) == [2, 5, 1, 9]  # 2 is in both lists
    cands = list(range(1, 20))
    ranked = rank(cands, {4: 3, 7: 5}, {12: 2.0, 4: 1.0}, "hybrid")
    assert ranked == [4, 7, 12]  # 4 is high in both lists; 7 and 12 tie (the earlier page first)
    assert rank(cands, {4: 3}, {}, "lexical") == []  # what no signal scored is not ranked
    assert rank(cands, {4: 3, 7: 5}, {12: 2.0}, "attention") == [7, 4]
    assert choose([10, 3], cands, 5, 1) == [2, 3, 9, 10, 11]  # 10 and its neighbours first, then 3, 2
    assert choose([1], cands, 3, 1) == [1, 2]  # page 0 (the sink) is not a candidate; the budget is not forced
    assert choose([19, 18], cands, 4, 2) == [16, 17, 18, 19]


def test_reading_config_validation():
    with pytest.raises(ValueError, match="signal"):
        ReadingConfig(signal="magic")
    with pytest.raises(ValueError, match="pages"):
        ReadingConfig(pages=0)
    with pytest.raises(ValueError, match="reading"):
        TieredConfig(reading=READ)  # own positions
    with pytest.raises(ValueError, match="reading"):
        TieredConfig(position="fixed", reading=READ, reencode_pages=2)
    assert TieredConfig(position="fixed", reading=READ).regime(32) == TieredConfig(position="fixed").regime(32)


def test_a_question_reads_its_pages_afresh_and_attends_only_to_them(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc = _ids(700, 4)  # 22 pages of 32
    needle = lm.codec.encode("zebra quokka")
    doc[400:400 + len(needle)] = needle  # page 12
    question = lm.codec.encode("quokka?")
    lexical = ReadingConfig(pages=3, signal="lexical", neighbours=1)  # a random model's attention means nothing
    with tiered(lm, tmp_path, TieredConfig(**FIXED, reading=lexical)) as tm:
        art = tm.ingest(doc)
        stored = [tm.store.get(k).to_bytes() for k in art.page_keys]
        out = tm.generate(question, max_new_tokens=3, question="where is the quokka")
        reading = tm.last_reading
        assert reading.pages == [11, 12, 13] and reading.ranked[0] == 12
        assert list(reading.lexical_scores) == [12] and reading.attention_votes == {}
        assert set(tm.cache.reencoded) == {0, *reading.pages}  # the sink too
        assert isinstance(tm.cache.policy, CompactReading)
        n_doc = len(art.page_keys)
        for layer in range(len(tm.cache.layers)):
            assert tm.cache.last_selection(layer) == sorted({0, *reading.pages, *range(n_doc, len(tm.cache.spans))})
        assert len(out) == 3
        # nothing stored changed, and the next graft attends with the model's own policy again
        assert [tm.store.get(k).to_bytes() for k in art.page_keys] == stored
        tm.graft(art)
        assert type(tm.cache.policy).__name__ == "FixedDistance" and not tm.cache.reencoded


@pytest.mark.parametrize("frame", [None, 5])
def test_reading_is_the_plain_model_over_the_packed_pages(frame, tiny_model, tmp_path):
    """The question's logits over a read context are torch.equal to the plain model run over the sink
    and the chosen pages packed right before the question (one forward), then the question in the same
    chunks: the reading is a compact document at the question's positions."""
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill
    from tieredkv.reading import read

    lm = tiny_model("tiny-llama")
    doc, question = _ids(700, 4), _ids(20, 5)
    cfg = TieredConfig(**FIXED, reading=ReadingConfig(pages=2, signal="attention", neighbours=0, frame_tokens=frame))
    with tiered(lm, tmp_path, cfg) as tm:
        tm.ingest(doc)
        tm.keep_in_memory()
        pages = read(tm.cache, question, "", cfg.reading, lm.codec).pages
        got = tm.prefill(question, logits_to_keep=0)
        assert tm.cache.reencoded[0][0][0].shape[1] == (frame or 32)  # [Hkv, T, D] of the sink at layer 0
    ids = doc[:frame or 32] + [t for p in pages for t in doc[p * 32:(p + 1) * 32]]
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([ids]), position_ids=torch.arange(700 - len(ids), 700)[None],
                 past_key_values=cache, use_cache=True)
    want = prefill(lm, question, cache, start=700, page_size=32, logits_to_keep=0)
    assert len(pages) == 2 and torch.equal(got, want)
