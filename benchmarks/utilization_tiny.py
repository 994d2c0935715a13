"""How much of its budget a tiny-world trial spends: planned and executed use per reward system × ρ.

Runs real GRPO trials of the tiny objective (the study's trial path, :meth:`TinyObjective.run`,
without the evaluation: it spends nothing of the budget) for each reward system × ρ at G = 4,
one seed, at the budgets of ``studies/tiny.toml`` (the full budget and the pilot budget,
``pilot_fraction × budget_flops``), and prints per trial

* ``plan use``: the plan's expected executed FLOPs / budget (:attr:`TrialPlan.budget_utilization`),
* ``use``: the executed FLOPs the meter charged / budget (what the trial really spent),
* asked ρ, the plan's realized ρ and the executed one,
* the iterations planned and run, the rollouts per iteration and the rows of the last iteration.

Run by hand (about 15–25 min on one lightly loaded core; each trial runs on one thread)::

    nice -n 10 python benchmarks/utilization_tiny.py --out benchmarks/calibration/utilization_after.json

``--summarize FILE`` prints the table of an earlier ``--out`` file without running anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

REWARDS = ("sparse", "structured", "dense", "proxy_prm", "prm")
RHOS = (0.2, 0.5, 0.9)
SPEC = Path(__file__).resolve().parents[1] / "studies" / "tiny.toml"


def study_budgets(spec: Path = SPEC) -> list[float]:
    """The full and the pilot budget (FLOPs) of a study file."""
    from allocopt.spec import StudySpec

    s = StudySpec.from_toml(spec)
    return [s.budget_flops, s.pilot_fraction * s.budget_flops]


def run_one(obj: Any, budget: float, reward: str, rho: float, group_size: int, seed: int) -> dict:
    """One trial without its evaluation; the plan's and the meter's numbers."""
    from allocopt.plan.allocation import Allocation, InfeasiblePlan, make_plan

    row: dict[str, Any] = {"budget_flops": budget, "reward": reward, "rho": rho,
                           "group_size": group_size, "seed": seed}
    try:
        plan = make_plan(budget, Allocation(rho, group_size, reward), obj.workload())
    except InfeasiblePlan as e:
        return {**row, "error": str(e)}
    row.update(plan_use=plan.budget_utilization, plan_rho=plan.realized_rho,
               plan_iterations=plan.iterations, rollouts_per_iteration=plan.rollouts_per_iteration,
               plan_last_rows=getattr(plan, "last_iteration_rows", None),
               rows_per_iteration=plan.rows_trained_per_iteration)
    t0 = time.perf_counter()
    try:
        res = obj.run(plan, seed=seed)
    except InfeasiblePlan as e:  # the meter refused the first iteration
        return {**row, "error": str(e), "wall_seconds": time.perf_counter() - t0}
    e = res.spent.executed
    row.update(use=e.total_flops / budget, executed_flops=e.total_flops, executed_rho=e.rho,
               iterations=len(res.curves),
               last_rows=res.curves[-1].rows_trained if res.curves else None,
               reward_share=e.reward_flops / e.total_flops if e.total_flops else 0.0,
               # a generation refused at stage 2 is charged without an iteration record
               discarded_flops=e.total_flops - (res.curves[-1].cumulative_flops if res.curves else 0),
               stopped_reason=res.stopped_reason, status=res.status,
               wall_seconds=time.perf_counter() - t0)
    return row


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table, one block per budget."""
    head = (f"{'reward':10} {'rho':>4} {'plan use':>8} {'use':>6} {'plan rho':>8} {'rho':>6} "
            f"{'iters':>7} {'batch':>5} {'last rows':>9} {'s':>5}")
    out = []
    for budget in sorted({r["budget_flops"] for r in rows}, reverse=True):
        out += [f"budget {budget:.3g} FLOPs", head]
        for r in (r for r in rows if r["budget_flops"] == budget):
            if "use" not in r:
                out.append(f"{r['reward']:10} {r['rho']:>4} {r.get('error', '')[:90]}")
                continue
            last = f"{r['last_rows']}/{round(r['rows_per_iteration'])}"
            out.append(f"{r['reward']:10} {r['rho']:>4} {r['plan_use']:>8.3f} {r['use']:>6.3f} "
                       f"{r['plan_rho']:>8.3f} {r['executed_rho']:>6.3f} "
                       f"{r['iterations']:>3}/{r['plan_iterations']:<3} {r['rollouts_per_iteration']:>5} "
                       f"{last:>9} {r['wall_seconds']:>5.0f}")
        done = [r for r in rows if r["budget_flops"] == budget and "use" in r]
        if done:
            out.append(f"min use {min(r['use'] for r in done):.3f}, min plan use "
                       f"{min(r['plan_use'] for r in done):.3f}, max |rho - asked| "
                       f"{max(abs(r['executed_rho'] - r['rho']) for r in done):.3f} over {len(done)} trials")
        out.append("")
    out.append("use: executed FLOPs / budget; iters: run/planned; batch: rollouts per iteration; "
               "last rows: rows the last iteration trained / the schedule's mean")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default=None,
                    help="comma-separated FLOPs (default: studies/tiny.toml's full and pilot budgets)")
    ap.add_argument("--rewards", default=",".join(REWARDS))
    ap.add_argument("--rhos", default=",".join(map(str, RHOS)))
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="utilization.json")
    ap.add_argument("--append", action="store_true",
                    help="add the trials to those already in --out (several runs, one table)")
    ap.add_argument("--summarize", metavar="JSON", help="run nothing: print the table of an --out file")
    a = ap.parse_args()
    if a.summarize:
        print(table(json.loads(Path(a.summarize).read_text())["trials"]))
        return
    import torch

    torch.set_num_threads(1)
    from objectives.tiny.objective import TinyObjective

    obj = TinyObjective()
    obj.evaluate = lambda model, tokenizer, reward: ({}, 0)  # type: ignore[method-assign]
    budgets = [float(b) for b in a.budgets.split(",")] if a.budgets else study_budgets()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    rows: list[dict] = json.loads(Path(a.out).read_text())["trials"] \
        if a.append and Path(a.out).exists() else []
    t0 = time.perf_counter()
    for budget in budgets:
        for reward in a.rewards.split(","):
            for rho in (float(x) for x in a.rhos.split(",")):
                rows.append(run_one(obj, budget, reward, rho, a.group_size, a.seed))
                r = rows[-1]
                print(f"{budget:.3g} {reward} rho {rho}: use {r.get('use', float('nan')):.3f} "
                      f"(plan {r.get('plan_use', float('nan')):.3f})", flush=True)
                Path(a.out).write_text(json.dumps({"commit": commit, "group_size": a.group_size,
                                                   "seed": a.seed, "trials": rows}, indent=1))
    print(table(rows))  # the budgets in turn, the trials in the order they ran
    print(f"{time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
