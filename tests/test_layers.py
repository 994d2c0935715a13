"""The house's imports point down: no circle among allocopt's and the objectives' modules, nor
among their packages (``benchmarks/import_graph.py`` draws and counts them; function-level
imports count too, since a lazy import is still an arrow). The library imports nothing from
``objectives/``, and an objective imports the plugin API, planning, accounting and the library's
GRPO infrastructure, never the study loop, the storage, the command line or the tracker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_grid_table import benchmark_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rooms", ["modules", "packages"])
def test_no_import_circle(rooms):
    g = benchmark_module("import_graph")
    known = g.modules()
    nodes, edges = sorted(known), g.arrows(known)
    if rooms == "packages":
        nodes, edges = g.collapse(known, edges)
    loops = [c for c in g.circles(nodes, edges) if len(c) > 1]
    assert loops == [], [" <-> ".join(c) for c in loops]
    assert ("allocopt.spec", "allocopt.race.design") not in edges  # the last circle, mended


TUNER = ("allocopt/race", "allocopt/surrogate")
"""The tuner's pure layer: plain observations in, proposals out (:mod:`allocopt.race.data`)."""


def forbidden_imports(source: str) -> list[str]:
    """What ``source`` imports (anywhere, lazily too) that the tuner's pure layer may not: Optuna,
    the study and store packages, the trial record (a reader of Optuna trials), the StudySpec."""
    import ast

    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        bad += [n for n in names if n.split(".")[0] == "optuna" or n == "allocopt.spec.StudySpec"
                or n.split(".")[:2] in (["allocopt", "study"], ["allocopt", "store"]) or n == "allocopt.record"]
    return bad


def test_the_scanner_finds_what_it_forbids():
    src = ("import optuna\nfrom optuna.trial import TrialState\nfrom allocopt.spec import SearchSpace, StudySpec\n"
           "def f():\n    from allocopt.study.loop import run_study\n    import allocopt.record\n")
    assert forbidden_imports(src) == ["optuna", "optuna.trial", "optuna.trial.TrialState",
                                      "allocopt.spec.StudySpec", "allocopt.study.loop",
                                      "allocopt.study.loop.run_study", "allocopt.record"]
    assert forbidden_imports("import allocopt.store.claims\n") == ["allocopt.store.claims"]
    assert forbidden_imports("from allocopt.spec import SearchSpace\nimport torch\nimport allocopt.stores\n") == []


def test_the_tuner_reads_no_study():
    """allocopt/race and allocopt/surrogate take plain data: no Optuna, no study or store, no
    StudySpec (the translator is allocopt/study/observe.py)."""
    root = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(root)): bad for d in TUNER for p in sorted((root / d).rglob("*.py"))
             if (bad := forbidden_imports(p.read_text()))}
    assert found == {}


def imported_names(source: str, package: str = "") -> list[str]:
    """Every module ``source`` imports, anywhere (inside functions too), as an absolute dotted
    name; ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a module). A relative import
    is resolved against ``package``, the importing module's package."""
    import ast

    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)] if package else []
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


NOT_FOR_OBJECTIVES = ("allocopt.study", "allocopt.store", "allocopt.cli", "allocopt.tracking")
"""What an objective may not import: the loop that calls it, and what the loop alone uses."""


def _package(path: Path) -> str:
    """The package a module file belongs to (a package's ``__init__`` belongs to itself)."""
    return ".".join(path.relative_to(ROOT).parts[:-1])


def _hits(source: str, package: str, prefixes: tuple[str, ...]) -> list[str]:
    return sorted({n for n in imported_names(source, package)
                   if any(n == p or n.startswith(p + ".") for p in prefixes)})


def test_the_import_scanner_reads_lazy_and_relative_imports():
    src = ("import allocopt.study.loop\nfrom allocopt import cli\n"
           "def f():\n    from allocopt.store.claims import reserving\n    import allocopt.tracking as t\n"
           "from . import sibling\nfrom ..study import trial\n")
    assert _hits(src, "allocopt.x", NOT_FOR_OBJECTIVES) == [
        "allocopt.cli", "allocopt.store.claims", "allocopt.store.claims.reserving", "allocopt.study",
        "allocopt.study.loop", "allocopt.study.trial", "allocopt.tracking"]
    assert _hits("from allocopt import studies\nimport allocopt.storex\nfrom allocopt.plan import handoff\n",
                 "", NOT_FOR_OBJECTIVES) == []
    assert _hits("def f():\n    from objectives.tiny import make\n", "allocopt", ("objectives",)) == [
        "objectives.tiny", "objectives.tiny.make"]


def test_objectives_import_nothing_of_the_study_loop():
    """objectives/ (tiny, qwen, synthetic, tiny-table, command and their helpers) reach the
    library through the plugin API, planning, accounting and the GRPO infrastructure only."""
    found = {str(p.relative_to(ROOT)): bad for p in sorted((ROOT / "objectives").rglob("*.py"))
             if (bad := _hits(p.read_text(), _package(p), NOT_FOR_OBJECTIVES))}
    assert found == {}


def test_the_library_imports_nothing_from_objectives():
    """allocopt finds the built-in objectives as entry points, like anyone's: no module of the
    library imports the ``objectives`` package, lazily or not."""
    found = {str(p.relative_to(ROOT)): bad for p in sorted((ROOT / "allocopt").rglob("*.py"))
             if (bad := _hits(p.read_text(), _package(p), ("objectives",)))}
    assert found == {}
