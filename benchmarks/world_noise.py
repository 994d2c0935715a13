"""How noisy each measured world is, next to the differences a tuner must tell apart.

Per world and target, over the feasible full-budget cells at the measured ρ levels:

* ``seeds``: measured seeds per cell (mean);
* ``one run``: the seed-to-seed standard deviation of one run (pooled over the cells), in % of
  the range of the cells' seed-means, which is the unit the judge's regrets are in;
* ``seed-mean truth``: the same over the square root of the seeds, what the seed-mean truth of a
  cell is itself off by (one standard deviation);
* ``best - 5th``: how far the fifth-best cell's seed-mean lies below the best's, in % of the range;
* ``runs to tell``: full runs per cell for the difference of two cells' run means to have a
  standard deviation as small as that gap (``2 sd² / gap²``).

A regret of a few % of the range at 8 to 16 runs is then within one run's noise, and the best
cell of the seed-mean truth is itself partly chosen by its seeds' noise.

    python benchmarks/world_noise.py --tables benchmarks/tiny_grid/trials.csv \\
        benchmarks/tiny_grid_small/trials.csv benchmarks/tiny_grid_medium/trials.csv
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = ("pass_at_1", "native_reward", "judge")


def cell_values(world, target: str) -> list[list[float]]:
    """``target``'s measured values at each full-budget cell of ``world``, one list per cell."""
    from benchmarks.tuners.truth import FULL

    return [[v[target] for v in world.seeds(a, FULL, a.rho).values()] for a in world.candidates]


def seed_variance(values: list[list[float]]) -> float:
    """One run's seed-to-seed variance, pooled over the cells with two or more seeds."""
    return statistics.fmean(statistics.variance(v) for v in values if len(v) > 1)


def noise_row(world, target: str) -> dict[str, float]:
    """The table's numbers (module docstring) for ``target`` on ``world`` (a table world)."""
    values = cell_values(world, target)
    means = sorted((statistics.fmean(v) for v in values), reverse=True)
    span = means[0] - means[-1]
    several = [v for v in values if len(v) > 1]
    if not several or span <= 0:
        raise ValueError(f"{world.name}/{target}: needs cells with two or more seeds and differing means")
    sd = math.sqrt(seed_variance(several))
    n = statistics.fmean(len(v) for v in values)
    gap = means[0] - means[min(4, len(means) - 1)]
    return {"seeds": n, "one_run": 100 * sd / span, "truth": 100 * sd / math.sqrt(n) / span,
            "gap5": 100 * gap / span, "runs": 2 * sd * sd / gap / gap if gap > 0 else math.inf}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, required=True, help="one measured table per world")
    a = ap.parse_args(argv)
    from benchmarks.tuners.cli import print_per_table
    from benchmarks.tuners.runner import world_of

    def rows_of(table: Path) -> list[str]:
        world = world_of("tiny-table", (str(table),))
        rows = [(target, noise_row(world, target)) for target in TARGETS]
        return [f"| {world.name} | {target} | {r['seeds']:.1f} | {r['one_run']:.1f} | {r['truth']:.1f} "
                f"| {r['gap5']:.1f} | {r['runs']:.1f} |" for target, r in rows]

    head = ["| world | target | seeds | one run, % of range | seed-mean truth, % | best - 5th, % | runs to tell |",
            "|---|---|---|---|---|---|---|"]
    return print_per_table(a.tables, head, rows_of)


if __name__ == "__main__":
    sys.exit(main())
