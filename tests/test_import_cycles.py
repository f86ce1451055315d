"""No import circle among the project's modules: counting imports inside functions too, since a
function-local import of a module that imports back only hides the circle until the call."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tieredkv", "paging", "index")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, name: str) -> set[str]:
    """Every module `path` imports, at module level or in a function; `from m import x` names m and m.x."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".")[: len(name.split(".")) - node.level + is_package] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: {m for m in imported_names(path, name) if m in paths and m != name}
            for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while (member := stack.pop()) != node:
                        component.append(member)
                        on_stack.discard(member)
                    on_stack.discard(node)
                    if component:
                        found.append(sorted([node, *component]))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_cycle_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert "tieredkv.engine.tiered_model" in graph and graph["tieredkv.engine.tiered_model"]
    assert cycles(graph) == []
