"""The Python API at its edges: two TieredModels on one model, use after close, token ids that are not
ids, config fields of the wrong type, and a deposit that would reuse a page sealed at another size."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from paging import PageStore, StoreConfig
from paging.errors import LayoutMismatchError
from tieredkv.artifacts.artifact import deposit
from tieredkv.artifacts.check import check_store
from tieredkv.engine.generation import GenerationOptionError
from tieredkv.engine.tiered_config import ReadingConfig, TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.errors import ClosedError, EmptyInputError, TokenIdsError

CONFIG = TieredConfig(local_pages=2, topk_pages=2)  # tiny-llama's 32-token pages: 300 tokens retrieve


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _answer(tm: TieredModel, doc: list[int], question: list[int]) -> list[int]:
    tm.ingest(doc)
    return tm.generate(question, max_new_tokens=12)


def test_closing_one_of_two_tiered_models_leaves_the_other_tiered(tiny_model, tmp_path):
    """Closing a TieredModel used to switch the shared model back to plain attention under every other
    TieredModel on it: their next tokens and pages were computed over the whole context instead."""
    lm = tiny_model("tiny-llama")
    own = lm.model.config._attn_implementation
    doc, question = _ids(300, 1), _ids(7, 2)
    with PageStore(tmp_path / "ref", StoreConfig()) as store, TieredModel(lm, store, CONFIG) as tm:
        reference = _answer(tm, doc, question)
    assert lm.model.config._attn_implementation == own
    with PageStore(tmp_path / "two", StoreConfig()) as store:
        first = TieredModel(lm, store, CONFIG)
        TieredModel(lm, store, CONFIG).close()
        assert lm.model.config._attn_implementation != own  # first still wraps it
        assert _answer(first, doc, question) == reference
        first.close()
        assert lm.model.config._attn_implementation == own  # the last one out switches it back
        first.close()  # a second close does nothing


def test_use_after_close_is_one_typed_error(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as store:
        tm = TieredModel(lm, store, CONFIG)
        tm.close()
        for call in (lambda: tm.generate([5, 6]), lambda: tm.ingest([5, 6]), lambda: tm.graft("x"), tm.reset):
            with pytest.raises(ClosedError, match="is closed"):
                call()
    tm = TieredModel(lm, PageStore(tmp_path / "t", StoreConfig()), CONFIG)
    tm.prefill(_ids(40, 3))  # a sealed page is waiting to be written
    tm.store.close()
    with pytest.raises(ClosedError, match="closed before this TieredModel"):
        tm.close()
    assert lm.model.config._attn_implementation in ("sdpa", "eager")  # released all the same


def test_token_ids_that_are_not_ids_are_refused(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    vocab = lm.model.get_input_embeddings().num_embeddings
    with PageStore(tmp_path / "s", StoreConfig()) as store, TieredModel(lm, store, CONFIG) as tm:
        for bad, match in (([5.7, 6.2], "int token ids"), (["5", "6"], "int token ids"), (b"hello", "bytes"),
                           ("text", "encode text first"), ([True, 5], "bool"), ([5, vocab], f"token id {vocab}"),
                           ([-1, 5], "token id -1"), ([[5, 6]], "int token ids")):
            for call in (tm.ingest, tm.generate, tm.prefill):
                if call == tm.ingest and isinstance(bad, str) or call == tm.generate and bad == [[5, 6]]:
                    continue  # ingest encodes text itself; generate takes a batch of one prompt, as HF does
                with pytest.raises(TokenIdsError, match=match):
                    call(bad)
        with pytest.raises(EmptyInputError):
            tm.generate([])
        with pytest.raises(EmptyInputError):
            tm.ingest("  \n")
        art = tm.ingest(np.array(_ids(40, 4)))  # numpy and torch integers are ids
        assert art.num_tokens == 40
        assert len(tm.generate(torch.tensor([5, 6]), max_new_tokens=2)) == 2


def test_generate_refuses_what_it_sets_itself_and_a_blank_question(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as store, TieredModel(lm, store, CONFIG) as tm:
        tm.ingest(_ids(40, 5))
        for kw, match in (({"num_beams": 2}, "num_beams=1"), ({"attention_mask": None}, "attention_mask"),
                          ({"past_key_values": None}, "tiered context is the cache"),
                          ({"max_length": 9}, "max_new_tokens")):
            with pytest.raises(GenerationOptionError, match=match):
                tm.generate([5, 6], **kw)
        with pytest.raises(EmptyInputError, match="question"):
            tm.generate([5, 6], question="  ")


@pytest.mark.parametrize("field,value", [("page_size", 1.5), ("page_size", 10**30), ("page_size", True),
                                         ("chunk_pages", 1.5), ("sink_pages", "1"), ("local_pages", float("nan")),
                                         ("topk_pages", -1), ("num_repr", 0), ("write_batch", True),
                                         ("reuse_steps", 0.5), ("reading", "yes")])
def test_tiered_config_refuses_a_field_of_the_wrong_type(field, value):
    kw = {"position": "fixed"} if field == "reading" else {}
    with pytest.raises(ValueError, match=field):
        TieredConfig(**kw, **{field: value})


@pytest.mark.parametrize("kw", [{"passages": 1.5}, {"passage_tokens": float("nan")}, {"frame_tokens": -1},
                                {"passages": True}])
def test_reading_config_refuses_a_field_of_the_wrong_type(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        ReadingConfig(**kw)


def test_deposit_refuses_to_reuse_a_page_sealed_at_another_size(tiny_model, tmp_path):
    """A text that fits one page at both sizes has the same first page key (keys do not hash the page
    size): the second deposit used to write a manifest that no read accepts, and `check` reported it
    as not genuine from then on."""
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as store:
        first = deposit(lm, [5, 6, 7], store, page_size=64)
        with pytest.raises(LayoutMismatchError, match="page size 64"):
            deposit(lm, [5, 6, 7], store, page_size=32)
        assert store.list_manifests() == [first.artifact_id]
        assert check_store(store)["healthy"]
        assert deposit(lm, [5, 6, 7], store, page_size=64).artifact_id == first.artifact_id
