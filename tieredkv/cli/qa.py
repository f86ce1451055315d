"""`tieredkv qa`: long-document question answering over the memory tier (the main job).

parse -> `TieredModel.open` once -> `TieredModel.ask` per question -> print (tieredkv/question/ask.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from pathlib import Path

from tieredkv.cli.common import (
    MAX_NEW_TOKENS,
    MAX_PAGE_SIZE,
    InputError,
    fraction,
    int_at_least,
    int_between,
    model_arg,
    nonneg_int,
    nothing_left_if_refused,
    open_store,
    positive_int,
    read_text_file,
    store_path,
    utf8_text,
)

MIN_DISK_BUDGET = 32 << 20  # LMDB's own overhead is 16 MiB (TieredModel.check_disk_budget)
_NEVER = -1.0  # --read-second-at 0: one passage always (ReadingConfig.second_at None)


def second_share(text: str) -> float:
    """An argparse type: 0 (never), or a share in (0, 1]."""
    try:
        return _NEVER if float(text) == 0 else fraction(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be 0 (one passage always) or a share in (0, 1], got {text!r}") from None


def _config_fields(args) -> dict:
    """TieredConfig fields the flags set over the library's QA defaults (tieredkv.question.qa.qa_config)."""
    from tieredkv.engine.tiered_config import ReadingConfig
    from tieredkv.question.qa import QA_READING

    fields = dict(page_size=args.page_size, sink_pages=args.sink_pages, local_pages=args.local_pages,
                  topk_pages=args.topk_pages, position=args.position)
    if args.retrieval is not None:
        fields["retrieval"] = args.retrieval
    reading_flags = {k: v for k, v in (("passages", args.read_passages), ("passage_tokens", args.read_tokens),
                                       ("signal", args.read_signal), ("candidates", args.read_candidates),
                                       ("run_pages", args.read_run_pages),
                                       ("second_at", args.read_second_at))
                     if v is not None}
    if reading_flags.get("second_at") == _NEVER:
        reading_flags["second_at"] = None
    if args.reencode_pages and args.read_passages:
        raise InputError(f"--reencode-pages replaces the question-time reading, so --read-passages "
                         f"{args.read_passages} would do nothing; give one or the other")
    if args.select is not None:
        if args.read_passages != 0:
            raise InputError(f"--select {args.select} chooses the stored pages attention reads, which the reading "
                             "replaces: add --read-passages 0")
        fields["selection"] = args.select
    if args.reencode_pages:
        fields.update(reencode_pages=args.reencode_pages, reading=None)
    elif args.read_passages == 0:
        fields["reading"] = None
    elif reading_flags:
        fields["reading"] = ReadingConfig(**{**dataclasses.asdict(QA_READING), **reading_flags})
    return fields


def _config(lm, num_tokens: int, fields: dict):
    """The configuration `open` will choose for this context; a flag combination it refuses, one line."""
    from tieredkv.errors import TieredKVError
    from tieredkv.question.qa import qa_config

    try:
        return qa_config(lm, num_tokens, **fields)
    except ValueError as e:
        raise TieredKVError(f"{e}. Check --position and the reading flags (`tieredkv qa --help`).") from None


def _questions(args) -> list[str]:
    """--question (any number), then --questions FILE (one per line, or JSONL with a "question" field)."""
    from tieredkv.errors import EmptyInputError
    from tieredkv.question.corpus import DEFAULT_QUESTION

    questions = list(args.question or [])
    if args.questions:
        for n, line in enumerate(read_text_file(args.questions, "--questions").splitlines(), 1):
            if line.strip():
                questions.append(_question_line(line, n, args.questions))
    for q in questions:
        if not q.strip():
            raise EmptyInputError("a question is empty")
    return questions or [DEFAULT_QUESTION]


def _question_line(line: str, n: int, path: str) -> str:
    if not line.lstrip().startswith("{"):
        return line.strip()
    try:
        q = json.loads(line).get("question")
    except (json.JSONDecodeError, AttributeError):
        q = None
    if not isinstance(q, str):
        raise InputError(f"--questions {path} line {n} is not a JSON object with a \"question\" string; give one "
                         "question per line, or JSONL like {\"question\": \"...\"}")
    return q


def _document(args) -> tuple[str, str]:
    """(text, label) of --doc (a file, or - for stdin; default: the bundled chapter)."""
    from tieredkv.errors import EmptyInputError
    from tieredkv.question.corpus import default_document

    if args.doc == "-":
        text, label = sys.stdin.read(), "stdin"
    elif args.doc:
        text, label = read_text_file(args.doc, "--doc"), Path(args.doc).name
    else:
        text, label = default_document(), "default"
    if not text.strip():
        raise EmptyInputError(f"the document {args.doc or '(default)'} is empty")
    return text, label


