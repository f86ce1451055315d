"""`tieredkv qa`: long-document question answering over the memory tier (the main job)."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

from tieredkv.cli.common import model_arg, nonneg_int, positive_int, print_json, read_text_file

# Under the fixed policy, re-encode the sink and this many most-retrieved pages before answering
# (TieredConfig.reencode_pages; measured in bench/placement_sweep.py, see the README).
QA_REENCODE = 8


def _prompt_parts(lm, document: str, question: str) -> tuple[list[int], list[int]]:
    """Token ids of (document part, question part) of one chat turn, so the document can be reused."""
    from tieredkv.text_codec import chat_frame

    codec = lm.codec
    if getattr(getattr(codec, "tokenizer", None), "chat_template", None):
        pre, post = chat_frame(codec)
        doc = codec.encode(pre + "Read this document.\n\n" + document)
        q = codec.encode(f"\n\nAnswer from the document above in one or two sentences. Question: {question}" + post)
        return doc, q
    return codec.encode("Document:\n" + document), codec.encode(f"\nQ: {question}\nA:")


def _find_artifact(store, name: str, regime: dict):
    from tieredkv.artifacts.manifest import parse_manifest

    for art_id in store.list_manifests():
        art = parse_manifest(store.get_manifest(art_id), stored_as=art_id, where=store.path)  # verified
        if art.name == name and art.domain.get("regime") == regime:
            return art
    return None


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


def cmd_qa(a) -> int:
    from paging import PageStore, StoreConfig
    from tieredkv.corpus import DEFAULT_QUESTION, default_document
    from tieredkv.errors import EmptyInputError, TieredKVError
    from tieredkv.models import cache_dir, load_model
    from tieredkv.tiered_config import TieredConfig
    from tieredkv.tiered_model import TieredModel, working_set_bytes

    document = read_text_file(a.doc, "--doc") if a.doc else default_document()
    question = a.question if a.question is not None else DEFAULT_QUESTION
    if not document.strip():
        raise EmptyInputError(f"the document {a.doc or '(default)'} is empty")
    if not question.strip():
        raise EmptyInputError("the question is empty")
    lm = load_model(a.model)
    store_dir = a.store or str(cache_dir() / "stores" / Path(a.model).name)
    doc_ids, q_ids = _prompt_parts(lm, document, question)
    # own positions inside the model's window (exact), fixed distance beyond it (TieredConfig.resolve)
    config = TieredConfig(page_size=a.page_size, sink_pages=a.sink_pages, local_pages=a.local_pages,
                          topk_pages=a.topk_pages, position=a.position)
    config = config.resolve(lm.model, len(doc_ids) + len(q_ids) + a.max_new_tokens)
    position = config.position
    if a.reencode_pages is not None and (a.reencode_pages < 0 or (a.reencode_pages and position != "fixed")):
        raise TieredKVError(f"--reencode-pages {a.reencode_pages}: re-encoding takes N >= 0 and runs under the fixed "
                            f"policy only; this context runs under {position} positions. Pass --position fixed, "
                            "or drop --reencode-pages.")
    reencode = a.reencode_pages if a.reencode_pages is not None else (QA_REENCODE if position == "fixed" else 0)
    config = dataclasses.replace(config, reencode_pages=reencode)
    name = "doc:" + hashlib.sha256(document.encode()).hexdigest()
    t0 = time.perf_counter()
    store_cfg = StoreConfig(lmdb_max_map_size=a.disk_budget, device_budget_bytes=working_set_bytes(lm, config))
    with PageStore(store_dir, store_cfg) as store:
        tm = TieredModel(lm, store, config)
        art = None if a.reingest else _find_artifact(store, name, tm.domain()["regime"])
        if art is not None:
            tm.graft(art)
            how = "grafted (no re-ingest)"
        else:
            tm.check_disk_budget(len(doc_ids) + len(q_ids) + a.max_new_tokens, budget_bytes=a.disk_budget)
            bar = _IngestBar(tm, len(doc_ids), a.quiet)
            try:
                art = tm.ingest(doc_ids, name=name, progress=bar)
            finally:
                bar.close()
            how = "ingested"
        t_ctx = time.perf_counter() - t0
        tm.cache.retrieval_log.clear()
        t1 = time.perf_counter()
        out = tm.generate(q_ids, max_new_tokens=a.max_new_tokens)
        t_answer = time.perf_counter() - t1
        if lm.codec.eos_token_id in out:
            out = out[: out.index(lm.codec.eos_token_id)]
        answer = lm.codec.decode(out).strip()
        counts = collections.Counter(p for sel in tm.cache.retrieval_log for p in sel)
        top = []
        for pid, n in counts.most_common(a.show_pages):
            span = tm.cache.spans[pid]
            text = lm.codec.decode(list(store.get(tm.cache.page_keys[pid]).token_ids))
            top.append({"page": pid, "tokens": [span.start, span.end], "times_retrieved": n, "text": text})
        reencoded = sorted(tm.cache.reencoded)
        stats = store.stats()
        tm.close()
    report = {"answer": answer, "question": question, "context": how, "position": position, "artifact": art.artifact_id,
              "document_tokens": len(doc_ids), "pages": len(art.page_keys), "context_s": round(t_ctx, 2),
              "answer_s": round(t_answer, 2), "retrieved_pages": top, "reencoded_pages": reencoded, "store": store_dir,
              "tiers": {k: stats[k] for k in ("device", "host", "lmdb")}}
    if a.json:
        print_json(report)
        return 0
    print(f"Q: {question}\nA: {answer}\n")
    print(f"context: {len(doc_ids):,} tokens, {len(art.page_keys)} pages, {how} in {t_ctx:.1f}s "
          f"(position policy {position}); "
          f"answer in {t_answer:.1f}s; artifact {art.artifact_id}")
    if not top:
        print("retrieval: the whole context fit the working set (nothing needed retrieving)")
    if reencoded:
        print(f"re-encoded for this question (sink and most-retrieved pages): {reencoded}")
    for p in top:
        snippet = " ".join(p["text"].split())[:160]
        print(f"  page {p['page']:4d} tokens {p['tokens'][0]}-{p['tokens'][1]} retrieved {p['times_retrieved']}x: "
              f"{snippet}…")
    mib = lambda b: b / 2**20  # noqa: E731
    st = report["tiers"]
    print(f"tiers: device {mib(st['device']['bytes']):.1f} MiB / {mib(st['device']['budget_bytes']):.0f} MiB, "
          f"host {mib(st['host']['bytes']):.1f} MiB, lmdb {mib(st['lmdb']['bytes']):.1f} MiB ({store_dir})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("qa", help="answer a question about a long document (ingested once, grafted after)")
    model_arg(p)
    p.add_argument("--doc", help="a UTF-8 text file (default: statements chapter of the Python language reference)")
    p.add_argument("--question", help="the question (default: %r)" % "What does the nonlocal statement do?")
    p.add_argument("--store", help="store directory (default: ~/.cache/tieredkv/stores/MODEL)")
    p.add_argument("--max-new-tokens", type=positive_int, default=48)
    p.add_argument("--page-size", type=positive_int)
    p.add_argument("--sink-pages", type=nonneg_int, default=1)
    p.add_argument("--local-pages", type=positive_int, default=16)
    p.add_argument("--topk-pages", type=positive_int, help="per KV head (default: 16 under --position own, 8 under fixed)")
    p.add_argument("--reencode-pages", type=nonneg_int,
                   help=f"fixed policy: compute the sink and the N pages the question retrieves most afresh, together, "
                        f"before answering (default: {QA_REENCODE} under fixed; 0: off)")
    p.add_argument("--position", choices=("auto", "own", "fixed"), default="auto",
                   help="auto: own positions when the context fits the model's window, else fixed distance")
    p.add_argument("--disk-budget", type=positive_int, help="bytes the store may use on disk (default: the free space)")
    p.add_argument("--show-pages", type=positive_int, default=3, help="how many retrieved pages to show")
    p.add_argument("--reingest", action="store_true", help="ingest again even if the document is stored")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_qa)
