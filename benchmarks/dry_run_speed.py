"""How long pricing a study takes before anything runs: ``allocopt study --dry-run``'s work.

At small budgets most RACE pilots are not usable where the grid put them, and
:func:`allocopt.race.pilot_plans.fit_pilots` searches each one's neighbourhood for a usable ρ:
hundreds of plans, each pricing thousands of GRPO iterations
(:func:`allocopt.plan.allocation.iteration_flops`). This prints, per budget of the synthetic
objective's workload (Qwen2.5-1.5B shape, LoRA r 32, the default space: 5 reward systems x
3 G, 60 pilots at 0.1 of the budget), the seconds (wall and CPU) of the full-budget plans over
the space (``study.dry_run``) and of fitting the pilots, the pilots moved, and the iteration
prices computed (cache misses). Run by hand (~1 min on one idle core)::

    python benchmarks/dry_run_speed.py
"""

from __future__ import annotations

import argparse
import os
import time


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="1e19,1e17,1e16,3e15",
                    help="comma-separated FLOP budgets (default: %(default)s)")
    args = ap.parse_args(argv)
    from allocopt.plan.allocation import iteration_flops
    from allocopt.race import RaceSettings, pilot_grid
    from allocopt.race.pilot_plans import fit_pilots, plan_pilot
    from allocopt.spec import StudySpec
    from allocopt.study.loop import dry_run
    from objectives.synthetic import SyntheticObjective

    workload = SyntheticObjective().workload()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'budget':>8} {'plans s':>8} {'plans CPU s':>11} {'pilots s':>9} {'pilots CPU s':>12} "
          f"{'moved':>5} {'usable':>6} {'prices':>7}")
    for b in (float(x) for x in args.budgets.split(",")):
        iteration_flops.cache_clear()
        spec = StudySpec(name="bench", objective="synthetic", budget_flops=b, tuner="race")
        _, pw, pc = _timed(lambda: dry_run(spec, workload))
        grid = pilot_grid(spec.space, RaceSettings(max_pilots=spec.pilots), spec.seed)
        budget = spec.pilot_fraction * b
        fitted, fw, fc = _timed(lambda: fit_pilots(grid, spec.space.rho, budget, workload))
        moved = sum(g.allocation != f.allocation for g, f in zip(grid, fitted))
        usable = sum(plan_pilot(p, budget, workload).usable for p in fitted)
        print(f"{b:8.0e} {pw:8.2f} {pc:11.2f} {fw:9.2f} {fc:12.2f} {moved:5d} "
              f"{usable:3d}/{len(fitted):<2d} {iteration_flops.cache_info().misses:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
