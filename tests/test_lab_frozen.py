"""lab/ holds finished studies, frozen: nothing in the product, its benchmarks or its tests imports them."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORTERS = ("tieredkv", "paging", "index", "bench", "testkit", "tests")


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_nothing_imports_lab():
    files = [p for top in IMPORTERS for p in sorted((REPO / top).rglob("*.py"))]
    assert files and (REPO / "lab").is_dir()
    hits = [f"{p.relative_to(REPO)} imports {name}" for p in files for name in imported_modules(p)
            if name.split(".")[0] == "lab"]
    assert not hits, hits


def test_no_sys_path_edits_in_bench():
    # bench/ is a package run as `python -m bench.<name>`: its modules import each other as bench.*
    hits = [str(p.relative_to(REPO)) for p in sorted((REPO / "bench").rglob("*.py"))
            if "sys.path.insert" in p.read_text(encoding="utf-8") or "sys.path.append" in p.read_text(encoding="utf-8")]
    assert not hits, hits
