"""`TieredConfig(retrieval="per_head")`: each KV head attends to its own top-k, a working set of fixed size.

Checked against an independent computation: the plain model over every key of the context at its own
position, with a per-head mask that admits exactly the sink, the head's pages and the local window
(approximate: other key order and kernels, so a tolerance; the union's mask must miss it).
"""
from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, DynamicCache

from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.placement import FixedDistance, OwnPositions
from tieredkv.engine.rotary import rerotate
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import working_set_bytes
from tieredkv.engine.working_set import fixed_positions

SMALL = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)
PAGE = 32  # tiny models' default page size


class _Recording:
    """Keeps every per-head selection (layer, rows), in forward order."""

    def __init__(self):
        self.rows: list[tuple[int, list[list[int]]]] = []

    def retrieve_per_head(self, ctx, layer_idx, query):
        rows = super().retrieve_per_head(ctx, layer_idx, query)
        self.rows.append((layer_idx, rows))
        return rows


class RecordingOwn(_Recording, OwnPositions):
    pass


class RecordingFixed(_Recording, FixedDistance):
    pass


def _masked_attention(allowed_by_layer):
    """An eager attention whose mask admits, for KV head h of layer l, the keys `allowed_by_layer[l][h]`
    ([kv] bool) and causality over the chunk."""
    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_kw):
        # query [1, Hq, q, D]; key, value [1, Hkv, kv, D]
        groups = query.shape[1] // key.shape[1]
        q, kv = query.shape[2], key.shape[2]
        allowed = allowed_by_layer[module.layer_idx].repeat_interleave(groups, dim=0)  # [Hq, kv]
        causal = torch.arange(kv)[None, :] <= torch.arange(kv - q, kv)[:, None]  # [q, kv]
        mask = allowed[:, None, :] & causal[None]  # [Hq, q, kv]
        k = key.repeat_interleave(groups, dim=1)
        v = value.repeat_interleave(groups, dim=1)
        scores = (query @ k.transpose(-1, -2)) * scaling
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(query.dtype) @ v
        return out.transpose(1, 2).contiguous(), None
    return attend


def _reference_logits(lm, store, page_keys, question, allowed_by_layer):
    cache = DynamicCache(config=lm.model.config)
    pages = [store.get(key) for key in page_keys]
    for layer in range(len(allowed_by_layer)):
        k = torch.cat([p.layer_kv(layer)[0] for p in pages], dim=1)[None]  # [1, Hkv, N, D]
        v = torch.cat([p.layer_kv(layer)[1] for p in pages], dim=1)[None]
        cache.update(k, v, layer)
    n = cache.get_seq_length()
    AttentionInterface.register("test_per_head_reference", _masked_attention(allowed_by_layer))
    before = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("test_per_head_reference")
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([question]), past_key_values=cache, use_cache=True,
                           position_ids=torch.arange(n, n + len(question))[None], logits_to_keep=0)
    finally:
        lm.model.set_attn_implementation(before)
    return out.logits[0]


def _allowed(rows_of_layer, num_pages, shared, question_len, per_head: bool):
    """[Hkv, kv] bool per layer: shared pages, the head's pages (or the union of every head's), the chunk."""
    out = {}
    for layer, rows in rows_of_layer.items():
        union = {p for row in rows for p in row}
        masks = []
        for row in rows:
            pages = shared | (set(row) if per_head else union)
            page_ok = torch.tensor([p in pages for p in range(num_pages)]).repeat_interleave(PAGE)
            masks.append(torch.cat([page_ok, torch.ones(question_len, dtype=torch.bool)]))
        out[layer] = torch.stack(masks)
    return out


