"""The paper-style IsoFLOP grid: every cell at the full budget, one ρ sweep after another.

Run order: model, reward system (in the order :meth:`Session.listed` draws for the
replication, not the world's own), G, then ρ (innermost) over the world's grid levels (a table's
measured levels; 8 evenly spaced levels on a synthetic world), truncated where the session's
compute ends. Own rule: the best observed full run.
"""

from __future__ import annotations

from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import BEST_OBSERVED
from benchmarks.tuners.session import Session


def run(session: Session) -> None:
    s = session.world.space
    rewards = {w: i for i, w in enumerate(session.listed(s.rewards, "reward"))}
    models = {m: i for i, m in enumerate(session.listed(s.models, "model"))}
    # a stable sort keeps G, then ρ, in the world's order within each model and reward system
    for a in sorted(session.world.grid_points(), key=lambda a: (models.get(a.model, 0), rewards[a.reward])):
        if session.done:
            return
        session.observe(a)


METHOD = Method("grid", "grid (IsoFLOP)", BEST_OBSERVED, run, weight=0.1)
