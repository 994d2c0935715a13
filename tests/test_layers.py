"""The house's imports point down: no circle among allocopt's and the objectives' modules, nor
among their packages (``benchmarks/import_graph.py`` draws and counts them; function-level
imports count too, since a lazy import is still an arrow)."""

from __future__ import annotations

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
