"""`TieredModel`: a HF causal LM with a long-context memory tier.

    tm = TieredModel.from_pretrained("smollm2", store=PageStore("kv"))
    art = tm.ingest(long_text)                      # pages -> LMDB/host, summaries -> index
    out = tm.generate(tm.encode("Question?"), max_new_tokens=32)

The model's own `forward()` / `generate()` run unchanged; attention sees a bounded working set
(sink, top-k retrieved and local pages) fetched through the store's tiers.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from index import IndexStaleError, PageIndex
from safefiles import AtomicFile
from paging import PageLayout, PageStore
from tieredkv.engine import attention
from tieredkv.artifacts.artifact import Artifact, artifact_id, bind_store, load_artifact
from tieredkv.artifacts.manifest import read_back
from tieredkv.provenance.domain import check_domain, determinism_domain, sha256_ids
from tieredkv.errors import (ClosedError, DiskBudgetError, EmptyInputError, ModelMismatchError, TornContextError,
                             UnsupportedModelError)
from tieredkv.models.loading import LoadedModel, forward_for, kv_bytes_per_token, load_model, num_kv_heads
from tieredkv.models.token_ids import check_token_ids
from tieredkv.engine.placement import PlacementPolicy, policy_for
from tieredkv.engine.schedule import canonical_chunks
from tieredkv.engine.tiered_cache import TieredCache, page_summaries
from tieredkv.engine.tiered_config import AUTO, TieredConfig
from tieredkv.engine.working_set import Span


# generate()'s own arguments to the model's generate (given twice, they were a bare TypeError)
GREEDY_ONLY = frozenset({"do_sample", "past_key_values", "attention_mask", "pad_token_id", "max_length"})


def working_set_bytes(lm: LoadedModel, config: TieredConfig) -> int:
    """Device-tier bytes (all layers) of the largest working set `config` can select for `lm`:
    the budget at which sink and local pages stay resident while retrieved pages change."""
    page_size = config.page_size or lm.default_page_size
    return config.working_set_pages(num_kv_heads(lm.model)) * page_size * kv_bytes_per_token(lm.model)


class TieredModel:
    """Wraps a loaded model; owns one growing context (`self.cache`) backed by `store`."""

    def __init__(self, lm: LoadedModel, store: PageStore, config: TieredConfig = TieredConfig(), *,
                 policy: PlacementPolicy | None = None):
        if config.position == AUTO:
            raise ValueError("TieredConfig(position='auto') must be resolved for a context first: "
                             "config.resolve(lm.model, num_tokens)")
        self.lm, self.store, self.config = lm, store, config
        # which pages full-attention layers attend to, and where (tieredkv/engine/placement.py)
        self.policy = policy if policy is not None else policy_for(config.position)
        self.page_size = config.page_size or lm.default_page_size
        if config.position == "fixed":
            from tieredkv.engine.rotary import rotary_module

            rotary_module(lm.model)  # fails early, with the reason, on models without rotary
        bind_store(store, lm)
        self.regime_fp = config.regime_fingerprint(lm.fingerprint, self.page_size)
        self.last_reading = None  # what the last question read (tieredkv/question/reading.py), if it read
        self._closed = False
        self.base_attn = attention.wrap(lm.model)
        self._hook = lm.model.get_input_embeddings().register_forward_pre_hook(self._note_ids)
        try:
            self.reset()
        except BaseException:  # NOTE: else the model stayed switched, counted for a TieredModel that never was
            self._hook.remove()
            attention.unwrap(lm.model)
            raise
        need = working_set_bytes(lm, config)
        if store.config.device_budget_bytes < need:
            warnings.warn(f"the device tier's budget ({store.config.device_budget_bytes / 2**20:.0f} MiB) is below one "
                          f"working set ({need / 2**20:.0f} MiB): pages will be copied in again at every step. "
                          "Size it with StoreConfig(device_budget_bytes=tieredkv.working_set_bytes(lm, config)).",
                          ResourceWarning, stacklevel=2)

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, store: PageStore, config: TieredConfig = TieredConfig(),
                        dtype: torch.dtype = torch.float32) -> "TieredModel":
        return cls(load_model(name_or_path, dtype=dtype), store, config)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Start a new, empty context."""
        self._check_open()
        if getattr(self, "cache", None) is not None:
            self.cache.close()
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

    def _note_ids(self, _module, args):
        if attention.ACTIVE_CACHE.get() is self.cache and args:
            self.cache.note_input_ids(args[0].reshape(-1).tolist())

    def _token_ids(self, ids, what: str) -> list[int]:
        """`ids` as a list of ints of this model's vocabulary; else a typed error that says what to pass."""
        return check_token_ids(ids, self.model, what, "tm.encode(text)")

    def _check_positions(self, extra: int) -> None:
        if self.cache.torn:
            raise TornContextError("an earlier forward failed part-way, so this context is incomplete; "
                                   "close this TieredModel and open the context again (ingest or graft)")
        cfg = self.model.config
        if cfg.model_type == "gpt2" and self.num_tokens + extra > cfg.n_positions:
            raise UnsupportedModelError(
                f"gpt2 has learned positions up to {cfg.n_positions}; the context would reach "
                f"{self.num_tokens + extra}. Use a rotary model for longer contexts."
            )

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
    def generate(self, new_ids: Sequence[int], *, max_new_tokens: int = 32, question: str | None = None,
                 **kwargs) -> list[int]:
        """Prefill `new_ids` (page-aligned), then greedy-decode with the model's own `generate()`.

        Over a sealed context that retrieves (right after `ingest` or `graft`), a question first reads:
        with `config.reading`, the passages it is about are read afresh right before it
        (tieredkv/question/reading.py; `question` is the text its words are matched with, default the decoded
        `new_ids`; what was read is in `last_reading`); with `config.reencode_pages`, its
        most-retrieved pages are re-encoded beside each layer's retrieval (tieredkv/question/reencode.py)."""
        self._check_open()
        new_ids = self._token_ids(new_ids, "generate")
        given = sorted(set(kwargs) & GREEDY_ONLY) + (["num_beams"] if kwargs.get("num_beams", 1) != 1 else [])
        if given:
            raise ValueError(f"TieredModel.generate decodes greedily, one beam, over its own cache: drop "
                             f"{', '.join(given)}")
        if question is not None and not question.strip():
            raise EmptyInputError("the question is empty or blank: give its text, or None to match the prompt's "
                                  "own words")
        self.last_reading = None
        if self._sealed_and_retrieving() and not self.cache.reencoded:
            if self.config.reading is not None:
                from tieredkv.question.reading import read

                query = question if question is not None else self.lm.codec.decode(list(new_ids))
                self.last_reading = read(self.cache, new_ids, query, self.config.reading, self.lm.codec)
            elif self.config.reencode_pages:
                from tieredkv.question.reencode import probe, reencode

                reencode(self.cache, probe(self.cache, new_ids, self.config.reencode_pages))
        if len(new_ids) > 1:
            self._prefill(new_ids[:-1], None, 1)
        n = self.num_tokens
        last = torch.tensor([[new_ids[-1]]], device=self.model.device)
        full_mask = torch.ones((1, n + 1), dtype=torch.long, device=self.model.device)
        self._check_positions(1 + max_new_tokens)
        with attention.activate(self.cache):
            out = self.model.generate(last, attention_mask=full_mask, past_key_values=self.cache,
                                      max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=self.lm.codec.eos_token_id, **kwargs)
        return out[0, 1:].tolist()

    def _sealed_and_retrieving(self) -> bool:
        """Every token is in a sealed page (right after ingest or graft), and more pages than one working set."""
        layer = self.cache.layers[0]
        return layer.is_initialized and layer.keys.shape[1] == 0 and self.cache.retrieving

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
        self.check_disk_budget(len(ids))
        self.reset()
        self._prefill(ids, progress, None)
        self.cache.flush(partial=True)
        domain = self.domain()
        art = Artifact(artifact_id(self.regime_fp, self.cache.page_keys[-1], domain), self.lm.fingerprint, domain,
                       len(ids), self.page_size, tuple(self.cache.page_keys), sha256_ids(ids),
                       self.cache.layout.to_dict(), name)
        self.store.put_manifest(art.artifact_id, art.to_json())
        # NOTE: success is reported only for what LMDB gives back: the manifest and every page, verified
        # and chained (as deposit does), not the host tier's copies
        read_back(self.store, art)
        self.cache.index.save(self._index_path(art))
        self._save_token_ids(art, ids)
        return art

    def graft(self, artifact: Artifact | str, *, allow_domain_mismatch: bool = False,
              progress: Callable[[int, int], None] | None = None) -> Artifact:
        """Reset and adopt a stored context at its own positions; pages stream in on demand."""
        self._check_open()
        art = load_artifact(self.store, artifact) if isinstance(artifact, str) else artifact
        if art.fingerprint != self.lm.fingerprint:
            raise ModelMismatchError(f"artifact {art.artifact_id}", art.fingerprint, self.lm.fingerprint)
        check_domain(art.domain, self.domain(), allow_mismatch=allow_domain_mismatch,
                     what=f"artifact {art.artifact_id}")
        layout = PageLayout.from_dict(art.layout)
        spans = [Span(i, s, e) for i, (s, e) in enumerate(canonical_chunks(0, art.num_tokens, art.page_size))]
        self.reset()
        index = self._load_or_rebuild_index(art, layout, progress)
        self.cache.attach(list(art.page_keys), spans, layout, index, token_ids=self._load_token_ids(art))
        return art

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
            self._hook.remove()
            attention.unwrap(self.model)

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

