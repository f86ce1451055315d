"""A second long-document QA corpus, of news prose: 300 Australian news articles, 360,083 characters.

The Lee background corpus: ABC news articles from around December 2001, one per line, shipped as
`gensim/test/test_data/lee_background.cor` inside the gensim 4.4.0 wheel on PyPI. The wheel is read with
`zipfile` (gensim is never installed or imported). It is looked for in `$TIEREDKV_CACHE/data/` (default
`~/.cache/tieredkv/data/`); if absent, it is fetched once with `pip download` at set-up. Both the wheel's
and the member file's SHA-256 are pinned below and checked on every build.

Text: the articles in file order, each stripped of surrounding whitespace, separated by one blank line,
ending with a newline. Each article is a Section titled "article N" (N from 1) with source "lee:N"; the
one Source is "lee". The text depends only on the pinned member file; `Corpus.python_version` records the
interpreter that built it, as in `bench.corpora.longdoc`. Questions over this corpus live in
`bench/corpora/news_questions.json`; `python -m bench.tools.longdoc_check --set news` validates them (`--tokens`
also counts the SmolLM2 tokens).

    from bench.corpora.news import build_corpus
    corpus = build_corpus()
    corpus.text, corpus.sections, corpus.sources, corpus.sha256
"""
from __future__ import annotations

import hashlib
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

from bench.corpora.longdoc import Corpus
from bench.corpora.pinned import assemble, data_dir, fetch_into, sha256_file

__all__ = ["build_corpus", "wheel_dir", "WHEEL", "MEMBER"]

WHEEL = "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"
MEMBER = "gensim/test/test_data/lee_background.cor"
MEMBER_SHA256 = "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb"
ARTICLES = 300
PIP_ARGS = ("download", "gensim==4.4.0", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
            "--platform", "manylinux_2_28_x86_64")


wheel_dir = data_dir  # where the wheel is kept: `$TIEREDKV_CACHE/data` (default `~/.cache/tieredkv/data`)


def _fetch(dest: Path) -> None:
    """`pip download` the wheel into a scratch folder under `dest`, then move it into place."""
    fetch_into(dest, WHEEL, [sys.executable, "-m", "pip", *PIP_ARGS, "-d", "."], "news corpus",
               f"copy the wheel from PyPI (gensim 4.4.0) into {dest}")


def _articles(wheel: Path) -> list[str]:
    digest = sha256_file(wheel)
    if digest != WHEEL_SHA256:
        raise ValueError(f"{wheel} has SHA-256 {digest}, not the pinned {WHEEL_SHA256}: "
                         f"delete it and run again to fetch it afresh")
    with zipfile.ZipFile(wheel) as z:
        raw = z.read(MEMBER)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != MEMBER_SHA256:
        raise ValueError(f"{MEMBER} in {wheel} has SHA-256 {digest}, not the pinned {MEMBER_SHA256}: "
                         f"delete the wheel and run again to fetch it afresh")
    articles = [line.strip() for line in raw.decode("utf-8").split("\n") if line.strip()]
    if len(articles) != ARTICLES:
        raise ValueError(f"{MEMBER} holds {len(articles)} articles, not {ARTICLES}")
    return articles


@lru_cache(maxsize=1)
def build_corpus() -> Corpus:
    """The corpus: deterministic, given the pinned wheel (fetched into `wheel_dir()` if it is not there)."""
    wheel = wheel_dir() / WHEEL
    if not wheel.is_file():
        _fetch(wheel.parent)
    sections = [(f"article {n}", article, f"lee:{n}") for n, article in enumerate(_articles(wheel), 1)]
    return assemble("lee", f"{wheel}!{MEMBER}", sections)
