"""Calibrate the tiny world: does the allocation really matter at the default study budget?

Runs real GRPO trials of the tiny objective over a grid of rho x reward systems with several
seeds each, plus the untrained base policy, and prints mean ± sd of every target per point,
the reward share of compute, and wall time per trial. Run by hand:

    python benchmarks/calibrate_tiny.py --seeds 3 --workers 2     # ~17 min on 2 cores

Each worker is one process on one thread (two torch processes on 2 cores thrash otherwise).
Results also go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence


def _objective(settings: dict):
    from objectives.tiny.objective import TinyObjective, TinySettings

    return TinyObjective(TinySettings.from_flat(**settings))


def _trial(args: tuple[float, str, int, float, int, dict]) -> dict:
    rho, reward, seed, budget, group_size, settings = args
    import torch

    torch.set_num_threads(1)
    from allocopt.plan.allocation import Allocation, make_plan
    obj = _objective(settings)
    plan = make_plan(budget, Allocation(rho, group_size, reward), obj.workload())
    t0 = time.perf_counter()
    res = obj.run(plan, seed=seed)
    e = res.spent.executed
    return {"rho": rho, "reward": reward, "seed": seed, **res.targets,
            "realized_rho": e.rho, "reward_share": e.reward_flops / e.total_flops,
            "utilization": e.total_flops / budget, "iterations": len(res.curves),
            "wall_seconds": time.perf_counter() - t0}


def _base(args: tuple[dict, str]) -> dict:
    """The untrained base policy's targets, ``native_reward`` under ``reward``."""
    settings, reward = args
    import torch

    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    obj = _objective(settings)
    model = AutoModelForCausalLM.from_pretrained(str(obj.world().policy))
    targets, _ = obj.evaluate(model, obj._tokenizer(), obj.reward(reward))
    return {"rho": 0.0, "reward": reward, "seed": 0, **targets, "realized_rho": 0.0,
            "reward_share": 0.0, "utilization": 0.0, "iterations": 0, "wall_seconds": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=3e11, help="FLOPs per trial (the tiny study's)")
    ap.add_argument("--rhos", default="0.2,0.4,0.6,0.8,0.9")
    ap.add_argument("--rewards", default="sparse,dense,prm")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="calibration.json")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="override a TinySettings field (repeatable), e.g. --set eval_problems=500")
    ap.add_argument("--summarize", nargs="+", metavar="JSON",
                    help="run nothing: print the tables of earlier --out files (merged)")
    a = ap.parse_args()
    if a.summarize:
        runs = [json.loads(Path(f).read_text()) for f in a.summarize]
        report([b for r in runs for b in r["base"]], [t for r in runs for t in r["trials"]],
               f"budget {runs[0]['budget']:.2e} FLOPs, merged from {', '.join(a.summarize)}")
        return
    settings = {}
    for item in a.settings:
        key, _, value = item.partition("=")
        settings[key] = json.loads(value)
    _objective(settings).world()  # build once (and check the settings), before the workers start
    jobs = [(float(r), w, s, a.budget, a.group_size, settings) for w in a.rewards.split(",")
            for r in a.rhos.split(",") for s in range(a.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.workers) as pool:
        base = list(pool.map(_base, [(settings, w) for w in a.rewards.split(",")]))
        rows = list(pool.map(_trial, jobs))
    wall = time.perf_counter() - t0
    Path(a.out).write_text(json.dumps({"budget": a.budget, "base": base, "trials": rows}, indent=1))
    report(base, rows, f"budget {a.budget:.2e} FLOPs, G={a.group_size}, {a.seeds} seeds per point, "
           f"settings {settings or 'default'}, {len(rows)} trials in {wall:.0f} s with {a.workers} workers")


def report(base: list[dict], rows: list[dict], header: str) -> None:
    """Print the per-point table, the summary and the rho* estimates of ``rows``."""
    targets = ("native_reward", "pass_at_1", "judge")
    print(header)
    print(f"{'reward':<16}{'rho':>5}" + "".join(f"{t:>20}" for t in targets)
          + f"{'real rho':>10}{'rwd share':>10}{'util':>7}{'s/trial':>9}")
    bases = {b["reward"]: b for b in base}
    for w, b in bases.items():
        print(f"{'base, ' + w:<16}{'-':>5}" + "".join(f"{b[t]:>20.3f}" for t in targets))
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["reward"], r["rho"]), []).append(r)
    for (w, rho), g in groups.items():
        cells = ""
        for t in targets:
            v = [x[t] for x in g]
            sd = statistics.stdev(v) if len(v) > 1 else float("nan")
            cells += f"{statistics.fmean(v):>13.3f} ±{sd:5.3f}"
        mean = lambda k: statistics.fmean(x[k] for x in g)  # noqa: E731
        print(f"{w:<16}{rho:>5.2f}{cells}{mean('realized_rho'):>10.3f}{mean('reward_share'):>10.2f}"
              f"{mean('utilization'):>7.2f}{mean('wall_seconds'):>9.1f}")
    print()
    print(summary(bases, groups, targets))
    print()
    print(rho_star_table(rows, targets))


