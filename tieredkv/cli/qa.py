"""`tieredkv qa`: long-document question answering over the memory tier (the main job)."""
from __future__ import annotations

import collections
import dataclasses
import sys
import time
from pathlib import Path

from tieredkv.cli.common import (MAX_NEW_TOKENS, MAX_PAGE_SIZE, InputError, int_at_least, int_between, model_arg,
                                 nonneg_int, nothing_left_if_refused, open_store, positive_int, print_json,
                                 read_text_file, store_path, utf8_text)

MIN_DISK_BUDGET = 32 << 20  # LMDB's own overhead is 16 MiB (TieredModel.check_disk_budget)


class _IngestBar:
    """tqdm bar with tokens/s, pages and bytes per tier."""

    def __init__(self, tm, total: int, quiet: bool):
        from tqdm import tqdm

        self.tm = tm
        self.bar = None if quiet else tqdm(total=total, desc="ingest", unit="tok", unit_scale=True, file=sys.stderr)
        self.last = 0.0

    def __call__(self, done: int, _total: int) -> None:
        if self.bar is None:
            return
        self.bar.n = done
        now = time.monotonic()
        if now - self.last > 0.5 or done == _total:
            st = self.tm.store.stats()
            mib = lambda b: f"{b / 2**20:.0f}MiB"  # noqa: E731
            self.bar.set_postfix(pages=len(self.tm.cache.spans), device=mib(st["device"]["bytes"]),
                                 host=mib(st["host"]["bytes"]), lmdb=mib(st["lmdb"]["bytes"]), refresh=False)
            self.last = now
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _config(args, lm, num_tokens: int):
    """TieredConfig of this question: the library's QA defaults (tieredkv.question.qa.qa_config) and the flags."""
    from tieredkv.errors import TieredKVError
    from tieredkv.question.qa import QA_READING, qa_config
    from tieredkv.engine.tiered_config import ReadingConfig

    fields = dict(page_size=args.page_size, sink_pages=args.sink_pages, local_pages=args.local_pages, topk_pages=args.topk_pages,
                  position=args.position)
    if args.retrieval is not None:
        fields["retrieval"] = args.retrieval
    reading_flags = {k: v for k, v in (("passages", args.read_passages), ("passage_tokens", args.read_tokens),
                                       ("signal", args.read_signal)) if v is not None}
    if args.reencode_pages and args.read_passages:
        raise InputError(f"--reencode-pages replaces the question-time reading, so --read-passages {args.read_passages} "
                         "would do nothing; give one or the other")
    try:
        if args.reencode_pages:
            fields.update(reencode_pages=args.reencode_pages, reading=None)
        elif args.read_passages == 0:
            fields["reading"] = None
        elif reading_flags:
            fields["reading"] = ReadingConfig(**{**dataclasses.asdict(QA_READING), **reading_flags})
        return qa_config(lm, num_tokens, **fields)
    except ValueError as e:  # a flag combination the configuration refuses
        raise TieredKVError(f"{e}. Check --position and the reading flags (`tieredkv qa --help`).") from None


def _text(tm, lm, first: int, end: int) -> str:
    """The document's text between two positions, from the pages' token ids."""
    spans = tm.cache.spans
    ids = [t for sp in spans if sp.end > first and sp.start < end
           for t in tm.cache.page_token_ids(sp.page_id)[max(0, first - sp.start):end - sp.start]]
    return lm.codec.decode(ids)


def _shown(tm, lm, count: int) -> tuple[str, list[dict]]:
    """What the answer attended to beyond the local window: the passages the question read (document
    order), or the pages retrieval brought in most often; ("fit", []) when the context fit the working set."""
    if tm.last_reading is not None:
        return "read", [{"tokens": [a, b], "text": _text(tm, lm, a, b)} for a, b in tm.last_reading.passages[:count]]
    if not tm.cache.retrieval_log:
        return "fit", []
    counts = collections.Counter(p for sel in tm.cache.retrieval_log for p in sel)
    out = []
    for pid, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:count]:
        span = tm.cache.spans[pid]
        out.append({"page": pid, "tokens": [span.start, span.end], "times_retrieved": n,
                    "text": _text(tm, lm, span.start, span.end)})
    return "retrieved", out