def cmd_qa(args) -> int:
    from paging.errors import CorruptPageError, PageNotFoundError
    from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
    from tieredkv.errors import StoredContextDamagedError
    from tieredkv.models.loading import cache_dir, load_model, trained_window
    from tieredkv.question.ask import QUIET, document_ids, question_ids

    fields, questions = _config_fields(args), _questions(args)
    document, label = _document(args)
    t0 = time.perf_counter()
    lm = load_model(args.model, quiet=args.quiet)
    load_s = time.perf_counter() - t0
    store_dir = args.store or os.environ.get("TIEREDKV_STORE") or str(cache_dir() / "stores" / Path(args.model).name)
    num_doc = len(document_ids(lm, document))
    room = max(len(question_ids(lm, q)) for q in questions) + args.max_new_tokens
    config = _config(lm, num_doc + room, fields)
    _check_window(trained_window(lm.model), config, num_doc, room, args.max_new_tokens)
    # open_store: a shared remote tier named by $TIEREDKV_REMOTE serves and receives pages too
    budget = {} if args.disk_budget is None else dict(lmdb_max_map_size=args.disk_budget,
                                                     lmdb_map_size=min(args.disk_budget, 1 << 30))
    with nothing_left_if_refused(store_dir), warnings.catch_warnings(), \
            open_store(store_dir, **budget, device_budget_bytes=working_set_bytes(lm, config)) as store:
        warnings.filterwarnings("ignore", message="own positions reach")  # _check_window said it for the CLI
        tm = TieredModel(lm, store, config)
        tm.disk_budget_bytes = args.disk_budget
        try:
            doc = tm.open(document, name=label, reingest=args.reingest, room=room,
                          progress=QUIET if args.quiet else None, **fields)
            for q in questions:
                ans = tm.ask(doc, q, max_new_tokens=args.max_new_tokens)
                _print(args, ans, doc, load_s, store_dir)
        except (CorruptPageError, PageNotFoundError) as e:
            raise StoredContextDamagedError(
                f"{e}. The store's copy of this document is damaged: run `tieredkv check --store {store_dir}` "
                f"(it quarantines what failed), then ask again with --reingest") from e
        finally:
            tm.close()
    return 0


def _check_window(window: int | None, config, num_doc: int, room: int, max_new: int) -> None:
    if window is not None and room > window:
        raise InputError(f"a question is {room - max_new:,} tokens: with --max-new-tokens {max_new} it runs past "
                         f"the model's window of {window:,} positions on its own; put long text in --doc and keep "
                         "the question short")
    total = num_doc + room
    if config.position == "own" and window is not None and total > window:
        print(f"tieredkv: warning: --position own puts {total - window:,} of {total:,} tokens at positions past the "
              f"model's window of {window:,}, which it never saw in training, so answers degrade there; the default, "
              "--position auto, switches to fixed distances beyond the window", file=sys.stderr)


def _report(ans, doc, load_s: float, store_dir: str) -> dict:
    """One JSON line: the Answer, with the document's configuration and the run's timings."""
    config = doc.config
    out = ans.to_dict()
    out["timings"] = {"load_s": round(load_s, 4), **ans.timings}
    out.update(answer=ans.text, artifact=ans.artifact_id, position=config.position,
               reading=dataclasses.asdict(config.reading) if config.reading else None,
               document_tokens=doc.num_tokens, pages=len(doc.artifact.page_keys), context_s=ans.timings["open_s"],
               answer_s=ans.timings["answer_s"], shown=ans.passages, store=store_dir)
    return out


def _print(args, ans, doc, load_s: float, store_dir: str) -> None:
    if args.json:
        print(json.dumps(_report(ans, doc, load_s, store_dir), sort_keys=True), flush=True)
        return
    t = ans.timings
    print(f"Q: {ans.question}\nA: {ans.text}\n")
    print(f"context: {doc.num_tokens:,} tokens, {len(doc.artifact.page_keys)} pages, {doc.context} in "
          f"{t['open_s']:.1f}s (position policy {doc.config.position}; back to it in {t['attach_s']:.2f}s); answer "
          f"in {t['answer_s']:.1f}s; artifact {ans.artifact_id}")
    if ans.attended == "whole document":
        print("attention: the whole context fit the working set (nothing was retrieved or read)")
    elif ans.attended == "read":
        print("read afresh right before the question (after the prompt's frame):")
    elif ans.reencoded_pages:
        print(f"re-encoded for this question (sink and most-retrieved pages): {ans.reencoded_pages}")
    for p in ans.passages[:args.show_pages]:
        snippet = " ".join(p["text"].split())[:160]
        where = f"tokens {p['tokens'][0]}-{p['tokens'][1]}"
        where = where if ans.attended == "read" else f"page {p['page']:4d} {where} retrieved {p['times_retrieved']}x"
        print(f"  {where}: {snippet}…")
    mib = lambda b: b / 2**20  # noqa: E731
    st = ans.tiers
    print(f"tiers: device {mib(st['device']['bytes']):.1f} MiB / {mib(st['device']['budget_bytes']):.0f} MiB, "
          f"host {mib(st['host']['bytes']):.1f} MiB, lmdb {mib(st['lmdb']['bytes']):.1f} MiB ({store_dir})\n",
          flush=True)


