"""A transformers model and tokenizer already in memory become a LoadedModel: fingerprinted from the weights
in memory (the same fingerprint as their directory's), usable by TieredModel as any loaded model."""
from __future__ import annotations

import pytest
import torch

from paging import PageStore, StoreConfig
from tests.models.test_local_directory import save_tiny_model
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.errors import UnsupportedModelError
from tieredkv.models.loading import LoadedModel, load_model
from tieredkv.models.text_codec import ByteTokenizer

CONFIG = TieredConfig(local_pages=2, topk_pages=2)  # 128-token pages: a 700-token document retrieves


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path / "tkv"))
    return save_tiny_model(tmp_path / "model")


def _from_pretrained(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_same_weights_same_fingerprint_as_their_directory(model_dir):
    model, tok = _from_pretrained(model_dir)
    lm = LoadedModel.from_hf(model, tok)
    assert lm.fingerprint == load_model(str(model_dir), quiet=True).fingerprint
    assert lm.name == str(model_dir) and lm.default_page_size == 128 and not model.training
    assert lm.codec.encode("w1 w2") == [4, 5]


def test_weights_changed_in_memory_get_their_own_fingerprint(model_dir):
    lm = load_model(str(model_dir), quiet=True)
    with torch.no_grad():
        lm.model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    changed = LoadedModel.from_hf(lm.model, lm.codec.tokenizer)
    assert changed.fingerprint != lm.fingerprint
    assert changed.fingerprint != load_model(str(model_dir), quiet=True).fingerprint


def test_a_tiered_model_runs_on_it_as_on_the_loaded_directory(model_dir, tmp_path):
    doc = torch.randint(3, 43, (700,), generator=torch.Generator().manual_seed(1)).tolist()
    answers, fingerprints = [], []
    for i, lm in enumerate([LoadedModel.from_hf(*_from_pretrained(model_dir)), load_model(str(model_dir))]):
        with PageStore(tmp_path / f"store{i}", StoreConfig()) as store, TieredModel(lm, store, CONFIG) as tm:
            tm.ingest(doc)
            answers.append(torch.as_tensor(tm.generate([7, 8, 9], max_new_tokens=8)))
            fingerprints.append(tm.lm.fingerprint)
    assert torch.equal(answers[0], answers[1]) and fingerprints[0] == fingerprints[1]


def test_a_text_codec_is_taken_as_the_tokenizer(tiny_model):
    model = tiny_model("tiny-gpt2").model
    assert LoadedModel.from_hf(model, ByteTokenizer()).fingerprint == tiny_model("tiny-gpt2").fingerprint


@pytest.mark.parametrize("model, tokenizer", [("gpt2", "tok"), (torch.nn.Linear(2, 2), "tok")])
def test_what_is_not_a_causal_lm_is_refused(model, tokenizer):
    with pytest.raises(UnsupportedModelError, match="takes a transformers causal LM"):
        LoadedModel.from_hf(model, tokenizer)


def test_what_is_not_a_tokenizer_is_refused(tiny_model):
    with pytest.raises(UnsupportedModelError, match="expected a transformers tokenizer"):
        LoadedModel.from_hf(tiny_model("tiny-llama").model, object())


def test_load_model_given_a_model_points_to_from_hf(tiny_model):
    with pytest.raises(TypeError, match=r"LoadedModel\.from_hf\(model, tokenizer\)"):
        load_model(tiny_model("tiny-llama").model)
