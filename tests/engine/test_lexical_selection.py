"""TieredConfig(selection="lexical"): a question over a sealed context that retrieves holds the pages whose text
matches its words in every layer's working set; nothing changes where the context fits or at ingest."""
from __future__ import annotations

import pytest

from tests.engine.test_tiered_model import tiered
from tieredkv.engine.tiered_config import TieredConfig

SMALL = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def _document(codec, planted: dict[int, str], tokens: int = 640) -> list[int]:
    """Filler with each planted sentence after about `at` tokens."""
    ids: list[int] = []
    for at, sentence in sorted(planted.items()):
        while len(ids) < at:
            ids += codec.encode(FILLER)
        ids += codec.encode(sentence)
    while len(ids) < tokens:
        ids += codec.encode(FILLER)
    return ids[:tokens]


@pytest.mark.parametrize("retrieval", ["per_head", "union"])
def test_the_question_holds_the_pages_that_hold_its_words(tiny_model, tmp_path, retrieval):
    lm = tiny_model("tiny-llama")
    doc = _document(lm.codec, {200: " The zanzibar ledger is red. ", 400: " A quokka guards the ledger. "})
    config = TieredConfig(**SMALL, retrieval=retrieval, selection="lexical")
    with tiered(lm, tmp_path, config) as tm:
        tm.ingest(doc)
        question = " Who guards the zanzibar ledger? A quokka"
        tm.cache.retrieval_log.clear()
        tm.generate(lm.codec.encode(question), max_new_tokens=3, question=question)
        held = tm.cache.held_pages
        texts = [lm.codec.decode(tm.cache.page_token_ids(p)) for p in held]
        heads = tm.cache.layout.num_kv_heads
        assert 1 <= len(held) <= (config.topk_pages if retrieval == "per_head" else heads * config.topk_pages)
        assert any("zanzibar" in t for t in texts) and any("quokka" in t for t in texts)
        n = len(tm.cache.spans)
        for layer in range(len(tm.cache.layers)):
            assert tm.cache.last_selection(layer) == sorted({0, *held, n - 2, n - 1})
        assert {tuple(found) for found in tm.cache.retrieval_log} == {tuple(held)}  # every forward, every layer


def test_a_question_holds_what_one_head_reads_under_its_retrieval():
    assert TieredConfig(topk_pages=4, retrieval="per_head").held_pages(3) == 4
    assert TieredConfig(topk_pages=4).held_pages(3) == 12  # the union's most
    assert TieredConfig(topk_pages=4, union_pages=5).held_pages(3) == 5


def test_without_a_matching_page_attention_searches(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, TieredConfig(**SMALL, selection="lexical")) as tm:
        tm.ingest(_document(lm.codec, {}))
        tm.generate(lm.codec.encode(" Where is the quokka?"), max_new_tokens=2, question="Where is the quokka?")
        assert tm.cache.held_pages is None and len(tm.cache.retrieval_log) > 0


def test_nothing_changes_where_the_context_fits(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc = _document(lm.codec, {100: " The zanzibar ledger is red. "}, tokens=300)  # 10 pages of 32 fit 1 + 16 + 16
    q = lm.codec.encode(" What colour is the zanzibar ledger?")
    outs = []
    for selection in ("attention", "lexical"):
        with tiered(lm, tmp_path / selection, TieredConfig(chunk_pages=1, selection=selection)) as tm:
            tm.ingest(doc)
            outs.append(tm.generate(q, max_new_tokens=6, question="What colour is the zanzibar ledger?"))
            assert tm.cache.held_pages is None and not tm.cache.retrieving
    assert outs[0] == outs[1]


def test_selection_is_question_time_only(tiny_model, tmp_path):
    assert TieredConfig(selection="lexical").regime(32) == TieredConfig().regime(32)
    with pytest.raises(ValueError, match="selection must be one of"):
        TieredConfig(selection="bm25")
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, TieredConfig(**SMALL)) as tm:
        art = tm.ingest(_document(lm.codec, {}))
        tm.configure(TieredConfig(**SMALL, selection="lexical"))
        assert tm.graft(art).artifact_id == art.artifact_id  # the same domain: no mismatch to allow


def test_qa_keeps_the_key_summaries_unless_asked(tiny_model):
    from tieredkv.question.qa import qa_config

    lm = tiny_model("tiny-llama")
    assert qa_config(lm, 4_000, reading=None).selection == "attention"
    assert qa_config(lm, 4_000, reading=None, selection="lexical").selection == "lexical"
