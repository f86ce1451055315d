"""An offline, deterministic long document (~150,000 SmolLM2 tokens) for long-context question answering.

Built only from texts that ship with CPython 3.11 and with a Debian base system, so nothing is downloaded:

1. `pydoc_data.topics`: the Python language reference (79 topics, in sorted key order), first;
2. `idlelib/help.html`: the IDLE documentation, stripped to text with `html.parser`;
3. `idlelib/extend.txt`: "Writing an IDLE extension";
4. CPython's `LICENSE.txt`: the history of the software and its licenses;
5. `/usr/share/common-licenses/`: `GPL-3`, `LGPL-2.1`, `Apache-2.0`, `MPL-2.0` and `GFDL-1.3` (Debian
   package `base-files`).

The text depends on the exact CPython version (the reference changes between patch releases), so
benchmarks should record `Corpus.sha256` and `Corpus.python_version` next to their results.
Questions over this corpus live in `bench/corpora/longdoc_questions.json`; `python -m bench.tools.longdoc_check`
validates them.

    from bench.corpora.longdoc import build_corpus
    corpus = build_corpus()
    corpus.text, corpus.sections, corpus.sources, corpus.sha256
"""
from __future__ import annotations

import hashlib
import platform
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["Section", "Source", "Corpus", "build_corpus", "CorpusSourceMissing"]

COMMON_LICENSES = Path("/usr/share/common-licenses")


class CorpusSourceMissing(FileNotFoundError):
    """A file the corpus is built from is not on this machine."""


@dataclass(frozen=True)
class Section:
    title: str
    start: int  # character offsets into Corpus.text, end exclusive
    end: int
    source: str  # e.g. "pydoc:nonlocal", "idle:shell-window", "license:GPL-3"


@dataclass(frozen=True)
class Source:
    name: str  # e.g. "pydoc", "idle-help"
    origin: str  # where the text comes from: a module or a file path
    start: int
    end: int


@dataclass(frozen=True)
class Corpus:
    text: str
    sections: tuple[Section, ...]
    sources: tuple[Source, ...]
    sha256: str
    python_version: str

    def section_at(self, offset: int) -> Section:
        """The section holding character `offset`."""
        for s in self.sections:
            if s.start <= offset < s.end:
                return s
        raise IndexError(f"offset {offset} is outside every section")


# ----------------------------------------------------------------------------- reading sources
def _stdlib_file(rel: str) -> Path:
    path = Path(sysconfig.get_path("stdlib")) / rel
    if not path.is_file():
        raise CorpusSourceMissing(f"long-document corpus source {path} is missing (it ships with CPython; "
                                  f"this interpreter's stdlib is {sysconfig.get_path('stdlib')})")
    return path


def _system_file(path: Path) -> Path:
    if not path.is_file():
        raise CorpusSourceMissing(f"long-document corpus source {path} is missing (Debian package base-files)")
    return path


