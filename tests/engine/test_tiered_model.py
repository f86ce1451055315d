"""TieredModel: exact where exactness should hold, bounded where it cannot, clear errors otherwise."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import prefill
from tieredkv.engine.tiered_cache import TieredCache
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel
from tieredkv.errors import DiskBudgetError, EmptyInputError, ModelMismatchError, UnsupportedModelError
from tieredkv.models.loading import TINY_MODELS

ROTARY = [m for m in TINY_MODELS if m != "tiny-gpt2"]


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@contextlib.contextmanager
def tiered(lm, path, config: TieredConfig, **store_kw):
    with PageStore(path, StoreConfig(**store_kw)) as store:
        tm = TieredModel(lm, store, config)
        try:
            yield tm
        finally:
            tm.close()


def _plain_logits(lm, ids: list[int], chunk: int, cache=None) -> torch.Tensor:
    out, cache = [], cache if cache is not None else DynamicCache(config=lm.model.config)
    prefill(lm, ids, cache, start=cache.get_seq_length(), page_size=chunk,
            on_chunk=lambda s, e, o: out.append(o.logits[0]), logits_to_keep=0)
    return torch.cat(out)


def _tiered_logits(tm: TieredModel, ids: list[int]) -> torch.Tensor:
    from tieredkv.engine.schedule import canonical_chunks

    chunk = tm.page_size * tm.config.chunk_pages
    start = tm.num_tokens
    return torch.cat([tm(torch.tensor([ids[s - start:e - start]]), logits_to_keep=0).logits[0]
                      for s, e in canonical_chunks(start, start + len(ids), chunk)])


@pytest.mark.parametrize("name", TINY_MODELS)
def test_fits_working_set_equals_plain_hf(name, tiny_model, tmp_path):
    lm = tiny_model(name)
    ids = _ids(300, 1)
    cfg = TieredConfig(chunk_pages=2, local_pages=8, topk_pages=4)  # 13 pages of 32 >= 300 tokens
    with tiered(lm, tmp_path, cfg) as tm:
        got = _tiered_logits(tm, ids)
        # decode steps (q = 1) too
        steps = [tm(torch.tensor([[t]]), logits_to_keep=0).logits[0] for t in (5, 6, 7)]
    cache = DynamicCache(config=lm.model.config)
    assert torch.equal(got, _plain_logits(lm, ids, 64, cache))
    ref_steps = [_plain_logits(lm, [t], 64, cache) for t in (5, 6, 7)]
    assert torch.equal(torch.cat(steps), torch.cat(ref_steps))


def test_smollm2_fits_working_set_equals_plain_hf(smollm2, tmp_path):
    ids = smollm2.codec.encode("The quick brown fox jumps over the lazy dog. " * 40)[:300]
    cfg = TieredConfig(chunk_pages=1)
    with tiered(smollm2, tmp_path, cfg) as tm:
        got = _tiered_logits(tm, ids)
    assert torch.equal(got, _plain_logits(smollm2, ids, 128))


def test_generate_unchanged_when_context_fits(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    doc, q = _ids(200, 2), _ids(9, 3)
    with tiered(lm, tmp_path, TieredConfig(chunk_pages=1)) as tm:
        tm.prefill(doc)
        got = tm.generate(q, max_new_tokens=6)
    cache = DynamicCache(config=lm.model.config)
    prefill(lm, doc, cache, page_size=32)
    prefill(lm, q[:-1], cache, start=200, page_size=32)
    ref = lm.model.generate(torch.tensor([doc + q]), past_key_values=cache, max_new_tokens=6, do_sample=False,
                            pad_token_id=257)[0, len(doc) + len(q):].tolist()
    assert got == ref


@pytest.mark.parametrize("name,position,retrieval", [(m, "own", "union") for m in TINY_MODELS]
                         + [(m, "fixed", "union") for m in ROTARY]
                         + [(m, p, "per_head") for m in ("tiny-llama", "tiny-gemma3") for p in ("own", "fixed")])
def test_graft_then_tiered_equals_fresh_tiered(name, position, retrieval, tiny_model, tmp_path):
    """With retrieval active (context far beyond the working set), a grafted context continues
    with logits torch.equal to the same TieredModel run fresh."""
    lm = tiny_model(name)
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position=position,
                       retrieval=retrieval)
    doc, question = _ids(700, 4), _ids(40, 5)
    with tiered(lm, tmp_path, cfg) as tm:
        art = tm.ingest(doc)
        fresh = _tiered_logits(tm, question)
        # retrieval really ran, in every model with a full-attention layer (tiny-mistral slides everywhere)
        has_full = any(not layer.is_sliding for layer in tm.cache.layers)
        assert has_full == (name != "tiny-mistral") and (len(tm.cache.retrieval_log) > 0) == has_full
        tm.graft(art.artifact_id)
        assert tm.num_tokens == len(doc)
        grafted = _tiered_logits(tm, question)
    assert torch.equal(fresh, grafted)


def test_graft_in_a_new_process_state(tiny_model, tmp_path):
    """Reopen the store (host tier cold, index loaded from disk) and graft: still equal."""
    lm = tiny_model("tiny-qwen2")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)
    doc, question = _ids(600, 6), _ids(33, 7)
    with tiered(lm, tmp_path, cfg) as tm:
        art = tm.ingest(doc)
        fresh = _tiered_logits(tm, question)
    with tiered(lm, tmp_path, cfg) as tm:
        tm.graft(art.artifact_id)
        assert torch.equal(_tiered_logits(tm, question), fresh)


def test_device_tier_stays_within_budget(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1)
    budget = 5 * 32 * 256 * 2  # 5 pages x 32 tokens x 256 B/token/layer x 2 layers: one working set
    with tiered(lm, tmp_path, cfg, device_budget_bytes=budget) as tm:
        seen = []
        for i in range(6):
            tm.prefill(_ids(256, 10 + i))
            seen.append(tm.store.stats()["device"]["bytes"])
        assert max(seen) <= budget
        assert seen[-1] == seen[-2]  # flat once full
        # the working set of every layer is bounded by working_set_pages (union of KV heads' top-k)
        bound = cfg.working_set_pages(lm.model.config.num_key_value_heads)
        assert bound == 1 + 2 + 2 * 2
        sizes = [len(tm.cache.last_selection(i)) for i in range(len(tm.cache.layers))]
        assert len(tm.cache.spans) > bound and max(sizes) <= bound and max(sizes) > cfg.capacity_pages - 1


def test_empty_document_and_question(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig()) as tm:
        with pytest.raises(EmptyInputError):
            tm.ingest("")
        with pytest.raises(EmptyInputError):
            tm.prefill([])


def test_document_larger_than_disk_budget_is_refused_before_work(tiny_model, tmp_path):
    from tieredkv.cli import main

    lm = tiny_model("tiny-llama")
    with tiered(lm, tmp_path / "s", TieredConfig()) as tm:
        with pytest.raises(DiskBudgetError, match="GiB"):
            tm.check_disk_budget(10_000_000, budget_bytes=1 << 20)
    doc = tmp_path / "doc.txt"
    doc.write_text("word " * 5000)
    rc = main(["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "q?", "--store",
               str(tmp_path / "s2"), "--disk-budget", str(1 << 20), "--quiet"])
    assert rc == 2
    with PageStore(tmp_path / "s2") as store:
        assert store.stats()["lmdb"]["pages"] == 0 and store.list_manifests() == []


def test_store_of_another_model_is_refused(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-llama"), tmp_path, TieredConfig()) as tm:
        tm.ingest(_ids(100, 1))
    with PageStore(tmp_path) as store, pytest.raises(ModelMismatchError) as err:
        TieredModel(tiny_model("tiny-qwen2"), store, TieredConfig())
    assert tiny_model("tiny-llama").fingerprint in str(err.value)
    assert tiny_model("tiny-qwen2").fingerprint in str(err.value)


def test_fixed_position_needs_rotary(tiny_model, tmp_path):
    with PageStore(tmp_path) as store, pytest.raises(UnsupportedModelError):
        TieredModel(tiny_model("tiny-gpt2"), store, TieredConfig(position="fixed"))


def test_gpt2_learned_positions_cap_is_a_clear_error(tiny_model, tmp_path):
    with tiered(tiny_model("tiny-gpt2"), tmp_path, TieredConfig()) as tm:
        with pytest.raises(UnsupportedModelError, match="learned positions"):
            tm.prefill(_ids(5000, 1))
        assert tm.num_tokens == 0  # refused before any work


def test_qa_cli_ingests_then_grafts(tmp_path, capsys):
    from tieredkv.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 150 + "The secret colour is teal. " + "Beta. " * 150)
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What colour?", "--store",
            str(tmp_path / "s"), "--local-pages", "2", "--topk-pages", "2", "--max-new-tokens", "4", "--json",
            "--quiet", "--read-passages", "0"]
    import json

    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["context"] == "ingested" and first["pages"] > 5
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["context"].startswith("grafted") and second["artifact"] == first["artifact"]
    assert second["answer"] == first["answer"]  # same context, same greedy answer
    # inside the model's window, no reading asked for: own positions, attention retrieves pages
    assert first["position"] == "own" and first["reading"] is None
    assert first["attended"] == "retrieved" and second["shown"] == first["shown"]
    assert first["shown"] and "text" in first["shown"][0] and first["shown"][0]["times_retrieved"] > 0
    # by default a document of this length is read inside the window too: the passage around the answer; the
    # answer reads no stored page, so the document is ingested with a per-head working set (other pages)
    assert main(args[:-2]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["position"] == "own" and read["attended"] == "read" and read["reading"]["passages"] == 1
    assert read["context"] == "ingested" and read["artifact"] != first["artifact"]
    assert "The secret colour is teal." in read["shown"][0]["text"]
    assert main(args[:-2]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["context"].startswith("grafted") and again["artifact"] == read["artifact"]
    assert again["answer"] == read["answer"]


def test_ingesting_a_document_that_extends_an_earlier_one(tiny_model, tmp_path):
    """Page keys are sound with the default one-page chunks: the shared prefix pages are the same
    bytes, so the second ingest re-writes them idempotently instead of raising PageConflictError."""
    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2)
    doc = _ids(500, 8)
    with tiered(lm, tmp_path, cfg) as tm:
        short = tm.ingest(doc[:300])
        longer = tm.ingest(doc)
    assert longer.page_keys[:9] == short.page_keys[:9]  # the 9 full pages of the short document


def test_device_budget_below_one_working_set_warns(tiny_model, tmp_path):
    import warnings

    from tieredkv.engine.tiered_model import working_set_bytes

    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(page_size=32, sink_pages=1, local_pages=2, topk_pages=2)
    need = working_set_bytes(lm, cfg)
    assert need == (1 + 2 + 2 * 2) * 32 * 256 * 2  # pages x tokens x bytes/token/layer x layers
    with pytest.warns(ResourceWarning, match="below one working set"):
        with tiered(lm, tmp_path / "a", cfg, device_budget_bytes=need - 1):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        with tiered(lm, tmp_path / "b", cfg, device_budget_bytes=need):
            pass


def test_fixed_policy_scores_pages_where_they_are_attended(tiny_model, tmp_path):
    """score_frame="attended": a page's summary is taken over its keys moved to page-relative
    positions, not over the keys at their own (far beyond the window) positions."""
    import numpy as np

    from tieredkv.engine.rotary import rerotate

    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position="fixed")
    with tiered(lm, tmp_path, cfg) as tm:
        tm.prefill(_ids(400, 8))
        tm.cache.flush()
        page_id, layer = 7, 1
        start = tm.cache.spans[page_id].start
        keys = tm.store.get(tm.cache.page_keys[page_id]).layer_kv(layer)[0]
        ids, upper, lower = tm.cache.index._layer_bounds(layer)
        row = int(np.flatnonzero(ids == page_id)[0])
        moved = rerotate(lm.model, keys, -start, layer).float()
        assert np.array_equal(upper[:, row], moved.amax(1).numpy().astype(np.float64))
        assert np.array_equal(lower[:, row], moved.amin(1).numpy().astype(np.float64))
        assert not np.array_equal(upper[:, row], keys.float().amax(1).numpy().astype(np.float64))


def _rotated_by_the_rotary_itself(model, keys, delta, layer_idx):
    """The reference rotation: the model's rotary called once over every token's distance."""
    from tieredkv.engine.rotary import _layer_type, rotary_module

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)

    rope, layer_type = rotary_module(model), _layer_type(model, layer_idx)
    kwargs = {"layer_type": layer_type} if layer_type else {}
    cos, sin = rope(keys, position_ids=delta[None], **kwargs)
    scale = getattr(rope, f"{layer_type}_attention_scaling", None) if layer_type else rope.attention_scaling
    return keys * (cos[0] / scale) + rotate_half(keys) * (sin[0] / scale)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "dynamic"])
def test_rerotate_gives_the_bytes_of_the_rotary_own_call(tiny_model, name):
    """rerotate computes each distinct distance once and keeps static rotaries' rows: the result must
    be the bytes of the rotary's own per-token call, on a first call, a repeat, and for a dynamic
    rotary (which is never kept)."""
    from tieredkv.engine.rotary import rerotate

    if name == "dynamic":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256,
                                             rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                              "rope_theta": 10000.0})).eval()
    else:
        model = tiny_model(name).model
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(2, 40, head_dim, generator=g)
    layer = len(model.model.layers) - 1
    for delta in (torch.tensor([-300] * 16 + [5] * 16 + [-7000] * 8),
                  torch.tensor([5] * 8 + [-300] * 16 + [900] * 16)):  # the second repeats two distances
        assert torch.equal(rerotate(model, keys, delta, layer),
                           _rotated_by_the_rotary_itself(model, keys, delta, layer))
        runs, sizes = torch.unique_consecutive(delta, return_counts=True)  # one distance per run of tokens
        assert torch.equal(rerotate(model, keys, runs, layer, sizes=sizes.tolist()),
                           _rotated_by_the_rotary_itself(model, keys, delta, layer))
        assert torch.equal(rerotate(model, keys.bfloat16(), delta, layer),
                           _rotated_by_the_rotary_itself(model, keys.bfloat16(), delta, layer))
    # runs of one length (whole pages) broadcast one row per run; distances given as ints
    delta = torch.tensor([-300] * 10 + [5] * 10 + [-300] * 10 + [77] * 10)
    assert torch.equal(rerotate(model, keys, [-300, 5, -300, 77], layer, sizes=[10] * 4),
                       _rotated_by_the_rotary_itself(model, keys, delta, layer))
    assert torch.equal(rerotate(model, keys, -300, layer),
                       _rotated_by_the_rotary_itself(model, keys, torch.full((40,), -300), layer))


def test_fixed_policy_moves_all_far_pages_in_one_rotation_with_the_same_bytes(tiny_model):
    from tieredkv.engine.rotary import rerotate

    lm = tiny_model("tiny-llama")
    cache = SimpleNamespace(model=lm.model)
    g = torch.Generator().manual_seed(2)
    parts = [torch.randn(2, n, 16, generator=g) for n in (32, 32, 7, 32)]
    shifts = [-640, 0, 96, -64]
    ks = list(parts)
    TieredCache._rerotate_parts(cache, ks, shifts, 1)
    for k, part, d in zip(ks, parts, shifts):
        assert torch.equal(k, rerotate(lm.model, part, d, 1) if d else part)
    assert ks[1] is parts[1]  # a page at its own position is not touched
    ks = [parts[0], parts[1], parts[3]]  # the moved pages all of one length: one row per page, broadcast
    TieredCache._rerotate_parts(cache, ks, [-640, 32, -64], 1)
    for k, part, d in zip(ks, [parts[0], parts[1], parts[3]], [-640, 32, -64]):
        assert torch.equal(k, rerotate(lm.model, part, d, 1))


def test_score_frame_is_part_of_the_fixed_regime_only():
    from tieredkv.artifacts.record import chain_fingerprint

    assert "score_frame" not in TieredConfig().regime(32)  # own positions: no effect, not recorded
    attended, own = TieredConfig(position="fixed"), TieredConfig(position="fixed", score_frame="own")
    assert attended.regime(32)["score_frame"] == "attended"
    assert attended.regime_fingerprint("m", 32) != own.regime_fingerprint("m", 32)
    # a fixed-policy context recorded before score_frame existed was scored at own positions
    legacy = SimpleNamespace(domain={"regime": own.regime(32)}, fingerprint="m", page_size=32)
    assert "score_frame" not in legacy.domain["regime"]
    assert chain_fingerprint(legacy) == own.regime_fingerprint("m", 32)
    with pytest.raises(ValueError, match="score_frame"):
        TieredConfig(score_frame="nearest")


def test_topk_default_follows_the_position_policy():
    """Beyond the window (fixed) fewer retrieved pages answered the passkey; inside it (own) more
    pages is closer to exact. An explicit top-k is kept, and a recorded regime rebuilds the same config."""
    assert TieredConfig().topk_pages == 16 and TieredConfig(position="fixed").topk_pages == 8
    assert TieredConfig(position="fixed", topk_pages=16).topk_pages == 16
    for cfg in (TieredConfig(), TieredConfig(position="fixed")):
        assert TieredConfig(**cfg.regime(32)).regime_fingerprint("m", 32) == cfg.regime_fingerprint("m", 32)


def test_ingest_reports_success_only_for_what_lmdb_gives_back(tiny_model, tmp_path, monkeypatch):
    """An ingest reads its manifest and every page back from LMDB (not the host copies): a page the
    disk lost after the write is an error, not a returned artifact."""
    from paging.errors import StoreIntegrityError

    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2)
    with tiered(lm, tmp_path, cfg) as tm:
        art = tm.ingest(_ids(300, 3))  # the real read-back passes
        assert tm.store.lmdb_tier.get(art.page_keys[1]) is not None
        real_get, real_views = tm.store.lmdb_tier.get, tm.store.lmdb_tier.views
        lost = set()

        def get(key):
            return None if key in lost else real_get(key)

        @contextlib.contextmanager
        def views(keys):  # the zero-copy reads the read-back verifies
            with real_views(keys) as raws:
                yield [None if key in lost else raw for key, raw in zip(keys, raws)]

        monkeypatch.setattr(tm.store.lmdb_tier, "get", get)
        monkeypatch.setattr(tm.store.lmdb_tier, "views", views)
        doc = _ids(300, 4)
        tm.reset()
        original_put = tm.store.put_manifest

        def put_manifest(artifact_id, data):  # the disk loses page 1 of this document right after the write
            lost.add(tm.cache.page_keys[1])
            return original_put(artifact_id, data)

        monkeypatch.setattr(tm.store, "put_manifest", put_manifest)
        with pytest.raises(StoreIntegrityError, match="lost a committed write"):
            tm.ingest(doc)


def _decode_logits(tm: TieredModel, question: list[int], steps: int) -> tuple[torch.Tensor, int]:
    """The question's logits, then `steps` greedy decode steps' logits; and the tokens the
    working-set buffers copied during those steps."""
    copied = lambda: sum(layer.buffer.num_copied_tokens for layer in tm.cache.layers if layer.buffer is not None)  # noqa: E731
    out = list(_tiered_logits(tm, question))
    before = copied()
    for _ in range(steps):
        out.append(tm(torch.tensor([[int(out[-1].argmax())]]), logits_to_keep=1).logits[0, -1])
    return torch.stack(out), copied() - before


@pytest.mark.parametrize("position,one_token_first,retrieval", [
    ("own", False, "union"), ("fixed", False, "union"), ("own", True, "union"),
    ("own", False, "per_head"), ("fixed", False, "per_head"), ("fixed", True, "per_head")])
def test_decode_steps_in_place_copy_less_and_keep_graft_equal_to_fresh(position, one_token_first, retrieval,
                                                                        tiny_model, tmp_path):
    """Retrieving decode steps leave pages where they sit in the working set (kv_buffer.py): fewer
    copies than position order, the same pages attended (logits equal up to summation order, which
    is documented as approximate), and a graft still continues torch.equal to a fresh run, also
    when the question's first chunk is a single token right after the ingest (a step that must not
    start from the ingest's layout)."""
    from tieredkv.engine.placement import policy_for

    lm = tiny_model("tiny-llama")
    cfg = TieredConfig(sink_pages=1, local_pages=2, topk_pages=2, chunk_pages=1, position=position,
                       retrieval=retrieval)
    with tiered(lm, tmp_path / "s", cfg) as tm:
        n = (700 // tm.page_size + 1) * tm.page_size - 1 if one_token_first else 700
        doc, question = _ids(n, 4), _ids(40, 5)
        art = tm.ingest(doc)
        fresh, in_place = _decode_logits(tm, question, 24)
        tm.graft(art.artifact_id)
        grafted, _ = _decode_logits(tm, question, 24)
        tm.use_policy(type("Ordered", (type(policy_for(position)),), {"slots_in_place": False})())
        tm.graft(art.artifact_id)
        ordered, in_order = _decode_logits(tm, question, 24)
    assert torch.equal(fresh, grafted)
    assert in_place < in_order
    assert torch.equal(fresh.argmax(-1), ordered.argmax(-1))
    assert torch.allclose(fresh, ordered, rtol=0, atol=1e-4)


def test_a_forward_that_fails_part_way_keeps_its_error_and_seals_nothing_torn(tiny_model, tmp_path, monkeypatch):
    """A page that fails verification inside a forward (here layer 0's working set) leaves the layers
    at different lengths: close() then writes the pages sealed before it and raises nothing over the
    real error, and the torn context refuses further forwards instead of sealing garbage."""
    from paging.errors import CorruptPageError
    from tieredkv.errors import TornContextError

    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path, StoreConfig()) as store:
        tm = TieredModel(lm, store, TieredConfig(local_pages=2, topk_pages=2))
        tm.ingest(_ids(300, 1), name="doc")
        real = tm.cache.working_set

        def failing(layer_idx, *args, **kwargs):
            if layer_idx == 0:
                raise CorruptPageError("p", "flipped by the test")
            return real(layer_idx, *args, **kwargs)

        monkeypatch.setattr(tm.cache, "working_set", failing)
        with pytest.raises(CorruptPageError, match="flipped by the test"):
            tm.generate(_ids(20, 2), max_new_tokens=2)
        assert tm.cache.torn and tm.cache.layers[0].num_tokens != tm.cache.layers[-1].num_tokens
        with pytest.raises(TornContextError, match="open the context again"):
            tm.prefill(_ids(5, 3))
        sealed = list(tm.cache.page_keys)
        tm.close()  # no AssertionError from sealing a torn step
        assert sealed and all(store.get(k) is not None for k in sealed)
        assert len(tm.cache.page_keys) == len(sealed)  # the failed step sealed no page


