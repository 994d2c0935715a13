"""No function of the library (``allocopt/``) is longer than :data:`MAX_LINES` lines.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` node (``ast``): its
signature, docstring and body, decorators excluded. Nested functions and methods count on
their own, and within their enclosing function's length too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "allocopt"
MAX_LINES = 80

ALLOWED: frozenset[tuple[str, str]] = frozenset()
"""``(path from the repository root, qualified name)`` of the functions allowed to be longer."""


def _function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of every function and method in ``path``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return found


def test_lengths_are_measured_as_the_def_node_spans(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("@decorator\n"          # not counted
                     "def f(x):\n"            # line 2
                     "    \"\"\"Doc.\"\"\"\n"
                     "    def inner():\n"
                     "        return x\n"
                     "    return inner\n"     # line 6: f is 5 lines
                     "\n"
                     "class C:\n"
                     "    async def g(self):\n"
                     "        pass\n", encoding="utf-8")
    assert _function_lengths(probe) == [("f", 2, 5), ("f.<locals>.inner", 4, 2), ("C.g", 9, 2)]


def test_no_library_function_is_over_80_lines():
    files = sorted(LIBRARY.rglob("*.py"))
    assert files, LIBRARY
    too_long = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for name, line, length in _function_lengths(path):
            if length > MAX_LINES and (rel, name) not in ALLOWED:
                too_long.append(f"{rel}:{line} {name}: {length} lines")
    assert not too_long, (f"functions over {MAX_LINES} lines (split them into named steps):\n"
                          + "\n".join(too_long))
