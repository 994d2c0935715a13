"""Seconds per proposal: what one ``ask`` of each sampler costs with ``n`` finished trials.

For the Optuna samplers, the time of ``study.ask`` in a study holding ``n`` random finished
trials (noisy values of the world's truth); for allocopt, its own proposal timing
(:func:`benchmarks.tuners.methods.allocopt.time_proposal`). The median of ``repeats`` calls
after one untimed warm-up, as wall-clock and process CPU seconds (one thread), with the
machine's 1-minute load average (wall clock scales with the load on a shared machine).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any, Sequence

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.methods import label
from benchmarks.tuners.methods.optuna_samplers import distributions, make_sampler
from benchmarks.tuners.truth import truth_for

TIMED = ("random", "tpe", "gp", "botorch", "allocopt")


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - t0[0], time.process_time() - t0[1]


def random_allocations(space: Any, n: int, rng: random.Random) -> list[Allocation]:
    lo, hi = space.rho
    return [Allocation(round(rng.uniform(lo, hi), 4), rng.choice(space.group_sizes), rng.choice(space.rewards),
                       rng.choice(space.models) if space.models else None) for _ in range(n)]


def time_optuna(world: Any, method: str, n_trials: int, repeats: int) -> tuple[float, float]:
    """``(wall, cpu)`` median seconds of one ``study.ask`` with ``n_trials`` finished trials."""
    import optuna
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    truth = truth_for(world, "pass_at_1", "seedmean", 0)
    rng = random.Random(f"timing|{world.name}|{n_trials}")
    dists = distributions(world.space)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(method, 0))
    for a in random_allocations(world.space, n_trials, rng):
        params = {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model}
        study.add_trial(create_trial(params={k: params[k] for k in dists}, distributions=dists,
                                     value=truth.value(a) + rng.gauss(0, 0.01)))
    ts = []
    for _ in range(repeats + 1):
        t0 = _clocks()
        trial = study.ask(dists)
        ts.append(_since(t0))
        p = trial.params
        study.tell(trial, truth.value(Allocation(p["rho"], p["group_size"], p["reward"], p.get("model"))))
    return statistics.median(t[0] for t in ts[1:]), statistics.median(t[1] for t in ts[1:])


def run_timings(worlds: Sequence[Any], trials: Sequence[int], repeats: int,
                methods: Sequence[str]) -> dict[str, dict[int, dict[str, float]]]:
    """``world -> n -> {method: wall s, method + ' cpu': cpu s, 'load': load average}``."""
    import torch

    torch.set_num_threads(1)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for w in worlds:
        for n in trials:
            load0 = os.getloadavg()[0]
            row: dict[str, float] = {}
            for m in methods:
                if m not in TIMED:
                    continue
                if m == "allocopt":
                    from benchmarks.tuners.methods.allocopt import missing, time_proposal

                    if missing() is None:
                        row.update(time_proposal(w, n, repeats))
                    continue
                row[m], row[m + " cpu"] = time_optuna(w, m, n, repeats)
            row["load"] = (load0 + os.getloadavg()[0]) / 2
            out.setdefault(w.name, {})[n] = row
    return out


def format_timings(t: dict[str, dict[int, dict[str, float]]], repeats: int) -> str:
    names = list(dict.fromkeys(k for by_n in t.values() for row in by_n.values() for k in row
                               if k != "load" and not k.endswith(" cpu")))
    lines = [f"Seconds per proposal, median of {repeats} (wall clock, then the process's CPU time, one thread), "
             "with the machine's 1-minute load average:",
             f"{'world':12s}{'trials':>7s}{'clock':>6s}" + "".join(f"{label(m)[:18]:>20s}" for m in names)
             + f"{'load':>8s}"]
    for w, by_n in t.items():
        for n, row in by_n.items():
            for suffix, name in (("", "wall"), (" cpu", "cpu")):
                lines.append(f"{w:12s}{n:7d}{name:>6s}" + "".join(
                    f"{row[m + suffix]:20.3f}" if m + suffix in row else f"{'—':>20s}" for m in names)
                    + f"{row.get('load', float('nan')):8.1f}")
    return "\n".join(lines)
