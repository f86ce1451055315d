"""Long-document question answering over the memory tier: what `tieredkv qa` runs, callable from Python.

    doc_ids, q_ids = prompt_parts(lm, document, question)      # one chat turn, split where the question starts
    config = qa_config(lm, len(doc_ids) + len(q_ids) + max_new)  # own inside the window, fixed + reading beyond
    tm = TieredModel(lm, store, config)
    art = open_document(tm, doc_ids, name)                      # graft if these tokens are stored, else ingest
    answer = tm.generate(q_ids, max_new_tokens=max_new)

The document is sealed as an artifact and reused across questions and processes; the question's
own pages are kept in memory, never written (`TieredModel.keep_in_memory`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Callable, Sequence

from tieredkv.engine.tiered_config import AUTO, TOPK_DEFAULTS, ReadingConfig, TieredConfig

if TYPE_CHECKING:  # NOTE: at run time it imports torch and transformers, which `tieredkv --help` must not wait for
    from tieredkv.artifacts.artifact import Artifact

DEFAULT_MAX_NEW_TOKENS = 48
# How a question reads a document (measured: bench/longdoc_qa.py); qa_config sets frame_tokens to the
# length of prompt_parts' frame. A second passage where the next place's BM25 reaches 0.8 of the best's: over
# three development sets 63 of 248 answered, against 56 with one passage always and 54 with two
# (lab/2026-12-07-second-place).
QA_READING = ReadingConfig(passages=1, passage_tokens=512, signal="lexical", second_at=0.8)
# Inside the model's window a question reads too once the context (document, question, answer) is longer than
# two passages: the model answers far more often from one passage read right before the question than from
# the whole document (bench/results/longdoc_qa.json, run window). Shorter contexts are attended whole, exactly.
READ_INSIDE_FROM = 2 * QA_READING.passage_tokens
# Retrieved pages per KV head while a document that a lexical reading answers from is ingested: the fixed
# policy's default, inside the window too (the answer reads no stored page; see qa_config)
READING_TOPK = TOPK_DEFAULTS["fixed"]


def qa_config(lm, num_tokens: int, **fields) -> TieredConfig:
    """The configuration `tieredkv qa` answers with for a context of `num_tokens` tokens (document,
    question and answer): question-time reading (QA_READING) once the context is longer than
    READ_INSIDE_FROM tokens, at own positions inside the model's window, with the fixed-distance policy
    beyond it; a shorter context is attended whole at own positions (exact). At every length the document is
    ingested with one working set per KV head (per-head retrieval of READING_TOPK pages). `fields` override
    TieredConfig's (position "auto"; reading=None attends to the stored pages, exact inside the window while
    they fit the working set; selection="lexical" has the question's words choose them where they do not;
    reencode_pages=N re-encodes beyond it; a reading given explicitly applies at any length; position="own"
    without a reading: no reading)."""
    fields.setdefault("position", AUTO)
    explicit = "reading" in fields
    if not explicit and not fields.get("reencode_pages") and fields["position"] != "own":
        fields["reading"] = QA_READING
    if fields.get("reading") is not None and fields["reading"].frame_tokens is None:  # QA prompts open with a frame
        fields["reading"] = dataclasses.replace(fields["reading"], frame_tokens=frame_tokens(lm))
    config = TieredConfig(**fields).resolve(lm.model, num_tokens)
    short = config.position == "own" and not explicit and num_tokens <= READ_INSIDE_FROM
    if short:
        config = dataclasses.replace(config, reading=None)
    lexical = config.reading is not None and config.reading.signal == "lexical"
    if (lexical or short) and "retrieval" not in fields:
        # NOTE: a lexical reading's answer attends to the frame and passages computed afresh and to the
        # question, never to the stored pages' K/V (sliding-window layers aside), so the ingest retrieves per
        # head under either policy: one small working set (sink + READING_TOPK + local pages per KV head), the
        # same device bytes inside the window as at 128K, ingest as fast, the same answer
        # (tests/engine/test_per_head.py). A short context fits that working set whole: attended exactly.
        config = dataclasses.replace(config, retrieval="per_head", topk_pages=fields.get("topk_pages") or READING_TOPK)
    return config


DOCUMENT_INTRO = "Read this document.\n\n"  # what the chat turn says before the document


def _frame(codec) -> tuple[str, str, str]:
    """(text before the document, between the document and the question, after the question)."""
    from tieredkv.models.text_codec import chat_frame

    if getattr(getattr(codec, "tokenizer", None), "chat_template", None):
        pre, post = chat_frame(codec)
        return (pre + DOCUMENT_INTRO,
                "\n\nAnswer from the document above in one or two sentences. Question: ", post)
    return "Document:\n", "\nQ: ", "\nA:"


def prompt_parts(lm, document: str, question: str) -> tuple[list[int], list[int]]:
    """Token ids of (document part, question part) of one chat turn, so the document can be reused."""
    before, between, after = _frame(lm.codec)
    return lm.codec.encode(before + document), lm.codec.encode(between + question + after)


def frame_tokens(lm) -> int:
    """How many tokens of `prompt_parts`' document part come before the document's text."""
    return len(lm.codec.encode(_frame(lm.codec)[0]))


def document_name(document: str) -> str:
    return "doc:" + hashlib.sha256(document.encode()).hexdigest()


def find_artifact(store, doc_ids: Sequence[int], domain: dict, model_fingerprint: str) -> Artifact | None:
    """The stored artifact of exactly these token ids, ingested in `domain` (the same determinism domain,
    regime included), if the store holds one. Found by content, never by its name (a label anyone who
    can write a manifest may change): its `token_ids_sha256` must be `doc_ids`' hash AND its page keys the
    chain recomputed from `doc_ids` (so every page it would graft commits to these tokens)."""
    from tieredkv.artifacts.manifest import parse_manifest
    from tieredkv.engine.tiered_config import stored_under
    from tieredkv.provenance.domain import domain_differences, sha256_ids

    want = sha256_ids(doc_ids)
    for art_id in store.list_manifests():
        art = parse_manifest(store.get_manifest(art_id), stored_as=art_id, where=store.path)
        regime = art.domain.get("regime", {})
        if art.token_ids_sha256 == want and art.num_tokens == len(doc_ids) \
                and stored_under(regime, domain.get("regime", {})) and not domain_differences(art.domain, domain) \
                and commits_to(art, doc_ids, model_fingerprint):
            return art
    return None


def commits_to(art: Artifact, doc_ids: Sequence[int], model_fingerprint: str) -> bool:
    """Whether `art`'s page keys are the chain of `doc_ids` under its recorded regime and this model."""
    from tieredkv.engine.schedule import page_chain
    from tieredkv.engine.tiered_config import regime_fingerprint

    fp = regime_fingerprint(model_fingerprint, art.domain.get("regime", {}))
    return art.fingerprint == model_fingerprint and tuple(page_chain(fp, doc_ids, art.page_size)) == art.page_keys


def open_document(tm, doc_ids: list[int], name: str = "", *, reingest: bool = False,
                  progress: Callable[[int, int], None] | None = None) -> tuple[Artifact, bool]:
    """Graft the document's artifact if `tm`'s store holds one of these very tokens made in `tm`'s domain
    (found by content: `find_artifact`), else ingest it under the label `name` (an artifact of another
    domain stays where it is). Returns (artifact, grafted)."""
    art = None if reingest else find_artifact(tm.store, doc_ids, tm.domain(), tm.lm.fingerprint)
    if art is not None:
        tm.graft(art)
        return art, True
    return tm.ingest(doc_ids, name=name, progress=progress), False