def test_qa_over_damaged_pages_names_the_damage_and_the_remedy(tmp_path, capsys):
    """Bits flipped in the stored document's pages: `qa` fails with the page's own error and the way
    out (check, then --reingest), never an unrelated one; after both steps it answers again."""
    import json

    from testkit.faults import flip_lmdb_value_bit
    from tieredkv.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 150 + "The secret colour is teal. " + "Beta. " * 150)
    store = tmp_path / "s"
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What colour?", "--store", str(store),
            "--local-pages", "2", "--topk-pages", "2", "--max-new-tokens", "4", "--json", "--quiet",
            "--read-passages", "0"]  # attention reads the stored pages (a reading computes its passage afresh)
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    with PageStore(store) as s:
        keys = list(s.lmdb_tier.keys())
    for key in keys:
        flip_lmdb_value_bit(store, key, 8 * 100_000)  # a payload byte (the offset wraps within the value)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "StoredContextDamagedError" in err and "corrupt page" in err
    assert "--reingest" in err and "tieredkv check" in err and "AssertionError" not in err
    assert main(["check", "--store", str(store)]) == 1
    capsys.readouterr()
    assert main(args) == 2  # quarantined now: not found, and the same remedy
    assert "--reingest" in capsys.readouterr().err
    assert main([*args, "--reingest"]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == first["answer"]
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["context"].startswith("grafted") and again["answer"] == first["answer"]


def test_qa_warns_when_own_positions_run_past_the_window(tmp_path, capsys, monkeypatch):
    """`--position own` is the user's choice past the window too, but never a silent one (a 256-position
    window stands in for the 8,192 of the real model, so the document stays small)."""
    import tieredkv.models.loading as models
    from tieredkv.cli import main

    real = models.load_model

    def small_window(name, **kw):
        lm = real(name, **kw)
        lm.model.config.max_position_embeddings = 256
        return lm

    monkeypatch.setattr(models, "load_model", small_window)
    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha beta gamma. " * 30)  # ~540 byte tokens
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What?", "--store", str(tmp_path / "s"),
            "--max-new-tokens", "2", "--quiet"]
    assert main([*args, "--position", "own"]) == 0
    err = capsys.readouterr().err
    assert "warning: --position own puts" in err and "window of 256" in err
    assert main(args) == 0  # auto: fixed distances beyond the window, no warning
    assert "warning" not in capsys.readouterr().err


