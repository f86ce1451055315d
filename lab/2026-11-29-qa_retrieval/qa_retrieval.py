"""Does retrieval bring in the page that answers a question? Measured on the QA demo's document.

The default QA document (statements of the Python language reference) is ingested once by
TieredModel. For each question "What does the X statement do?" the answer pages are the pages
overlapping the section "## The X statement". The question's real query vectors are captured
per layer, and every scorer ranks the eligible pages (not sink, not local window):

    oracle      the attention mass full attention would give each page (softmax over all keys)
    minmax      Quest upper bound, queries averaged (the PageIndex default)
    minmax-max  Quest upper bound per query, max over the chunk's queries
    mean, repr  PageIndex's flat summaries

Reported per scorer: the fraction of layers whose top-k holds an answer page, and the overlap
of its top-k with the oracle's top-k. The oracle says whether the model itself looks there.

    python bench/qa_retrieval.py --json
"""
from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-11-29-summary_choice"))  # a sibling study
from bench.report import environment, sha256_ids, write_report  # noqa: E402
from summary_choice import capture_queries  # noqa: E402

from index import PageIndex, summarize  # noqa: E402
from index.scoring import quest_bound  # noqa: E402
from paging import PageStore, StoreConfig  # noqa: E402
from tieredkv.question.qa import prompt_parts as _prompt_parts  # noqa: E402
from tieredkv.question.corpus import default_document  # noqa: E402
from tieredkv.models.loading import load_model  # noqa: E402
from tieredkv.engine.tiered_config import TieredConfig  # noqa: E402
from tieredkv.engine.tiered_model import TieredModel  # noqa: E402

TOPICS = ("assert", "break", "continue", "del", "global", "import", "nonlocal", "pass", "raise", "return",
          "yield", "with", "while", "try", "lambda")
SCORERS = ("oracle", "minmax", "minmax-max", "mean", "repr")


