"""`TieredModel.generate` as HF users call it: the inputs a tokenizer returns, HF's output object, and a
TieredCache handed to a plain `model.generate` refused with a typed error."""
from __future__ import annotations

import pytest
import torch

from paging import PageStore, StoreConfig
from tieredkv.engine.generation import GenerationOptionError
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.errors import CacheNotActiveError

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_inputs_as_a_tokenizer_returns_them(smollm2, tmp_path):
    """ids, a [1, n] tensor, a BatchEncoding from apply_chat_template and chat messages give one answer."""
    tok = smollm2.codec.tokenizer
    enc = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)  # a BatchEncoding
    ids = list(enc["input_ids"])
    answers = []
    with PageStore(tmp_path / "s", StoreConfig()) as store, TieredModel(smollm2, store, TieredConfig()) as tm:
        for inputs in (ids, torch.tensor([ids]), enc, {"input_ids": torch.tensor([ids])}, MESSAGES):
            tm.reset()
            answers.append(tm.generate(inputs, max_new_tokens=4))
        tm.reset()
        out = tm.generate(enc, max_new_tokens=4, return_dict_in_generate=True, output_scores=True)
        with pytest.raises(GenerationOptionError, match="batch of 2 prompts"):
            tm.generate(torch.tensor([ids, ids]), max_new_tokens=2)
    assert all(a == answers[0] for a in answers) and len(answers[0]) == 4
    assert out.sequences[0].tolist() == ids + answers[0] and len(out.scores) == 4  # prompt + new, as HF returns
    assert smollm2.codec.decode(answers[0]).startswith("The capital")


def test_a_plain_model_generate_over_the_tiered_cache_is_refused(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as store, TieredModel(lm, store, TieredConfig()) as tm:
        tm.prefill(list(range(5, 45)))
        with pytest.raises(CacheNotActiveError, match=r"tm\.generate"):
            lm.model.generate(torch.tensor([[7, 8]]), past_key_values=tm.cache, max_new_tokens=2)
        assert tm.num_tokens == 40 and not tm.cache.torn  # nothing was appended
        assert len(tm.generate([7, 8], max_new_tokens=2)) == 2
