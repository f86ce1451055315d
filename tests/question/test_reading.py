"""Question-time reading (TieredConfig.reading): ranking, choosing, and reading the chosen pages afresh."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from index.lexical import BM25Index, stem, words
from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.tiered_config import ReadingConfig, TieredConfig
from tieredkv.engine.working_set import Span
from tieredkv.question.reading import (
    CompactReading,
    centre,
    choose,
    fragments,
    fuse,
    lexical_runs,
    lexical_scores,
    merge,
    places,
    rank,
    run_pages,
    word_weights,
)

READ = ReadingConfig(passages=1, passage_tokens=96, signal="lexical")
FIXED = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed")


def test_words_drop_function_words_and_keep_identifiers():
    assert words("What does the __init_subclass__ hook of f_lineno do?") == ["__init_subclass__", "hook", "f_lineno"]


def test_bm25_prefers_the_rare_word_and_shorter_pages():
    texts = ["the tbreak command sets a temporary breakpoint", "break and continue in loops",
             "a breakpoint " * 20, "nothing relevant here at all"]
    scores = BM25Index(texts).scores("Which command sets a temporary breakpoint?")
    assert scores.argmax() == 0 and scores[3] == 0
    assert BM25Index(texts).scores("").tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        BM25Index(texts, b=2)


def test_bm25_over_runs_of_pages():
    texts = ["koala", "quokka wombat quokka wombat", "filler", "zebra", "quokka filler wombat", "filler"]
    index = BM25Index(texts)
    q = "quokka wombat zebra"
    assert np.array_equal(index.run_scores(q, 1), index.scores(q))  # a run of one page is the page
    runs = index.run_scores(q, 2)  # run i: pages i and i + 1
    assert len(runs) == 5 and runs.argmax() == 3  # where all three words meet, not where two of them repeat
    assert index.scores(q).argmax() == 1
    assert index.run_scores(q, 99).shape == (1,)  # more pages than the index holds: one run of them all
    assert BM25Index([]).run_scores(q, 2).shape == (0,)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="pages"):
            index.run_scores(q, bad)


class _WordCodec:
    VOCAB = ["x", "quokka", "wombat", "zebra"]

    def decode(self, ids):
        return "".join(" " + self.VOCAB[i] for i in ids)


def _word_cache(pages: list[list[int]]) -> SimpleNamespace:
    ids = [t for p in pages for t in p]
    n = len(pages[0])
    spans = [Span(i, n * i, n * i + n) for i in range(len(pages))]
    return SimpleNamespace(spans=spans, lexical_index=None, page_token_ids=lambda p: ids[n * p:n * p + n])


def test_a_passage_goes_where_the_question_words_meet():
    """Page 2 repeats two of the question's words; all three meet across pages 7 and 8. Pages scored alone
    read page 2 first; runs as long as the passage read pages 7 and 8, centred in the run's best page (8)."""
    pages = [[0] * 4 for _ in range(12)]
    pages[2], pages[7], pages[8] = [1, 2, 1, 2], [0, 0, 0, 3], [1, 0, 2, 0]
    cache, codec, q, cands = _word_cache(pages), _WordCodec(), "quokka wombat zebra", list(range(12))
    by_page = rank(cands, {}, lexical_scores(cache, cands, q, codec), "lexical")
    by_run = rank(cands, {}, lexical_runs(cache, cands, q, codec, 2), "lexical")
    assert by_page[0] == 2 and by_run[0] == 7
    assert places(cache, by_page, q, 1, 8, codec, first=0, end=48) == [(5, 13)]
    assert places(cache, by_run, q, 1, 8, codec, first=0, end=48, run=2) == [(29, 37)]  # all three words
    # a second place never overlaps the first: the runs starting at pages 6 and 8 are passed over
    assert places(cache, by_run, q, 2, 8, codec, first=0, end=48, run=2) == [(29, 37), (5, 13)]
    assert run_pages(ReadingConfig(passage_tokens=512), 128) == 4
    assert run_pages(ReadingConfig(passage_tokens=512, run_pages=1), 128) == 1
    assert run_pages(ReadingConfig(passage_tokens=512, signal="hybrid"), 128) == 1  # attention ranks pages
    with pytest.raises(ValueError, match="run_pages"):
        ReadingConfig(run_pages=0)


