"""allocopt's earlier tuner, RACE (``tuner = "race"``), in the harness: :func:`run_race` spends a
session, for the ablation beside :mod:`benchmarks.tuners.methods.allocopt`.

It runs RACE's loop (:mod:`allocopt.race`) as a study would: its pilot grid
(:func:`allocopt.race.pilot_grid`; on a table world the design of
``benchmarks/tiny_grid/tiny_race.toml``, or ``$ALLOCOPT_RACE_STUDY``: its ``pilots``,
``pilot_fraction`` and ``[race]`` table, ``pilots`` once per policy size of a pooled world, with
pilots at the full budget when the table has no pilots at that fraction; on a synthetic world RACE's
defaults at 10 %), then full runs proposed ``BATCH`` per round by its surrogate
(:func:`allocopt.race.propose`) until the session's compute is spent, with RACE's own
recommendation (:func:`allocopt.race.recommend`) after each round; nothing before the pilots
are done. Feasibility: a synthetic world's plans come from the planner
(:class:`allocopt.race.PlanCache`); a table's from the table (an infeasible trial costs nothing).
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.tuners.methods import Method, race_study
from benchmarks.tuners.scoring import OWN
from benchmarks.tuners.session import Session

BATCH = 2
"""Proposals per round (``q``: a study with two workers)."""


def missing() -> str | None:
    try:
        from allocopt.race import propose, recommend  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"allocopt.race does not import ({type(e).__name__}: {e})"
    return None


def race_terms(session: Session) -> tuple[float, Any, Any, str]:
    """``(pilot fraction, RaceSettings, StudySpec, note)`` of the race on the session's world."""
    from allocopt.race import RaceSettings
    from allocopt.race.design import settings_for
    from allocopt.spec import StudySpec, target_label

    w = session.world
    base = dict(name=f"bench-{w.name}-{session.replication}", budget_flops=w.full_budget_flops,
                target=target_label(session.target), seed=1000 * session.replication, space=w.space)
    if w.kind != "table":
        return 0.1, RaceSettings(), StudySpec(objective="synthetic", **base), ""
    study = StudySpec.from_toml(race_study())
    # the design is per reward system of one policy: a world whose space holds several policy
    # sizes gets it once per size, so that no size's curve is fitted on fewer pilots
    pilots = None if study.pilots is None else study.pilots * max(1, len(w.space.models))
    spec = StudySpec(objective="tiny-table", pilots=pilots, pilot_fraction=study.pilot_fraction,
                     race=study.race, **base)
    f = round(study.pilot_fraction, 4)
    if f in w.fractions:
        return f, settings_for(spec), spec, ""
    return 1.0, settings_for(spec), spec, f"pilots at the full budget: the table has no pilots at {f:g}"


def run_race(session: Session) -> None:
    """RACE's loop on the session (module docstring)."""
    from allocopt.race import Observation, PlanCache, SurrogateCache, pilot_grid, propose, recommend

    f, settings, spec, note = race_terms(session)
    session.note = note
    w = session.world
    workload = _synthetic_workload(w) if w.kind != "table" else None
    plans = PlanCache(workload) if workload is not None else None
    obs, existing = [], []

    def run(a, fidelity: str, frac: float) -> None:
        existing.append((a, fidelity))
        if plans is not None and plans(frac * w.full_budget_flops, a) is None:
            return  # the planner finds no feasible plan: recorded, costs nothing
        y = session.observe(a, frac)
        if y is not None:
            obs.append(Observation(len(existing) - 1, a, y, frac * w.full_budget_flops, frac, fidelity, math.nan))

    for p in pilot_grid(spec.space, settings, spec.seed):
        run(p.allocation, "pilot", f)
    cache = SurrogateCache(spec.space, seed=spec.seed)
    while True:
        sur = cache(obs)
        session.recommend(recommend(sur, obs, spec.space, settings)[0])
        if session.done:
            return
        q = min(BATCH, math.ceil(session.cap - session.spent - 1e-9))
        props = propose(obs, spec, workload, existing=existing, q=q, pilot_fraction=f, allow_pilots=False,
                        settings=settings, surrogate=sur, plans=plans)
        if not props:
            return
        for pr in props:
            run(pr.allocation, pr.fidelity, pr.budget_flops / w.full_budget_flops)


def _synthetic_workload(world: Any) -> Any:
    """The synthetic objective's workload with 16 rollouts per iteration (the response does not
    depend on it; a small batch keeps the planner fast)."""
    from objectives.synthetic import SyntheticObjective

    return SyntheticObjective(variant=world.variant).workload().with_setup(rollouts_per_iteration=16)


def time_proposal(world: Any, n_trials: int, repeats: int) -> dict[str, float]:
    """Seconds of one proposal with ``n_trials`` observations (60 % of them pilots at the
    world's smallest fraction), surrogate included, averaged over a refit cycle of
    :class:`allocopt.race.SurrogateCache` (one call with a hyperparameter fit, then
    ``ceil(refit_growth · n) - 1`` that keep them); both kinds also apart, as ``allocopt
    (refit)`` and ``allocopt (reuse)``. Wall clock under each name, CPU with `` cpu`` appended."""
    import random
    import statistics
    from dataclasses import replace

    from allocopt.race import Observation, SurrogateCache, propose
    from allocopt.spec import StudySpec
    from benchmarks.tuners.timings import _clocks, _since, random_allocations
    from benchmarks.tuners.truth import draw_key, truth_for

    truth = truth_for(world, "pass_at_1", "seedmean", 0)
    f = min(world.fractions) if world.fractions else 1.0
    spec = StudySpec(name="timing", objective="synthetic", budget_flops=world.full_budget_flops,
                     target="pass@1", space=world.space)
    obs = []
    for i, a in enumerate(random_allocations(world.space, 2 * n_trials, random.Random(f"timing|{n_trials}"))):
        frac = f if i < 0.6 * n_trials else 1.0
        y = truth.draw(a, frac, draw_key(0, "seedmean", a, frac, i))
        if y is not None and len(obs) < n_trials:
            obs.append(Observation(len(obs), a, y, frac * world.full_budget_flops, frac,
                                   "pilot" if frac < 1 else "full", math.nan))
    existing = [(o.allocation, o.fidelity) for o in obs]
    fit_ts, reuse_ts = [], []
    for k in range(repeats + 1):  # the first, untimed, warms up imports and caches
        cache = SurrogateCache(world.space, seed=k)
        t0 = _clocks()
        propose(obs, spec, None, existing=existing, q=1, surrogate=cache(obs))
        fit_ts.append(_since(t0))
        extra = obs + [replace(obs[-1], number=len(obs), value=obs[-1].value + 0.001)]
        t0 = _clocks()
        propose(extra, spec, None, existing=existing, q=1, surrogate=cache(extra))
        reuse_ts.append(_since(t0))
    cycle = max(1, math.ceil(cache.refit_growth * n_trials))
    out = {}
    for k, suffix in ((0, ""), (1, " cpu")):
        fit_s = statistics.median(t[k] for t in fit_ts[1:])
        reuse_s = statistics.median(t[k] for t in reuse_ts[1:])
        out["allocopt (refit)" + suffix], out["allocopt (reuse)" + suffix] = fit_s, reuse_s
        out["allocopt" + suffix] = (fit_s + (cycle - 1) * reuse_s) / cycle
    return out


METHOD = Method("race", "allocopt RACE (before)", OWN, run_race, missing, weight=60)
