"""TieredConfig.reuse_steps: approximate and opt-in; off, the selection is searched at every step."""
import torch

import tieredkv.engine.tiered_cache as tiered_cache
from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.question.qa import find_artifact


def _answer(lm, path, cfg, ids):
    with PageStore(path, StoreConfig()) as store:
        tm = TieredModel(lm, store, cfg)
        try:
            tm.graft(tm.ingest(ids))
            return tm.generate(ids[:5], max_new_tokens=12), dict(tm.cache.fetch_counts), tm.cache
        finally:
            tm.close()


def test_reuse_is_bounded_by_steps_and_sealing(tiny_model, tmp_path, monkeypatch):
    lm = tiny_model("tiny-llama")
    ids = torch.randint(0, 250, (700,), generator=torch.Generator().manual_seed(3)).tolist()
    base = dict(page_size=32, local_pages=4, topk_pages=2)
    exact, counts, _ = _answer(lm, tmp_path / "a", TieredConfig(**base), ids)
    assert "reused_plans" not in counts
    monkeypatch.setattr(tiered_cache, "REUSE_MIN_COSINE", -1.0)  # every query counts as stable
    approx, counts, cache = _answer(lm, tmp_path / "b", TieredConfig(**base, reuse_steps=3), ids)
    full = sum(not layer.is_sliding for layer in cache.layers)
    # 11 decode steps: each layer searches at most every 4th step (3 reuses per search)
    assert 0 < counts["reused_plans"] <= full * 11 * 3 // 4 + full
    assert len(approx) == len(exact)


def test_reuse_steps_is_part_of_the_regime_only_when_on():
    assert "reuse_steps" not in TieredConfig().regime(128)
    assert TieredConfig(reuse_steps=4).regime(128)["reuse_steps"] == 4
    assert TieredConfig().regime_fingerprint("ab" * 32, 128) != TieredConfig(reuse_steps=4).regime_fingerprint(
        "ab" * 32, 128)


def _decode_logits(tm, first: int, steps: int) -> torch.Tensor:
    out, tok = [], first
    for _ in range(steps):
        logits = tm.forward(torch.tensor([[tok]]), logits_to_keep=1).logits[0, -1]
        out.append(logits)
        tok = int(logits.argmax())
    return torch.stack(out)


def test_a_context_ingested_with_exact_selection_decodes_under_reuse_as_a_fresh_ingest_would(
        tiny_model, tmp_path, monkeypatch):
    lm = tiny_model("tiny-llama")
    ids = torch.randint(0, 250, (700,), generator=torch.Generator().manual_seed(4)).tolist()
    base = dict(page_size=32, local_pages=4, topk_pages=2)
    monkeypatch.setattr(tiered_cache, "REUSE_MIN_COSINE", -1.0)
    reuse = TieredConfig(**base, reuse_steps=3)
    with PageStore(tmp_path / "a", StoreConfig()) as store:
        tm = TieredModel(lm, store, TieredConfig(**base))
        exact_art = tm.ingest(ids, name="exact")
        tm.close()
        runs = []
        for start in ("graft", "ingest"):
            tm = TieredModel(lm, store, reuse)
            try:
                reuse_art = tm.graft(exact_art) if start == "graft" else tm.ingest(ids, name="with reuse")
                runs.append(_decode_logits(tm, 7, 10))
                assert tm.cache.fetch_counts["reused_plans"] > 0
            finally:
                tm.close()
        # reuse changes decode steps only, never a prefill chunk: the stored pages are the same bytes
        assert torch.equal(runs[0], runs[1])
        # so `tieredkv qa` (which finds a document by its tokens) serves the exact context under reuse, but never
        # serves the one recorded with reuse to a config without it
        for cfg, found in ((reuse, (exact_art, reuse_art)), (TieredConfig(**base), (exact_art,))):
            tm = TieredModel(lm, store, cfg)
            try:
                assert find_artifact(store, ids, tm.domain(), lm.fingerprint) in found
            finally:
                tm.close()
        assert reuse_art.domain["regime"]["reuse_steps"] == 3