def test_a_second_passage_is_read_where_the_words_meet_about_as_well_again():
    """`second_at`: the best run (pages 7-8, all three words) is read; the next place that does not overlap it
    (around page 2, two of the words repeated) is read too when its BM25 reaches that share of the first's."""
    pages = [[0] * 4 for _ in range(12)]
    pages[2], pages[7], pages[8] = [1, 2, 1, 2], [0, 0, 0, 3], [1, 0, 2, 0]
    cache, codec, q = _word_cache(pages), _WordCodec(), "quokka wombat zebra"
    cache.sealed_upto, cache.page_size = 48, 4
    base = ReadingConfig(passages=1, passage_tokens=8, signal="lexical", run_pages=2)
    one = choose(cache, [], q, base, codec, 0)
    assert one.passages == [(29, 37)]
    runs = lexical_runs(cache, list(range(12)), q, codec, 2)
    share = max(v for p, v in runs.items() if p not in (6, 7, 8)) / runs[7]  # the best run that does not overlap
    assert 0 < share < 1
    below = dataclasses.replace(base, second_at=share * 0.99)
    above = dataclasses.replace(base, second_at=min(1.0, share * 1.01))
    assert choose(cache, [], q, below, codec, 0).passages == [(5, 13), (29, 37)]  # both, in document order
    assert choose(cache, [], q, above, codec, 0).passages == [(29, 37)]
    assert choose(cache, [], q, dataclasses.replace(base, passages=2), codec, 0).passages == [(5, 13), (29, 37)]
    for bad in (0, 1.5, -0.1, True, "0.8"):
        with pytest.raises(ValueError, match="second_at"):
            ReadingConfig(second_at=bad)


def test_stemming_meets_inflections_and_leaves_identifiers():
    assert {stem(w) for w in ("harpooned", "harpooning", "harpoons", "harpoon")} == {"harpoon"}
    assert stem("treaties") == stem("treaty") and stem("churches") == stem("church") and stem("stopped") == "stop"
    assert stem("move") == stem("moved") == stem("moving") and stem("called") == "call"
    assert [stem(w) for w in ("sea", "glass", "status", "f_lineno", "utf8")] == ["sea", "glass", "status", "f_lineno",
                                                                                "utf8"]
    assert words("The harpooneers sailed", stemmed=True) == ["harpooneer", "sail"]
    texts = ["they sailed and harpooned the whales", "a whale was seen", "nothing relevant here"]
    assert BM25Index(texts).scores("who harpoons whales while sailing")[0] > 0
    index = BM25Index(texts, stemmed=True)
    plain, stemmed = BM25Index(texts).scores("harpoon sail whale"), index.scores("harpoon sail whale")
    assert plain[0] == 0 and stemmed.argmax() == 0 and stemmed[1] > 0 and stemmed[2] == 0
    assert index.term("The") is None and index.term("Sailing") == "sail"


def test_a_stemmed_reading_finds_the_inflected_words():
    """Page 5 holds "wombats" twice; the question asks about one "wombat": only the stemmed signal ranks it,
    and the stemmed places centre on it."""
    codec = _WordCodec()
    codec.VOCAB = ["x", "quokka", "wombats", "zebra"]
    pages = [[0] * 4 for _ in range(8)]
    pages[5] = [0, 2, 2, 0]
    cache, cands = _word_cache(pages), list(range(8))
    assert lexical_scores(cache, cands, "a wombat", codec) == {}
    ranked = rank(cands, {}, lexical_scores(cache, cands, "a wombat", codec, stemmed=True), "lexical")
    assert ranked == [5] and cache.lexical_index.stemmed
    assert places(cache, ranked, "a wombat", 1, 4, codec, first=0, end=32, stemmed=True) == [(19, 23)]  # both
    with pytest.raises(ValueError, match="stemmed"):
        ReadingConfig(stemmed="yes")


def test_ranking_fusion():
    assert fuse([[5, 1, 2], [2, 9]]) == [2, 5, 1, 9]  # 2 is in both lists
    cands = list(range(1, 20))
    assert rank(cands, {4: 3, 7: 5}, {12: 2.0, 4: 1.0}, "hybrid") == [4, 7, 12]  # 4 high in both; 7, 12 tie
    assert rank(cands, {4: 3}, {}, "lexical") == []  # what no signal scored is not ranked
    assert rank(cands, {4: 3, 7: 5}, {12: 2.0}, "attention") == [7, 4]


def test_passage_geometry():
    # words are found across token boundaries and weighted by the token they start in
    assert word_weights(["The qu", "okka", " and", " zebra"], {"quokka": 2.0, "zebra": 1.0}).tolist() == [2, 0, 0, 1]
    assert centre([0, 0, 0, 5, 0, 0, 1, 0], 3) == 3 and centre([0, 0, 0, 0], 2) == 2
    assert centre([1, 0, 1, 0, 0, 0, 0, 3], 8) == 7 and centre([2, 0, 2, 0, 0, 0, 0, 3], 8) == 1  # weight, then density
    assert merge([(10, 20), (0, 5), (18, 30), (30, 31)]) == [(0, 5), (10, 31)]
    spans = [Span(i, 32 * i, 32 * i + 32) for i in range(4)]
    assert fragments(spans, [(0, 5), (40, 70)]) == [(0, 0, 5), (1, 40, 64), (2, 64, 70)]
    assert fragments(spans, [(66, 70), (80, 90)]) == [(2, 66, 90)]  # one fragment per page


def test_reading_config_validation():
    with pytest.raises(ValueError, match="signal"):
        ReadingConfig(signal="magic")
    with pytest.raises(ValueError, match="passages"):
        ReadingConfig(passages=0)
    assert TieredConfig(reading=READ).reading == READ  # own positions read too (inside the window)
    with pytest.raises(ValueError, match="reading"):
        TieredConfig(position="fixed", reading=READ, reencode_pages=2)
    assert TieredConfig(position="fixed", reading=READ).regime(32) == TieredConfig(position="fixed").regime(32)


