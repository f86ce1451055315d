"""The Cache subclass behind `TieredModel`: pages out, working set in.

    model layer l ──update(k, v)──> TieredLayer.tail  (unsealed tokens + the current chunk)
                                        │ full page (all layers) ──seal──> PageStore (LMDB + host)
                                        │                             └──> PageIndex summaries
    attention(l, q) ──working_set──> [sink | retrieved | local pages | tail] from the device tier

`get_seq_length()` is the absolute number of tokens seen (it drives positions and generate()),
never the working-set size.
"""
from __future__ import annotations

import array
import collections
import hashlib
import json
import logging
from typing import Any, Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from index import PageIndex, summarize
from paging import ROOT_KEY, Page, PageLayers, PageLayout, PageStore, PageWriter
from tieredkv.engine import attention, head_block
from tieredkv.engine.kv_buffer import SlotKey, SlotKVs, WorkingSetBuffer
from tieredkv.engine.placement import PlacementPolicy, policy_for
from tieredkv.engine.prefetch import Prefetcher
from tieredkv.engine.tiered_config import REUSE_MIN_COSINE, TieredConfig
from tieredkv.engine.working_set import HeadPages, Span, build_mask, sliding_spans
from tieredkv.errors import CacheNotActiveError, UnsupportedModelError

log = logging.getLogger(__name__)


def page_summaries(model, config: TieredConfig, layer_keys: Sequence[torch.Tensor], start: int) -> np.ndarray:
    """Index summaries [L, Hkv, R, D] of a page starting at `start`, from its keys per layer
    ([Hkv, T, D] each). Keys are summarised as stored (own positions), or moved to page-relative
    positions [0, T) when the config scores pages where they are attended. Sealing and the index
    rebuild both call this, so a rebuilt index is the one sealing built."""
    if config.relative_scoring:
        from tieredkv.engine.rotary import rerotate

        layer_keys = [rerotate(model, k, -start, i) for i, k in enumerate(layer_keys)]
    return np.stack([summarize(k.float().cpu().numpy(), config.summary, config.num_repr) for k in layer_keys])


