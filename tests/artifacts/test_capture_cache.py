"""CaptureCache: a capacity hint allocates each layer's K/V once and changes no byte."""
from __future__ import annotations

import torch

from tieredkv.artifacts.artifact import deposit_forward
from tieredkv.artifacts.capture import CaptureCache, GrowingLayer
from tieredkv.question.corpus import python_reference


def _forward(lm, ids, capacity: int):
    cache = CaptureCache(lm.model.config, capacity=capacity)
    chunks, buffers = [], set()

    def on_chunk(_s, _e, _out):
        chunks.append(cache.take())
        buffers.add(cache.layers[0]._buf_k.data_ptr())

    with torch.inference_mode():
        deposit_forward(lm, ids, cache, page_size=lm.default_page_size, on_chunk=on_chunk)
    return cache, chunks, buffers


def test_capacity_allocates_once_and_keeps_every_byte(tiny_model):
    lm = tiny_model("tiny-llama")
    page = lm.default_page_size
    ids = lm.codec.encode(python_reference()[:40 * page])[:6 * page + 7]  # 7 chunks, the last partial
    grown, grown_chunks, grown_buffers = _forward(lm, ids, capacity=0)
    sized, sized_chunks, sized_buffers = _forward(lm, ids, capacity=len(ids))

    assert all(isinstance(layer, GrowingLayer) for layer in sized.layers)
    assert len(sized_buffers) == 1  # allocated once, at the first chunk
    assert len(grown_buffers) > 1  # without the hint the buffers double as the context grows
    assert sized.layers[0]._buf_k.shape[-2] == len(ids)
    for (k0, v0), (k1, v1) in zip(grown_chunks, sized_chunks, strict=True):  # what each page is sealed from
        assert all(torch.equal(a, b) for a, b in zip(k0 + v0, k1 + v1, strict=True))
    for a, b in zip(grown.layers, sized.layers, strict=True):  # what attention read
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_context_longer_than_the_capacity_still_grows(tiny_model):
    lm = tiny_model("tiny-llama")
    page = lm.default_page_size
    ids = lm.codec.encode(python_reference()[:40 * page])[:4 * page]
    cache, _, buffers = _forward(lm, ids, capacity=page)
    assert len(buffers) > 1 and cache.layers[0].keys.shape[-2] == len(ids)
