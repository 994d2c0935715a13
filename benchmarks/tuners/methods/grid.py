"""The paper-style IsoFLOP grid: every cell at the full budget, one ρ sweep after another.

Run order: model, reward system (as the space lists them), G, then ρ (innermost) over the
world's grid levels (a table's measured levels; 8 evenly spaced levels on a synthetic world),
truncated where the session's compute ends. Own rule: the best observed full run.
"""

from __future__ import annotations

from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import BEST_OBSERVED
from benchmarks.tuners.session import Session


def run(session: Session) -> None:
    for a in session.world.grid_points():
        if session.done:
            return
        session.observe(a)


METHOD = Method("grid", "grid (IsoFLOP)", BEST_OBSERVED, run, weight=0.1)
