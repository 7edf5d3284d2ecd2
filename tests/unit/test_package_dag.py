"""The library's packages import each other in one direction (docs/ARCHITECTURE.md §3): the
graph of ``modelless``'s top-level packages and modules, every import counted (a function's
lazy import too), has no cycle. A new import that closes one fails here, naming the imports
that form it.

Read from the source with ``ast`` (no import is run), so a cycle is found however the imports
are placed. Also: no library module is over ``MAX_MODULE_LINES``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[2] / "layers" / "modelless" / "modelless"
MAX_MODULE_LINES = 800


def node_of(module: str) -> str:
    """``modelless.pools.local`` -> ``pools``; ``modelless.selection`` -> ``selection``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def library_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(LIBRARY.rglob("*.py")):
        relative = path.relative_to(LIBRARY.parent).with_suffix("")
        yield ".".join(relative.parts).removesuffix(".__init__"), path


def imports_of(path: Path, module: str) -> Iterator[tuple[str, int]]:
    """The ``modelless`` modules ``path`` imports (absolute or relative), with their lines."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for statement in ast.walk(ast.parse(path.read_text())):
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.name.startswith("modelless"):
                    yield alias.name, statement.lineno
        elif isinstance(statement, ast.ImportFrom):
            if statement.level:
                base = package.rsplit(".", statement.level - 1)[0] if statement.level > 1 else package
                target = f"{base}.{statement.module}" if statement.module else base
            else:
                target = statement.module or ""
            if target == "modelless":  # ``from modelless import aws_clients``: the modules named
                for alias in statement.names:
                    yield f"modelless.{alias.name}", statement.lineno
            elif target.startswith("modelless"):
                yield target, statement.lineno


def package_graph() -> dict[str, dict[str, list[str]]]:
    """node -> node it imports -> the imports that make the edge (``module:line -> target``)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, path in library_modules():
        for target, line in imports_of(path, module):
            source, sink = node_of(module), node_of(target)
            if source != sink and sink != "modelless":
                graph[source][sink].append(f"{module}:{line} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, {}):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_the_library_packages_import_each_other_without_a_cycle() -> None:
    graph = package_graph()
    assert len(graph) > 10  # the graph was read
    found = cycles(graph)
    detail = [
        f"{source} -> {sink}: {graph[source][sink][0]}"
        for component in found
        for source in component
        for sink in graph[source]
        if sink in component
    ]
    assert found == [], "package-level import cycles:\n" + "\n".join(detail)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b": ["x"]}, "b": {"c": ["x"]}, "c": {"a": ["x"]}}, [["a", "b", "c"]]),
        ({"a": {"b": ["x"]}, "b": {"c": ["x"]}}, []),
        (
            {"a": {"b": ["x"]}, "b": {"a": ["x"]}, "c": {"d": ["x"]}, "d": {"c": ["x"]}},
            [["a", "b"], ["c", "d"]],
        ),
    ],
)
def test_the_cycle_finder_finds_hand_made_cycles(
    graph: dict[str, dict[str, list[str]]], expected: list[list[str]]
) -> None:
    assert sorted(cycles(graph)) == expected


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import sibling\nfrom ..other import thing\n"
        "import modelless.types\nfrom modelless import aws_clients\n"
    )
    assert [t for t, _ in imports_of(source, "modelless.pools.mod")] == [
        "modelless.pools",
        "modelless.other",
        "modelless.types",
        "modelless.aws_clients",
    ]


def test_no_library_module_is_over_the_limit() -> None:
    long = {
        module: n
        for module, path in library_modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