def test_a_reading_answers_from_verified_tokens_over_damaged_pages(tmp_path, capsys):
    """Inside the window a question reads its passage afresh from the document's verified token ids: bits
    flipped in every stored page's K/V are never served, and the answer is the one the intact store gave."""
    import json

    from testkit.faults import flip_lmdb_value_bit
    from tieredkv.cli import main

    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 150 + "The secret colour is teal. " + "Beta. " * 150)
    store = tmp_path / "s"
    args = ["qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What colour?", "--store", str(store),
            "--max-new-tokens", "4", "--json", "--quiet"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["attended"] == "read"
    with PageStore(store) as s:
        keys = list(s.lmdb_tier.keys())
    for key in keys:
        flip_lmdb_value_bit(store, key, 8 * 100_000)
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["token_ids"] == first["token_ids"] and again["context"].startswith("grafted")
    before, after = first["store_stats"]["integrity"], again["store_stats"]["integrity"]
    assert before["verified_reads"] > 0 and before["corrupt_detected"] == 0
    # the damaged pages this run touched were caught and quarantined; none passed as good (a page may be
    # caught twice, by a prefetch and a read racing, so the counts need not be equal)
    assert after["corrupt_detected"] > 0 and after["quarantined"] > 0 and after["verified_reads"] == 0
