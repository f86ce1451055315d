"""One call per question: `TieredModel.open`, `.ask` and `.chat` (what `tieredkv qa` and the benchmark run).

    doc = tm.open(text, name="book")        # the config for its length, then graft if stored (by content), else ingest
    ans = tm.ask(doc, "Who wrote it?")      # re-attach the sealed document, read, answer -> Answer
    ans = tm.chat(doc, messages)            # a conversation over the document (chat template applied)

Every question starts from the document's sealed state: the pages a question or its answer seals stay
in memory and are dropped before the next one, so questions never see each other and each reads afresh.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from tieredkv.errors import EmptyInputError, TieredKVError, TokenIdsError
from tieredkv.question.qa import DEFAULT_MAX_NEW_TOKENS, DOCUMENT_INTRO, _frame, qa_config
from tieredkv.question.qa import open_document as graft_or_ingest

log = logging.getLogger(__name__)

# Room `open` keeps after the document for a question's prompt; with the answer's tokens it decides
# whether the context fits the model's window (own positions) or reads beyond it.
QUESTION_TOKENS = 64
# Passages or retrieved pages an Answer lists (with their text).
SHOWN_PASSAGES = 3


@dataclass(frozen=True)
class Document:
    """A document opened on a TieredModel: its stored artifact and the configuration it is read with."""

    name: str  # a label only: a stored document is found by its token ids (find_artifact)
    artifact: Any  # tieredkv.artifacts.artifact.Artifact
    config: Any  # the TieredConfig it was ingested under and is asked with
    context: str  # "grafted" (it was stored) or "ingested"
    open_s: float

    @property
    def num_tokens(self) -> int:
        return self.artifact.num_tokens


@dataclass(frozen=True)
class Answer:
    """What one question got: the answer, what it attended to, and what it cost."""

    text: str
    token_ids: list[int]
    question: str
    document: str  # the Document's name
    artifact_id: str
    context: str  # how the document was opened: "grafted" or "ingested"
    attended: str  # "read": passages read afresh; "retrieved": pages retrieved; "whole document": it all fit
    passages: list[dict]  # what was read ({tokens, text}) or retrieved most ({page, tokens, times_retrieved, text})
    pages_attended: int  # distinct stored pages the answer attended beyond the local window (0: whole document)
    reencoded_pages: list[int]
    timings: dict[str, float]  # open_s (the document's open), attach_s (back to its sealed state), answer_s
    tiers: dict[str, dict]  # bytes per tier (device, host, lmdb)
    store_stats: dict = field(repr=False, default_factory=dict)  # PageStore.stats() as it is after the answer

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def open_document(tm, source: str | Sequence[int], name: str = "", *, reingest: bool = False, progress=None,
                  room: int | None = None, **config_fields) -> Document:
    """`tm` configured for the document (qa_config: own positions inside the window, reading beyond; `room`:
    tokens kept for a question and its answer; `config_fields` override TieredConfig's), then its stored
    artifact grafted if the store holds these very tokens, else ingested. Ids are the document's own
    tokens: the question frame is put before them as before a text."""
    t0 = time.perf_counter()
    if isinstance(source, str):
        doc_ids = document_ids(tm.lm, source)
    else:
        doc_ids = tm.lm.codec.encode(_frame(tm.lm.codec)[0]) + tm._token_ids(source, "open")
    room = QUESTION_TOKENS + DEFAULT_MAX_NEW_TOKENS if room is None else room
    tm.configure(qa_config(tm.lm, len(doc_ids) + room, **config_fields))
    bar = _ProgressBar(tm, len(doc_ids)) if progress is None else progress
    try:
        art, grafted = graft_or_ingest(tm, doc_ids, name, reingest=reingest, progress=bar)
    finally:
        if progress is None:
            bar.close()
    doc = Document(name, art, tm.config, "grafted" if grafted else "ingested", time.perf_counter() - t0)
    tm.sealed_for = doc
    log.info("opened %r: %d tokens, %d pages, %s in %.2fs (position %s)", name or art.artifact_id[:16],
             art.num_tokens, len(art.page_keys), doc.context, doc.open_s, doc.config.position)
    return doc


def QUIET(_done: int, _total: int) -> None:
    """A progress callback that shows nothing (`open(..., progress=QUIET)`)."""


def document_ids(lm, text: str) -> list[int]:
    """The document part of the QA prompt: the frame's opening, then the document's text."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyInputError("the document is empty")
    return lm.codec.encode(_frame(lm.codec)[0] + text)


def question_ids(lm, question: str) -> list[int]:
    """The question part of the QA prompt (what follows the document in the same chat turn)."""
    if not isinstance(question, str):
        raise TokenIdsError(f"a question is text, got {type(question).__name__}")
    if not question.strip():
        raise EmptyInputError("the question is empty")
    _, between, after = _frame(lm.codec)
    return lm.codec.encode(between + question + after)


def ask(tm, doc: Document, question: str, **generate_kwargs) -> Answer:
    """Answer `question` from `doc`'s sealed state (tm.generate's options pass through)."""
    return _answer(tm, doc, question, question_ids(tm.lm, question), question, generate_kwargs)


def chat(tm, doc: Document, messages: list[dict], **generate_kwargs) -> Answer:
    """The assistant's next turn of `messages` (user and assistant turns, the document before the first
    user turn), from `doc`'s sealed state. Append the answer's text as the assistant's turn to go on."""
    turns = _check_messages(messages)
    tok = getattr(tm.lm.codec, "tokenizer", None)
    if tok is None or not getattr(tok, "chat_template", None):
        raise TokenIdsError("this model's tokenizer has no chat template: ask one question at a time with tm.ask")
    before, between, _ = _frame(tm.lm.codec)
    marker = "\u2063DOC\u2063"
    first = {**turns[0], "content": DOCUMENT_INTRO + marker + between + turns[0]["content"]}
    text = tok.apply_chat_template([first, *turns[1:]], add_generation_prompt=True, tokenize=False)
    head, tail = text.split(marker)
    if head != before:
        raise TieredKVError("this chat template puts text before the first user turn that the stored document "
                            "was not read with; ask one question at a time with tm.ask")
    last_user = next(m["content"] for m in reversed(turns) if m["role"] == "user")
    return _answer(tm, doc, last_user, tm.lm.codec.encode(tail), last_user, generate_kwargs)


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise TokenIdsError("chat takes a list of messages like {'role': 'user', 'content': '...'}")
    if messages[0].get("role") != "user" or messages[-1].get("role") != "user":
        raise TokenIdsError("a conversation over a document starts and ends with a user turn (the document is "
                            "read before the first); system prompts are not supported")
    return list(messages)


def _answer(tm, doc: Document, question: str, prompt: list[int], query: str, kwargs: dict) -> Answer:
    if not isinstance(doc, Document):
        raise TypeError(f"ask takes a Document, got {type(doc).__name__}: open it first (doc = tm.open(text))")
    if kwargs.get("return_dict_in_generate"):
        raise TieredKVError("ask returns an Answer; for HF's output object call tm.generate(..., "
                            "return_dict_in_generate=True) after tm.open")
    kwargs.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    attach_s = attach(tm, doc)
    tm.keep_in_memory()  # the question's pages: the store keeps the document only
    tm.cache.retrieval_log.clear()
    t0 = time.perf_counter()
    tm.sealed_for = None  # from here the context holds this question
    out = tm.generate(prompt, question=query, **kwargs)
    answer_s = time.perf_counter() - t0
    eos = tm.lm.codec.eos_token_id
    if eos in out:
        out = out[:out.index(eos)]
    attended, passages, num_pages = _attended(tm)
    stats = tm.store.stats()
    ans = Answer(tm.lm.codec.decode(out).strip(), out, question, doc.name, doc.artifact.artifact_id, doc.context,
                 attended, passages, num_pages, sorted(tm.cache.reencoded),
                 {"open_s": round(doc.open_s, 4), "attach_s": round(attach_s, 4), "answer_s": round(answer_s, 4)},
                 {k: stats[k] for k in ("device", "host", "lmdb")}, stats)
    log.info("asked %r: %d tokens in %.2fs, %s (%d pages)", question[:60], len(out), answer_s, attended, num_pages)
    return ans


def attach(tm, doc: Document) -> float:
    """Put `tm` back in `doc`'s sealed state (graft its pages again unless nothing was added since);
    returns the seconds it took."""
    t0 = time.perf_counter()
    if tm.sealed_for is not doc:
        tm.configure(doc.config)
        tm.graft(doc.artifact)
        tm.sealed_for = doc
    return time.perf_counter() - t0


def _attended(tm) -> tuple[str, list[dict], int]:
    """What the answer attended to beyond the local window: the passages the question read (document order),
    or the pages retrieval brought in most often; nothing when the context fit the working set."""
    reading = tm.last_reading
    if reading is not None:
        shown = [{"tokens": [a, b], "text": _text(tm, a, b)} for a, b in reading.passages[:SHOWN_PASSAGES]]
        return "read", shown, len(reading.pages)
    if not tm.cache.retrieval_log:
        return "whole document", [], 0
    counts = collections.Counter(p for sel in tm.cache.retrieval_log for p in sel)
    shown = []
    for pid, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN_PASSAGES]:
        span = tm.cache.spans[pid]
        shown.append({"page": pid, "tokens": [span.start, span.end], "times_retrieved": n,
                      "text": _text(tm, span.start, span.end)})
    return "retrieved", shown, len(counts)


def _text(tm, first: int, end: int) -> str:
    """The document's text between two positions, from the pages' token ids."""
    from tieredkv.question.reading import span_ids

    return tm.lm.codec.decode(span_ids(tm.cache, first, end))


class _ProgressBar:
    """An ingest progress bar (tqdm: tokens/s, pages, bytes per tier) when stderr is a terminal; made at the
    first progress report, so a document grafted shows none."""

    def __init__(self, tm, total: int):
        self.tm, self.total, self.last, self.bar = tm, total, 0.0, None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if not sys.stderr.isatty():
                return
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc="ingest", unit="tok", unit_scale=True, file=sys.stderr)
        self.bar.n = done
        now = time.monotonic()
        if now - self.last > 0.5 or done == total:
            st = self.tm.store.stats()
            mib = lambda b: f"{b / 2**20:.0f}MiB"  # noqa: E731
            self.bar.set_postfix(pages=len(self.tm.cache.spans), device=mib(st["device"]["bytes"]),
                                 host=mib(st["host"]["bytes"]), lmdb=mib(st["lmdb"]["bytes"]), refresh=False)
            self.last = now
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
