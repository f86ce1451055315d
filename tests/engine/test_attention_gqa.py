"""Grouped K/V heads without `repeat_kv`: a masked prefill chunk on CPU runs SDPA with `enable_gqa` over the
working set (tieredkv/engine/attention.py), and must give the bytes transformers' `repeat_kv` path gives."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import repeat_kv

import tieredkv.engine.attention as attention
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel

SHAPES = [  # (query heads, K/V heads, queries, keys, head dim)
    (9, 3, 128, 3000, 64),  # smollm2
    (4, 2, 64, 300, 16),  # tiny-llama
    (8, 2, 129, 1000, 64),
    (4, 1, 2, 70, 128),
]


# NOTE: run in a child process. Changing torch's thread count around attention run at one thread made
# the next forward of this process compute the rotary's cos differently in 6 of 20 processes (torch 2.13
# CPU; lab/2026-12-02-thread_switch_hazard/, docs/DESIGN.md), which the exactness tests after this one would see.
_CHILD = """
import sys, torch
from transformers.integrations.sdpa_attention import repeat_kv
import tieredkv.engine.attention as attention

SHAPES = %r
dtype, threads = getattr(torch, sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(0)
for hq, hkv, q, n, d in SHAPES:
    query = torch.randn(1, hq, q, d, generator=gen).to(dtype)
    key, value = (torch.randn(1, hkv, n, d, generator=gen).to(dtype) for _ in range(2))
    keep = torch.rand(1, 1, q, n, generator=gen) > 0.3
    keep[..., 0] = True  # every query sees a key
    for mask in (keep, torch.zeros(1, 1, q, n, dtype=dtype).masked_fill(~keep, float("-inf"))):
        want = torch.nn.functional.scaled_dot_product_attention(
            query, repeat_kv(key, hq // hkv), repeat_kv(value, hq // hkv), attn_mask=mask, scale=d ** -0.5)
        got, _ = attention._sdpa_grouped(query, key, value, mask, scaling=d ** -0.5)
        if not torch.equal(got, want.transpose(1, 2).contiguous()):
            sys.exit(f"differs: {(hq, hkv, q, n, d)} mask {mask.dtype}")
print("equal")
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_enable_gqa_gives_the_bytes_of_repeat_kv(dtype, threads):
    done = subprocess.run([sys.executable, "-c", _CHILD % (SHAPES,), dtype, str(threads)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "equal", done.stderr[-2000:]


def test_tiered_prefill_takes_the_grouped_path_and_equals_plain_hf(smollm2, tmp_path, monkeypatch):
    calls = []
    real = attention._sdpa_grouped
    monkeypatch.setattr(attention, "_sdpa_grouped", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    ids = smollm2.codec.encode("Grouped heads read one copy of the working set. " * 40)[:384]
    with PageStore(tmp_path, StoreConfig()) as store:
        tm = TieredModel(smollm2, store, TieredConfig(chunk_pages=1))
        try:
            got = torch.cat([tm(torch.tensor([ids[s:s + 128]]), logits_to_keep=0).logits[0]
                             for s in range(0, len(ids), 128)])
        finally:
            tm.close()
    cache = DynamicCache(config=smollm2.model.config)
    want = []
    prefill(smollm2, ids, cache, page_size=128, logits_to_keep=0, on_chunk=lambda s, e, out: want.append(out.logits[0]))
    # every layer of the second and third chunk; the first needs no mask (plain causal) and stays with transformers
    assert len(calls) == 2 * smollm2.model.config.num_hidden_layers
    assert torch.equal(got, torch.cat(want))


def test_decode_steps_and_cuda_keep_transformers_path():
    module = type("M", (), {"num_key_value_groups": 3})()
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    assert not attention._grouped_on_cpu(module, torch.zeros(1, 9, 1, 8), mask, {})  # decode: pack_gqa there
    assert attention._grouped_on_cpu(module, torch.zeros(1, 9, 2, 8), mask, {})
    assert not attention._grouped_on_cpu(module, torch.zeros(1, 9, 2, 8), mask, {"softcap": 50.0})
    assert not attention._grouped_on_cpu(module, torch.zeros(1, 9, 2, 8), None, {})
    assert not attention._grouped_on_cpu(type("M", (), {"num_key_value_groups": 1})(), torch.zeros(1, 9, 2, 8),
                                         mask, {})


def test_deposit_takes_the_grouped_path_and_stores_plain_hf_bytes(smollm2, tmp_path, monkeypatch):
    """deposit() prefills under `grouped_prefill` and skips the LM head; its pages hold exactly the K/V
    of transformers' own sdpa prefill with the same chunks, and the model is left on its own attention."""
    from tieredkv.artifacts.artifact import deposit, restore_artifact

    calls = []
    real = attention._sdpa_grouped
    monkeypatch.setattr(attention, "_sdpa_grouped", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = smollm2.codec.encode("Deposits read one copy of the prefix per layer. " * 40)[:300]
    with PageStore(tmp_path, StoreConfig()) as store:
        art = deposit(smollm2, ids, store)
        kv = restore_artifact(store, art).kv  # [L, 2, Hkv, N, D]
    assert smollm2.model.config._attn_implementation == "sdpa"
    assert len(calls) == 2 * smollm2.model.config.num_hidden_layers  # chunks 2 and 3 (300 tokens)
    cache = DynamicCache(config=smollm2.model.config)
    prefill(smollm2, ids, cache, page_size=128)
    for layer in range(kv.shape[0]):
        assert torch.equal(kv[layer, 0], cache.layers[layer].keys[0])
        assert torch.equal(kv[layer, 1], cache.layers[layer].values[0])


def test_the_tiered_mask_is_sdpa_s_additive_form_and_gives_the_same_bytes():
    """The mask function registered for `tiered` turns transformers' bool sdpa mask into 0 / -inf once
    per forward; SDPA given either (a fully masked query row too) returns the same bytes."""
    attention.register()
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    kw = dict(batch_size=1, q_length=6, kv_length=20, q_offset=14, mask_function=causal_mask_function,
              allow_is_causal_skip=False)
    bool_mask = sdpa_mask(**kw)
    additive = attention._additive_sdpa_mask(**kw, dtype=torch.float32)
    assert bool_mask.dtype == torch.bool and additive.dtype == torch.float32
    assert torch.equal(additive == 0, bool_mask) and bool(torch.isneginf(additive[~bool_mask]).all())
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, 6, 16, generator=gen)
    key, value = (torch.randn(1, 2, 20, 16, generator=gen) for _ in range(2))
    keep = bool_mask.clone()
    keep[..., 3, :] = False  # a query that sees no key
    want = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 2), repeat_kv(value, 2),
                                                            attn_mask=keep, scale=0.25)
    for mask in (keep, attention._additive(keep, torch.float32)):
        got, _ = attention._sdpa_grouped(query, key, value, mask, scaling=0.25)
        assert torch.equal(got, want.transpose(1, 2).contiguous())
