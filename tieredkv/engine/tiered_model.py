"""`TieredModel`: a HF causal LM with a long-context memory tier.

    tm = TieredModel.from_pretrained("smollm2", store="kv")
    doc = tm.open(long_text)                        # config for its length; graft if stored (by content), else ingest
    answer = tm.ask(doc, "Question?")               # from the document's sealed state (tieredkv/question/ask.py)

    tm = TieredModel(lm, store, config)             # the engine: one context
    art = tm.ingest(long_text)                      # pages -> LMDB/host, summaries -> index
    out = tm.generate(tm.encode("Question?"), max_new_tokens=32)

The model's own `forward()` / `generate()` run unchanged; attention sees a bounded working set
(sink, top-k retrieved and local pages) fetched through the store's tiers.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from index import IndexStaleError, PageIndex
from paging import PageLayout, PageStore, StoreConfig
from safefiles import AtomicFile
from tieredkv.artifacts.artifact import Artifact, artifact_id, bind_store, load_artifact, put_manifest, require_stored
from tieredkv.artifacts.manifest import read_back
from tieredkv.engine import attention
from tieredkv.engine.generation import generation_options, prompt_ids, seeded, with_prompt
from tieredkv.engine.placement import PlacementPolicy, policy_for
from tieredkv.engine.schedule import canonical_chunks
from tieredkv.engine.tiered_cache import TieredCache, page_summaries
from tieredkv.engine.tiered_config import AUTO, QUESTION_SELECTIONS, TieredConfig
from tieredkv.engine.working_set import Span
from tieredkv.errors import (
    CacheNotActiveError,
    ClosedError,
    DiskBudgetError,
    EmptyInputError,
    ModelMismatchError,
    StoreNotGivenError,
    TornContextError,
    UnsupportedModelError,
)
from tieredkv.models.loading import (
    LoadedModel,
    forward_for,
    kv_bytes_per_token,
    load_model,
    num_kv_heads,
    trained_window,
)
from tieredkv.models.token_ids import check_token_ids
from tieredkv.provenance.domain import check_domain, determinism_domain, sha256_ids

log = logging.getLogger(__name__)


def qa_budget_bytes(lm: LoadedModel) -> int:
    """Device-tier bytes for every working set `TieredModel.open` may choose for `lm` (the question
    configuration inside the model's window and beyond it)."""
    from tieredkv.question.qa import qa_config

    window = trained_window(lm.model)
    lengths = [1] if window is None else [1, window + 1]
    return max(working_set_bytes(lm, qa_config(lm, n)) for n in lengths)


def working_set_bytes(lm: LoadedModel, config: TieredConfig) -> int:
    """Device-tier bytes (all layers) of the largest working set `config` can select for `lm`:
    the budget at which sink and local pages stay resident while retrieved pages change."""
    page_size = config.page_size or lm.default_page_size
    return config.working_set_pages(num_kv_heads(lm.model)) * page_size * kv_bytes_per_token(lm.model)


class TieredModel:
    """Wraps a loaded model; owns one growing context (`self.cache`) backed by `store`."""

    def __init__(self, lm: LoadedModel, store: PageStore, config: TieredConfig = TieredConfig(), *,
                 policy: PlacementPolicy | None = None):
        self.lm, self.store = lm, store
        bind_store(store, lm)
        self.last_reading = None  # what the last question read (tieredkv/question/reading.py), if it read
        self.sealed_for = None  # the Document whose sealed state the context holds (tieredkv/question/ask.py)
        self._closed, self._owns_store, self._warned_window = False, False, False
        self.disk_budget_bytes: int | None = None  # what `ingest` may use on disk (default: the free space)
        self.base_attn = attention.wrap(lm.model)
        self._hook = lm.model.get_input_embeddings().register_forward_pre_hook(self._note_ids)
        self._guard = lm.model.register_forward_pre_hook(self._refuse_plain_call, with_kwargs=True)
        try:
            self.configure(config, policy=policy)
        except BaseException:  # NOTE: else the model stayed switched, counted for a TieredModel that never was
            self._hook.remove()
            self._guard.remove()
            attention.unwrap(lm.model)
            raise

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, store: PageStore | str | os.PathLike | None = None,
                        config: TieredConfig = TieredConfig(), dtype: torch.dtype = torch.float32) -> "TieredModel":
        """Load a model and wrap it. `store`: a PageStore, or a directory (default $TIEREDKV_STORE) opened
        with a device tier sized for the working sets `open` chooses, and closed with this TieredModel."""
        lm = load_model(name_or_path, dtype=dtype)
        if isinstance(store, PageStore):
            return cls(lm, store, config)
        path = store if store is not None else os.environ.get("TIEREDKV_STORE")
        if not path:
            raise StoreNotGivenError("no store given: pass store='DIR' (or a PageStore), or set TIEREDKV_STORE")
        opened = PageStore(path, StoreConfig(device_budget_bytes=qa_budget_bytes(lm)))
        try:
            tm = cls(lm, opened, config)
        except BaseException:
            opened.close()
            raise
        tm._owns_store = True
        return tm

    def configure(self, config: TieredConfig, *, policy: PlacementPolicy | None = None) -> None:
        """Attend with `config` from now on, in a new, empty context (`open` picks one per document)."""
        if config.position == AUTO:
            raise ValueError("TieredConfig(position='auto') must be resolved for a context first: "
                             "config.resolve(lm.model, num_tokens)")
        if getattr(self, "config", None) == config and policy is None:
            return
        if config.position == "fixed":
            from tieredkv.engine.rotary import rotary_module

            rotary_module(self.lm.model)  # fails early, with the reason, on models without rotary
        self.config = config
        # which pages full-attention layers attend to, and where (tieredkv/engine/placement.py)
        self.policy = policy if policy is not None else policy_for(config.position)
        self.page_size = config.page_size or self.lm.default_page_size
        self.regime_fp = config.regime_fingerprint(self.lm.fingerprint, self.page_size)
        self.reset()
        need = working_set_bytes(self.lm, config)
        if self.store.config.device_budget_bytes < need:
            warnings.warn(f"the device tier's budget ({self.store.config.device_budget_bytes / 2**20:.0f} MiB) is "
                          f"below one working set ({need / 2**20:.0f} MiB): pages will be copied in again at every "
                          "step. Size it with StoreConfig(device_budget_bytes=tieredkv.working_set_bytes(lm, config)).",
                          ResourceWarning, stacklevel=3)

    # ------------------------------------------------------------------ one call per question
    def open(self, source: str | Sequence[int], name: str = "", *, reingest: bool = False,
             progress: Callable[[int, int], None] | None = None, room: int | None = None, **config_fields):
        """A document to ask about: ingested once (a progress bar when stderr is a terminal), found again by
        its tokens (never by `name`, a label) and grafted afterwards; the configuration is chosen for its
        length (`room`: tokens for a question and answer; `config_fields` override it). Returns a Document
        (tieredkv/question/ask.py)."""
        self._check_open()
        from tieredkv.question.ask import open_document

        return open_document(self, source, name, reingest=reingest, progress=progress, room=room, **config_fields)

    def ask(self, doc, question: str, **generate_kwargs):
        """Answer `question` about an opened document, from its sealed state: questions never see each
        other. `generate_kwargs` as for `generate`. Returns an Answer (tieredkv/question/ask.py)."""
        self._check_open()
        from tieredkv.question.ask import ask

        return ask(self, doc, question, **generate_kwargs)

    def chat(self, doc, messages: list[dict], **generate_kwargs):
        """The assistant's next turn of a conversation over an opened document (chat template applied).
        Returns an Answer; append {"role": "assistant", "content": answer.text} to go on."""
        self._check_open()
        from tieredkv.question.ask import chat

        return chat(self, doc, messages, **generate_kwargs)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Start a new, empty context."""
        self._check_open()
        self.sealed_for, self._warned_window = None, False
        if getattr(self, "cache", None) is not None:
            self.cache.close()
        self._release()
        self.cache = TieredCache(self.lm.model, self.store, self.config, fingerprint=self.regime_fp,
                                 page_size=self.page_size, policy=self.policy)

    def use_policy(self, policy: PlacementPolicy) -> None:
        """Attend with `policy` from now on (this context and the next ones): diagnostics install
        oracles or other placements here (tieredkv/engine/placement.py)."""
        self.policy = self.cache.policy = policy

    def keep_in_memory(self) -> None:
        """Pages sealed from now on in this context (a question, its answer) stay in memory and are
        never written: the store keeps the document only. `reset`, `ingest` and `graft` undo it."""
        self.cache.writer.persist = False

    @property
    def model(self):
        return self.lm.model

    @property
    def num_tokens(self) -> int:
        return self.cache.get_seq_length()

    def domain(self) -> dict[str, Any]:
        d = determinism_domain(self.model, self.lm.fingerprint, self.page_size)
        d["attn_implementation"] = self.base_attn
        d["regime"] = self.config.regime(self.page_size)
        return d

    def encode(self, text: str) -> list[int]:
        return self.lm.codec.encode(text)

    def _refuse_plain_call(self, _module, _args, kwargs):
        """The model called with this context's cache but without the tiered attention (a plain
        `model.generate(past_key_values=tm.cache)`): refused before the model slices its inputs by the cache."""
        if kwargs.get("past_key_values") is self.cache and attention.ACTIVE_CACHE.get() is not self.cache:
            raise CacheNotActiveError()

    def _note_ids(self, _module, args):
        if attention.ACTIVE_CACHE.get() is self.cache and args:
            self.cache.note_input_ids(args[0].reshape(-1).tolist())

    def _token_ids(self, ids, what: str) -> list[int]:
        """`ids` as a list of ints of this model's vocabulary; else a typed error that says what to pass."""
        return check_token_ids(ids, self.model, what, "tm.encode(text)")

    def _check_positions(self, extra: int) -> None:
        """Before `extra` tokens extend the context: refuse what cannot run, warn past the trained window."""
        self.sealed_for = None  # NOTE: the context no longer holds a document's sealed state alone
        if self.cache.torn:
            raise TornContextError("an earlier forward failed part-way, so this context is incomplete; "
                                   "close this TieredModel and open the context again (ingest or graft)")
        cfg = self.model.config
        if cfg.model_type == "gpt2" and self.num_tokens + extra > cfg.n_positions:
            raise UnsupportedModelError(
                f"gpt2 has learned positions up to {cfg.n_positions}; the context would reach "
                f"{self.num_tokens + extra}. Use a rotary model for longer contexts."
            )
        window = trained_window(self.model)
        if self.config.position == "own" and window and self.num_tokens + extra > window and not self._warned_window:
            self._warned_window = True
            warnings.warn(f"own positions reach {self.num_tokens + extra:,}, past the model's trained window of "
                          f"{window:,}: answers degrade there; use tm.open (fixed distances and reading beyond the "
                          "window) or TieredConfig(position='auto').resolve(model, num_tokens)", stacklevel=4)

    # ------------------------------------------------------------------ running the model
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, **kwargs):
        """One forward of new tokens at positions [N, N+q) (use `prefill` for page-aligned chunks)."""
        self._check_open()
        self._check_positions(input_ids.shape[-1])
        with attention.activate(self.cache):
            return self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kwargs)

    __call__ = forward

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], *, progress: Callable[[int, int], None] | None = None,
                logits_to_keep: int | None = 1):
        """Feed `ids` in chunks of `chunk_pages` pages, cut at multiples of the chunk size (so always at
        page boundaries); returns the last chunk's logits (None with `logits_to_keep=None`: no LM head)."""
        self._check_open()
        return self._prefill(self._token_ids(ids, "prefill"), progress, logits_to_keep)

    @torch.inference_mode()
    def _prefill(self, ids: list[int], progress: Callable[[int, int], None] | None,
                 logits_to_keep: int | None):
        """`prefill` of ids already checked (ingest and generate check theirs once)."""
        start, out = self.num_tokens, None
        self._check_positions(len(ids))
        run, extra = forward_for(self.model, logits_to_keep)
        for s, e in canonical_chunks(start, start + len(ids), self.page_size * self.config.chunk_pages):
            x = torch.tensor([list(ids[s - start:e - start])], device=self.model.device)
            with attention.activate(self.cache):
                out = run(input_ids=x, past_key_values=self.cache, use_cache=True, **extra)
            if progress is not None:
                progress(e - start, len(ids))
        return None if logits_to_keep is None else out.logits

    @torch.inference_mode()
    def generate(self, inputs, *, max_new_tokens: int = 32, question: str | None = None, seed: int | None = None,
                 **kwargs):
        """Prefill the prompt (page-aligned), then decode with the model's own `generate()`: greedy unless
        `do_sample=True`; sampling options, logits processors and streamers pass through (`seed` reproduces a
        sampled answer); beams and batches are refused (tieredkv/engine/generation.py). `inputs`: a list of ids,
        a [1, n] tensor, a BatchEncoding/dict with `input_ids`, or chat messages. Returns the new ids as a list,
        or HF's output object (sequences = prompt + new) with `return_dict_in_generate=True`.

        Over a sealed context (right after `ingest` or `graft`), a question first reads: with `config.reading`,
        the passages it is about are read afresh right before it (tieredkv/question/reading.py; `question` is
        the text its words are matched with, default the decoded prompt; what was read is in `last_reading`);
        with `config.reencode_pages`, over a context that retrieves, its most-retrieved pages are re-encoded
        beside each layer's retrieval (tieredkv/question/reencode.py)."""
        self._check_open()
        new_ids = self._token_ids(prompt_ids(inputs, getattr(self.lm.codec, "tokenizer", None)), "generate")
        gen_config, model_kwargs = generation_options(self.model, {"max_new_tokens": max_new_tokens, **kwargs})
        if gen_config.pad_token_id is None:
            gen_config.pad_token_id = self.lm.codec.eos_token_id
        if question is not None and not question.strip():
            raise EmptyInputError("the question is empty or blank: give its text, or None to match the prompt's "
                                  "own words")
        self._read_for(new_ids, question)
        if len(new_ids) > 1:
            self._prefill(new_ids[:-1], None, 1)
        n = self.num_tokens
        last = torch.tensor([[new_ids[-1]]], device=self.model.device)
        full_mask = torch.ones((1, n + 1), dtype=torch.long, device=self.model.device)
        self._check_positions(1 + gen_config.max_new_tokens)
        with attention.activate(self.cache), seeded(seed, self.model.device):
            out = self.model.generate(last, attention_mask=full_mask, past_key_values=self.cache,
                                      generation_config=gen_config, **model_kwargs)
        if gen_config.return_dict_in_generate:
            return with_prompt(out, new_ids)
        return out[0, 1:].tolist()

    def _read_for(self, new_ids: list[int], question: str | None) -> None:
        """Question-time reading before a prompt over a sealed context (or re-encoding, over one that retrieves)."""
        self.last_reading = None
        if not self._sealed() or self.cache.reencoded:
            return
        self.cache.question_ranking = None
        if self.config.reading is not None:  # NOTE: whether or not attention retrieves: a reading picks passages
            from tieredkv.question.reading import read

            query = self._question_text(new_ids, question)
            self.last_reading = read(self.cache, new_ids, query, self.config.reading, self.lm.codec)
        elif self.config.reencode_pages and self.cache.retrieving:
            from tieredkv.question.reencode import probe, reencode

            reencode(self.cache, probe(self.cache, new_ids, self.config.reencode_pages))
        elif self.config.selection == "lexical" and self.cache.retrieving:
            from tieredkv.question.reading import lexical_pages

            k = self.config.held_pages(self.cache.layout.num_kv_heads)
            self.cache.held_pages = lexical_pages(self.cache, self._question_text(new_ids, question), k, self.lm.codec)
        elif self.config.selection in QUESTION_SELECTIONS and self.cache.retrieving:
            from tieredkv.engine.question_choice import arm
            from tieredkv.question.reading import lexical_ranking

            query = self._question_text(new_ids, question)
            hybrid = self.config.selection == "hybrid"
            arm(self.cache, lexical_ranking(self.cache, query, self.lm.codec) if hybrid else None)

    def _question_text(self, new_ids: list[int], question: str | None) -> str:
        """What a question-time step matches against the pages: the question given, else the prompt's text."""
        return question if question is not None else self.lm.codec.decode(list(new_ids))

    def _sealed(self) -> bool:
        """Every token is in a sealed page (right after ingest or graft)."""
        layer = self.cache.layers[0]
        return layer.is_initialized and layer.keys.shape[1] == 0

    def check_disk_budget(self, num_tokens: int, *, budget_bytes: int | None = None) -> None:
        """Refuse, before any work, a context whose pages would not fit the disk (or `budget_bytes`)."""
        import shutil

        need = int(num_tokens * kv_bytes_per_token(self.model) * 1.02) + (16 << 20)  # + LMDB overhead
        free = shutil.disk_usage(self.store.path).free + self.store.stats()["lmdb"]["disk_bytes"]
        budget = min(free, budget_bytes) if budget_bytes else free
        used = self.store.stats()["lmdb"]["disk_bytes"]
        if used + need > budget:
            raise DiskBudgetError(
                f"{num_tokens:,} tokens need about {need / 2**30:.2f} GiB of KV pages on disk; the store at "
                f"{self.store.path} has {max(0, budget - used) / 2**30:.2f} GiB left of its budget. Free disk space, "
                "raise --disk-budget, or use a shorter document."
            )

    # ------------------------------------------------------------------ contexts as artifacts
    def ingest(self, source: str | Sequence[int], *, name: str = "",
               progress: Callable[[int, int], None] | None = None) -> Artifact:
        """Reset, prefill a document, seal every page (the last may be partial), save it as an artifact
        (read back from LMDB and verified before it is returned)."""
        self._check_open()
        if isinstance(source, str) and not source.strip():
            raise EmptyInputError("the document is empty")
        ids = self.encode(source) if isinstance(source, str) else self._token_ids(source, "ingest")
        self.check_disk_budget(len(ids), budget_bytes=self.disk_budget_bytes)
        self.reset()
        self._prefill(ids, progress, None)
        self.cache.flush(partial=True)
        domain = self.domain()
        art = Artifact(artifact_id(self.regime_fp, self.cache.page_keys[-1], domain), self.lm.fingerprint, domain,
                       len(ids), self.page_size, tuple(self.cache.page_keys), sha256_ids(ids),
                       self.cache.layout.to_dict(), name)
        art = put_manifest(self.store, art)  # the same text stored under another name is this artifact
        # NOTE: success is reported only for what LMDB gives back: the manifest and every page, verified
        # and chained (as deposit does), not the host tier's copies
        read_back(self.store, art)
        self._hold(art)
        self.cache.index.save(self._index_path(art))
        self._save_token_ids(art, ids)
        log.info("ingested %d tokens into %d pages: artifact %s", len(ids), len(art.page_keys), art.artifact_id)
        return art

    def graft(self, artifact: Artifact | str, *, allow_domain_mismatch: bool = False,
              progress: Callable[[int, int], None] | None = None) -> Artifact:
        """Reset and adopt a stored context at its own positions; pages stream in on demand."""
        self._check_open()
        art = load_artifact(self.store, artifact) if isinstance(artifact, str) else require_stored(self.store, artifact)
        if art.fingerprint != self.lm.fingerprint:
            raise ModelMismatchError(f"artifact {art.artifact_id}", art.fingerprint, self.lm.fingerprint)
        check_domain(art.domain, self.domain(), allow_mismatch=allow_domain_mismatch,
                     what=f"artifact {art.artifact_id}")
        layout = PageLayout.from_dict(art.layout)
        spans = [Span(i, s, e) for i, (s, e) in enumerate(canonical_chunks(0, art.num_tokens, art.page_size))]
        self.reset()
        index = self._load_or_rebuild_index(art, layout, progress)
        self.cache.attach(list(art.page_keys), spans, layout, index, token_ids=self._load_token_ids(art))
        self._hold(art)
        log.info("grafted artifact %s: %d tokens, %d pages", art.artifact_id, art.num_tokens, len(art.page_keys))
        return art

    def _hold(self, art: Artifact) -> None:
        """The document is in use while this context holds it (a size cap never evicts it), and used now (LRU)."""
        self._release()
        self.store.pin(art.artifact_id)
        self._held = art.artifact_id
        self.store.mark_used(art.artifact_id)

    def _release(self) -> None:
        """The document this context held is no longer in use by it (`reset`, `close`)."""
        held, self._held = getattr(self, "_held", None), None
        if held is not None and not self.store.closed:
            self.store.unpin(held)

    def _index_path(self, art: Artifact) -> Path:
        path = Path(self.store.path) / "indexes" / f"{art.artifact_id}.{self.config.summary}.faiss"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _token_ids_path(self, art: Artifact) -> Path:
        return self._index_path(art).with_name(f"{art.artifact_id}.token_ids")

    def _save_token_ids(self, art: Artifact, ids: Sequence[int]) -> None:
        """The context's token ids beside its index (derived data, checked against the manifest when
        read): a question matches words against page text without reading whole pages."""
        with AtomicFile(self._token_ids_path(art)) as f:
            f.write(np.asarray(ids, dtype="<i4").tobytes())

    def _load_token_ids(self, art: Artifact) -> list[int] | None:
        """The saved token ids if they hash to the manifest's `token_ids_sha256`, else None (the cache
        then reads them from the verified pages when asked)."""
        try:
            ids = np.frombuffer(self._token_ids_path(art).read_bytes(), dtype="<i4").tolist()
        except (OSError, ValueError):
            return None
        return ids if len(ids) == art.num_tokens and sha256_ids(ids) == art.token_ids_sha256 else None

    def _load_or_rebuild_index(self, art: Artifact, layout: PageLayout, progress) -> PageIndex:
        """The index is derived data: load it if it matches the artifact, else rebuild it from the pages."""
        geometry = dict(num_layers=layout.num_layers, num_heads=layout.num_kv_heads, dim=layout.head_dim,
                        method=self.config.summary, num_repr=self.config.num_repr)
        path = self._index_path(art)
        try:
            return PageIndex.load(path, **geometry, expected_page_ids=range(len(art.page_keys)))
        except IndexStaleError:
            pass
        index = PageIndex(**geometry)
        for i, key in enumerate(art.page_keys):
            page = self.store.get(key)  # verified
            keys = [page.layer_kv(l)[0] for l in range(layout.num_layers)]
            index.add(i, page_summaries(self.model, self.config, keys, i * art.page_size))
            if progress is not None:
                progress(i + 1, len(art.page_keys))
        index.save(path)
        return index

    def close(self) -> None:
        """Write out every complete page and release the model (a second call does nothing). After a
        forward that failed part-way only the pages sealed before it are written: its tokens are dropped
        and its error stands."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.store.closed:
                raise ClosedError(f"the store {self.store.path} was closed before this TieredModel: the pages "
                                  "sealed since the last write are lost; close the TieredModel first, then its store")
            if self.cache.torn:
                self.cache.writer.flush()
            else:
                self.cache.flush(partial=False)
        finally:
            self.cache.close()
            self._release()
            self._hook.remove()
            self._guard.remove()
            attention.unwrap(self.model)
            if self._owns_store:
                self.store.close()

    def __enter__(self) -> "TieredModel":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this TieredModel is closed; open a new one (TieredModel(lm, store, config)) and "
                              "ingest or graft its context")
        if self.store.closed:
            raise ClosedError(f"the store {self.store.path} is closed; open it again and a new TieredModel on it")

