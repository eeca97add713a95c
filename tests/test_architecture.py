"""The layers of searchrl stay straight: no import cycle among its modules, read from the source (fast, no import).

An edge A -> B means importing A can run B: a top-level or a function-level import (a cycle hidden inside a
function is still a cycle), including the `__init__` of every package on B's dotted path. Imports under
`if TYPE_CHECKING:` never run and do not count. A module's own parent packages are already loading when it
runs, so reaching them again adds no edge, unless the module imports names from the package itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "searchrl"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere in the file except under `if TYPE_CHECKING:`."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        for statement in node.orelse:
            yield from _runtime_imports(statement)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _runtime_imports(child)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The modules a statement imports by name (`from pkg import submodule` names the submodule, not pkg)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    submodules = [f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in known]
    return submodules + ([prefix] if len(submodules) < len(node.names) else [])


def import_graph() -> dict[str, set[str]]:
    """searchrl module -> the searchrl modules importing it can run (see the module docstring)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree):
            for target in _targets(module, path.name == "__init__.py", node, known):
                parts = target.split(".")
                for loaded in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                    own_parent = module.startswith(loaded + ".")
                    if loaded in known and loaded != module and (loaded == target or not own_parent):
                        graph[module].add(loaded)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_through(group, graph) for group in groups]


def _cycle_through(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path inside `group` from its first module back to itself (breadth first)."""
    start = min(group)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(group)}")


def test_no_import_cycle_among_searchrl_modules():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (give each thing one owner below both, or invert the dependency):\n" + (
        "\n".join(" -> ".join(c) for c in cycles)
    )


def test_the_graph_sees_top_level_function_level_and_package_imports():
    graph = import_graph()
    assert len(graph) > 80
    # top level: the suite evaluation reads the benchmark sets from data/
    assert "searchrl.data.benchmarks" in graph["searchrl.evaluation.benchmarks"]
    # function level (deferring torch): the report's check for a suite evaluation
    assert "searchrl.evaluation.benchmarks" in graph["searchrl.evaluation.report"]
    # importing searchrl.env.environment from outside the package runs searchrl/env/__init__.py first
    assert "searchrl.env" in graph["searchrl.sections"]


def test_imports_under_type_checking_do_not_count():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import only_for_types\nelse:\n    import at_run_time\n"
        "def f():\n    import inside_a_function\n"
    )
    names = [alias.name for node in _runtime_imports(tree) for alias in node.names]
    assert names == ["TYPE_CHECKING", "at_run_time", "inside_a_function"]


def test_find_cycles_reports_a_cycle_and_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
