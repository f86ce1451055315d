"""TieredConfig(selection="question"): a question's own attention ranks each layer's far pages once (SnapKV, per
page), and every forward of the question and its answer reads each KV head's top-k of that ranking."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.engine.test_lexical_selection import SMALL, _document
from tests.engine.test_tiered_model import tiered
from tieredkv.engine.question_choice import page_mass, rank_by_attention
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.working_set import Span


def _pages_ctx(keys: list[torch.Tensor], config: TieredConfig):
    """A context of synthetic pages: keys[p] is page p's [Hkv, T, D] keys."""
    t = keys[0].shape[1]
    layout = SimpleNamespace(num_kv_heads=keys[0].shape[0])
    return SimpleNamespace(config=config, model=torch.nn.Module(), layout=layout, question_words=None,
                           spans=[Span(p, p * t, (p + 1) * t) for p in range(len(keys))],
                           page_kv=lambda p, layer: (keys[p], torch.zeros_like(keys[p])))


def test_each_head_ranks_first_the_page_its_queries_attend_to():
    g = torch.Generator().manual_seed(0)
    hkv, t, d, pages = 2, 4, 8, 10
    keys = [0.1 * torch.randn(hkv, t, d, generator=g) for _ in range(pages)]
    unit = torch.eye(d)
    keys[3][0, 1] = 4 * unit[0]  # head 0's queries point along e0, head 1's along e1
    keys[6][1, 2] = 4 * unit[1]
    query = torch.stack([unit[0], unit[0], unit[1], unit[1]])[None, :, None, :].repeat(1, 1, 3, 1)  # Hq 4, G 2
    ctx = _pages_ctx(keys, TieredConfig(sink_pages=1, local_pages=2, topk_pages=2))
    ranking = rank_by_attention(ctx, 0, query)
    assert ranking[0][0] == 3 and ranking[1][0] == 6
    assert [sorted(row) for row in ranking] == [list(range(1, 8))] * 2  # every far page, no sink, no local
    ctx.question_words = [5]  # selection="hybrid": the pages' BM25 ranking, fused by rank
    fused = rank_by_attention(ctx, 0, query)
    assert [row[:2] for row in fused] == [[5, 3], [5, 6]]
    assert [sorted(row) for row in fused] == [list(range(1, 8))] * 2


def test_the_mass_is_the_softmax_over_the_documents_keys(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, TieredConfig(**SMALL)) as tm:
        tm.ingest(_document(lm.codec, {}))
        cache = tm.cache
        hkv, d = cache.layout.num_kv_heads, cache.layout.head_dim
        query = torch.randn(1, 2 * hkv, 3, d, generator=torch.Generator().manual_seed(1))
        layer = 1
        mass = page_mass(cache, layer, query)
        keys = torch.cat([cache.page_kv(s.page_id, layer)[0] for s in cache.spans], dim=1).double()
        scale = lm.model.model.layers[layer].self_attn.scaling
        grouped = query[0].reshape(hkv, -1, d).double()
        weights = torch.softmax(grouped @ keys.transpose(1, 2) * scale, dim=-1).sum(dim=1)  # [Hkv, tokens]
        sizes = [s.end - s.start for s in cache.spans]
        direct = torch.stack([w.sum(-1) for w in weights.split(sizes, dim=-1)], dim=-1)
        assert mass.shape == (hkv, len(cache.spans))
        torch.testing.assert_close(mass, direct, rtol=1e-9, atol=1e-12)  # two float64 formulations of one sum
        assert torch.allclose(mass.sum(-1), torch.full((hkv,), 2.0 * 3, dtype=torch.float64))  # G * q queries


@pytest.mark.parametrize("retrieval, selection, position", [
    ("per_head", "question", "own"), ("union", "question", "own"), ("per_head", "hybrid", "own"),
    ("per_head", "question", "fixed")])
def test_the_question_ranks_once_and_every_forward_reads_its_choice(tiny_model, tmp_path, retrieval, selection,
                                                                   position, monkeypatch):
    lm = tiny_model("tiny-llama")
    config = TieredConfig(**SMALL, retrieval=retrieval, selection=selection, position=position)
    with tiered(lm, tmp_path, config) as tm:
        art = tm.ingest(_document(lm.codec, {}))
        cache = tm.cache
        search = cache.index.search

        def no_search(*args, **kwargs):
            raise AssertionError("the index searched while a question held its pages")

        monkeypatch.setattr(cache.index, "search", no_search)
        cache.retrieval_log.clear()
        tm.generate(lm.codec.encode(" Where is the ledger kept?"), max_new_tokens=3)
        layers = len(cache.layers)
        ranking = cache.question_ranking
        assert sorted(ranking) == list(range(layers))
        log = list(cache.retrieval_log)
        assert len(log) == 4 * layers  # the question's forward, its last token's, then two decode steps
        for layer in range(layers):
            rows = [row[:config.topk_pages] for row in ranking[layer]]
            found = sorted({p for row in rows for p in row})
            assert [log[step * layers + layer] for step in range(4)] == [found] * 4
        first = {layer: [list(r) for r in rows] for layer, rows in ranking.items()}

        monkeypatch.setattr(cache.index, "search", search)
        tm.graft(art)  # a new question over the document alone ranks afresh
        monkeypatch.setattr(tm.cache.index, "search", no_search)
        tm.generate(lm.codec.encode(" Who wrote the letter at the end?"), max_new_tokens=2)
        assert sorted(tm.cache.question_ranking) == list(range(layers))
        assert tm.cache.question_ranking != first


def test_other_selections_and_contexts_that_fit_never_rank(tiny_model, tmp_path):
    assert TieredConfig(selection="question").regime(32) == TieredConfig().regime(32)  # question-time only
    lm = tiny_model("tiny-llama")
    doc = _document(lm.codec, {100: " The zanzibar ledger is red. "}, tokens=300)  # fits 1 + 16 + 16 pages of 32
    q = lm.codec.encode(" What colour is the zanzibar ledger?")
    outs = []
    for selection in ("attention", "question"):
        with tiered(lm, tmp_path / selection, TieredConfig(chunk_pages=1, selection=selection)) as tm:
            tm.ingest(doc)
            outs.append(tm.generate(q, max_new_tokens=6))
            assert tm.cache.question_ranking is None and not tm.cache.retrieving
    assert outs[0] == outs[1]
    with tiered(lm, tmp_path / "switch", TieredConfig(**SMALL, selection="question")) as tm:
        art = tm.ingest(_document(lm.codec, {}))
        tm.generate(q, max_new_tokens=1)
        assert tm.cache.question_ranking
        tm.configure(TieredConfig(**SMALL))
        tm.graft(art)
        tm.cache.retrieval_log.clear()
        tm.generate(q, max_new_tokens=1)
        assert tm.cache.question_ranking is None and tm.cache.retrieval_log  # the index searched