def _clean(text: str) -> str:
    """Unix newlines, no trailing spaces, no tabs or form feeds, no runs of more than one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "\n").expandtabs(8)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


class _HelpHTML(HTMLParser):
    """Text of the Sphinx page body (everything inside the top-level <section>), as (heading, id) and text blocks."""

    BLOCK = {"p", "li", "dt", "dd", "pre", "div", "tr", "blockquote", "section", "ul", "ol", "dl", "table",
             "h1", "h2", "h3", "h4", "h5", "h6", "br"}
    HEADING = {"h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str, str]] = []  # (kind "heading"|"text", text, section id)
        self._buf: list[str] = []
        self._section_ids: list[str] = []
        self._skip = 0  # inside <a class="headerlink"> (the pilcrow) or <script>/<style>
        self._pre = 0
        self._heading = False

    def _flush(self) -> None:
        raw = "".join(self._buf)
        self._buf = []
        text = raw.strip("\n") if self._pre else " ".join(raw.split())
        if text.strip():
            kind = "heading" if self._heading else "text"
            self.blocks.append((kind, text, self._section_ids[-1] if self._section_ids else ""))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if self._skip:
            self._skip += tag in ("a", "script", "style")
            return
        if (tag == "a" and "headerlink" in (a.get("class") or "").split()) or tag in ("script", "style"):
            self._skip = 1
            return
        if tag == "section":
            self._flush()
            self._section_ids.append(a.get("id") or "")
        elif self._section_ids and tag in self.BLOCK:
            self._flush()
            if tag in self.HEADING:
                self._heading = True
            if tag == "pre":
                self._pre += 1

    def handle_endtag(self, tag):
        if self._skip:
            self._skip -= tag in ("a", "script", "style")
            return
        if tag == "section" and self._section_ids:
            self._flush()
            self._section_ids.pop()
        elif self._section_ids and tag in self.BLOCK:
            self._flush()
            if tag in self.HEADING:
                self._heading = False
            if tag == "pre":
                self._pre -= 1

    def handle_data(self, data):
        if self._section_ids and not self._skip:
            self._buf.append(data)


# ----------------------------------------------------------------------------- building
class _Builder:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pos = 0
        self.sections: list[Section] = []
        self.sources: list[Source] = []

    def _add(self, text: str) -> None:
        self.parts.append(text)
        self.pos += len(text)

    def _sep(self) -> None:
        if self.pos:
            self._add("\n\n\n")

    def source(self, name: str, origin: str, banner: str, sections: list[tuple[str | None, str, str]]) -> None:
        """One source: an underlined banner line, then (title, body, section key) sections.

        A section opens with its title line; a section titled None (a whole-file source) has the
        banner for its title and no line of its own."""
        self._sep()
        start = self.pos
        self._add(f"{banner}\n{'=' * len(banner)}")
        for title, body, key in sections:
            self._add("\n\n")
            s = self.pos
            if title is None:
                self._add(body)
            else:
                self._add(f"{title}\n\n{body}" if body else title)
            self.sections.append(Section(banner if title is None else title, s, self.pos, key))
        self.sources.append(Source(name, origin, start, self.pos))


def _pydoc_sections() -> list[tuple[str, str, str]]:
    from pydoc_data.topics import topics

    return [(f"Reference topic: {key}", _clean(topics[key]), f"pydoc:{key}") for key in sorted(topics)]


def _idle_sections(path: Path) -> list[tuple[str, str, str]]:
    parser = _HelpHTML()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    out: list[tuple[str, list[str], str]] = []
    for kind, text, sid in parser.blocks:
        if kind == "heading" or not out:
            out.append((text if kind == "heading" else "IDLE", [], sid))
            if kind == "heading":
                continue
        out[-1][1].append(text)
    return [(title, _clean("\n".join(body)), f"idle:{sid}") for title, body, sid in out]


def _whole_file(path: Path, key: str) -> list[tuple[str | None, str, str]]:
    return [(None, _clean(path.read_text(encoding="utf-8")), key)]


@lru_cache(maxsize=1)
def build_corpus() -> Corpus:
    """The corpus: deterministic for a given CPython version and Debian base-files."""
    import pydoc_data.topics

    b = _Builder()
    b.source("pydoc", f"pydoc_data.topics ({pydoc_data.topics.__file__})", "The Python Language Reference",
             _pydoc_sections())
    help_html = _stdlib_file("idlelib/help.html")
    b.source("idle-help", str(help_html), "IDLE, the Python editor and shell", _idle_sections(help_html))
    extend = _stdlib_file("idlelib/extend.txt")
    b.source("idle-extend", str(extend), "IDLE extensions", _whole_file(extend, "idle-extend"))
    lic = _stdlib_file("LICENSE.txt")
    b.source("python-license", str(lic), "Python history and license", _whole_file(lic, "python-license"))
    for name, title in (("GPL-3", "GNU General Public License, version 3"),
                        ("LGPL-2.1", "GNU Lesser General Public License, version 2.1"),
                        ("Apache-2.0", "Apache License, Version 2.0"),
                        ("MPL-2.0", "Mozilla Public License, version 2.0"),
                        ("GFDL-1.3", "GNU Free Documentation License, version 1.3")):
        path = _system_file(COMMON_LICENSES / name)
        b.source(f"license:{name}", str(path), title, _whole_file(path, f"license:{name}"))
    text = "".join(b.parts) + "\n"
    return Corpus(text, tuple(b.sections), tuple(b.sources), hashlib.sha256(text.encode("utf-8")).hexdigest(),
                  platform.python_version())