def register(sub) -> None:
    from tieredkv.engine.tiered_config import READING_SIGNALS, RETRIEVAL_MODES, SELECTIONS
    from tieredkv.question.corpus import DEFAULT_QUESTION
    from tieredkv.question.qa import DEFAULT_MAX_NEW_TOKENS, QA_READING, READ_INSIDE_FROM

    p = sub.add_parser("qa", help="answer a question about a long document (ingested once, grafted after)")
    model_arg(p)
    p.add_argument("--doc", help="a UTF-8 text file, or - for stdin (default: statements chapter of the Python "
                                 "language reference)")
    p.add_argument("--question", type=utf8_text, action="append",
                   help=f"a question; give it several times to ask several (default: {DEFAULT_QUESTION!r})")
    p.add_argument("--questions", metavar="FILE",
                   help="more questions: one per line, or JSONL with a \"question\" field (after the --question ones)")
    p.add_argument("--store", type=store_path,
                   help="store directory (default: $TIEREDKV_STORE, else ~/.cache/tieredkv/stores/MODEL)")
    p.add_argument("--max-new-tokens", type=int_between(1, MAX_NEW_TOKENS), default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--page-size", type=int_between(1, MAX_PAGE_SIZE))
    p.add_argument("--sink-pages", type=nonneg_int, default=1)
    p.add_argument("--local-pages", type=positive_int, default=16)
    p.add_argument("--topk-pages", type=positive_int,
                   help="per KV head (default: 8 where the question reads its passage or the document is "
                        "short, else 16 under --position own and 8 under fixed)")
    p.add_argument("--position", choices=("auto", "own", "fixed"), default="auto",
                   help="auto: own positions when the context fits the model's window, else fixed distance; own "
                        "without a --read flag: the whole document attended at own positions (exact)")
    p.add_argument("--retrieval", choices=RETRIEVAL_MODES,
                   help="whom a KV head's top-k pages serve: every head (union) or itself (per_head: a working set "
                        "of fixed size); default per_head for a document read with the lexical signal or a short one, "
                        "else union")
    r = p.add_argument_group(f"question-time reading (contexts over {READ_INSIDE_FROM:,} tokens; "
                             "tieredkv/question/reading.py)")
    r.add_argument("--read-passages", type=nonneg_int,
                   help=f"places in the document the question reads afresh (default {QA_READING.passages}; 0: no "
                        "reading, attention retrieves from the stored pages)")
    r.add_argument("--read-tokens", type=positive_int,
                   help=f"tokens read around each place (default {QA_READING.passage_tokens})")
    r.add_argument("--read-signal", choices=READING_SIGNALS,
                   help=f"how pages are ranked to find the places (default {QA_READING.signal})")
    r.add_argument("--read-candidates", type=positive_int,
                   help=f"places considered; more than --read-passages: the model judges which to read, by the "
                        f"question's likelihood after each (default {QA_READING.candidates})")
    r.add_argument("--read-run-pages", type=positive_int,
                   help="the lexical signal scores runs of this many pages, each as one passage (default: as many "
                        "as --read-tokens spans; 1: each page alone)")
    r.add_argument("--read-second-at", type=second_share, metavar="SHARE",
                   help="with one passage: read a second where the next place's BM25 reaches this share of the best's "
                        f"(default {QA_READING.second_at}; 0: one passage always)")
    r.add_argument("--select", choices=SELECTIONS,
                   help="with --read-passages 0, over a document larger than the working set: how the question "
                        "chooses the stored pages it attends to (attention, the default: each step scores the pages' "
                        "keys; lexical: the pages matching the question's words, once per question; question: each "
                        "layer's pages ranked by the question's attention over their keys, once per question; "
                        "hybrid: that ranking fused with the words')")
    r.add_argument("--reencode-pages", type=nonneg_int,
                   help="instead of reading: re-encode the N most-retrieved pages beside each layer's retrieval "
                        "(the earlier question-time step)")
    p.add_argument("--disk-budget", type=int_at_least(MIN_DISK_BUDGET),
                   help="bytes the store may use on disk, at least 32 MiB (LMDB's own overhead is 16 MiB; default: "
                        "the free space)")
    p.add_argument("--show-pages", type=positive_int, default=3,
                   help="how many read passages or retrieved pages to show (at most 3)")
    p.add_argument("--reingest", action="store_true", help="ingest again even if the document is stored")
    p.add_argument("--json", action="store_true", help="one JSON object per answer (JSONL), with its timings")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_qa)