def cmd_qa(args) -> int:
    from tieredkv.question.corpus import DEFAULT_QUESTION, default_document
    from paging.errors import CorruptPageError, PageNotFoundError
    from tieredkv.errors import EmptyInputError, StoredContextDamagedError
    from tieredkv.models.loading import cache_dir, load_model, trained_window
    from tieredkv.question.qa import document_name, find_artifact, prompt_parts
    from tieredkv.engine.tiered_model import TieredModel, working_set_bytes

    document = read_text_file(args.doc, "--doc") if args.doc else default_document()
    question = args.question if args.question is not None else DEFAULT_QUESTION
    if not document.strip():
        raise EmptyInputError(f"the document {args.doc or '(default)'} is empty")
    if not question.strip():
        raise EmptyInputError("the question is empty")
    lm = load_model(args.model, quiet=args.quiet)
    store_dir = args.store or str(cache_dir() / "stores" / Path(args.model).name)
    doc_ids, q_ids = prompt_parts(lm, document, question)
    total = len(doc_ids) + len(q_ids) + args.max_new_tokens
    config = _config(args, lm, total)
    window = trained_window(lm.model)
    if window is not None and len(q_ids) + args.max_new_tokens > window:
        raise InputError(f"the question is {len(q_ids):,} tokens: with --max-new-tokens {args.max_new_tokens} it "
                         f"runs past the model's window of {window:,} positions on its own; put long text in --doc and keep the "
                         "question short")
    if config.position == "own" and window is not None and total > window:
        print(f"tieredkv: warning: --position own puts {total - window:,} of {total:,} tokens at positions past the "
              f"model's window of {window:,}, which it never saw in training, so answers degrade there; the default, "
              "--position auto, switches to fixed distances beyond the window", file=sys.stderr)
    name = document_name(document)
    t0 = time.perf_counter()
    # open_store: a shared remote tier named by $TIEREDKV_REMOTE serves and receives pages too
    budget = {} if args.disk_budget is None else dict(lmdb_max_map_size=args.disk_budget,
                                                     lmdb_map_size=min(args.disk_budget, 1 << 30))
    with nothing_left_if_refused(store_dir), \
            open_store(store_dir, **budget, device_budget_bytes=working_set_bytes(lm, config)) as store:
        tm = TieredModel(lm, store, config)
        try:
            art = None if args.reingest else find_artifact(store, name, tm.domain())
            if art is None:
                tm.check_disk_budget(total, budget_bytes=args.disk_budget)
            bar = _IngestBar(tm, len(doc_ids), args.quiet or art is not None)
            try:  # open_document's two branches, with the one manifest scan above
                grafted = art is not None
                art = tm.graft(art, progress=bar) if grafted else tm.ingest(doc_ids, name=name, progress=bar)
            finally:
                bar.close()
            how = "grafted (no re-ingest)" if grafted else "ingested"
            t_ctx = time.perf_counter() - t0
            tm.keep_in_memory()  # the question's pages: the store keeps the document only
            tm.cache.retrieval_log.clear()
            t1 = time.perf_counter()
            out = tm.generate(q_ids, max_new_tokens=args.max_new_tokens, question=question)
            t_answer = time.perf_counter() - t1
            if lm.codec.eos_token_id in out:
                out = out[: out.index(lm.codec.eos_token_id)]
            answer = lm.codec.decode(out).strip()
            what, shown = _shown(tm, lm, args.show_pages)
            reencoded = sorted(tm.cache.reencoded)
            stats = store.stats()
        except (CorruptPageError, PageNotFoundError) as e:
            raise StoredContextDamagedError(
                f"{e}. The store's copy of this document is damaged: run `tieredkv check --store {store_dir}` "
                f"(it quarantines what failed), then ask again with --reingest") from e
        finally:
            tm.close()
    report = {"answer": answer, "question": question, "context": how, "position": config.position,
              "reading": dataclasses.asdict(config.reading) if config.reading else None,
              "artifact": art.artifact_id, "document_tokens": len(doc_ids), "pages": len(art.page_keys),
              "context_s": round(t_ctx, 2), "answer_s": round(t_answer, 2), "attended": what, "shown": shown,
              "reencoded_pages": reencoded, "store": store_dir, "tiers": {k: stats[k] for k in ("device", "host", "lmdb")}}
    if args.json:
        print_json(report)
        return 0
    print(f"Q: {question}\nA: {answer}\n")
    print(f"context: {len(doc_ids):,} tokens, {len(art.page_keys)} pages, {how} in {t_ctx:.1f}s "
          f"(position policy {config.position}); answer in {t_answer:.1f}s; artifact {art.artifact_id}")
    if what == "fit":
        print("attention: the whole context fit the working set (nothing was retrieved or read)")
    elif what == "read":
        print("read afresh right before the question (after the prompt's frame):")
    elif reencoded:
        print(f"re-encoded for this question (sink and most-retrieved pages): {reencoded}")
    for p in shown:
        snippet = " ".join(p["text"].split())[:160]
        where = f"tokens {p['tokens'][0]}-{p['tokens'][1]}"
        where = where if what == "read" else f"page {p['page']:4d} {where} retrieved {p['times_retrieved']}x"
        print(f"  {where}: {snippet}…")
    mib = lambda b: b / 2**20  # noqa: E731
    st = report["tiers"]
    print(f"tiers: device {mib(st['device']['bytes']):.1f} MiB / {mib(st['device']['budget_bytes']):.0f} MiB, "
          f"host {mib(st['host']['bytes']):.1f} MiB, lmdb {mib(st['lmdb']['bytes']):.1f} MiB ({store_dir})")
    return 0


