"""The tiny world's ground truth: a seeded grid of real GRPO trials, appended to a table.

Every reward system × every G of the tiny study's space × ρ at ``--rho-levels`` evenly spaced
levels over its range, at the full budget (``--budget``, 3e11 FLOPs as ``studies/tiny.toml``)
with ``--full-seeds`` seeds and at each pilot budget (``--pilot-fractions`` of it: 25 % as the
tiny study by default, fidelity ``pilot``; another fraction is fidelity ``pilot<percent>``, e.g.
``pilot10``, optionally at ``--pilot-group-sizes`` only) with ``--pilot-seeds`` seeds. Each trial is one real run of the ``tiny`` objective
(TRL GRPO + LoRA on the CPU, scored on every target: ``native_reward``, ``pass_at_1``,
``judge``), exactly as a study runs it: :func:`allocopt.plan.allocation.make_plan` and
``objective.run(plan, seed=seed)``. Nothing is simulated.

The table (``benchmarks/tiny_grid/trials.csv``, one row a trial) is appended as each trial
ends; each trial's per-iteration curves go to ``curves.jsonl`` beside it. Stop it at any time
(Ctrl-C, or kill): running it again skips every (reward, G, ρ, fidelity, seed) already in the
table. The order is breadth first (every cell's first full-budget seed, then the first pilot
seed, then the next seeds), so a partial grid already covers the space.

``--workers 2`` (default) runs two single-threaded trials at once (``torch.set_num_threads(1)``
in each: two torch processes with default threads on 2 cores thrash).

Usage::

    python benchmarks/tiny_grid.py --estimate      # how many trials are left and how long
    nice -n 10 python benchmarks/tiny_grid.py      # run (resumes)
    python benchmarks/tiny_grid.py --limit 4       # at most 4 more trials, then stop
    python benchmarks/tiny_grid.py --fidelities pilot   # only the 25 % pilots (the cheap quarter)
    python benchmarks/tiny_grid.py --pilot-fractions 0.25 0.1 --pilot-group-sizes 4  # + pilots at 10 %, G 4
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # objectives/ beside allocopt/

OUT = Path(__file__).resolve().parent / "tiny_grid"
COLUMNS = ("reward", "group_size", "rho", "fidelity", "budget_flops", "seed", "status",
           "native_reward", "pass_at_1", "judge", "search_flops", "learning_flops",
           "reward_flops", "total_flops", "realized_rho", "planned_rho", "iterations",
           "wall_seconds", "eval_flops", "error", "finished_at")


@dataclass(frozen=True)
class Cell:
    """One trial of the grid: an allocation, a fidelity and a seed."""

    reward: str
    group_size: int
    rho: float
    fidelity: str
    budget_flops: float
    seed: int
    model: str | None = None
    """The policy size (``--model``); ``None``: the world's own policy, no ``model`` column."""

    def key(self) -> tuple:
        return (self.reward, self.group_size, f"{self.rho:.4f}", self.fidelity, self.seed)


def fidelity_name(pilot_fraction: float) -> str:
    """The table's fidelity label of pilots at ``pilot_fraction`` of the budget: ``pilot`` for the
    tiny study's 25 %, ``pilot<percent>`` for another fraction (``pilot10`` at 10 %)."""
    return "pilot" if abs(pilot_fraction - 0.25) < 1e-9 else f"pilot{pilot_fraction * 100:g}"


def grid(args: argparse.Namespace) -> list[Cell]:
    """Every trial of the grid, breadth first (seed rank, then fidelity, then the cells); pilot
    fidelities only at ``--pilot-group-sizes`` (default every G)."""
    lo, hi = args.rho_range
    levels = [round(lo + (hi - lo) * i / (args.rho_levels - 1), 4) for i in range(args.rho_levels)]
    fids = [("full", args.full_seeds, args.budget, args.group_sizes)]
    fids += [(fidelity_name(f), args.pilot_seeds, args.budget * f, args.pilot_group_sizes or args.group_sizes)
             for f in args.pilot_fractions]
    out = []
    for rank in range(max(args.full_seeds, args.pilot_seeds)):
        for fidelity, seeds, budget, gs in fids:
            if rank >= seeds:
                continue
            for reward in args.rewards:
                for g in gs:
                    for rho in levels:
                        out.append(Cell(reward, g, rho, fidelity, budget, rank, getattr(args, "model", None)))
    return out


