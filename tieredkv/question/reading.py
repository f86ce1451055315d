"""Question-time reading (fixed policy; approximate): find where in a long document a question's
answer is, and read those passages afresh, together, right before the question.

    rank     the document's pages, over the stored pages, by
               lexical    BM25 of the question's words over the text (its token ids, decoded) of each run
                          of consecutive pages as long as a passage, the run named by its first page
               attention  a probe forward of the question over a throwaway copy of the context: how
                          many layers retrieve the page (each layer: the union of its KV heads' top-k
                          by the page index, as attention itself retrieves)
               hybrid     both, fused by reciprocal rank (Cormack et al. 2009)
    place    in the best page of each of the best `passages` runs (by BM25 over pages alone; for the
             attention signals, each of the best pages), the point where the question's words are densest
             (each matching word weighted by its BM25 idf); a passage is the `passage_tokens` tokens
             centred there, which may reach into the neighbouring pages
    read     the context's frame (its first `frame_tokens` tokens, else the sink page) and the
             passages, computed afresh by the model in document order and packed right before the
             question, so that the question reads them as one short document; attention then sees
             exactly those tokens and the question's own (`CompactReading`)

Nothing stored changes: the re-encoded K/V live in the cache for this context only
(`TieredCache.reencoded`), and the question's pages are keyed under a fingerprint that names them.
This is GemFilter's and InfiniRetri's "select, then re-read the selection", with the selection made
over the memory tier's own pages. bench/longdoc_qa.py measures it, and each signal's ranks
("signals"): for the 135M embedded model the lexical signal finds the answer page first for nearly
every question, the attention signals rarely do, and fusing them loses to lexical alone.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from tieredkv.engine.placement import PlacementPolicy
from tieredkv.engine.tiered_config import ReadingConfig  # noqa: F401  (re-exported)
from tieredkv.engine.working_set import far_pages, fuse
from tieredkv.question.reencode import attention_votes

_WORD = re.compile(r"[a-z0-9_]+")


@dataclass
class Reading:
    """What one question read: its passages, and how the signal ranked the pages."""

    passages: list[tuple[int, int]]  # token ranges [first, end) read, own positions, document order
    pages: list[int]  # the pages those ranges touch
    ranked: list[int]  # pages the signal scored (lexical: the first page of each run), best first
    attention_votes: dict[int, int] = field(default_factory=dict)
    lexical_scores: dict[int, float] = field(default_factory=dict)
    # the places the model judged (ReadingConfig.candidates > passages), best place first, and their scores
    candidates: list[tuple[int, int]] = field(default_factory=list)
    likelihoods: list[float] = field(default_factory=list)

    def to_dict(self, top: int = 16) -> dict:
        d = asdict(self)
        d["ranked"] = self.ranked[:top]
        d["attention_votes"] = [[p, n] for p, n in sorted(self.attention_votes.items(), key=lambda kv: -kv[1])[:top]]
        d["lexical_scores"] = [[p, round(s, 3)] for p, s in
                               sorted(self.lexical_scores.items(), key=lambda kv: -kv[1])[:top]]
        return d


# ----------------------------------------------------------------------------- the signals
def lexical_index(cache, codec, stemmed: bool = False):
    """BM25 over the text of every sealed page of `cache` (words `stemmed` or as they are), built at a
    context's first question."""
    from index.lexical import BM25Index

    index = cache.lexical_index
    if index is None or len(index) != len(cache.spans) or index.stemmed != stemmed:
        texts = [codec.decode(cache.page_token_ids(p)) for p in range(len(cache.spans))]
        index = cache.lexical_index = BM25Index(texts, stemmed=stemmed)
    return index


def lexical_scores(cache, candidates: Sequence[int], query: str, codec, stemmed: bool = False) -> dict[int, float]:
    """Page id -> BM25 of `query`'s words over the page's text (pages where none occurs are left out)."""
    scores = lexical_index(cache, codec, stemmed).scores(query)
    return {p: float(scores[p]) for p in candidates if scores[p] > 0}


def lexical_runs(cache, candidates: Sequence[int], query: str, codec, run: int, stemmed: bool = False
                 ) -> dict[int, float]:
    """First page -> BM25 of `query`'s words over the run of `run` pages from it, for runs starting at a candidate
    (runs where none occurs are left out; with fewer pages than `run`, the one run of them all)."""
    scores = lexical_index(cache, codec, stemmed).run_scores(query, run)
    return {p: float(scores[p]) for p in candidates if p < len(scores) and scores[p] > 0}


def lexical_pages(cache, query: str, k: int, codec) -> list[int] | None:
    """The `k` far pages (not sink, not local) whose text best matches `query` (BM25), in position order;
    None where no far page holds one of its words (attention then searches as usual)."""
    return sorted(lexical_ranking(cache, query, codec)[:k]) or None


def lexical_ranking(cache, query: str, codec) -> list[int]:
    """The far pages (not sink, not local) that hold one of `query`'s words, best BM25 first (ties: the earlier)."""
    c = cache.config
    scores = lexical_scores(cache, far_pages(len(cache.spans), sink=c.sink_pages, local=c.local_pages), query, codec)
    return sorted(scores, key=lambda p: (-scores[p], p))


