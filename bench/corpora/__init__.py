"""The texts the benchmarks read: the long-document QA corpora with their questions, and the synthetic
long-context tasks built over real prose.

    longdoc.py   CPython and Debian reference text (~151K SmolLM2 tokens); longdoc_questions.json
    news.py      300 news articles from a pinned PyPI wheel, held out; news_questions.json
    moby.py      Moby-Dick chapters 1-61 from a pinned npm tarball, a development set; moby_questions.json
    sotu.py      State of the Union addresses 1790-1827 from a pinned npm tarball, held out; sotu_questions.json
    pinned.py    the registry files those three read: fetched once at set-up, checked by SHA-256
    tasks.py     passkey, multikey and the RULER-style suite (`tasks.SUITE`)
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

QUESTION_SETS = {  # set name: (corpus module, questions file)
    "longdoc": ("bench.corpora.longdoc", HERE / "longdoc_questions.json"),
    "news": ("bench.corpora.news", HERE / "news_questions.json"),
    "moby": ("bench.corpora.moby", HERE / "moby_questions.json"),
    "sotu": ("bench.corpora.sotu", HERE / "sotu_questions.json"),
}
