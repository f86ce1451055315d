"""Configuration of the retrieval-streamed attention (what goes into the working set)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

POSITION_POLICIES = ("own", "fixed")
AUTO = "auto"  # TieredConfig(position=AUTO).resolve(model, num_tokens) picks one of POSITION_POLICIES
SCORE_FRAMES = ("attended", "own")
TOPK_DEFAULTS = {"own": 16, "fixed": 8}
REUSE_MIN_COSINE = 0.95  # see TieredConfig.reuse_steps
READING_SIGNALS = ("attention", "lexical", "hybrid")
RETRIEVAL_MODES = ("union", "per_head")  # see TieredConfig.retrieval
SELECTIONS = ("attention", "lexical", "question", "hybrid")  # see TieredConfig.selection
QUESTION_SELECTIONS = ("question", "hybrid")  # ranked by the question's attention (engine/question_choice.py)
MAX_PAGE_SIZE = 1 << 16  # tokens per page: far above any useful page (the default is 128)
MAX_COUNT = 1 << 24  # any other count of pages, steps or summaries: far above any useful one


def check_ints(obj, bounds: dict[str, tuple[int, int]]) -> None:
    """Each named field of `obj` an int (not a bool) in [low, high], or None where its default is None."""
    for name, (low, high) in bounds.items():
        value, optional = getattr(obj, name), getattr(type(obj), name, 0) is None  # the class holds the default
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{type(obj).__name__}.{name} must be an int in {low}..{high}"
                             f"{' (or None)' if optional else ''}, got {value!r}")


@dataclass(frozen=True)
class ReadingConfig:
    """How a question reads a long context (`TieredConfig.reading`, tieredkv/question/reading.py)."""

    passages: int = 1  # places in the document the question reads
    passage_tokens: int = 512  # tokens read around each place, centred where the question's words are densest
    signal: str = "lexical"  # how pages are ranked: "lexical", "attention", or "hybrid" (both, fused by rank)
    # The context's first tokens that frame it (a chat template's header and instructions): read before
    # the passages. None: the sink pages.
    frame_tokens: int | None = None
    # Places considered: with more than `passages`, the model judges which to read (the question most
    # likely after the passage; one forward per candidate). 1: the signal's best places, unjudged.
    candidates: int = 1
    # The lexical signal scores runs of this many consecutive pages, each as one passage (BM25 over their
    # joined text), so that a place where several of the question's words meet outranks a page where one of
    # them repeats. None: as many pages as one passage spans; 1: each page alone.
    run_pages: int | None = None
    # The lexical signal matches words by a light stem (index.lexical.stem: "harpooned" meets "harpoon").
    stemmed: bool = False
    # With one passage and no judge, read a second where the next place (the best run that does not overlap the
    # first) scores at least this share of the first's BM25: where the question's words meet about as well in
    # two places, it reads both. None: one passage always. The lexical signal only.
    second_at: float | None = None

    def __post_init__(self):
        check_ints(self, {"passages": (1, MAX_COUNT), "passage_tokens": (1, MAX_COUNT),
                          "frame_tokens": (0, MAX_COUNT), "candidates": (1, MAX_COUNT),
                          "run_pages": (1, MAX_COUNT)})
        if self.signal not in READING_SIGNALS:
            raise ValueError(f"reading signal must be one of {READING_SIGNALS}, got {self.signal!r}")
        if not isinstance(self.stemmed, bool):
            raise ValueError(f"reading stemmed must be True or False, got {self.stemmed!r}")
        s = self.second_at
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1):
            raise ValueError(f"reading second_at must be None or a share in (0, 1], got {s!r}")


@dataclass(frozen=True)
class TieredConfig:
    """Working set per full-attention layer and query chunk:

        [ sink pages ][ top-k retrieved pages ][ local pages ][ unsealed tail + current chunk ]

    When every sealed page fits (`<= sink + topk + local` pages) the working set is the whole
    context in position order and attention is exactly the model's own. Sliding-window layers
    always see exactly their window.

    position: "own" keeps every key at its absolute position (exact; the default inside the
    model's window). "fixed" re-rotates sink and retrieved pages so they sit right before the
    local window (InfLLM-style; approximate; meant for contexts beyond the window).

    score_frame (only with position="fixed"): where retrieval places a page when it scores it
    against the queries. "attended" (the default) scores it at the distance attention will give it,
    right before the local window, as InfLLM does: page summaries are taken over keys moved to
    page-relative positions, and queries are moved to match. "own" scores it at its own distance,
    which beyond the window is a distance the model never saw in training (the earlier behaviour,
    kept to measure the difference: bench/passkey.py --score-frame).
    """

    page_size: int | None = None  # None: the model's default (128 for smollm2)
    # Prefill chunk = chunk_pages pages, cut at multiples of its size. NOTE: with more than one
    # page per chunk, a page's bytes also depend on where the document's last chunk ends, which
    # page keys do not cover: ingesting a document that extends an earlier one in the same store
    # can then raise PageConflictError. 1 (the default) keeps keys sound; 4 prefills ~1.7x faster.
    chunk_pages: int = 1
    sink_pages: int = 1
    local_pages: int = 16
    # Per KV head (see `retrieval`). None: the policy's default,
    # TOPK_DEFAULTS. Under "own" more pages is closer to exact; under "fixed" (beyond the window)
    # more retrieved filler drowns the answer: for smollm2 at 16K top-8 answered passkeys that
    # top-15 and top-16 did not (lab/2026-11-29-passkey-runs/passkey-16k-diagnosis).
    topk_pages: int | None = None
    summary: str = "minmax"
    num_repr: int = 4
    position: str = "own"
    # Whom a KV head's retrieved pages are for, while the context retrieves:
    # "union": every head of a layer attends to the union of the KV heads' top-k (up to Hkv x top-k
    #   pages; how many depends on how much the heads agree, so the working set grows with the context);
    # "per_head": each KV head attends to its own top-k only (Quest), beside the shared sink and local
    #   pages: a working set of exactly sink + top-k + local pages per head at every context length.
    # Approximate either way; the two attend to other keys, so pages sealed under them are other bytes.
    retrieval: str = "union"
    # retrieval="union" only, approximate: the most retrieved pages a layer's union may hold. None (the
    # default): no cap, up to Hkv x top-k. Else the union is filled by rank, each KV head's best page
    # first, then each head's second, and so on, until it holds `union_pages` pages: a working set of at
    # most sink + union_pages + local pages at every context length, in which every head still reads its
    # best pages and all heads' pages together (lab/NOTEBOOK.md measures speed, docs/RESULTS.md answers).
    union_pages: int | None = None
    # Approximate, while the context retrieves: how a question over a sealed context (right after ingest or
    # graft) chooses the far pages its layers attend to. "attention" (the default): each forward scores the
    # pages' key summaries against its queries, per layer (and KV head). "lexical": once per question, the
    # pages whose text best matches the question's words (BM25 over the pages' text) are held in every
    # layer's working set for all KV heads while the question and its answer run, with the sink and local
    # pages, as many as one head reads under `retrieval` (`held_pages`); no index search per step. "question"
    # (SnapKV, per page): at the question's forward each layer scores every page's keys against the question's
    # queries (softmax over the document) and each KV head ranks the far pages by the attention they get; the
    # ranking is held while the question and its answer run (engine/question_choice.py). "hybrid": that
    # ranking fused by rank with the pages' BM25 ranking for the question's words. Ingest is unchanged either
    # way (the stored pages are the same bytes).
    selection: str = "attention"
    score_frame: str = "attended"
    write_batch: int = 16  # sealed pages written to the store per LMDB transaction
    # "fixed" only, approximate: before a prompt is answered over a sealed context that retrieves
    # (right after ingest or graft), the sink and the `reencode_pages` pages the prompt retrieves
    # most are computed afresh together, at the positions `fixed` packs them to (tieredkv/question/reencode.py).
    # Nothing stored changes. 0 (the default): off.
    reencode_pages: int = 0
    # Approximate: before a prompt is answered over a sealed context (right after ingest or graft), find the
    # passages it is about and read them afresh right before it (tieredkv/question/reading.py), under either
    # position policy. None: off (attention over the stored pages; exact under "own" while the context fits
    # the working set).
    reading: ReadingConfig | None = None
    # Approximate, off by default (0): a decode step (one query token) may attend to a full-attention
    # layer's previous selection instead of searching again, for up to `reuse_steps` steps after a
    # search, while the layer's query stays within cosine REUSE_MIN_COSINE of the query that searched
    # and no page was sealed meanwhile (tiered_cache.py). Saves the search and the page copies of a
    # changed selection; lab/2026-12-01-reuse_selection/ measured what it does to answers.
    reuse_steps: int = 0

    def __post_init__(self):
        from index import SUMMARY_METHODS

        if self.position not in (*POSITION_POLICIES, AUTO):
            raise ValueError(f"position must be one of {(*POSITION_POLICIES, AUTO)}, got {self.position!r}")
        if self.topk_pages is None and self.position != AUTO:
            object.__setattr__(self, "topk_pages", TOPK_DEFAULTS[self.position])  # frozen: resolve once
        check_ints(self, {"page_size": (1, MAX_PAGE_SIZE), "chunk_pages": (1, MAX_COUNT), "sink_pages": (0, MAX_COUNT),
                          "local_pages": (1, MAX_COUNT), "topk_pages": (0, MAX_COUNT), "num_repr": (1, MAX_COUNT),
                          "write_batch": (1, MAX_COUNT), "reencode_pages": (0, MAX_COUNT),
                          "reuse_steps": (0, MAX_COUNT)})
        if self.reading is not None and not isinstance(self.reading, ReadingConfig):
            raise ValueError(f"reading must be a ReadingConfig (or None: off), got {self.reading!r}")
        if self.summary not in SUMMARY_METHODS:
            raise ValueError(f"summary must be one of {SUMMARY_METHODS}, got {self.summary!r}")
        if self.retrieval not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval must be one of {RETRIEVAL_MODES}, got {self.retrieval!r}")
        if self.union_pages is not None and (isinstance(self.union_pages, bool) or not isinstance(self.union_pages, int)
                                             or self.union_pages < 1 or self.retrieval != "union"):
            raise ValueError(f"union_pages caps retrieval='union' and must be an int >= 1 (or None: no cap), got "
                             f"{self.union_pages!r} with retrieval={self.retrieval!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.score_frame not in SCORE_FRAMES:
            raise ValueError(f"score_frame must be one of {SCORE_FRAMES}, got {self.score_frame!r}")
        if self.reading is not None and self.reencode_pages:
            raise ValueError("reading replaces reencode_pages: give one")
        if self.reencode_pages and self.position == "own":
            raise ValueError(f"reencode_pages is for position='fixed' only "
                             f"(got {self.reencode_pages} with position={self.position!r})")

    def resolve(self, model, num_tokens: int) -> "TieredConfig":
        """A concrete config for a context of `num_tokens` (document, question and answer) on `model`.

        position "auto": own positions (exact) when the context fits the model's trained window or
        its keys cannot be moved (learned positions), else the fixed-distance policy. Fields left at
        None take the chosen policy's defaults (TOPK_DEFAULTS). A concrete config is returned as is."""
        if self.position != AUTO:
            return self
        window = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
        fits = window is None or num_tokens <= window
        position = "own" if fits or not _can_move_keys(model) else "fixed"
        if position == "own" and self.reencode_pages:
            raise ValueError(f"reencode_pages={self.reencode_pages}: re-encoding is for the fixed policy, and "
                             f"{num_tokens:,} tokens fit this model's window ({window:,}): own positions apply")
        # topk_pages, if None, takes the chosen policy's default; reading applies under either policy
        return replace(self, position=position)

    @property
    def capacity_pages(self) -> int:
        return self.sink_pages + self.topk_pages + self.local_pages

    @property
    def relative_scoring(self) -> bool:
        """Summaries over page-relative keys and moved queries (fixed policy, attended frame)."""
        return self.position == "fixed" and self.score_frame == "attended"

    def working_set_pages(self, num_kv_heads: int) -> int:
        """The most pages one layer's working set can read: every KV head's top-k may differ (with
        either `retrieval`; `union_pages` caps the union), so a device tier of this many pages (all
        layers) never evicts mid-forward."""
        retrieved = num_kv_heads * self.topk_pages
        if self.union_pages is not None:
            retrieved = min(retrieved, self.union_pages)
        return self.sink_pages + self.local_pages + retrieved

    def held_pages(self, num_kv_heads: int) -> int:
        """How many far pages a question holds under selection="lexical": what one KV head reads at most
        under `retrieval` (per_head: its top-k; union: the union's most, Hkv x top-k or `union_pages`)."""
        if self.retrieval == "per_head":
            return self.topk_pages
        return self.working_set_pages(num_kv_heads) - self.sink_pages - self.local_pages

    def regime(self, page_size: int) -> dict:
        """What decides the K/V bytes of pages sealed under this config."""
        d = asdict(self)
        d.pop("write_batch")
        d.pop("reencode_pages")  # question-time only: the stored pages are the same bytes
        d.pop("reading")
        d.pop("selection")  # question-time only, like reading
        if not self.reuse_steps:
            d.pop("reuse_steps")  # exact selection: what regimes recorded before the field existed
        if self.retrieval == "union":
            d.pop("retrieval")  # what regimes recorded before the field existed
        if self.union_pages is None:
            d.pop("union_pages")  # no cap: what regimes recorded before the field existed
        if self.position != "fixed" or self.score_frame == "own":
            # no effect under "own"; "own" is what fixed-policy regimes recorded before the field existed
            d.pop("score_frame")
        d["page_size"] = page_size
        return d

    def regime_fingerprint(self, model_fingerprint: str, page_size: int) -> str:
        """Page keys of tiered contexts hash this instead of the bare model fingerprint: pages computed
        with retrieval attention are other bytes than a full-attention deposit of the same tokens."""
        return regime_fingerprint(model_fingerprint, self.regime(page_size))


def regime_fingerprint(model_fingerprint: str, regime: dict) -> str:
    """What the page keys of a context sealed under `regime` (a `TieredConfig.regime` record) hash."""
    blob = json.dumps({"model": model_fingerprint, "regime": regime}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def stored_under(recorded: dict, current: dict) -> bool:
    """Whether pages sealed under regime `recorded` are the bytes an ingest under `current` would seal.
    `reuse_steps` changes one-token decode steps only, never a prefill chunk: a context ingested
    without it serves a config with it (tests/engine/test_decode_reuse.py). The converse is not assumed: a
    context recorded with it may hold pages sealed from approximate decode steps."""
    if "reuse_steps" not in recorded:
        current = {k: v for k, v in current.items() if k != "reuse_steps"}
    return recorded == current


def _can_move_keys(model) -> bool:
    """Whether the fixed-distance policy can re-rotate this model's keys (no: learned positions)."""
    from tieredkv.engine.rotary import rotary_module
    from tieredkv.errors import UnsupportedModelError

    try:
        rotary_module(model)
        return True
    except UnsupportedModelError:
        return False
