"""Imports sit at module top; one inside a function says why (``# lazy: reason``).

An import postponed into a function hides a dependency from the reader (and, before the
cycle test, hid two import cycles).  It is kept only where loading the module at import time
would cost something real: torch, a cloud SDK, Prefect, numpy in a module the CLI's validation
or the agent loads, matplotlib.  Such an import carries a one-line reason on its own line or
in a comment line directly above it (one comment covers a run of imports, blank lines between
them included).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sailor_core", "infra", "tasks", "flows")
MARK = "# lazy:"


def _function_imports(tree: ast.AST) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [sub for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))]
    return out


def _has_reason(lines: list[str], node: ast.stmt, import_lines: set[int]) -> bool:
    """The import's own lines, or the comment lines above its run of consecutive imports, give a reason."""
    end = node.end_lineno or node.lineno
    if any(MARK in lines[i - 1] for i in range(node.lineno, end + 1)):
        return True
    i = node.lineno - 1
    while i >= 1:
        text = lines[i - 1].strip()
        if MARK in text and (text.startswith("#") or i in import_lines):
            return True
        if text and not text.startswith("#") and i not in import_lines:
            return False
        i -= 1
    return False


def unexplained_function_imports() -> list[str]:
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            lines = source.splitlines()
            nodes = _function_imports(ast.parse(source))
            import_lines = {i for n in nodes for i in range(n.lineno, (n.end_lineno or n.lineno) + 1)}
            found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in nodes
                      if not _has_reason(lines, n, import_lines)]
    return found


def test_every_import_inside_a_function_says_why_it_is_lazy():
    assert unexplained_function_imports() == []


def test_the_check_notices_an_unexplained_import_and_accepts_a_reason():
    plain = "def f():\n    import json\n    return json\n"
    reasoned = "def f():\n    # lazy: torch loads only in a worker\n    import torch\n    import json\n    return json\n"
    inline = "def f():\n    import torch  # lazy: workers only\n"
    for source, expected in ((plain, False), (reasoned, True), (inline, True)):
        lines = source.splitlines()
        nodes = _function_imports(ast.parse(source))
        import_lines = {n.lineno for n in nodes}
        assert all(_has_reason(lines, n, import_lines) for n in nodes) is expected, source