def done_keys(table: Path) -> set[tuple]:
    """The cells already in the table (complete, infeasible or failed: each is a measurement)."""
    if not table.exists():
        return set()
    with table.open(newline="") as f:
        return {(r["reward"], int(r["group_size"]), f"{float(r['rho']):.4f}", r["fidelity"], int(r["seed"]))
                for r in csv.DictReader(f)}


_OBJECTIVE = None


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_cell(cell: Cell) -> tuple[dict, list[dict]]:
    """Run one trial of the tiny objective; the table row and its curves."""
    global _OBJECTIVE
    from dataclasses import asdict

    from allocopt.objective import TrialFailed, get_objective
    from allocopt.plan.allocation import Allocation, InfeasiblePlan, make_plan
    from allocopt.quiet import quiet

    if _OBJECTIVE is None:
        _OBJECTIVE = get_objective("tiny")
    row = {k: "" for k in columns(cell.model)}
    if cell.model:
        row["model"] = cell.model
    row.update(reward=cell.reward, group_size=cell.group_size, rho=cell.rho, fidelity=cell.fidelity,
               budget_flops=cell.budget_flops, seed=cell.seed)
    curves: list[dict] = []
    start = time.monotonic()
    try:
        plan = make_plan(cell.budget_flops, Allocation(cell.rho, cell.group_size, cell.reward, cell.model),
                         _OBJECTIVE.workload())
        row.update(planned_rho=round(plan.realized_rho, 5), iterations=plan.iterations)
        with quiet(False):
            res = _OBJECTIVE.run(plan, seed=cell.seed)
        status = "complete"
    except InfeasiblePlan as e:
        row.update(status="infeasible", error=str(e)[:200], finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        return row, curves
    except TrialFailed as e:
        res, status = e.result, "failed"
        row["error"] = str(e)[:200]
    b = res.spent.executed
    row.update(status=status, search_flops=b.search_flops, learning_flops=b.learning_flops,
               reward_flops=b.reward_flops, total_flops=b.total_flops,
               realized_rho=round(b.rho, 5) if b.total_flops else "",
               wall_seconds=round(time.monotonic() - start, 1), eval_flops=res.eval_flops,
               finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    for k in ("native_reward", "pass_at_1", "judge"):
        if k in res.targets:
            row[k] = round(res.targets[k], 5)
    curves = [asdict(r) for r in res.curves]
    return row, curves


def columns(model: str | None) -> tuple[str, ...]:
    """The table's columns: with a ``model`` column when the grid is of a named policy size."""
    return COLUMNS + ("model",) if model else COLUMNS


def append(table: Path, curves_file: Path, row: dict, curves: list[dict]) -> None:
    new = not table.exists()
    with table.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns(row.get("model")))
        if new:
            w.writeheader()
        w.writerow(row)
    with curves_file.open("a") as f:
        key = {k: row[k] for k in ("reward", "group_size", "rho", "fidelity", "seed")}
        f.write(json.dumps({**key, "curves": curves}) + "\n")


def median_wall(table: Path) -> dict[str, float]:
    """Median wall seconds per fidelity of the finished trials (for the estimate; the median,
    since trials run beside other work took up to 10x longer)."""
    out: dict[str, list[float]] = {}
    if table.exists():
        with table.open(newline="") as f:
            for r in csv.DictReader(f):
                if r["wall_seconds"]:
                    out.setdefault(r["fidelity"], []).append(float(r["wall_seconds"]))
    return {k: sorted(v)[len(v) // 2] for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=3e11, help="full budget, FLOPs (default 3e11)")
    p.add_argument("--pilot-fractions", "--pilot-fraction", type=float, nargs="+", default=[0.25],
                   help="pilot budgets as fractions of --budget (default 0.25, the tiny study's); "
                        "fidelity 'pilot' at 0.25, 'pilot10' at 0.1, ...")
    p.add_argument("--pilot-group-sizes", type=int, nargs="+", default=None,
                   help="G of the pilot cells (default: --group-sizes)")
    p.add_argument("--rho-range", type=float, nargs=2, default=(0.2, 0.9))
    p.add_argument("--rho-levels", type=int, default=8)
    p.add_argument("--group-sizes", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--rewards", nargs="+", default=["sparse", "structured", "dense", "proxy_prm", "prm"])
    p.add_argument("--full-seeds", type=int, default=3)
    p.add_argument("--pilot-seeds", type=int, default=2)
    p.add_argument("--fidelities", nargs="+", default=None,
                   help="run only these fidelities (full, pilot, pilot10, ...; e.g. the pilots first: "
                        "they take a quarter of the time); default all")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="run at most this many trials, then stop")
    p.add_argument("--model", default=None,
                   help="policy size of the tiny world (tiny, small, medium; objectives.tiny.sizes); "
                        "rows get a model column. Default: the world's own policy, no column")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--estimate", action="store_true", help="print what is left and how long; run nothing")
    args = p.parse_args()
    if args.rho_levels < 2 or not all(0 < f < 1 for f in args.pilot_fractions) or args.workers < 1:
        sys.exit("error: --rho-levels >= 2, 0 < --pilot-fractions < 1 and --workers >= 1")
    if args.model is not None:
        from objectives.tiny.sizes import SIZES

        if args.model not in SIZES:
            sys.exit(f"error: --model {args.model!r}: not a tiny policy size; known: {', '.join(SIZES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    table, curves_file = args.out / "trials.csv", args.out / "curves.jsonl"
    cells = grid(args)
    done = done_keys(table)
    todo = [c for c in cells if c.key() not in done]
    n_done = len(cells) - len(todo)
    if args.fidelities:
        todo = [c for c in todo if c.fidelity in args.fidelities]
    walls = median_wall(table)
    # a fidelity without finished trials yet: the full trials' median scaled by its budget share
    full_wall = walls.get("full", 75.0)
    guess = {c.fidelity: walls.get(c.fidelity, max(10.0, full_wall * c.budget_flops / args.budget)) for c in cells}
    left_s = sum(guess[c.fidelity] for c in todo) / args.workers
    print(f"grid: {len(cells)} trials, {n_done} done, {len(todo)} left"
          f"{' in ' + '/'.join(args.fidelities) if args.fidelities else ''}; "
          f"about {left_s / 3600:.1f} h with {args.workers} workers "
          f"(median wall per trial: {', '.join(f'{k} {v:.0f} s' for k, v in guess.items())}"
          f"{'' if walls else ', guessed'})", flush=True)
    if args.estimate or not todo:
        return
    if args.limit is not None:
        todo = todo[:args.limit]
    ctx = mp.get_context("spawn")
    n, t0 = 0, time.monotonic()
    with ctx.Pool(args.workers, initializer=_init_worker, maxtasksperchild=20) as pool:
        try:
            for row, curves in pool.imap_unordered(run_cell, todo):
                append(table, curves_file, row, curves)
                n += 1
                # what is left at the medians, scaled by how this run's pace compares with them so far
                pace = (time.monotonic() - t0) / max(1e-9, sum(guess[c.fidelity] for c in todo[:n]) / args.workers)
                eta = pace * sum(guess[c.fidelity] for c in todo[n:]) / args.workers
                print(f"[{n}/{len(todo)}] {row['fidelity']} {row['reward']} G={row['group_size']} "
                      f"rho={row['rho']} seed={row['seed']}: {row['status']} pass@1={row['pass_at_1']} "
                      f"({row['wall_seconds']} s; about {eta / 60:.0f} min left)", flush=True)
        except KeyboardInterrupt:
            pool.terminate()
            print(f"stopped after {n} trials; run again to continue", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