def rank(candidates: Sequence[int], votes: dict[int, int] | None, lexical: dict[int, float] | None,
         signal: str) -> list[int]:
    """The candidates that `signal` scored, best first (pages no signal scored are left out)."""
    by_votes = sorted((p for p in candidates if votes and votes.get(p)), key=lambda p: (-votes[p], p))
    by_words = sorted((p for p in candidates if lexical and lexical.get(p, 0) > 0), key=lambda p: (-lexical[p], p))
    first = {"attention": [by_votes], "lexical": [by_words], "hybrid": [by_votes, by_words]}[signal]
    return fuse(first) if len(first) > 1 else list(first[0])


# ----------------------------------------------------------------------------- passages
def word_weights(token_texts: Sequence[str], weights: dict[str, float], term=lambda w: w) -> np.ndarray:
    """[T] per token: the summed weight of the question's words (by their `term`) that start in it."""
    text, starts = "", []
    for t in token_texts:
        starts.append(len(text))
        text += t
    out = np.zeros(len(token_texts))
    for m in _WORD.finditer(text.lower()):
        w = weights.get(term(m.group()))
        if w:
            out[np.searchsorted(starts, m.start(), side="right") - 1] += w
    return out


def centre(weights: Sequence[float], width: int) -> int:
    """The index whose surrounding `width` tokens hold the most weight, nearer tokens counting more (so a
    lone word is its own centre, and a cluster's centre is its middle); the middle when nothing weighs."""
    weights = np.asarray(weights, dtype=np.float64)
    if not weights.any():
        return len(weights) // 2
    half = max(1, width // 2)
    kernel = np.exp(-2.0 * (np.arange(-half, half + 1) / half) ** 2)  # a Gaussian, sigma = width / 4
    around = np.convolve(weights, kernel, mode="full")[half:half + len(weights)]  # [T]: centred on each token
    return int(np.argmax(around))


def places(cache, ranked: Sequence[int], query: str, count: int, width: int, codec, *,
           first: int, end: int, run: int = 1, stemmed: bool = False) -> list[tuple[int, int]]:
    """Token ranges [a, b) (own positions, within [first, end)) of up to `count` passages of `width` tokens,
    best run first (`ranked`: the first page of each run of `run` pages): each centred where the question's
    words are densest in and around the run's best page (BM25 over pages alone; ties: the earlier page).
    A run that overlaps a passage already placed is passed over (the places read are distinct)."""
    return [r for r, _ in placed_runs(cache, ranked, query, count, width, codec, first=first, end=end, run=run,
                                      stemmed=stemmed)]


def placed_runs(cache, ranked: Sequence[int], query: str, count: int, width: int, codec, *,
                first: int, end: int, run: int = 1, stemmed: bool = False) -> list[tuple[tuple[int, int], int]]:
    """`places`, each with the first page of the run it was placed in."""
    index = lexical_index(cache, codec, stemmed)
    terms = {index.term(w) for w in _WORD.findall(query.lower())} - {None}
    weights = {t: index.idf.get(t, 0.0) for t in terms}
    page_scores = index.scores(query) if run > 1 else None
    spans, out = cache.spans, []
    for r in ranked:
        if len(out) == count:
            break
        last = min(len(spans), r + run) - 1
        if any(a < spans[last].end and spans[r].start < b for (a, b), _ in out):
            continue
        p = r if page_scores is None else max(range(r, last + 1), key=lambda q: (page_scores[q], -q))
        lo_page, hi_page = max(0, p - 1), min(len(spans), p + 2)
        ids = [t for q in range(lo_page, hi_page) for t in cache.page_token_ids(q)]
        around = spans[lo_page].start  # own position of ids[0]
        dense = word_weights([codec.decode([t]) for t in ids], weights, index.term)
        # the centre lies in page p (its neighbours only widen the window the passage may use)
        c = spans[p].start - around + centre(dense[spans[p].start - around:spans[p].end - around], width)
        a = max(first, min(around + c - width // 2, end - width))
        out.append(((a, min(end, a + width)), r))
    return out


def span_ids(cache, first: int, end: int) -> list[int]:
    """The context's token ids at own positions [first, end), from its pages."""
    return [t for sp in cache.spans if sp.end > first and sp.start < end
            for t in cache.page_token_ids(sp.page_id)[max(0, first - sp.start):end - sp.start]]


def likelihoods(cache, frame: int, ranges: Sequence[tuple[int, int]], prompt_ids: Sequence[int]) -> list[float]:
    """Per range: the summed log-probability of `prompt_ids` after the context's frame and that range, by the
    plain model (one forward each): how well the passage leads to the question (query likelihood, as in
    Sachan et al. 2022's unsupervised passage re-ranking)."""
    import torch

    model, head, n = cache.model, span_ids(cache, 0, frame), len(prompt_ids)
    target = torch.tensor(list(prompt_ids), device=model.device)
    out = []
    for a, b in ranges:
        ids = head + span_ids(cache, a, b) + list(prompt_ids)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], device=model.device), logits_to_keep=n + 1).logits[0]
        logp = torch.log_softmax(logits[:-1].float(), dim=-1)  # row i predicts prompt_ids[i]
        out.append(float(logp.gather(1, target[:, None]).sum()))
    return out


def merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ranges joined."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def fragments(spans, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(page id, first, end) per page that `ranges` touch, document order; one fragment per page
    (two ranges in one page are read as the span from the first's start to the second's end)."""
    per_page: dict[int, list[int]] = {}
    for a, b in ranges:
        for s in spans:
            lo, hi = max(a, s.start), min(b, s.end)
            if lo < hi:
                f = per_page.setdefault(s.page_id, [lo, hi])
                f[0], f[1] = min(f[0], lo), max(f[1], hi)
    return [(p, lo, hi) for p, (lo, hi) in sorted(per_page.items())]


# ----------------------------------------------------------------------------- reading
class CompactReading(PlacementPolicy):
    """Attention over exactly the re-encoded tokens (already at their packed positions) and the pages
    sealed after the document (the question's own): no retrieval, no local window."""

    name = "compact"

    def __init__(self, document_pages: int):
        self.document_pages = document_pages

    def select(self, ctx, layer_idx, query):
        return sorted({*ctx.reencoded, *range(self.document_pages, len(ctx.spans))})

    def place(self, ctx, page_ids):
        return {}  # re-encoded keys were computed where they sit; the question's pages are at their own


def run_pages(config: ReadingConfig, page_size: int) -> int:
    """Pages the lexical signal scores as one run: `config.run_pages`, else as many as one passage spans; one
    (each page alone) for the signals that rank pages by attention."""
    if config.signal != "lexical":
        return 1
    return config.run_pages or max(1, config.passage_tokens // page_size)


def frame_end(cache, config: ReadingConfig) -> int:
    """Where the context's frame ends (`config.frame_tokens`, else the sink pages), at most its sealed end."""
    spans = cache.spans
    frame = (config.frame_tokens if config.frame_tokens is not None
             else spans[min(cache.config.sink_pages, len(spans)) - 1].end)
    return min(frame, cache.sealed_upto)


def choose(cache, prompt_ids: Sequence[int], query: str, config: ReadingConfig, codec, frame: int) -> Reading:
    """The passages the question reads (`Reading`; nothing is encoded): the signal ranks the pages, `places` puts
    the passages (with `second_at`, a second one where the next place's BM25 comes that close to the first's),
    and with more candidates than passages the model judges them."""
    spans, end = cache.spans, cache.sealed_upto
    candidates = [s.page_id for s in spans if s.end > frame]
    votes = attention_votes(cache, prompt_ids) if config.signal in ("attention", "hybrid") else {}
    run = max(1, min(run_pages(config, cache.page_size), len(candidates)))  # a short document: one run of it all
    stemmed = config.stemmed
    words = {} if config.signal == "attention" else (
        lexical_runs(cache, candidates, query, codec, run, stemmed) if run > 1
        else lexical_scores(cache, candidates, query, codec, stemmed))
    ranked = rank(candidates, votes, words, config.signal)
    second = (config.second_at is not None and config.signal == "lexical" and config.passages == 1
              and config.candidates == 1)
    runs = placed_runs(cache, ranked, query, max(config.passages, config.candidates, 2 if second else 1),
                       config.passage_tokens, codec, first=frame, end=end, run=run, stemmed=stemmed)
    found = [r for r, _ in runs]
    read = config.passages
    if second and len(runs) == 2 and words[runs[1][1]] >= config.second_at * words[runs[0][1]]:
        read = 2  # the question's words meet about as well in a second place: read both
    found = found[:max(read, config.candidates)]
    judged = likelihoods(cache, frame, found, prompt_ids) if len(found) > read else []
    if judged:
        found = [r for _, r in sorted(zip(judged, found), key=lambda x: -x[0])]  # stable: ties keep the signal's order
    # nothing matched (no word of the question in the document): read the document's end, as truncation does
    ranges = merge(found[:read]) or [(max(frame, end - config.passage_tokens * config.passages), end)]
    return Reading(ranges, [p for p, _, _ in fragments(spans, ranges)], ranked, votes, words,
                   found if judged else [], sorted(judged, reverse=True))


def read(cache, prompt_ids: Sequence[int], query: str, config: ReadingConfig, codec) -> Reading:
    """Find the question's passages (`choose`), read them afresh right before it (the frame first), and make
    attention see only them and the question (`CompactReading`)."""
    from tieredkv.question.reencode import encode_fragments

    frame = frame_end(cache, config)
    reading = choose(cache, prompt_ids, query, config, codec, frame)
    parts = fragments(cache.spans, merge([(0, frame), *reading.passages]))
    encode_fragments(cache, parts, cache.sealed_upto, keep_packed=True)
    cache.policy = CompactReading(len(cache.spans))  # this context only: a reset restores the model's policy
    return reading