def token_starts(lm, document: str) -> list[int]:
    """Character offset at which each of `document`'s tokens starts (the byte tokenizer: each byte)."""
    tok = getattr(lm.codec, "tokenizer", None)
    if tok is None:  # one token per UTF-8 byte
        return [i for i, ch in enumerate(document) for _ in ch.encode()]
    return [s for s, _ in tok(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]


def section_pages(document: str, starts: list[int], prefix: int, topic: str, page_size: int) -> list[int]:
    """Pages whose tokens overlap the section of `topic`; `prefix` tokens precede the document."""
    head = f"## The {topic} statement"
    a = document.index(head)
    nxt = document.find("\n\n## The ", a + len(head))
    b = len(document) if nxt < 0 else nxt
    ta = prefix + bisect.bisect_right(starts, a) - 1  # the token holding character a
    tb = prefix + bisect.bisect_left(starts, b)  # the first token at or after b
    return list(range(ta // page_size, (tb - 1) // page_size + 1))


def oracle_mass(queries: np.ndarray, keys: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """queries [H, Q, D], keys [H, T, D] -> [H, N] mean softmax mass per page (full attention)."""
    logits = np.einsum("hqd,htd->hqt", queries.astype(np.float64), keys.astype(np.float64))
    logits /= np.sqrt(queries.shape[-1])
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    return np.stack([p[:, :, s:e].sum(axis=-1).mean(axis=-1) for s, e in spans], axis=1)


def ranked(scores: np.ndarray, eligible: list[int], k: int) -> list[set[int]]:
    """scores [H, N] -> per head, the top-k eligible page ids."""
    el = np.asarray(eligible)
    return [set(el[np.argsort(-s[el], kind="stable")[:k]].tolist()) for s in scores]


def layer_scores(method: str, layer: int, q: np.ndarray, keys: tuple[np.ndarray, np.ndarray, np.ndarray], spans,
                 index_by_method) -> np.ndarray:
    """[H, N] scores of every page for the queries q [H, Q, D] at `layer`; keys: (all keys [H, T, D],
    upper and lower bounds [H, N, D]) of the layer."""
    every, upper, lower = keys
    if method == "oracle":
        return oracle_mass(q, every, spans)
    if method == "minmax-max":
        return np.stack([np.max([quest_bound(q[h, i:i + 1], upper[h], lower[h]) for i in range(q.shape[1])], axis=0)
                         for h in range(q.shape[0])])
    ids, sc = index_by_method[method].search(layer, q, len(spans))  # all pages, best first per head
    out = np.full((q.shape[0], len(spans)), -np.inf)
    for h in range(q.shape[0]):
        keep = ids[h] >= 0
        out[h, ids[h][keep]] = sc[h][keep]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--topics", default=",".join(TOPICS))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--out", default="bench/results/qa_retrieval.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int)
    a = ap.parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    document = default_document()
    doc_ids, _ = _prompt_parts(lm, document, "x")
    cfg = TieredConfig()
    rows = []
    with tempfile.TemporaryDirectory() as d, PageStore(d, StoreConfig()) as store:
        tm = TieredModel(lm, store, cfg)
        art = tm.ingest(doc_ids)
        pages = [store.get(k) for k in art.page_keys]
        layout = pages[0].layout
        spans, pos = [], 0
        for p in pages:
            spans.append((pos, pos + len(p.token_ids)))
            pos += len(p.token_ids)
        n = len(pages)
        eligible = [i for i in range(n) if i >= cfg.sink_pages and i < n - cfg.local_pages]
        keys = [[p.layer_kv(l)[0].float().numpy() for p in pages] for l in range(layout.num_layers)]
        layer_keys = [(np.concatenate(ks, axis=1), np.stack([k.max(axis=1) for k in ks], axis=1),
                       np.stack([k.min(axis=1) for k in ks], axis=1)) for ks in keys]  # once per layer
        starts, prefix = token_starts(lm, document), len(doc_ids) - len(lm.codec.encode(document))
        indexes = {}
        for method in ("minmax", "mean", "repr"):
            index = PageIndex(layout.num_layers, layout.num_kv_heads, layout.head_dim, method=method)
            for i in range(n):
                index.add(i, np.stack([summarize(keys[l][i], method) for l in range(layout.num_layers)]))
            indexes[method] = index
        for topic in a.topics.split(","):
            target = [t for t in section_pages(document, starts, prefix, topic, tm.page_size) if t in eligible]
            if not target:
                print(f"# {topic}: its section lies in the sink or local pages; skipped", file=sys.stderr)
                continue
            _, q_ids = _prompt_parts(lm, "", f"What does the {topic} statement do?")  # the question part only
            tm.graft(art)
            queries = capture_queries(tm, q_ids)
            hits = {m: [] for m in SCORERS}
            overlap = {m: [] for m in SCORERS}
            for layer in range(layout.num_layers):
                q = queries[layer]
                tops = {}
                for m in SCORERS:
                    tops[m] = ranked(layer_scores(m, layer, q, layer_keys[layer], spans, indexes), eligible, a.k)
                for m in SCORERS:
                    union = set().union(*tops[m])
                    hits[m].append(bool(union & set(target)))
                    overlap[m].append(np.mean([len(t & o) / a.k for t, o in zip(tops[m], tops["oracle"])]))
            for m in SCORERS:
                rows.append({"topic": topic, "scorer": m, "answer_pages": target, "pages": n, "k": a.k,
                             "layer_hit_rate": float(np.mean(hits[m])), "oracle_overlap": float(np.mean(overlap[m])),
                             "input_sha256": sha256_ids(doc_ids + q_ids)})
                print({k: v for k, v in rows[-1].items() if k != "input_sha256"}, file=sys.stderr)
        tm.close()
    summary = [{"scorer": m, "layer_hit_rate": float(np.mean([r["layer_hit_rate"] for r in rows if r["scorer"] == m])),
                "oracle_overlap": float(np.mean([r["oracle_overlap"] for r in rows if r["scorer"] == m]))}
               for m in SCORERS]
    write_report(a.out, {"bench": "qa_retrieval", "model": lm.name, "model_fingerprint": lm.fingerprint,
                         "environment": environment(), "config": {"tiered": cfg.regime(tm.page_size), "args": vars(a)},
                         "rows": rows, "summary": summary}, print_json=a.json)
    print(f"\n| scorer | answer page in top-{a.k} (fraction of layers) | overlap with oracle top-{a.k} |\n|---|---|---|")
    for s in summary:
        print(f"| {s['scorer']} | {s['layer_hit_rate']:.2f} | {s['oracle_overlap']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
