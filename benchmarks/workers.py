"""Seconds per RACE proposal while other workers' trials are pending.

A worker asks for a trial while ``--pending`` trials of other workers are running: RACE fits
its surrogate on the complete trials (refitted only when they changed) and conditions on the
pending ones (constant liar) before it proposes. This measures that ask (Optuna ``study.ask``
+ ``RaceSampler.suggest``) on the synthetic objective, after the pilots and after a growing
number of complete full-budget trials, with the pending trials in the same storage as N real
workers would leave them, and prints a table::

    python benchmarks/workers.py                       # 3 pending; 0, 8, 24 full trials done
    python benchmarks/workers.py --pending 3 --levels 0,8,24 --repeats 3 --storage sqlite:///b.db

Each level's seconds are the median (and max) over ``--repeats`` asks; "distinct" says whether
every proposal differed from the pending allocations (it must).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pending", type=int, default=3)
    ap.add_argument("--pilots", type=int, default=30)
    ap.add_argument("--levels", default="0,8,24", help="complete full-budget trials before each measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--storage", default=None, help="Optuna storage URL (default: a temporary SQLite file)")
    a = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import optuna
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from allocopt.spec import SearchSpace, StudySpec
    from allocopt.study.open import distributions, make_sampler, open_study
    from allocopt.study.trial import run_one_trial
    from objectives.synthetic import SyntheticObjective

    storage = a.storage or f"sqlite:///{tempfile.mkdtemp(prefix='allocopt-bench-')}/b.db"
    spec = StudySpec(name="bench-workers", objective="synthetic", budget_flops=1e19, target="pass@1",
                     tuner="race", trials=10_000, pilots=a.pilots, seed=0,
                     space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 4, 8, 16),
                                       rewards=("sparse", "dense", "prm")))
    obj = SyntheticObjective()
    workload = obj.workload()
    study = open_study(spec, storage)
    sampler = make_sampler(spec, workload=workload)
    study.sampler = sampler
    study.set_user_attr("spec", spec.to_dict())
    dists = distributions(spec, fidelity=True)

    def ask():
        t = study.ask(dists)
        return t, sampler.suggest(t)

    def run(t):
        run_one_trial(study, t, spec, objective=obj, workload=workload)

    t0 = time.perf_counter()
    while sampler.pilots_left(study):
        run(ask()[0])
    print(f"{len(sampler.design)} pilots run in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    done_full = 0
    for level in [int(x) for x in a.levels.split(",")]:
        while done_full < level:
            t, d = ask()
            run(t)
            done_full += d.fidelity == "full"
        secs, distinct = [], True
        for _ in range(a.repeats):
            pending = [ask() for _ in range(a.pending)]  # other workers' trials, left running
            s = time.perf_counter()
            t, d = ask()
            secs.append(time.perf_counter() - s)
            distinct &= all(d.allocation != p[1].allocation for p in pending)
            for p, _ in pending + [(t, d)]:
                run(p)
                done_full += study.trials[p.number].params.get("fidelity") == "full"
        rows.append((len(sampler.design), level, a.pending, statistics.median(secs), max(secs), distinct))
    print(f"\n{'pilots':>6} {'full done':>9} {'pending':>7} {'s/proposal':>10} {'max s':>7} {'distinct':>8}")
    for r in rows:
        print(f"{r[0]:>6} {r[1]:>9} {r[2]:>7} {r[3]:>10.2f} {r[4]:>7.2f} {str(r[5]):>8}")


if __name__ == "__main__":
    main()
