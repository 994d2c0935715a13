"""What noise the tuner learns on each measured world, and how often its runs repeat a cell.

Replays the shipped tuner (as the judge replays ``allocopt``: the same replications, targets and
draws; replication ``s`` is of the target ``s mod 3`` of native_reward, pass_at_1, judge, so
``--seeds`` below 3 leaves targets out) and reports, per world, truth and target:

* ``repeats``: the share of its full runs by 40 that repeat a cell it had already run;
* ``same value``: the share of those repeats that returned exactly the value of an earlier run
  of the cell (with two measured seeds per cell the held-out truth leaves one seed to draw
  from, so every repeat returns the same value; a real repeat, at another seed, does not);
* ``noise share 0.02 / 0.1 / 0.5``: the mixture's weight on each noise share of the model's grid
  (:attr:`allocopt.tuner.model.HyperGrid.noise_share`, the noise as a share of the values'
  variance: the runs report no evaluation variance) at 40 runs, mean over the replications;
* ``one run's noise share``: what the table says it is for that target, the seed-to-seed
  variance of one run over the variance of single runs across the cells.

About 3 s a replication on one core.

    python benchmarks/noise_learned.py --tables benchmarks/tiny_grid/trials.csv \\
        benchmarks/tiny_grid_small/trials.csv [--seeds 12] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEVEL = 40.0


def replay(world, truth_mode: str, seed: int) -> dict[str, float]:
    """One replication of the shipped tuner: its repeats and the noise weights at :data:`LEVEL`."""
    from benchmarks.tuners.ablation import observation_of
    from benchmarks.tuners.methods.allocopt import make_tuner, run_allocopt
    from benchmarks.tuners.runner import TARGETS
    from benchmarks.tuners.session import Session
    from benchmarks.tuners.truth import truth_for

    truth = truth_for(world, TARGETS[seed % len(TARGETS)], truth_mode, seed, len(TARGETS))
    session = Session(world, truth, seed, LEVEL, (LEVEL,))
    run_allocopt(session)
    full = [e for e in session.events if e.value is not None and e.fraction >= 1]
    seen: dict = {}
    repeats = same = 0
    for e in full:
        if e.allocation in seen:
            repeats += 1
            same += e.value in seen[e.allocation]
        seen.setdefault(e.allocation, []).append(e.value)
    kg = make_tuner(Session(world, truth, seed, LEVEL, (LEVEL,)))
    obs = kg.observed([observation_of(e) for e in full])
    post = kg.tuner.posterior(obs, kg.tuner.targets(obs)[:1])
    weights = {share: 0.0 for share in kg.tuner.grid.noise_share}
    for w, h in zip(post.weights, post.hypers):
        weights[h[-1]] += float(w)
    return {"runs": len(full), "repeats": repeats, "same": same, **{f"w{k:g}": v for k, v in weights.items()}}


def table_noise_share(world, target: str) -> float:
    """One run's seed-to-seed variance over the variance of single runs across the cells."""
    from benchmarks.world_noise import cell_values, seed_variance

    values = cell_values(world, target)
    runs = [x for v in values for x in v]
    if not any(len(v) > 1 for v in values) or len(runs) < 2:
        return float("nan")
    return seed_variance(values) / statistics.variance(runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, required=True, help="one measured table per world")
    ap.add_argument("--seeds", type=int, default=12,
                    help="replications per world and truth, the targets in turn (default 12: 4 a target)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    a = ap.parse_args(argv)
    from allocopt.errors import ConfigError
    from benchmarks.tuners.cli import tables_refusal

    bad = tables_refusal(a.tables) or (f"--seeds={a.seeds!r}: must be >= 1" if a.seeds < 1 else None)
    if not bad and a.out is not None and not a.out.parent.is_dir():
        bad = f"--out={str(a.out)!r}: its folder does not exist"
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from benchmarks.tuners.runner import TARGETS, world_of
    from benchmarks.tuners.truth import truths_of

    try:
        worlds = [world_of("tiny-table", (str(p),)) for p in a.tables]
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = ["| world | truth | target | repeats | same value | noise share 0.02 / 0.1 / 0.5 at 40 runs | "
             "one run's noise share |", "|---|---|---|---|---|---|---|"]
    for world in worlds:
        for mode in truths_of(world):
            for k, target in enumerate(TARGETS):
                rs = [replay(world, mode, s) for s in range(k, a.seeds, len(TARGETS))]
                if rs:
                    lines.append(_row(world.name, mode, target, rs, table_noise_share(world, target)))
            print(f"  {world.name}, {mode}: done", file=sys.stderr, flush=True)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out is not None:
        a.out.write_text(text)
    return 0


def _row(world: str, mode: str, target: str, rs: list[dict[str, float]], told: float) -> str:
    runs, rep, same = (sum(r[k] for r in rs) for k in ("runs", "repeats", "same"))
    ws = " / ".join(f"{statistics.fmean(r[k] for r in rs):.2f}" for k in rs[0] if k.startswith("w"))
    return f"| {world} | {mode} | {target} | {rep / runs:.0%} | {same / rep if rep else 0:.0%} | {ws} | {told:.2f} |"


if __name__ == "__main__":
    raise SystemExit(main())
