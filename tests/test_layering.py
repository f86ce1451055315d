"""index/ knows vectors and page ids: it must not import the model or storage layers."""

import ast
from pathlib import Path

FORBIDDEN = {"tieredkv", "paging", "transformers", "torch"}


def test_index_imports_stay_below_models_and_storage():
    root = Path(__file__).resolve().parents[1] / "index"
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
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
