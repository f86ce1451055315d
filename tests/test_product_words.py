"""The product's files state current facts: they name no work item by number and nothing of the work's
schedule. lab/ (finished studies, frozen) and tests/ are not the product; bench/results/ holds reports."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE_DIRS = ("tieredkv", "paging", "index", "bench", "scripts", "testkit")
SUFFIXES = {".py", ".sh", ".md", ".txt", ".toml"}
SKIP_DIRS = {"results", "data", "__pycache__"}
PROCESS_WORDS = re.compile(
    r"\bissues?\s+#?\d+"            # "issue 12", "issue #12", "issues 16"
    r"|#\d+'s"                      # "#17's"
    r"|\bthis (?:stop|task|session)\b"
    r"|\blent\b",
    re.IGNORECASE)


def product_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for top in CODE_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            parts = set(path.relative_to(REPO / top).parts[:-1])
            if path.is_file() and path.suffix in SUFFIXES and not parts & SKIP_DIRS:
                files.append(path)
    return files


def process_words(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in PROCESS_WORDS.finditer(text)]


@pytest.mark.parametrize("text, found", [
    ("see issue 12 for why", ["issue 12"]),
    ("Issue #12 fixed it", ["Issue #12"]),
    ("where #17's targets stand", ["#17's"]),
    ("## This stop (2026-12-05)", ["This stop"]),
    ("no GPU was lent to this session", ["lent", "this session"]),
    ("in this task and in issues 3", ["this task", "issues 3"]),
    ("an excellent result; the task's pages; issue the call; #17 alone", []),
])
def test_process_words_pattern(text, found):
    assert [word for _, word in process_words(text)] == found


def test_product_files_name_no_work_items_or_schedule():
    files = product_files()
    assert REPO / "README.md" in files and REPO / "tieredkv" / "__init__.py" in files
    hits = [f"{path.relative_to(REPO)}:{line}: {word}"
            for path in files for line, word in process_words(path.read_text(encoding="utf-8"))]
    assert not hits, "state the product's current facts, not the work's history: " + "; ".join(hits)