def summary(bases: dict[str, dict], groups: dict[tuple[str, float], list[dict]],
            targets: Sequence[str]) -> str:
    """Per reward system and target, the calibration questions in numbers: the best rho, the
    gain of the best point over the base policy (``bases[reward]``: ``native_reward`` is the
    reward system's own score, so each has its base) in sd of that point
    (``(mean - base) / sd``), and the
    response across rho (``(max mean - min mean) / pooled sd``, the pooled sd being the root
    mean of the points' variances)."""
    lines = [f"{'reward':<16}{'target':<15}{'best rho':>9}{'best':>8}{'gain/sd':>9}"
             f"{'range':>8}{'pooled sd':>10}{'range/sd':>9}"]
    for w in dict.fromkeys(k[0] for k in groups):
        pts = sorted((rho, g) for (r, rho), g in groups.items() if r == w)
        for t in targets:
            means = [statistics.fmean(x[t] for x in g) for _, g in pts]
            var = [statistics.variance([x[t] for x in g]) for _, g in pts if len(g) > 1]
            sd = math.sqrt(statistics.fmean(var)) if var else float("nan")
            i = max(range(len(means)), key=means.__getitem__)
            g = [x[t] for x in pts[i][1]]
            sd_best = statistics.stdev(g) if len(g) > 1 else float("nan")
            gain = (means[i] - bases[w][t]) / sd_best if sd_best > 0 else float("inf")
            spread = max(means) - min(means)
            lines.append(f"{w:<16}{t:<15}{pts[i][0]:>9.2f}{means[i]:>8.3f}{gain:>9.1f}"
                         f"{spread:>8.3f}{sd:>10.3f}{spread / sd if sd > 0 else float('inf'):>9.1f}")
    return "\n".join(lines)


def rho_star_table(rows: Sequence[dict], targets: Sequence[str]) -> str:
    """Per reward system and target, the best rho with its 90 % credible interval by the
    project's one rho* estimator (RACE's local quadratic, :func:`allocopt.race.diagnose_group`,
    fitted on every seed of every point: the seeds are its replicates), with the reward share
    of compute at rho* and the regime it implies."""
    from allocopt.plan.allocation import Allocation
    from allocopt.race.diagnose import Observation, diagnose_group

    rhos = [r["rho"] for r in rows]
    lo, hi = min(rhos), max(rhos)
    lines = [f"{'reward':<16}{'target':<15}{'rho*':>6}{'90% interval':>15}{'rwd share':>10}"
             f"  regime (P)"]
    for w in dict.fromkeys(r["reward"] for r in rows):
        mine = [r for r in rows if r["reward"] == w]
        for t in targets:
            obs = [Observation(i, Allocation(r["rho"], 4, w), float(r[t]), 0.0, 1.0, "full",
                               r["reward_share"]) for i, r in enumerate(mine)]
            d = diagnose_group(obs, (lo, hi))
            lines.append(f"{w:<16}{t:<15}{d.rho:>6.2f}{d.rho_interval[0]:>8.2f}-{d.rho_interval[1]:<6.2f}"
                         f"{d.reward_share:>10.2f}  {d.regime} ({d.probability:.2f})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
