"""Working-set budget systems of `bench/longdoc_qa.py`: the tiered path at own positions answering from a
working set that holds a fraction of the document's pages (sink + top-k + local), no question-time reading.

    ws12, ws25, ws50   1 sink page, 3/8 of the budget local, the rest retrieved by each KV head alone (per_head)
    ws25-union         the same budget, the KV heads' retrieval shared (their union capped to the same pages)
    stream25           the sink and local pages only (StreamingLLM's working set, the same pages)
    oracle25           ws25's stored pages; the question and answer attend to the sink, local and the
                       evidence pages (forced: what a working set that holds the evidence can do)

Each budget is its own regime (the document is ingested with that working set: pages beyond it were never
seen by later tokens), so each is ingested once per window into the window's store. Rows record the
working set's pages per KV head, its device bytes, decode ms per token, and whether the evidence page was in
the working set of each layer while the question was read.
"""
from __future__ import annotations

import math
import time

from paging import PageStore, StoreConfig
from testkit.placement import ForcedPages
from tieredkv.engine.placement import OwnPositions
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.question.qa import open_document

CHUNK_PAGES = 4  # prefill chunks of 512 tokens: a quarter of the retrieval rounds of one-page chunks

# system -> (fraction of the document's pages in the working set, how the top-k is chosen)
BUDGET_SYSTEMS = {"ws12": (0.125, "per_head"), "ws25": (0.25, "per_head"), "ws50": (0.5, "per_head"),
                  "ws25-union": (0.25, "union"), "stream25": (0.25, "stream"), "oracle25": (0.25, "oracle")}


def budget_config(num_pages: int, fraction: float, mode: str, page_size: int) -> TieredConfig:
    """Own positions, `fraction` of `num_pages` per KV head: 1 sink page, 3/8 local, the rest retrieved;
    the document prefilled CHUNK_PAGES pages at a time (each chunk attends to the working set and itself)."""
    budget = max(3, round(fraction * num_pages))
    common = dict(position="own", sink_pages=1, page_size=page_size, chunk_pages=CHUNK_PAGES)
    if mode == "stream":
        return TieredConfig(**common, local_pages=budget - 1, topk_pages=0)
    local = max(1, round(budget * 3 / 8))
    topk = budget - 1 - local
    if mode == "union":
        return TieredConfig(**common, local_pages=local, topk_pages=topk, union_pages=topk)
    return TieredConfig(**common, local_pages=local, topk_pages=topk, retrieval="per_head")


def answer(runner, item, q_ids: list[int], system: str) -> tuple[list[int], dict]:
    """One question under a budget system; (answer ids, the row's evidence)."""
    lm, w, max_new = runner.lm, item.window, runner.a.max_new_tokens
    fraction, mode = BUDGET_SYSTEMS[system]
    page_size = runner.a.page_size
    config = budget_config(math.ceil(len(w.doc_ids) / page_size), fraction, "per_head" if mode == "oracle" else mode,
                           page_size)
    evidence = item.answer_pages(page_size)
    with PageStore(runner.work / w.name, StoreConfig(device_budget_bytes=working_set_bytes(lm, config))) as store:
        tm = TieredModel(lm, store, config)
        try:
            t0 = time.perf_counter()
            art, grafted = open_document(tm, w.doc_ids, "longdoc-budget")
            t_open = time.perf_counter() - t0
            if mode == "oracle":
                tm.cache.policy = ForcedPages(OwnPositions(), evidence, replace=True)
            tm.keep_in_memory()
            tm.cache.retrieval_log.clear()
            t1 = time.perf_counter()
            out = tm.generate(q_ids, max_new_tokens=max_new)
            t_answer = time.perf_counter() - t1
            log, layers = list(tm.cache.retrieval_log), len(tm.cache.layers)
            local_first = tm.cache.local_first
        finally:
            tm.close()
    read_layers = log[:layers]  # the question's forward: one selection per layer
    return out, {"config": {"sink_pages": 1, "local_pages": config.local_pages, "topk_pages": config.topk_pages,
                            "retrieval": config.retrieval, "chunk_pages": config.chunk_pages, "mode": mode},
                 "pages_per_head": config.capacity_pages, "document_pages": math.ceil(len(w.doc_ids) / page_size),
                 "device_tier_budget_bytes": working_set_bytes(lm, config), "artifact": art.artifact_id,
                 "grafted": grafted, "open_s": round(t_open, 2), "answer_s": round(t_answer, 2),
                 "decode_ms_per_token": round(1000 * t_answer / max(1, len(out)), 1), "answer_pages": evidence,
                 "evidence_local": any(p >= local_first for p in evidence),
                 "evidence_layers": sum(bool(set(sel) & set(evidence)) for sel in read_layers),
                 "layers": len(read_layers)}
