"""The placement-policy seam: which pages a layer attends to and where, chosen by public objects."""
from __future__ import annotations

import pytest
import torch

from testkit.placement import DenseLayers, ForcedPages
from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.placement import FixedDistance, OwnPositions, PlacementPolicy, grouped_queries
from tieredkv.engine.tiered_cache import FullAttentionLayer, SlidingWindowLayer
from tieredkv.engine.tiered_config import TieredConfig

SMALL = dict(sink_pages=1, local_pages=2, topk_pages=1, chunk_pages=1)


def test_auto_resolves_by_the_window_and_the_positions(tiny_model):
    llama, gpt2 = tiny_model("tiny-llama"), tiny_model("tiny-gpt2")  # windows 8,192 and 4,096
    auto = TieredConfig(position="auto")
    assert auto.resolve(llama.model, 8192).position == "own"
    fixed = auto.resolve(llama.model, 8193)
    assert fixed.position == "fixed" and fixed.topk_pages == 8  # the policy's default top-k
    assert TieredConfig(position="auto", topk_pages=3).resolve(llama.model, 10**6).topk_pages == 3
    assert auto.resolve(gpt2.model, 10**6).position == "own"  # learned positions cannot move
    assert TieredConfig(position="fixed").resolve(llama.model, 10) == TieredConfig(position="fixed")
    with pytest.raises(ValueError, match="re-encoding is for the fixed policy"):
        TieredConfig(position="auto", reencode_pages=4).resolve(llama.model, 100)


def test_tiered_model_refuses_an_unresolved_config(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="resolve"):
        with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig(position="auto")):
            pass


def test_layer_kinds_follow_the_model_layer_types(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-gemma3"), tmp_path, TieredConfig()) as tm:
        kinds = [type(layer) for layer in tm.cache.layers]
    assert kinds == [SlidingWindowLayer, SlidingWindowLayer, FullAttentionLayer]
    assert [layer.sliding_window for layer in tm.cache.layers] == [64, 64, None]


def test_default_policy_per_position(tiny_model, tmp_path):
    for position, cls in (("own", OwnPositions), ("fixed", FixedDistance)):
        with tiered(tiny_model("tiny-llama"), tmp_path / position, TieredConfig(position=position)) as tm:
            assert type(tm.policy) is cls and tm.cache.policy is tm.policy


def test_forced_pages_replace_retrieval_and_survive_a_graft(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig(**SMALL)) as tm:
        art = tm.ingest(_ids(640, 1))  # 20 pages of 32
        tm.use_policy(ForcedPages(tm.policy, [7, 11], replace=True))
        tm.graft(art)
        tm.prefill(_ids(5, 2))
        for layer in range(len(tm.cache.layers)):
            assert tm.cache.last_selection(layer) == [0, 7, 11, 18, 19]  # sink, forced, local
        assert set(map(tuple, tm.cache.retrieval_log)) == {(7, 11)}


def test_forced_pages_added_to_retrieval_keep_its_log(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig(**SMALL)) as tm:
        tm.ingest(_ids(640, 1))
        tm.use_policy(ForcedPages(OwnPositions(), [7]))
        tm.cache.retrieval_log.clear()
        tm.prefill(_ids(5, 2))  # one forward: one log entry per layer, what the index found
        assert len(tm.cache.retrieval_log) == len(tm.cache.layers)
        for layer, found in enumerate(tm.cache.retrieval_log):
            selection = tm.cache.last_selection(layer)
            assert 7 in selection and set(found) <= set(selection)
            assert len(selection) == len({0, 18, 19, 7, *found})


@pytest.mark.parametrize("retrieval", ["per_head", "union"])
def test_dense_layers_read_every_page_and_the_rest_select_as_their_base(tiny_model, tmp_path, retrieval):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig(**SMALL, retrieval=retrieval)) as tm:
        tm.ingest(_ids(640, 1))  # 20 pages of 32
        tm.use_policy(DenseLayers(OwnPositions(), 1))
        tm.cache.retrieval_log.clear()
        tm.prefill(_ids(5, 2))
        layers = len(tm.cache.layers)
        assert layers > 1 and tm.cache.last_selection(0) == list(range(20))
        assert tm.cache.retrieval_log[0] == list(range(1, 18))  # every far page
        for layer in range(1, layers):
            assert len(tm.cache.last_selection(layer)) <= 1 + 2 + tm.cache.layout.num_kv_heads * 1


class _Everything(PlacementPolicy):
    """A policy that attends to every page (own positions): logits equal to a context that fits."""

    def select(self, ctx, layer_idx, query):
        return list(range(len(ctx.spans)))


def test_a_policy_that_selects_everything_is_full_attention(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    ids, question = _ids(640, 1), _ids(9, 2)
    with tiered(lm, tmp_path / "a", TieredConfig(**SMALL)) as tm:
        tm.use_policy(_Everything())
        tm.prefill(ids)
        got = tm.prefill(question, logits_to_keep=0)
    big = TieredConfig(sink_pages=1, local_pages=32, topk_pages=1, chunk_pages=1)  # 640 + 9 tokens fit
    with tiered(lm, tmp_path / "b", big) as tm:
        tm.prefill(ids)
        want = tm.prefill(question, logits_to_keep=0)
    assert torch.equal(got, want)


def test_grouped_queries_follow_gqa():
    q = torch.arange(4 * 3 * 2, dtype=torch.float32).reshape(1, 4, 3, 2)  # Hq=4, q=3, D=2
    g = grouped_queries(q, 2)
    assert g.shape == (2, 6, 2)
    assert torch.equal(g[0], torch.cat([q[0, 0], q[0, 1]])) and torch.equal(g[1], torch.cat([q[0, 2], q[0, 3]]))
