"""TieredConfig.union_pages: a cap on the union of the KV heads' top-k, filled by rank."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.placement import FixedDistance, OwnPositions
from tieredkv.engine.tiered_config import TieredConfig

SMALL = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)  # tiny-llama: 2 KV heads, up to 4 pages


class _Ranked:
    """Keeps every (ranked rows, union) that retrieval produced."""

    def __init__(self):
        self.seen: list[tuple[list[list[int]], list[int]]] = []

    def ranked_per_head(self, ctx, layer_idx, query):
        rows = super().ranked_per_head(ctx, layer_idx, query)
        self.seen.append((rows, None))
        return rows

    def retrieve(self, ctx, layer_idx, query):
        found = super().retrieve(ctx, layer_idx, query)
        self.seen[-1] = (self.seen[-1][0], found)
        return found


class RankedOwn(_Ranked, OwnPositions):
    pass


class RankedFixed(_Ranked, FixedDistance):
    pass


def _run(lm, path, cfg, policy, doc, question):
    with tiered(lm, path, cfg) as tm:
        tm.use_policy(policy)
        tm.ingest(doc)
        logits = tm(torch.tensor([question]), logits_to_keep=0).logits
        bound = cfg.working_set_pages(lm.model.config.num_key_value_heads)
        sizes = [len(tm.cache.last_selection(i)) for i in range(len(tm.cache.layers))]
        return logits, bound, sizes


@pytest.mark.parametrize("policy_cls,position", [(RankedOwn, "own"), (RankedFixed, "fixed")])
def test_the_cap_holds_every_union_to_its_size_and_keeps_each_heads_best_page(tiny_model, tmp_path, policy_cls,
                                                                                position):
    lm = tiny_model("tiny-llama")
    doc, question = _ids(640, 1), _ids(40, 2)
    free = policy_cls()
    _run(lm, tmp_path / "free", TieredConfig(**SMALL, position=position), free, doc, question)
    assert max(len(u) for _, u in free.seen) > 2, "the heads never disagreed: the cap would not bite"
    capped = policy_cls()
    cfg = TieredConfig(**SMALL, position=position, union_pages=2)
    _, bound, sizes = _run(lm, tmp_path / "capped", cfg, capped, doc, question)
    assert capped.seen and bound == 1 + 2 + 2 and max(sizes) <= bound
    for rows, union in capped.seen:
        assert len(union) == min(2, len({p for r in rows for p in r}))
        assert {r[0] for r in rows if r} <= set(union)  # every head's best page is read by every head


def test_a_cap_the_union_never_reaches_attends_to_the_same_keys(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc, question = _ids(640, 3), _ids(40, 4)
    free, _, _ = _run(lm, tmp_path / "free", TieredConfig(**SMALL), OwnPositions(), doc, question)
    roomy, _, _ = _run(lm, tmp_path / "roomy", TieredConfig(**SMALL, union_pages=4), OwnPositions(), doc, question)
    assert torch.equal(free, roomy)


def test_union_pages_is_validated_and_recorded_in_the_regime():
    assert TieredConfig(union_pages=None).regime(32) == TieredConfig().regime(32)  # stored contexts still found
    assert TieredConfig(union_pages=24).regime(32)["union_pages"] == 24
    assert (TieredConfig(union_pages=24).regime_fingerprint("f" * 64, 32)
            != TieredConfig().regime_fingerprint("f" * 64, 32))
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="union_pages"):
            TieredConfig(union_pages=bad)
    with pytest.raises(ValueError, match="union_pages caps retrieval='union'"):
        TieredConfig(union_pages=8, retrieval="per_head")
