"""Where does the reading's one passage land, by each way of choosing it? No model forward: tokens only.

    PYTHONPATH=. python lab/2026-12-06-passage-choice/passage_choice.py --out passage_choice.json

For every question of bench/longdoc_qa.py's two sets at every length, the document's 128-token pages are
ranked and one 512-token passage placed: `page`, BM25 over single pages, the passage centred where the
question's words are densest in and around the best page (the earlier default); `run`, BM25 over each run of 4
pages, the passage centred as `page` centres it in the run's best page by BM25 over pages alone
(tieredkv/question/reading.py now); `run-centred`, centred where the words are densest in the whole best run;
`run-exact`, the best run itself;
`run-fine`, inside the best run and a page either side, the 512-token passage (every 16 tokens) with the highest
BM25. A choice is counted when the passage holds the whole evidence sentence. Inputs are hashed as
bench/longdoc_qa.py hashes them.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from types import SimpleNamespace

from bench.longdoc_qa import prepare
from tieredkv.engine.working_set import Span
from tieredkv.models.loading import load_model
from tieredkv.question import reading

PAGE, WIDTH = 128, 512


def fake_cache(doc_ids: list[int]) -> SimpleNamespace:
    spans = [Span(i, a, min(a + PAGE, len(doc_ids))) for i, a in enumerate(range(0, len(doc_ids), PAGE))]
    return SimpleNamespace(spans=spans, lexical_index=None, sealed_upto=len(doc_ids),
                           page_token_ids=lambda p: doc_ids[spans[p].start:spans[p].end])


def choose(cache, question: str, frame: int, codec, run: int) -> tuple[int, int]:
    """The reading's one passage, as `reading.read` places it with the lexical signal over runs of `run` pages
    (1: each page alone, the earlier default)."""
    candidates = [s.page_id for s in cache.spans if s.end > frame]
    words = (reading.lexical_runs(cache, candidates, question, codec, run) if run > 1
             else reading.lexical_scores(cache, candidates, question, codec))
    ranked = reading.rank(candidates, {}, words, "lexical")
    found = reading.places(cache, ranked, question, 1, WIDTH, codec, first=frame, end=cache.sealed_upto, run=run)
    return found[0] if found else (max(frame, cache.sealed_upto - WIDTH), cache.sealed_upto)


def choose_run_exact(cache, question: str, frame: int, codec) -> tuple[int, int]:
    """The best run of WIDTH // PAGE pages by BM25 over the run, read as it is (page-aligned)."""
    import numpy as np

    k = WIDTH // PAGE
    scores = reading.lexical_index(cache, codec).run_scores(question, k)
    first_page = next(s.page_id for s in cache.spans if s.end > frame)
    scores[:first_page] = -1
    i = int(np.argmax(scores))
    end = cache.sealed_upto
    a = max(frame, min(cache.spans[i].start, end - WIDTH))
    return a, min(end, a + WIDTH)


def word_hits(token_texts, weights):
    """(token index, word) of every question word (a key of `weights`) that starts in a token."""
    import numpy as np

    text, starts = "", []
    for t in token_texts:
        starts.append(len(text))
        text += t
    return [(int(np.searchsorted(starts, m.start(), side="right") - 1), m.group())
            for m in reading._WORD.finditer(text.lower()) if m.group() in weights]


