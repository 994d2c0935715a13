"""The tiny world under a FLOP budget and under the equivalent CPU-hour budget: does the answer move?

Real GRPO trials of the ``tiny`` objective (TRL + LoRA on the CPU, single-threaded), nothing
simulated:

1. **FLOP budget**: one trial per ρ in ``--rho`` at ``--budget`` FLOPs (reward ``--reward``,
   G ``--group-size``, seed 0), each through :func:`allocopt.plan.allocation.make_plan` and
   ``objective.run`` as a study runs it. The FLOP budget's answer: the ρ with the best target.
2. **Profile**: the CPU's achieved FLOP/s per phase, measured from those trials' own phase
   timings (:func:`allocopt.plan.throughput.profile_from_trials`: Σ executed FLOPs / Σ wall
   seconds per phase; the driver times generation with its scoring as ``search+reward``, which
   for a rule-based reward is the search phase: its reward costs 0 FLOPs).
3. **The equivalent CPU-hour budget**: the hours the FLOP budget's answer takes at that profile
   (so that allocation gets the same FLOPs, the same plan and the same run: its trial is
   reused, not rerun), given to every ρ as a time budget (:meth:`allocopt.spec.StudySpec.budget_for`:
   each ρ gets the FLOPs it can execute in those hours). One trial per other ρ at its FLOPs.
   The time budget's answer: the ρ with the best target.

Prints a table: per ρ and budget, FLOPs, expected hours (profile), measured training hours
(search+reward + learning wall seconds), the target; and which ρ each budget recommends.
The machine it runs on is shared: wall times carry the load of the moment (say so with the
numbers). Run it niced::

    nice -n 10 python benchmarks/tiny_time_budget.py                 # 3 rho x G 4, sparse, 1e11
    nice -n 10 python benchmarks/tiny_time_budget.py --json out.json

The same study under both budgets is a 3-point grid here (the argmax of the measured target);
one seed per point, so a difference smaller than the tiny eval's noise (±0.016 pass@1 at 1000
problems, one binomial sd at 0.5) is not a finding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _row(res, plan) -> dict:
    e = res.spent.executed
    ws = res.wall_seconds
    return {"budget_flops": plan.budget_flops, "search_flops": e.search_flops, "learning_flops": e.learning_flops,
            "reward_flops": e.reward_flops, "total_flops": e.total_flops, "realized_rho": e.rho,
            "iterations": plan.iterations,
            "search_wall_seconds": ws.get("search+reward", 0.0), "learning_wall_seconds": ws.get("learning", 0.0),
            "eval_wall_seconds": ws.get("eval", 0.0), **{k: float(v) for k, v in res.targets.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1e11, help="FLOP budget (default 1e11)")
    ap.add_argument("--rho", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--reward", default="sparse")
    ap.add_argument("--target", default="pass_at_1")
    ap.add_argument("--eval-problems", type=int, default=1000, help="as studies/tiny.toml")
    ap.add_argument("--json", type=Path, default=None, help="also write every row here")
    args = ap.parse_args(argv)

    from allocopt.plan.allocation import Allocation, make_plan
    from allocopt.plan.throughput import TimeBudget, profile_from_trials
    from allocopt.spec import StudySpec
    from objectives.tiny import make

    obj = make(eval_problems=args.eval_problems)
    w = obj.workload()
    allocs = [Allocation(r, args.group_size, args.reward) for r in args.rho]

    def run(a: Allocation, budget: float) -> dict:
        plan = make_plan(budget, a, w)
        t0 = time.perf_counter()
        res = obj.run(plan, seed=0)
        row = {"rho": a.rho, **_row(res, plan), "wall_seconds": time.perf_counter() - t0}
        print(f"  rho {a.rho:.2f}: {budget:.3e} FLOPs, {row['wall_seconds']:.0f} s, "
              f"{args.target} {row[args.target]:.3f}", file=sys.stderr, flush=True)
        return row

    print(f"FLOP budget {args.budget:.3e}: {len(allocs)} trials", file=sys.stderr, flush=True)
    flop_rows = [run(a, args.budget) for a in allocs]
    prof = profile_from_trials([{**r, "number": f"rho={r['rho']}"} for r in flop_rows], gpu="cpu",
                               fingerprint=w.fingerprint(allocs[0]))
    best_flop = max(range(len(allocs)), key=lambda i: flop_rows[i][args.target])
    tb = TimeBudget(gpu_hours=1.0, profile=prof)
    e_best = make_plan(args.budget, allocs[best_flop], w).expected.executed
    hours = tb.hours_of(e_best)["total"] * args.budget / e_best.total_flops  # the budget's hours
    spec = StudySpec(budget_gpu_hours=hours, throughput=prof.to_dict())
    print(f"profile: search {prof.search_decode:.3e} FLOP/s, learning {prof.learning:.3e} FLOP/s; "
          f"time budget {hours * 3600:.1f} CPU-seconds", file=sys.stderr, flush=True)
    time_rows = []
    for i, a in enumerate(allocs):
        b = spec.budget_for(a, w)
        time_rows.append(dict(flop_rows[i], reused=True) if i == best_flop else {**run(a, b), "reused": False})
    best_time = max(range(len(allocs)), key=lambda i: time_rows[i][args.target])

    def hours_of(r: dict) -> float:
        return (r["search_flops"] / prof.search_decode + r["learning_flops"] / prof.learning) / 3600

    print(f"\nTiny world, {args.reward} G={args.group_size}, one seed; profile from the FLOP trials' phase "
          f"timings (cpu, 1 thread): search {prof.search_decode:.3e}, learning {prof.learning:.3e} FLOP/s")
    print(f"{'budget':<10}{'rho':>5}{'got':>7}{'FLOPs':>11}{'exp s':>8}{'meas s':>8}{'iters':>6}"
          f"{args.target:>11}")
    for name, rows, best in (("FLOP", flop_rows, best_flop), ("CPU-time", time_rows, best_time)):
        for i, r in enumerate(rows):
            meas = r["search_wall_seconds"] + r["learning_wall_seconds"]
            mark = " *" if i == best else ""
            print(f"{name:<10}{r['rho']:>5.2f}{r['realized_rho']:>7.3f}{r['total_flops']:>11.3e}"
                  f"{hours_of(r) * 3600:>8.1f}{meas:>8.1f}{r['iterations']:>6}{r[args.target]:>11.3f}{mark}"
                  + (" (same run as FLOP)" if r.get("reused") else ""))
    print(f"FLOP budget {args.budget:.3e} recommends rho {args.rho[best_flop]}; the equivalent "
          f"{hours * 3600:.1f} CPU-seconds recommends rho {args.rho[best_time]}: "
          + ("the answer does not move" if best_flop == best_time else "the answer moves"))
    if args.json:
        args.json.write_text(json.dumps({"profile": prof.to_dict(), "hours": hours, "flop": flop_rows,
                                         "time": time_rows, "best_flop_rho": args.rho[best_flop],
                                         "best_time_rho": args.rho[best_time]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
