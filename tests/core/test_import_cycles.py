"""No import cycles among Sailor's own modules (sailor_core, infra, tasks, flows).

The graph is built from the source (``ast``), not by importing, and from EVERY import
statement: at module top, inside functions, under ``if``/``try``.  An import moved into a
function only postpones the cycle to the first call; it does not remove the dependency.

Edges, for an import written in module M:

- ``import a.b.c`` and ``from a.b import c`` where ``a.b.c`` is a module: an edge to
  ``a.b.c``;  ``from a.b import name`` where ``name`` is not a module: an edge to ``a.b``
  (its ``__init__``).
- Package ``__init__`` re-exports: a package is a node of its own whose edges are its
  ``__init__``'s imports.  Importing a name from the package therefore depends on everything
  the ``__init__`` re-exports, which is what Python executes.  And since Python runs a
  package's ``__init__`` before any of its submodules, importing ``a.b.c`` also adds an edge
  to each enclosing package (``a``, ``a.b``) that M is not itself inside: entering a package
  from outside runs its ``__init__``; from inside, that ``__init__`` has already started, so
  a submodule importing a sibling does not depend on its own package's ``__init__`` (it does
  when it imports a name from it, by the first rule).
- Modules outside the four roots (the standard library, torch, prefect, ...) are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sailor_core", "infra", "tasks", "flows")


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the four packages."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_package(modules: dict[str, Path], name: str) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _with_packages(target: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """``target`` and every package enclosing it that ``importer`` is not inside."""
    parts = target.split(".")
    out = {target}
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if not (importer == package or importer.startswith(package + ".")):
            out.add(package)
    return {m for m in out if m in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node, _is_package(modules, module))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                graph[module] |= _with_packages(target, module, modules) - {module}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, first == last) per strongly connected component: break it
    and the test names the next one of that component, if any."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is a few hundred nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "sailor_core.errors" in graph["sailor_core.plan.types"]
    assert len(graph) > 100


def test_find_cycles_names_the_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
