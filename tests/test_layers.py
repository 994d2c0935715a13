"""The house's imports point down: no circle among allocopt's and the objectives' modules, nor
among their packages (``benchmarks/import_graph.py`` draws and counts them; function-level
imports count too, since a lazy import is still an arrow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_grid_table import benchmark_module


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
