"""Question-time reading under own positions (inside the window), and the model judging candidate places."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_tiered_model import _ids, tiered
from tieredkv.engine.tiered_config import ReadingConfig, TieredConfig
from tieredkv.question.reading import likelihoods, span_ids

SMALL = dict(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)


def _document(lm, n: int = 700) -> list[int]:
    """Random ids with the question's words at two places, a denser cluster at 200, a lone word at 500."""
    doc = _ids(n, 7)
    for at, text in ((200, " quokka and quokka "), (500, " quokka ")):
        words = lm.codec.encode(text)
        doc[at:at + len(words)] = words
    return doc


def test_a_reading_applies_under_own_positions_even_when_the_context_fits_the_working_set(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    reading = ReadingConfig(passages=1, passage_tokens=48, frame_tokens=6)
    big = dict(sink_pages=1, local_pages=16, topk_pages=8, chunk_pages=1)  # 25 pages of 32 > 700 tokens
    with tiered(lm, tmp_path / "s", TieredConfig(**big, position="own", reading=reading)) as tm:
        tm.ingest(_document(lm))
        assert not tm.cache.retrieving
        tm.keep_in_memory()
        tm.generate(lm.codec.encode("quokka?"), max_new_tokens=2, question="where is the quokka")
        assert tm.last_reading is not None and tm.last_reading.passages
        (a, b), = tm.last_reading.passages
        assert b - a == 48 and a <= 200 < b  # centred on the denser cluster
        assert tm.last_reading.candidates == []  # candidates=1: nothing judged


def test_likelihoods_are_the_question_log_probability_after_each_range(tiny_model, tmp_path):
    """One full-sequence forward per range, sliced independently, gives the very same sums."""
    lm = tiny_model("tiny-llama")
    doc, prompt = _document(lm), lm.codec.encode(" where is the quokka?")
    with tiered(lm, tmp_path / "s", TieredConfig(**SMALL, position="own")) as tm:
        tm.ingest(doc)
        ranges = [(180, 228), (480, 528)]
        got = likelihoods(tm.cache, 6, ranges, prompt)
        assert span_ids(tm.cache, 180, 228) == doc[180:228]
    for (a, b), score in zip(ranges, got):
        ids = doc[:6] + doc[a:b] + prompt
        with torch.inference_mode():
            logp = torch.log_softmax(lm.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        n = len(prompt)
        want = sum(float(logp[len(ids) - n - 1 + i, t]) for i, t in enumerate(prompt))
        assert score == pytest.approx(want, rel=1e-5)  # float sums in another order: documented as approximate


def test_the_model_judges_candidates_and_reads_the_likeliest(tiny_model, tmp_path, monkeypatch):
    """With candidates > passages every candidate is scored and the best-scored one is read, whatever
    the lexical order; a tie keeps the signal's order."""
    import tieredkv.question.reading as reading_mod

    lm = tiny_model("tiny-llama")
    seen = []

    def fake(cache, frame, ranges, prompt_ids):
        seen.append(list(ranges))
        return [0.0] + [1.0] * (len(ranges) - 1)  # the lexical second place scores best

    monkeypatch.setattr(reading_mod, "likelihoods", fake)
    cfg = TieredConfig(**SMALL, position="own", reading=ReadingConfig(passage_tokens=48, frame_tokens=6, candidates=3))
    with tiered(lm, tmp_path / "s", cfg) as tm:
        tm.ingest(_document(lm))
        tm.keep_in_memory()
        tm.generate(lm.codec.encode("quokka?"), max_new_tokens=1, question="where is the quokka")
        r = tm.last_reading
    assert len(seen) == 1 and 2 <= len(seen[0]) <= 3
    assert r.passages == [seen[0][1]] and r.candidates[0] == seen[0][1]
    assert r.likelihoods == sorted(r.likelihoods, reverse=True)


def test_a_reading_refuses_zero_candidates():
    with pytest.raises(ValueError, match="candidates"):
        ReadingConfig(candidates=0)
