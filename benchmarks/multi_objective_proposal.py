"""Seconds per proposal of a study with several targets: what one ``ask`` of the sampler a
two-target study runs (:func:`allocopt.study.open.make_sampler`: allocopt's knowledge-gradient
tuner on a fresh random weighting of the targets, ``tuner = "kg"``, the default; with ``tuner =
"bo"``, Optuna's ``GPSampler`` or ``BoTorchSampler`` with qLogNEHVI) costs with ``n`` finished
trials.

The trials are the synthetic objective's (``pass@1`` and ``judge`` at random allocations of its
default space, one seed each), each with the ``budget`` constraint and the user attributes a
study records (state, targets, fidelity, budget), told to an in-memory Optuna study; then the median of ``--repeats`` timed ``study.ask``
calls after one untimed warm-up, wall clock and process CPU (one torch thread), with the
machine's 1-minute load average (the wall clock scales with it on a shared machine).

    python benchmarks/multi_objective_proposal.py --trials 20 100 200 --repeats 3 --samplers kg gp
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGETS = ("pass@1", "judge")


def filled_study(sampler_name: str, n: int, seed: int = 0):
    """An in-memory two-target study of ``n`` finished synthetic trials, its sampler the one a
    study runs with ``tuner = "kg"`` (``sampler_name`` ``kg``) or ``tuner = "bo"`` and
    ``sampler = sampler_name``."""
    import optuna

    from allocopt.plan.allocation import Allocation, make_plan
    from allocopt.spec import StudySpec, allocation_of
    from allocopt.study.open import make_sampler
    from allocopt.study.sampler import space_distributions
    from objectives.synthetic import SyntheticObjective

    kg = sampler_name == "kg"
    spec = StudySpec(name="mo", objective="synthetic", budget_flops=1e19, target=TARGETS,
                     tuner="kg" if kg else "bo", sampler="gp" if kg else sampler_name, seed=seed)
    obj = SyntheticObjective()
    workload = obj.workload()
    dists = space_distributions(spec.space, fidelity=kg)
    study = optuna.create_study(directions=["maximize"] * len(TARGETS),
                                sampler=make_sampler(spec, workload=workload))
    rng = random.Random(seed)
    while len(study.trials) < n:
        params = {k: (rng.uniform(d.low, d.high) if hasattr(d, "low") else rng.choice(d.choices))
                  for k, d in dists.items()}
        params.update({"fidelity": "full"} if kg else {})
        alloc: Allocation = allocation_of(spec, params)
        try:
            res = obj.run(make_plan(spec.budget_flops, alloc, workload), seed=len(study.trials))
        except Exception:  # an allocation the budget cannot buy: not a finished trial here
            continue
        trial = optuna.trial.create_trial(
            params=params, distributions=dists, values=[res.targets[spec.vocabulary.key(t)] for t in TARGETS],
            system_attrs={"constraints:budget": -1.0},
            user_attrs={"state": "COMPLETE", "targets": dict(res.targets), "fidelity": "full",
                        "budget_flops": spec.budget_flops})
        study.add_trial(trial)
    return study, dists


def time_ask(sampler_name: str, n: int, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one ``ask`` with ``n`` finished trials."""
    study, dists = filled_study(sampler_name, n)
    if sampler_name == "kg":  # the knowledge-gradient step is timed, not the initial design's runs
        study.sampler.tuner.initial = []
    study.ask(dists)  # warm-up: imports, the first fit's compilation
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        study.ask(dists)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, nargs="+", default=[20, 100, 200])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samplers", nargs="+", default=["kg", "gp", "botorch"], choices=["kg", "gp", "botorch"],
                   help="kg: the default tuner; gp, botorch: tuner = bo with that sampler")
    a = p.parse_args(argv)
    import warnings

    import optuna
    import torch

    warnings.filterwarnings("ignore")  # BoTorch's and Optuna's experimental/numerical notes
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'sampler':>8} {'trials':>6} {'wall s':>8} {'CPU s':>8}")
    for s in a.samplers:
        for n in a.trials:
            wall, cpu = time_ask(s, n, a.repeats)
            print(f"{s:>8} {n:>6} {wall:8.3f} {cpu:8.3f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
