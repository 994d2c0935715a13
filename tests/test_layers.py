"""The house's imports point down: no circle among allocopt's and the objectives' modules, nor
among their packages (``benchmarks/import_graph.py`` draws and counts them; function-level
imports count too, since a lazy import is still an arrow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rooms", ["modules", "packages"])
def test_no_import_circle(rooms):
    g = _graph()
    known = g.modules()
    nodes, edges = sorted(known), g.arrows(known)
    if rooms == "packages":
        nodes, edges = g.collapse(known, edges)
    loops = [c for c in g.circles(nodes, edges) if len(c) > 1]
    assert loops == [], [" <-> ".join(c) for c in loops]
    assert ("allocopt.spec", "allocopt.race.design") not in edges  # the last circle, mended
