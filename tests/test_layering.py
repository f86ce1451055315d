"""index/ knows vectors and page ids: it must not import the model or storage layers. safefiles/ sits below
every package of the project: it imports none of them."""

import ast
from pathlib import Path

FORBIDDEN = {"tieredkv", "paging", "transformers", "torch"}


def _imports_of(folder: str, forbidden: set[str]) -> None:
    root = Path(__file__).resolve().parents[1] / folder
    files = sorted(root.rglob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{folder}/{path.name} imports {name}"


def test_index_imports_stay_below_models_and_storage():
    _imports_of("index", FORBIDDEN)


def test_safefiles_imports_nothing_of_ours():
    _imports_of("safefiles", FORBIDDEN | {"index", "safefiles"})