def choose_fine(cache, question: str, frame: int, codec, stride: int = 16) -> tuple[int, int]:
    """The best run of pages by window BM25, then inside it and a page either side the WIDTH-token passage
    (every `stride` tokens) with the highest BM25 (saturated counts: distinct words over repeats); ties:
    the one nearest the run's middle."""
    import numpy as np
    from index.lexical import STOPWORDS

    index = reading.lexical_index(cache, codec)
    k = WIDTH // PAGE
    scores = index.run_scores(question, k)
    first_page = next(s.page_id for s in cache.spans if s.end > frame)
    scores[:first_page] = -1
    i = int(np.argmax(scores))
    spans, end = cache.spans, cache.sealed_upto
    lo_p, hi_p = max(first_page, i - 1), min(len(spans), i + k + 1)
    lo, hi = spans[lo_p].start, spans[hi_p - 1].end
    mid = (spans[i].start + spans[min(i + k, len(spans)) - 1].end) // 2
    if scores[i] <= 0 or hi - lo <= WIDTH:
        a = max(frame, min(lo, end - WIDTH))
        return a, min(end, a + WIDTH)
    weights = {w: index.idf.get(w, 0.0) for w in set(reading._WORD.findall(question.lower())) if w not in STOPWORDS}
    ids = [t for q in range(lo_p, hi_p) for t in cache.page_token_ids(q)]
    hits = word_hits([codec.decode([t]) for t in ids], weights)
    best = None
    for a in range(lo, hi - WIDTH + 1, stride):
        tf = collections.Counter(w for t, w in hits if a <= lo + t < a + WIDTH)
        score = sum(weights[w] * n * (index.k1 + 1) / (n + index.k1) for w, n in tf.items())
        key = (round(score, 9), -abs(a + WIDTH // 2 - mid))
        if best is None or key > best[0]:
            best = (key, a)
    a = max(frame, min(best[1], end - WIDTH))
    return a, min(end, a + WIDTH)


def choose_run_centred(cache, question: str, frame: int, codec) -> tuple[int, int]:
    """The best run of WIDTH // PAGE pages by BM25 over the run, the passage centred where the question's words
    are densest in the whole run (the first version of the change; it answered fewer at 8K)."""
    import numpy as np
    from index.lexical import STOPWORDS

    k = WIDTH // PAGE
    index = reading.lexical_index(cache, codec)
    scores = index.run_scores(question, k)
    first_page = next(s.page_id for s in cache.spans if s.end > frame)
    scores[:first_page] = -1
    i, spans, end = int(np.argmax(scores)), cache.spans, cache.sealed_upto
    if scores[i] <= 0:
        return max(frame, end - WIDTH), end
    last = min(i + k, len(spans)) - 1
    lo_page, hi_page = max(0, i - 1), min(len(spans), last + 2)
    weights = {w: index.idf.get(w, 0.0) for w in set(reading._WORD.findall(question.lower())) if w not in STOPWORDS}
    ids = [t for q in range(lo_page, hi_page) for t in cache.page_token_ids(q)]
    around = spans[lo_page].start
    dense = reading.word_weights([codec.decode([t]) for t in ids], weights)
    c = spans[i].start - around + reading.centre(dense[spans[i].start - around:spans[last].end - around], WIDTH)
    a = max(frame, min(around + c - WIDTH // 2, end - WIDTH))
    return a, min(end, a + WIDTH)


VARIANTS = {"page": lambda *x: choose(*x, run=1),  # the earlier default
            "run": lambda *x: choose(*x, run=WIDTH // PAGE),  # the default now (reading.run_pages)
            "run-centred": choose_run_centred,
            "run-exact": choose_run_exact,
            "run-fine": choose_fine}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4k,8k,16k,32k,128k")
    ap.add_argument("--news-lengths", default="8k,32k")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    lm = load_model("smollm2")
    rows, tally, inputs = [], collections.Counter(), {}
    for qset, lengths in (("longdoc", a.lengths), ("news", a.news_lengths)):
        info, items = prepare(lm, lengths.split(","), None, qset)
        inputs[qset] = {k: info[k] for k in ("corpus_sha256", "questions_sha256", "corpus_tokens")}
        caches: dict[str, SimpleNamespace] = {}
        for it in items:
            w = it.window
            cache = caches.setdefault(w.name, fake_cache(w.doc_ids))
            ea, eb = it.evidence_tokens()
            row = {"set": qset, "length": w.length, "id": it.q["id"], "window": w.name, "evidence": [ea, eb]}
            for name, f in VARIANTS.items():
                pa, pb = f(cache, it.q["question"], w.prefix_len, lm.codec)
                hit = pa <= ea and eb <= pb
                key = f"{qset} {w.length} {name}"
                tally[key, "n"] += 1
                tally[key, "hit"] += hit
                row[name] = {"passage": [pa, pb], "hit": hit}
            rows.append(row)
        print({k[0]: f"{tally[k[0], 'hit']}/{tally[k[0], 'n']}" for k in tally if k[0].startswith(qset)},
              file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump({"model": lm.name, "inputs": inputs, "rows": rows, "summary": {k: f"{tally[k, 'hit']}/{tally[k, 'n']}"
                                             for k in sorted({k for k, _ in tally})}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