def test_per_head_attends_to_each_heads_own_pages(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    question = _ids(5, 2)
    with tiered(lm, tmp_path, TieredConfig(**SMALL, retrieval="per_head")) as tm:
        art = tm.ingest(_ids(640, 1))  # 20 pages of 32
        policy = RecordingOwn()
        tm.use_policy(policy)
        tm.graft(art)
        got = tm.prefill(question, logits_to_keep=0)
        rows = dict(policy.rows)  # one forward: one entry per layer
        assert sorted(rows) == list(range(len(tm.cache.layers)))
        assert any(len({tuple(r) for r in rs}) > 1 for rs in rows.values()), "heads never disagreed: a weak test"
        for layer in tm.cache.layers:  # sink + 2 per head + local: the same at any context length
            assert layer.buffer.num_slot_tokens == (1 + 2 + 2) * PAGE
        shared = {0, 18, 19}
        want = _reference_logits(lm, tm.store, art.page_keys, question, _allowed(rows, 20, shared, 5, True))
        union = _reference_logits(lm, tm.store, art.page_keys, question, _allowed(rows, 20, shared, 5, False))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (got - want).abs().max()
    assert not torch.allclose(got, union, atol=1e-5, rtol=1e-4)  # the union would be another computation


def test_per_head_fixed_packs_each_heads_pages_before_the_local_window(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, TieredConfig(**SMALL, position="fixed", retrieval="per_head")) as tm:
        art = tm.ingest(_ids(640, 1))
        policy = RecordingFixed()
        tm.use_policy(policy)
        tm.graft(art)
        tm.prefill(_ids(5, 2))
        pages = [tm.store.get(key) for key in art.page_keys]
        for layer, rows in policy.rows:
            buf = tm.cache.layers[layer].buffer
            at = buf.lo
            for slot in buf.slots:  # sink, the block, local pages
                if slot.source > 0:
                    break
                at += slot.num_tokens
            assert slot.num_tokens == 2 * PAGE
            for h, row in enumerate(rows):
                shifts = fixed_positions(tm.cache.spans, [0, *row], tm.cache.spans[18].start)
                assert [shifts[p] + p * PAGE for p in row] == [(18 - 2 + j) * PAGE for j in range(2)]
                keys = torch.cat([pages[p].layer_kv(layer)[0][h] for p in row])
                moved = rerotate(lm.model, keys, [shifts[p] for p in row], layer, sizes=[PAGE, PAGE])
                assert torch.equal(buf.k[0, h, at:at + 2 * PAGE], moved)
                values = torch.cat([pages[p].layer_kv(layer)[1][h] for p in row])
                assert torch.equal(buf.v[0, h, at:at + 2 * PAGE], values)


@pytest.mark.parametrize("position", ["own", "fixed"])
def test_per_head_is_the_union_while_the_context_fits(position, tiny_model, tmp_path):
    """Nothing is retrieved while every page fits: both modes are the model's own attention, bit for bit."""
    lm = tiny_model("tiny-llama")
    ids = _ids(150, 3)  # 5 pages <= 1 + 2 + 2
    out = {}
    for mode in ("union", "per_head"):
        with tiered(lm, tmp_path / mode, TieredConfig(**SMALL, position=position, retrieval=mode)) as tm:
            out[mode] = tm.prefill(ids, logits_to_keep=0)
    assert torch.equal(out["union"], out["per_head"])


def test_per_head_decode_steps_and_their_working_set(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    sizes = {}
    for mode in ("union", "per_head"):
        with tiered(lm, tmp_path / mode, TieredConfig(**SMALL, retrieval=mode)) as tm:
            tm.prefill(_ids(640, 1))
            for t in range(6):
                tm(torch.tensor([[t + 3]]), logits_to_keep=1)
            sizes[mode] = max(layer.buffer.num_slot_tokens - layer.buffer.num_hole_tokens for layer in tm.cache.layers)
    assert sizes["per_head"] == 5 * PAGE < sizes["union"]


def test_per_head_is_its_own_regime_and_union_keeps_the_old_one():
    union, per_head = TieredConfig(), TieredConfig(retrieval="per_head")
    assert "retrieval" not in union.regime(128)  # stores ingested before the field existed stay valid
    assert per_head.regime(128)["retrieval"] == "per_head"
    assert union.regime_fingerprint("m", 128) != per_head.regime_fingerprint("m", 128)
    with pytest.raises(ValueError, match="retrieval must be one of"):
        TieredConfig(retrieval="heads")


@pytest.mark.parametrize("position", ["own", "fixed"])
def test_a_lexical_reading_answers_the_same_over_either_ingest(position, tiny_model, tmp_path):
    """What `tieredkv qa` does inside the window (own) and beyond it (fixed): the question reads its passage
    afresh and attends to nothing stored, so a per-head ingest (other page bytes) gives the very same logits."""
    from tieredkv.engine.tiered_config import ReadingConfig
    from tieredkv.question.qa import qa_config
    from tieredkv.question.reading import read

    lm = tiny_model("tiny-llama")
    doc = _ids(700, 4)
    needle = lm.codec.encode(" zebra quokka ")
    doc[400:400 + len(needle)] = needle
    question = lm.codec.encode("quokka?")
    reading = ReadingConfig(passages=1, passage_tokens=48, signal="lexical", frame_tokens=6)
    got, stored = {}, {}
    for mode in ("union", "per_head"):
        cfg = TieredConfig(**SMALL, position=position, reading=reading, retrieval=mode)
        with tiered(lm, tmp_path / mode, cfg) as tm:
            art = tm.ingest(doc)
            stored[mode] = tm.store.get(art.page_keys[-1]).payload_blake3
            tm.keep_in_memory()
            read(tm.cache, question, "where is the quokka", reading, lm.codec)
            got[mode] = tm.prefill(question, logits_to_keep=0)
    assert stored["union"] != stored["per_head"]  # other pages were stored ...
    assert torch.equal(got["union"], got["per_head"])  # ... and the answer did not read them
    beyond = qa_config(lm, 10_000)
    assert beyond.position == "fixed" and beyond.retrieval == "per_head"
    inside = qa_config(lm, 4_000)  # inside the window: own positions, a reading, and the same working set
    assert inside.position == "own" and inside.reading is not None
    short = qa_config(lm, 1_000)  # a short context is attended whole: it fits that working set
    assert short.reading is None and short.capacity_pages * 128 >= 1_000
    for config in (inside, short):
        assert (config.retrieval, config.topk_pages, config.local_pages) == \
            (beyond.retrieval, beyond.topk_pages, beyond.local_pages)
        assert working_set_bytes(lm, config) == working_set_bytes(lm, beyond)
    own = qa_config(lm, 4_000, position="own")  # own positions asked for: no reading, the stored pages attended
    assert own.reading is None and own.retrieval == "union"
    assert qa_config(lm, 10_000, reading=ReadingConfig(signal="attention")).retrieval == "union"


@pytest.mark.parametrize("position", ["own", "fixed"])
def test_per_head_decode_steps_update_the_block_in_place(position, tiny_model, tmp_path):
    """Decode steps keep each head's still-wanted pages in their columns and write only what joined (or,
    under fixed, re-rotate the keys of a page whose packed position moved): every column still holds
    exactly its page's bytes, and the block holds exactly each head's current pages."""
    lm = tiny_model("tiny-llama")
    policy = RecordingOwn() if position == "own" else RecordingFixed()
    with tiered(lm, tmp_path, TieredConfig(**SMALL, position=position, retrieval="per_head")) as tm:
        tm.use_policy(policy)
        tm.prefill(_ids(640, 1))
        tm.cache.flush(partial=False)
        pages = {i: tm.store.get(key) for i, key in enumerate(tm.cache.page_keys)}
        copied, changed = 0, 0
        for step in range(8):
            before = sum(layer.buffer.num_copied_tokens for layer in tm.cache.layers)
            policy.rows.clear()
            tm(torch.tensor([[step + 3]]), logits_to_keep=1)
            copied += sum(layer.buffer.num_copied_tokens for layer in tm.cache.layers) - before
            for layer, rows in policy.rows:
                key, heads = tm.cache.blocks[layer]
                buf = tm.cache.layers[layer].buffer
                at = buf.slot_start(key)
                assert [sorted(r) for r in heads.pages] == rows  # each head's current pages, some column order
                changed += step > 0 and heads.pages != tuple(map(tuple, rows))
                for h, (row, moved) in enumerate(zip(heads.pages, heads.shifts)):
                    for j, (p, d) in enumerate(zip(row, moved)):
                        k, v = pages[p].layer_kv(layer)
                        want = rerotate(lm.model, k[h], [d], layer, sizes=[PAGE]) if d else k[h]
                        assert torch.equal(buf.k[0, h, at + j * PAGE:at + (j + 1) * PAGE], want)
                        assert torch.equal(buf.v[0, h, at + j * PAGE:at + (j + 1) * PAGE], v[h])
    assert changed, "no step kept pages out of position order: the in-place path was not exercised"
    whole = 8 * len(tm.cache.layers) * 2 * PAGE  # each step rewriting every block whole
    assert copied < whole


class _PartialToHeadZero(OwnPositions):
    """Head 0's top pages swap its first page for the partial page 20 (as a head may choose it)."""

    def retrieve_per_head(self, ctx, layer_idx, query):
        rows = super().retrieve_per_head(ctx, layer_idx, query)
        if 20 not in rows[0] and all(20 not in r for r in rows[1:]):
            rows[0] = sorted([20, *rows[0][1:]])
        return rows


def test_per_head_falls_back_to_the_union_when_heads_would_read_unequal_keys(tiny_model, tmp_path):
    """A context continued after a partial last page holds a partial page among the far ones: a forward
    where heads chose pages of unequal total length attends to the union instead (one buffer cannot
    hold rows of unequal length)."""
    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path, TieredConfig(**SMALL, retrieval="per_head")) as tm:
        art = tm.ingest(_ids(650, 1))  # 20 whole pages and a partial one of 10 tokens
        tm.graft(art)
        tm.prefill(_ids(200, 2))  # the partial page 20 leaves the local window
        assert tm.cache.spans[20].end - tm.cache.spans[20].start == 10 and tm.cache.local_first > 20
        tm.use_policy(_PartialToHeadZero())
        tm.cache.blocks.clear()
        logits = tm(torch.tensor([[9]]), logits_to_keep=1).logits
        for layer in range(len(tm.cache.layers)):  # the union: page 20 for every head, no per-head block
            assert 20 in tm.cache.last_selection(layer) and layer not in tm.cache.blocks
            assert not any(slot.source > 0 for slot in tm.cache.layers[layer].buffer.slots)
    assert torch.isfinite(logits).all()
