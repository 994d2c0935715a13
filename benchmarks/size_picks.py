"""Does a tuner pick the policy size right? Per method and compute level of a replay of the
pooled model-size world (``benchmarks/optimizers.py --tiny-table A B C``), the share of
replications whose answer names the size of the best cell for the replication's target.

The best cell is the one the judge's seed-mean truth names on the pooled world (the same
tables, read as the replay reads them). Held-out replications have a different truth per
replication, so only the seed-mean truth's are counted.

    python benchmarks/size_picks.py --results benchmarks/tuner_results/sizes/results.csv \\
        --tables benchmarks/tiny_grid/trials.csv benchmarks/tiny_grid_small/trials.csv benchmarks/tiny_grid_medium/trials.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = ("pass_at_1", "native_reward", "judge")


def best_sizes(tables: Sequence[Path]) -> dict[str, str]:
    """The size of the best full-budget cell per target under the judge's seed-mean truth
    (:func:`benchmarks.tuners.truth.truth_for` on the pooled world the replay reads)."""
    from benchmarks.tuners.runner import TABLE, world_of
    from benchmarks.tuners.truth import truth_for

    world = world_of(TABLE, tuple(str(t) for t in tables))
    out = {}
    for target in TARGETS:
        truth = truth_for(world, target, "seedmean", 0)
        out[target] = max(world.candidates, key=truth.value).model
    return out


def picks(results: Path, best: dict[str, str]) -> dict[tuple[str, float], tuple[float, int]]:
    """``(method, level) -> (share of seed-mean replications naming the best size, replications)``."""
    hits: dict = defaultdict(list)
    for r in csv.DictReader(open(results, newline="")):
        if r["truth"] == "seedmean" and r.get("model"):
            hits[(r["method"], float(r["level"]))].append(r["model"] == best[r["target"]])
    return {k: (sum(v) / len(v), len(v)) for k, v in hits.items()}


def table(shares: dict[tuple[str, float], tuple[float, int]]) -> str:
    levels = sorted({lv for _, lv in shares})
    methods = list(dict.fromkeys(m for m, _ in shares))
    lines = ["| method | " + " | ".join(f"{lv:g}" for lv in levels) + " |", "|---|" + "---|" * len(levels)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{shares[(m, lv)][0]:.0%} (n={shares[(m, lv)][1]})"
                                              if (m, lv) in shares else "—" for lv in levels) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "tuner_results" / "sizes" / "results.csv")
    ap.add_argument("--tables", type=Path, nargs="+", default=[ROOT / "benchmarks" / d / "trials.csv" for d in
                                                            ("tiny_grid", "tiny_grid_small", "tiny_grid_medium")])
    a = ap.parse_args(argv)
    best = best_sizes(a.tables)
    print("best cell's size per target (seed-mean): " + ", ".join(f"{t} {m}" for t, m in best.items()))
    print(table(picks(a.results, best)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
