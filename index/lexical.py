"""Lexical page scores: Okapi BM25 of a question's words over each page's text.

A second signal beside the key summaries: a question that names a rare word ("nonlocal",
"tbreak", "Saratoga") finds the pages that contain it whatever the model's queries look like.
Pure Python over strings; the caller decodes pages to text (this package knows no tokenizer).

    scores = BM25Index(page_texts).scores("Which pdb command sets a temporary breakpoint?")  # [N]
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

import numpy as np

_WORD = re.compile(r"[a-z0-9_]+")
# Function words of English questions: they carry no evidence of where an answer is.
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have having
he her here hers him his how i if in into is it its itself just me more most my no nor not now of off on
once only or other our out over own same she should so some such than that the their them then there
these they this those through to too under until up very was we were what when where which while who whom
why will with would you your answer answers question document one two sentences many much called
""".split())


def stem(word: str) -> str:
    """A light English stemmer for a lower-case word: inflections only (plural -s/-es/-ies, -ed, -ing, a final
    -e, a doubled final consonant), so that "harpooneers", "harpooned" and "harpooning" meet "harpoon".
    Conflating a few unrelated words ("news", "new") is the price; identifiers with digits or underscores,
    and words of 3 letters or fewer, are left as they are."""
    if len(word) <= 3 or not word.isalpha():
        return word
    w = word
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "ches", "shes", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and any(c in "aeiouy" for c in w[:-len(suffix)]):
            w = w[:-len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiouls":
                w = w[:-1]  # "stopped" -> "stop", but "called" and "seeing" keep theirs
            break
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]  # "move", "moved", "moving" -> "mov"
    return w


def term(word: str, *, stemmed: bool = False) -> str | None:
    """The index term a word of text counts as: lower case, reduced by `stem` when `stemmed`; None for a
    stopword or a word of underscores alone (never counted)."""
    w = word.lower()
    if w in STOPWORDS or not w.strip("_"):
        return None
    return stem(w) if stemmed else w


def words(text: str, *, stemmed: bool = False) -> list[str]:
    """The terms of `text` in order (`term`): `__init__` and `f_lineno` stay one word."""
    return [t for t in (term(w, stemmed=stemmed) for w in _WORD.findall(text.lower())) if t is not None]


class BM25Index:
    """BM25 (k1, b) over a fixed list of page texts; page ids are list positions."""

    def __init__(self, texts: Sequence[str], *, k1: float = 1.2, b: float = 0.75, stemmed: bool = False):
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b, self.stemmed = k1, b, stemmed
        self.counts = [Counter(words(t, stemmed=stemmed)) for t in texts]
        self.lengths = np.array([sum(c.values()) for c in self.counts], dtype=np.float64)
        self.avg_length = float(self.lengths.mean()) if len(self.counts) and self.lengths.sum() else 1.0
        df = Counter(w for c in self.counts for w in c)
        n = len(self.counts)
        self.idf = {w: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def __len__(self) -> int:
        return len(self.counts)

    def term(self, word: str) -> str | None:
        """The index term a word of text counts as in this index (`term`)."""
        return term(word, stemmed=self.stemmed)

    def scores(self, query: str) -> np.ndarray:
        """[N] float64 BM25 score of every page for the words of `query` (0 where none occurs)."""
        out = np.zeros(len(self.counts), dtype=np.float64)
        norm = self.k1 * (1 - self.b + self.b * self.lengths / self.avg_length)
        for w in set(words(query, stemmed=self.stemmed)):
            idf = self.idf.get(w)
            if idf is None:
                continue
            tf = np.array([c.get(w, 0) for c in self.counts], dtype=np.float64)
            out += idf * tf * (self.k1 + 1) / (tf + norm)
        return out

    def run_scores(self, query: str, pages: int) -> np.ndarray:
        """[N - pages + 1] float64 BM25 of `query` over each run of `pages` consecutive pages (run i: pages i
        to i + pages - 1) scored as one passage: counts summed over the run, lengths normalised by the mean
        run's, idf over pages. A run is one passage of the length a question reads, so a run where several of
        the question's words meet outscores a page where one of them repeats (BM25 saturates repeats).
        `pages` >= the page count: one run of every page. `pages` = 1: `scores`."""
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 1:
            raise ValueError(f"pages must be an int >= 1, got {pages!r}")
        n = len(self.counts)
        pages = min(pages, n)
        m = n - pages + 1
        if n == 0:
            return np.zeros(0, dtype=np.float64)

        def summed(per_page: np.ndarray) -> np.ndarray:  # [m]: the sum over each run
            c = np.concatenate([[0.0], np.cumsum(per_page)])
            return c[pages:] - c[:m]

        lengths = summed(self.lengths)
        norm = self.k1 * (1 - self.b + self.b * lengths / max(float(lengths.mean()), 1.0))
        out = np.zeros(m, dtype=np.float64)
        for w in set(words(query, stemmed=self.stemmed)):
            idf = self.idf.get(w)
            if idf is not None:
                tf = summed(np.array([c.get(w, 0) for c in self.counts], dtype=np.float64))
                out += idf * tf * (self.k1 + 1) / (tf + norm)
        return out


def bm25_scores(texts: Sequence[str], query: str) -> np.ndarray:
    return BM25Index(texts).scores(query)