def register(sub) -> None:
    from tieredkv.question.corpus import DEFAULT_QUESTION
    from tieredkv.question.qa import DEFAULT_MAX_NEW_TOKENS, QA_READING
    from tieredkv.engine.tiered_config import READING_SIGNALS, RETRIEVAL_MODES

    p = sub.add_parser("qa", help="answer a question about a long document (ingested once, grafted after)")
    model_arg(p)
    p.add_argument("--doc", help="a UTF-8 text file (default: statements chapter of the Python language reference)")
    p.add_argument("--question", type=utf8_text, help=f"the question (default: {DEFAULT_QUESTION!r})")
    p.add_argument("--store", type=store_path, help="store directory (default: ~/.cache/tieredkv/stores/MODEL)")
    p.add_argument("--max-new-tokens", type=int_between(1, MAX_NEW_TOKENS), default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--page-size", type=int_between(1, MAX_PAGE_SIZE))
    p.add_argument("--sink-pages", type=nonneg_int, default=1)
    p.add_argument("--local-pages", type=positive_int, default=16)
    p.add_argument("--topk-pages", type=positive_int, help="per KV head (default: 16 under --position own, 8 under fixed)")
    p.add_argument("--position", choices=("auto", "own", "fixed"), default="auto",
                   help="auto: own positions when the context fits the model's window, else fixed distance")
    p.add_argument("--retrieval", choices=RETRIEVAL_MODES,
                   help="whom a KV head's top-k pages serve: every head (union) or itself (per_head: a working set "
                        "of fixed size); default per_head for a document read with the lexical signal, else union")
    r = p.add_argument_group("question-time reading (beyond the model's window; tieredkv/question/reading.py)")
    r.add_argument("--read-passages", type=nonneg_int,
                   help=f"places in the document the question reads afresh (default {QA_READING.passages}; 0: no "
                        "reading, attention retrieves from the stored pages)")
    r.add_argument("--read-tokens", type=positive_int,
                   help=f"tokens read around each place (default {QA_READING.passage_tokens})")
    r.add_argument("--read-signal", choices=READING_SIGNALS,
                   help=f"how pages are ranked to find the places (default {QA_READING.signal})")
    r.add_argument("--reencode-pages", type=nonneg_int,
                   help="instead of reading: re-encode the N most-retrieved pages beside each layer's retrieval "
                        "(the earlier question-time step)")
    p.add_argument("--disk-budget", type=int_at_least(MIN_DISK_BUDGET),
                   help="bytes the store may use on disk, at least 32 MiB (LMDB's own overhead is 16 MiB; default: "
                        "the free space)")
    p.add_argument("--show-pages", type=positive_int, default=3, help="how many read passages or retrieved pages to show")
    p.add_argument("--reingest", action="store_true", help="ingest again even if the document is stored")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_qa)
