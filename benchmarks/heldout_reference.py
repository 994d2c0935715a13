"""What the held-out truth can reward: per measured world, the regret (in % of the range, as the
judge scores it) of the answer that knows every other seed of every cell, over the judge's own
held-out replications (the same target and held-out seed per replication as
``benchmarks/optimizers.py``).

Its regret is the held-out seed's own noise: no method's runs see that seed. It is a reference,
not a bound: it answers the argmax of the other seeds' means, which their own noise can also
mislead, so a method may score below it.

    python benchmarks/heldout_reference.py --tables benchmarks/tiny_grid/trials.csv \\
        benchmarks/tiny_grid_small/trials.csv benchmarks/tiny_grid_medium/trials.csv [--seeds 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def reference(table: Path, seeds: int) -> tuple[str, list[float]]:
    """``(world name, regret of the other seeds' answer per held-out replication)``."""
    from benchmarks.tuners.runner import TARGETS, world_of
    from benchmarks.tuners.truth import other_seeds_answer, regret_pct, truth_for

    world = world_of("tiny-table", (str(table),))
    out = []
    for rep in range(seeds):
        truth = truth_for(world, TARGETS[rep % len(TARGETS)], "heldout", rep, len(TARGETS))
        out.append(regret_pct(truth, other_seeds_answer(truth)))
    return world.name, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, required=True, help="one measured table per world")
    ap.add_argument("--seeds", type=int, default=50, help="held-out replications per world (default 50)")
    a = ap.parse_args(argv)
    import numpy as np

    from benchmarks.tuners.cli import print_per_table

    def rows_of(table: Path) -> list[str]:
        name, regrets = reference(table, a.seeds)
        q1, q3 = np.percentile(regrets, [25, 75])
        return [f"| {name} | {len(regrets)} | {statistics.median(regrets):.1f} [{q1:.1f}, {q3:.1f}] "
                f"| {statistics.fmean(regrets):.1f} |"]

    head = ["| world | replications | median [IQR], % of range | mean |", "|---|---|---|---|"]
    return print_per_table(a.tables, head, rows_of, f"--seeds={a.seeds!r}: must be >= 1" if a.seeds < 1 else None)


if __name__ == "__main__":
    sys.exit(main())