class TieredLayer(CacheLayerMixin):
    """One layer: the unsealed tail lives here; sealed pages live in the store."""

    is_compileable = False

    is_sliding = False
    sliding_window: int | None = None

    def __init__(self, owner: "TieredCache", layer_idx: int, **_layer_kwargs):
        self.buffer: WorkingSetBuffer | None = None  # the working set on the device: slots, then the tail
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.num_tokens = 0  # absolute tokens written to this layer

    # The tail (unsealed tokens + the current chunk) is a view of the buffer, right behind its slots.
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self.buffer is None else self.buffer.tail_keys  # [Hkv, t, D]

    @keys.setter
    def keys(self, states: torch.Tensor | None) -> None:
        self._set_tail("k", states)

    @property
    def values(self) -> torch.Tensor | None:
        return None if self.buffer is None else self.buffer.tail_values

    @values.setter
    def values(self, states: torch.Tensor | None) -> None:
        self._set_tail("v", states)

    def _set_tail(self, which: str, states: torch.Tensor | None) -> None:
        """Replace the tail ([Hkv, t, D], ending at `num_tokens`); None (transformers' init) is nothing."""
        if states is None:
            return
        b = self.buffer
        if b is None or (b.dtype, b.device, b.num_kv_heads, b.head_dim) != (
                states.dtype, states.device, states.shape[0], states.shape[-1]):
            self.buffer = b = WorkingSetBuffer(states.shape[0], states.shape[-1], states.dtype, states.device)
        b.set_tail(which, states, self.num_tokens - states.shape[1])

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        # k: [1, Hkv, q, D]
        self.buffer = WorkingSetBuffer(key_states.shape[1], key_states.shape[-1], self.dtype, self.device)
        self.buffer.reset(self.num_tokens)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        # k, v: [1, Hkv, q, D], post-rotary at absolute positions [num_tokens, num_tokens + q)
        assert key_states.shape[0] == 1, "TieredModel runs one sequence (batch size 1)"
        if self.layer_idx == 0 and attention.ACTIVE_CACHE.get() is not self.owner:
            # NOTE: refused before anything is appended: without the tiered attention the model would attend to
            # this chunk alone (the context's pages are not in these tensors)
            raise CacheNotActiveError()
        if self.layer_idx == 0:
            self.owner.seal_full_pages()
        if not self.is_initialized or (self.buffer.is_empty and self.buffer.device != key_states.device):
            self.lazy_initialization(key_states, value_states)  # (or a context attached on the store's device)
        self.buffer.append(key_states, value_states)  # in place: no copy of the tail already there
        self.num_tokens += key_states.shape[-2]
        return key_states, value_states

    def drop_front(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tail's first `n` tokens ([Hkv, n, D] views), now a sealed page: they stay where they are
        in the buffer, as its last slot. NOTE: read them before this layer's next update."""
        return self.buffer.seal_front(n)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # The attention function builds its own mask from absolute positions; keep transformers'
        # mask tiny (it is ignored) instead of [q, whole context].
        return query_length, self.owner.get_seq_length()

    def get_seq_length(self) -> int:
        return self.num_tokens

    def get_max_length(self) -> int:
        return -1

    def plan(self, query: torch.Tensor) -> tuple[list[tuple[Span, int]], dict[int, int], HeadPages | None]:
        """The sealed pages this layer attends to for `query` ([1, Hq, q, D]): (span, offset of its
        first used token) in position order, page id -> position shift (empty: own positions), and
        the pages each KV head reads alone (`retrieval="per_head"`; None: every head reads them all)."""
        raise NotImplementedError


class FullAttentionLayer(TieredLayer):
    """Attends to what the cache's placement policy selects, where the policy places it."""

    def plan(self, query):
        owner = self.owner
        ids, rows = owner.policy.select_heads(owner, self.layer_idx, query)
        if rows is None:
            return [(owner.spans[i], 0) for i in ids], owner.policy.place(owner, ids), None
        shifts, heads = owner.policy.place_heads(owner, ids, rows)
        return [(owner.spans[i], 0) for i in ids], shifts, heads


class SlidingWindowLayer(TieredLayer):
    """Attends to exactly its window, at own positions: the model's own attention, whatever the policy."""

    is_sliding = True

    def __init__(self, owner: "TieredCache", layer_idx: int, *, sliding_window: int, **_layer_kwargs):
        super().__init__(owner, layer_idx)
        self.sliding_window = sliding_window

    def plan(self, query):
        first_needed = max(0, (self.num_tokens - query.shape[2]) - (self.sliding_window - 1))
        tail_start = self.num_tokens - self.keys.shape[1]
        return (sliding_spans(self.owner.spans, first_needed) if first_needed < tail_start else []), {}, None


# transformers' layer types -> the layer class that plans its working set
LAYER_KINDS: dict[str, type[TieredLayer]] = {"full_attention": FullAttentionLayer,
                                             "sliding_attention": SlidingWindowLayer}


def make_layers(owner: "TieredCache", text_config) -> list[TieredLayer]:
    types, kwargs = get_layer_types_and_kwargs(text_config)
    unknown = sorted(set(types) - set(LAYER_KINDS))
    if unknown:
        raise UnsupportedModelError(f"{text_config.model_type} has layers of type {unknown}; tieredkv pages "
                                    f"{sorted(LAYER_KINDS)} layers only")
    return [LAYER_KINDS[t](owner, i, **kw) for i, (t, kw) in enumerate(zip(types, kwargs))]


class TieredCache(Cache):
    """Pages of one growing context, with a working set per layer fetched through the store's tiers."""

    def __init__(self, model, store: PageStore, config: TieredConfig, *, fingerprint: str, page_size: int,
                 policy: PlacementPolicy | None = None, persist: bool = True):
        super().__init__(layers=make_layers(self, model.config.get_text_config(decoder=True)))
        self.model, self.store, self.config = model, store, config
        self.policy = policy if policy is not None else policy_for(config.position)
        self.page_size = page_size
        self.fingerprint = fingerprint  # regime fingerprint: what page keys hash
        self.token_ids: list[int] = []  # ids of unsealed tokens (filled by the embedding hook)
        # ids of each sealed page (int32; None for an attached page whose ids were not given: read from the store)
        self.sealed_ids: list[array.array | None] = []
        self.spans: list[Span] = []
        self.page_keys: list[str] = []
        self.layout: PageLayout | None = None
        self.index: PageIndex | None = None
        # sealed pages go to the store in batches; persist=False keeps them in memory only
        self.writer = PageWriter(store, max_pages=config.write_batch, persist=persist)
        # pages retrieved per (layer, forward), most recent only: bounded, a long session must not grow it
        self.retrieval_log: collections.deque[list[int]] = collections.deque(maxlen=16384)
        self.fetch_counts = {"device_hits": 0, "fetches": 0}
        self.prefetcher = Prefetcher(store)
        self._last_selection: dict[int, list[int]] = {}  # layer -> page ids of its previous working set
        self._prev_q: dict[int, int] = {}  # layer -> query tokens of its previous forward (none since a flush)
        self.blocks: dict[int, tuple[SlotKey, HeadPages]] = {}  # layer -> the per-head block its buffer holds
        # page id -> per layer (K, V), computed afresh at question time (tieredkv/question/reencode.py); full-attention
        # layers read these instead of the stored page, and always hold them in their working set
        self.reencoded: dict[int, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}
        self.reencoded_start: dict[int, int] = {}  # page id -> own position of its first re-encoded token
        # BM25 over page text, built at a question's first reading (tieredkv/question/reading.py)
        self.lexical_index = None
        # far pages a question chose by its words, attended instead of searching (TieredConfig.selection)
        self.held_pages: list[int] | None = None
        # layer -> each KV head's far pages as a question's attention ranked them (TieredConfig.selection=
        # "question", question_choice.py); None: the index searches
        self.question_ranking: dict[int, list[list[int]]] | None = None
        self.question_words: list[int] | None = None  # selection="hybrid": the pages' BM25 ranking, fused in

    # ------------------------------------------------------------------ bookkeeping
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[0].num_tokens

    @property
    def torn(self) -> bool:
        """A forward failed part-way (a page that failed verification, say): the layers hold different
        numbers of tokens, so that step cannot be sealed. The pages sealed before it are whole."""
        return len({layer.num_tokens for layer in self.layers}) > 1

    @property
    def sealed_upto(self) -> int:
        return self.spans[-1].end if self.spans else 0

    def note_input_ids(self, ids: list[int]) -> None:
        self.token_ids.extend(int(i) for i in ids)

    def _ensure_layout(self) -> PageLayout:
        if self.layout is None:
            ref = self.layers[0]
            self.layout = PageLayout(num_layers=len(self.layers), num_kv_heads=ref.keys.shape[0],
                                     head_dim=ref.keys.shape[-1], dtype=str(ref.dtype).replace("torch.", ""),
                                     page_size=self.page_size)
            self.index = PageIndex(len(self.layers), self.layout.num_kv_heads, self.layout.head_dim,
                                   method=self.config.summary, num_repr=self.config.num_repr)
        return self.layout

    # ------------------------------------------------------------------ sealing
    def _next_boundary(self) -> int:
        return (self.sealed_upto // self.page_size + 1) * self.page_size

    def seal_full_pages(self) -> None:
        """Seal every complete page held in the tails (called before a forward writes new K/V)."""
        while self.layers[0].is_initialized and self.get_seq_length() >= self._next_boundary():
            self._seal(self._next_boundary())

    def flush(self, *, partial: bool = True) -> None:
        """Seal complete pages, and the partial last page too when `partial`; write everything out."""
        self._prev_q.clear()  # the next step lays its working set out in order (see working_set)
        self.seal_full_pages()
        if partial and self.layers[0].is_initialized and self.get_seq_length() > self.sealed_upto:
            self._seal(self.get_seq_length())
        self.writer.flush()

    def _seal(self, end: int) -> None:
        layout = self._ensure_layout()
        start = self.sealed_upto
        n = end - start
        assert len(self.token_ids) >= n, "token ids missing: run the model through TieredModel (input_ids)"
        kv = [layer.drop_front(n) for layer in self.layers]
        ids, self.token_ids = self.token_ids[:n], self.token_ids[n:]
        parent = self.page_keys[-1] if self.page_keys else ROOT_KEY
        page = Page.seal(layout, self.fingerprint, parent, start, ids, [k for k, _ in kv], [v for _, v in kv])
        page_id = len(self.spans)
        self.sealed_ids.append(array.array("i", ids))
        self.spans.append(Span(page_id, start, end))
        self.page_keys.append(page.key)
        self.index.add(page_id, page_summaries(self.model, self.config, [k for k, _ in kv], start))
        self.writer.add(page)

    # ------------------------------------------------------------------ grafting
    def attach(self, page_keys: list[str], spans: list[Span], layout: PageLayout, index: PageIndex,
               token_ids: Sequence[int] | None = None) -> None:
        """Adopt already-stored pages as this context's past (own positions); nothing is copied yet.
        `token_ids`: the context's ids, if the caller holds them verified (else pages are read for them)."""
        assert not self.spans and not self.layers[0].is_initialized, "attach into a fresh cache only"
        self.page_keys, self.spans, self.layout, self.index = list(page_keys), list(spans), layout, index
        self.sealed_ids = [None if token_ids is None else array.array("i", token_ids[s.start:s.end]) for s in spans]
        n = spans[-1].end if spans else 0
        for layer in self.layers:
            layer.num_tokens = n
            layer.dtype, layer.device = layout.torch_dtype, torch.device(self.store.config.device)
            shape = (layout.num_kv_heads, 0, layout.head_dim)
            layer.keys = torch.empty(shape, dtype=layout.torch_dtype, device=layer.device)
            layer.values = torch.empty(shape, dtype=layout.torch_dtype, device=layer.device)
            layer.is_initialized = True

    def adopt_reencoded(self, fresh: dict[int, tuple[int, list]]) -> None:
        """Serve `fresh` (page id -> (own position of its first token, per layer (K, V) or None),
        tieredkv/question/reencode.py) to full-attention layers in place of the stored pages; a re-encoded
        page may hold only part of the page's tokens. Pages sealed from here on attend to them, not
        to the stored bytes: other bytes, so their keys hash a fingerprint that names them."""
        for page_id, (first, kv) in fresh.items():
            self.reencoded[page_id], self.reencoded_start[page_id] = kv, first
        blob = json.dumps({"regime": self.fingerprint, "reencoded": sorted(self.reencoded_start.items())},
                          sort_keys=True)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()

    def page_token_ids(self, page_id: int) -> list[int]:
        """Token ids of a sealed page (from memory, else from the store's verified page)."""
        ids = self.sealed_ids[page_id]
        if ids is None:
            ids = self.sealed_ids[page_id] = array.array("i", self.store.get(self.page_keys[page_id]).token_ids)
        return ids.tolist()

    # ------------------------------------------------------------------ the working set
    @property
    def num_written(self) -> int:
        """Sealed pages that are in the store (the rest wait in `writer.pending`)."""
        return len(self.page_keys) - len(self.writer.pending)

    def reads_reencoded(self, page_id: int, layer: int) -> bool:
        """Whether attention at `layer` reads the page's re-encoded K/V (full-attention layers only)."""
        return page_id in self.reencoded and not self.layers[layer].is_sliding

    def page_kv(self, page_id: int, layer: int, pin=frozenset()) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V ([Hkv, T, D]) of a sealed page at one layer, as attention reads them: re-encoded K/V
        for full-attention layers when the page was re-encoded, else the stored page (device tier,
        then host, then LMDB; `pin`: (key, layer) pairs the device tier must not evict meanwhile)."""
        if self.reads_reencoded(page_id, layer):
            return self.reencoded[page_id][layer]
        key = self.page_keys[page_id]
        if page_id >= self.num_written:
            page = self.writer.pending[page_id - self.num_written]
            return page.layer_kv(layer, device=self.layers[layer].device)
        self._before_fetch([page_id], [key], layer)
        return self.store.fetch_layer(key, layer, pin=pin)

    def _before_fetch(self, page_ids: list[int], keys: list[str], layer: int) -> None:
        """Count stored pages' fetches at one layer, wait for each one's prefetch unless the device tier holds it."""
        counts, contains, wait = self.fetch_counts, self.store.device_tier.contains, self.prefetcher.wait
        debug = log.isEnabledFor(logging.DEBUG)
        counts["fetches"] += len(keys)
        for page_id, key in zip(page_ids, keys):
            hit = contains((key, layer))
            if hit:
                counts["device_hits"] += 1
            else:
                wait(key)
            if debug:
                log.debug("layer %d: page %d %s", layer, page_id, "on the device" if hit else "fetched from host/LMDB")

    def working_set(self, layer_idx: int, query: torch.Tensor, kind: str) -> tuple[Any, Any, Any]:
        """K, V ([1, Hkv, kv, D]) and mask for `query` ([1, Hq, q, D]) at this layer.

        The layer's buffer keeps the previous working set in place: only pages that joined the
        selection, or moved in it, are fetched and copied (kv_buffer.py). With `retrieval="per_head"`
        each KV head's own pages make one slot between the sink and the local window (head_block.py):
        head h's rows hold head h's pages, and every query sees all of them (far pages precede every
        query, so the mask needs no per-head rows)."""
        layer = self.layers[layer_idx]
        q = query.shape[2]
        end = layer.num_tokens
        parts, shifts, heads = self._plan_or_reuse(layer, query)
        self._prefetch_for(layer_idx + 1)
        buffer = layer.buffer
        # NOTE: in place only when this layer's previous forward was a decode step too: the first step
        # after a prefill chunk, a graft or an ingest lays the working set out in position order, so what
        # follows depends on the tokens and selections only, never on how the context was reached
        # (a graft continues torch.equal to a fresh run)
        in_place = (q == 1 and self._prev_q.get(layer_idx) == 1 and self.retrieving and self.policy.slots_in_place
                    and not layer.is_sliding)
        self._prev_q[layer_idx] = q
        items: list[tuple[Span, int] | HeadPages] = list(parts)
        if self.reencoded:
            wanted = [self._slot_key(s, off, shifts.get(s.page_id, 0), layer_idx) for s, off in parts]
        else:  # `_slot_key` of stored pages, without a call per page
            wanted = [SlotKey(s.start, s.end, off, shifts.get(s.page_id, 0) if shifts else 0, 0) for s, off in parts]
        if heads is not None:
            heads = head_block.update_in_place(self, layer_idx, heads) if in_place else heads
            at = sum(1 for s, _ in parts if s.page_id < self.local_first)  # after the shared far pages
            items.insert(at, heads)
            wanted.insert(at, head_block.block_key(self.spans, heads))
        self._last_selection[layer_idx] = sorted({s.page_id for s, _ in parts}.union(heads.union() if heads else ()))
        buffer.arrange(wanted, lambda idx: self._fill([items[i] for i in idx], shifts, layer_idx),
                       in_order=not in_place)
        if heads is not None:
            self.blocks[layer_idx] = (wanted[at], heads)
        k_all, v_all, k_pos = buffer.views()
        q_pos = torch.arange(end - q, end, device=query.device)
        mask = build_mask(q_pos, k_pos, sliding_window=layer.sliding_window, kind=kind, dtype=query.dtype,
                          q_offset=end - q)
        return k_all, v_all, mask

    def _plan_or_reuse(self, layer: TieredLayer, query: torch.Tensor):
        """`layer.plan(query)`, or with `config.reuse_steps` (approximate) a full-attention layer's previous
        plan for a decode step: at most that many steps after a search, while the query stays close to the
        one that searched (cosine >= REUSE_MIN_COSINE) and no page was sealed since."""
        steps = self.config.reuse_steps
        if not steps or query.shape[2] != 1 or layer.is_sliding or not self.retrieving:
            return layer.plan(query)
        q = query.reshape(-1).float()  # [Hq * D]
        plans = self.__dict__.setdefault("_reuse_plans", {})  # layer -> its last searched plan
        prev = plans.get(layer.layer_idx)
        if (prev is not None and prev["num_pages"] == len(self.spans) and prev["age"] < steps
                and float(torch.nn.functional.cosine_similarity(q, prev["query"], dim=0)) >= REUSE_MIN_COSINE):
            prev["age"] += 1
            self.fetch_counts["reused_plans"] = self.fetch_counts.get("reused_plans", 0) + 1
            return prev["plan"]
        plan = layer.plan(query)
        plans[layer.layer_idx] = {"plan": plan, "query": q, "num_pages": len(self.spans), "age": 0}
        return plan

    def _slot_key(self, s: Span, off: int, shift: int, layer_idx: int) -> SlotKey:
        """What the slot of page span `s` (from token `off` on) holds at this layer. NOTE: own positions;
        a re-encoded page may hold only some of its tokens ([reencoded_start, + its length))."""
        if not self.reads_reencoded(s.page_id, layer_idx):
            return SlotKey(s.start, s.end, off, shift, 0)
        kv = self.reencoded[s.page_id]
        first = self.reencoded_start[s.page_id]
        source = self.layers[layer_idx].buffer.source_id(kv)
        return SlotKey(first, first + kv[layer_idx][0].shape[1], off, shift, source)

    def _fill(self, items: list[tuple[Span, int] | HeadPages], shifts: dict[int, int], layer_idx: int) -> SlotKVs:
        """K, V ([Hkv, n, D]) of each item as attention reads it: a page (`_slot_kv`) or a per-head block."""
        pages = [i for i, item in enumerate(items) if not isinstance(item, HeadPages)]
        if len(pages) == len(items):
            return self._slot_kv(items, shifts, layer_idx)
        out: list = [None] * len(items)
        for i, kv in zip(pages, self._slot_kv([items[i] for i in pages], shifts, layer_idx) if pages else ()):
            out[i] = kv
        for i, item in enumerate(items):
            if isinstance(item, HeadPages):
                out[i] = head_block.block_kv(self, item, layer_idx)
        return out

    def _slot_kv(self, parts: list[tuple[Span, int]], shifts: dict[int, int], layer_idx: int) -> SlotKVs:
        """K, V ([Hkv, n, D]) of `parts` as attention reads them: from `offset` on, keys moved by their shift.
        Stacked (`SlotKVs`) when they are whole stored pages of one size on a CPU store (`_stacked_pages`)."""
        stacked = self._stacked_pages(parts, shifts, layer_idx)
        if stacked is not None:
            return stacked
        ks, vs = [], []
        for (_, off), (k, v) in zip(parts, self.page_kvs([s.page_id for s, _ in parts], layer_idx)):
            ks.append(k[:, off:] if off else k), vs.append(v[:, off:] if off else v)
        if shifts:
            self._rerotate_parts(ks, [shifts.get(s.page_id, 0) for s, _ in parts], layer_idx)
        return list(zip(ks, vs))

    def _stacked_pages(self, parts: list[tuple[Span, int]], shifts: dict[int, int], layer_idx: int
                       ) -> PageLayers | None:
        """K, V of `parts` ([n, 2, Hkv, T, D], unjoined) through one `PageStore.layer_parts` when they are stored
        pages of T tokens each, read whole at own positions from a CPU store; else None. The working-set buffer
        copies each page's bytes straight from the host tier's payload.

        NOTE: a retrieving decode step at 1M tokens brings ~25 new pages per layer; through `fetch_layers`
        each cost a device-tier entry (views of the host page, its LRU order, an eviction) before the buffer
        copied it again. On a CPU store the buffer is the device copy, so the pages skip the device tier: the
        same bytes, a fraction of the calls (lab/2026-12-07-flat-decode). A CUDA store keeps `fetch_layers`
        (its device tier saves a host-to-device copy when a page comes back)."""
        if shifts or self.reencoded or not parts or self.store.device_tier.device.type != "cpu":
            return None
        first, written = parts[0][0], self.num_written
        t = first.end - first.start
        if any(off or s.end - s.start != t or s.page_id >= written for s, off in parts):
            return None
        keys = [self.page_keys[s.page_id] for s, _ in parts]
        self.fetch_counts["fetches"] += len(keys)
        contains, wait = self.store.host_tier.contains, self.prefetcher.wait
        for key in keys:
            if not contains(key):
                wait(key)
        return self.store.layer_parts(keys, layer_idx)

    def page_kvs(self, page_ids: list[int], layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`page_kv` of each page at one layer, the device tier holding all of them at once: the stored pages
        through one `PageStore.fetch_layers` (the same bytes as one `fetch_layer` per page, fewer calls)."""
        written, keys = self.num_written, self.page_keys
        out: list = [None] * len(page_ids)
        if not self.reencoded and (not page_ids or max(page_ids) < written):
            stored: Sequence[int] = range(len(page_ids))  # every page from the store (a decode step's case)
        else:
            stored = []  # indices of `page_ids` read from the store
            for i, page_id in enumerate(page_ids):
                if self.reads_reencoded(page_id, layer) or page_id >= written:
                    out[i] = self.page_kv(page_id, layer)
                else:
                    stored.append(i)
        if not stored:
            return out
        fetch = [keys[page_ids[i]] for i in stored]
        self._before_fetch([page_ids[i] for i in stored], fetch, layer)
        # the other pages' stored entries stay too, as they did when each page was fetched with all of them pinned
        pin = {(keys[p], layer) for p in page_ids if p < len(keys)} if len(stored) < len(page_ids) else ()
        for i, kv in zip(stored, self.store.fetch_layers(fetch, layer, pin=pin)):
            out[i] = kv
        return out

    def last_selection(self, layer_idx: int) -> list[int]:
        """Page ids of the layer's most recent working set (sealed pages only), position order."""
        return list(self._last_selection.get(layer_idx, ()))

    def _rerotate_parts(self, ks: list[torch.Tensor], shifts: list[int], layer_idx: int) -> None:
        """Move the keys of every part with a non-zero shift, in place in `ks`, in one rotation: one
        call per layer instead of one per page (elementwise, so the bytes are the same either way)."""
        from tieredkv.engine.rotary import rerotate

        moved = [j for j, d in enumerate(shifts) if d]
        if not moved:
            return
        sizes = [ks[j].shape[1] for j in moved]
        rotated = rerotate(self.model, torch.cat([ks[j] for j in moved], dim=1), [shifts[j] for j in moved],
                           layer_idx, sizes=sizes)
        for j, piece in zip(moved, rotated.split(sizes, dim=1)):
            ks[j] = piece

    def _prefetch_for(self, layer_idx: int) -> None:
        """Start reading what `layer_idx` used last time, while this layer computes."""
        self.prefetcher.admit_ready()
        ids = self._last_selection.get(layer_idx % len(self.layers), ())
        written = self.num_written
        self.prefetcher.submit(self.page_keys[i] for i in ids if i < written)

    def close(self) -> None:
        self.prefetcher.close()

    @property
    def retrieving(self) -> bool:
        """More sealed pages than one working set holds: attention retrieves (and `fixed` moves pages)."""
        return len(self.spans) > self.config.capacity_pages

    @property
    def local_first(self) -> int:
        """The first page of the local window."""
        return max(0, len(self.spans) - self.config.local_pages)