def test_a_question_reads_a_passage_afresh_and_attends_only_to_it(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc = _ids(700, 4)  # 22 pages of 32
    needle = lm.codec.encode(" zebra quokka ")
    doc[400:400 + len(needle)] = needle  # page 12, tokens 400-414
    question = lm.codec.encode("quokka?")
    framed = ReadingConfig(passages=1, passage_tokens=48, signal="lexical", frame_tokens=6)
    with tiered(lm, tmp_path, TieredConfig(**FIXED, reading=framed)) as tm:
        art = tm.ingest(doc)
        stored = [tm.store.get(k).to_bytes() for k in art.page_keys]
        out = tm.generate(question, max_new_tokens=3, question="where is the quokka")
        reading = tm.last_reading
        (a, b), = reading.passages
        assert (a, b) == (407 - 24, 407 + 24) and reading.ranked == [12]  # centred on "quokka" (token 407)
        assert reading.lexical_scores.keys() == {12} and reading.attention_votes == {}
        assert reading.pages == [11, 12, 13] and sorted(tm.cache.reencoded) == [0, 11, 12, 13]
        again = choose(tm.cache, question, "where is the quokka", framed, lm.codec, 6)  # nothing encoded
        assert again.passages == reading.passages and again.ranked == reading.ranked
        assert tm.cache.reencoded_start[0] == 0 and tm.cache.reencoded[0][0][0].shape[1] == 6  # the frame
        assert isinstance(tm.cache.policy, CompactReading)
        n_doc = len(art.page_keys)
        for layer in range(len(tm.cache.layers)):
            assert tm.cache.last_selection(layer) == sorted({0, *reading.pages, *range(n_doc, len(tm.cache.spans))})
        assert len(out) == 3
        # nothing stored changed, and the next graft attends with the model's own policy again
        assert [tm.store.get(k).to_bytes() for k in art.page_keys] == stored
        tm.graft(art)
        assert type(tm.cache.policy).__name__ == "FixedDistance" and not tm.cache.reencoded


def test_a_document_shorter_than_a_run_is_ranked_as_one_run(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc = _ids(96, 4)  # 3 pages of 32; the frame covers page 0, so pages 1 and 2 are the candidates
    needle = lm.codec.encode(" zebra quokka ")
    doc[70:70 + len(needle)] = needle
    reading = ReadingConfig(passages=1, passage_tokens=128, signal="lexical", frame_tokens=40)  # runs of 4 pages
    with tiered(lm, tmp_path, TieredConfig(**FIXED, reading=reading)) as tm:
        tm.ingest(doc)
        tm.generate(lm.codec.encode("quokka?"), max_new_tokens=1, question="where is the quokka")
        assert tm.last_reading.ranked == [1] and tm.last_reading.lexical_scores.keys() == {1}


def test_a_question_without_a_matching_word_reads_the_document_end(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig(**FIXED, reading=READ)) as tm:
        tm.ingest(_ids(700, 4))
        tm.generate(_ids(5, 1), max_new_tokens=1, question="xylophone")
        assert tm.last_reading.ranked == [] and tm.last_reading.passages == [(700 - 96, 700)]


@pytest.mark.parametrize("frame", [None, 5])
def test_reading_is_the_plain_model_over_the_packed_passages(frame, tiny_model, tmp_path):
    """The question's logits over a read context are torch.equal to the plain model run over the frame
    and the passages packed right before the question (one forward), then the question in the same
    chunks: the reading is a compact document at the question's positions."""
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill
    from tieredkv.question.reading import read

    lm = tiny_model("tiny-llama")
    doc, question = _ids(700, 4), _ids(20, 5)
    reading = ReadingConfig(passages=2, passage_tokens=40, signal="attention", frame_tokens=frame)
    cfg = TieredConfig(**FIXED, reading=reading)
    with tiered(lm, tmp_path, cfg) as tm:
        tm.ingest(doc)
        tm.keep_in_memory()
        ranges = read(tm.cache, question, "", reading, lm.codec).passages
        got = tm.prefill(question, logits_to_keep=0)
        assert tm.cache.reencoded[0][0][0].shape[1] >= (frame or 32)  # [Hkv, T, D] of the sink at layer 0
    spans = [Span(i, 32 * i, min(700, 32 * i + 32)) for i in range(22)]
    ids = [t for _, a, b in fragments(spans, merge([(0, frame or 32), *ranges])) for t in doc[a:b]]
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([ids]), position_ids=torch.arange(700 - len(ids), 700)[None],
                 past_key_values=cache, use_cache=True)
    want = prefill(lm, question, cache, start=700, page_size=32, logits_to_keep=0)
    assert len(ranges) == 2 and sum(b - a for a, b in ranges) == 80 and len(ids) >= (frame or 32) + 80
    assert torch.equal(got, want)
