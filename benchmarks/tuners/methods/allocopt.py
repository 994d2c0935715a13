"""allocopt's tuner in the harness: :func:`run_allocopt` spends a session as a study with
``tuner = "kg"`` would.

This is the only module that knows how allocopt's algorithm is called. It drives the study's own
tuner object, :class:`allocopt.tuner.study.KGTuner`, over the same plain data the study's sampler
hands it (:mod:`allocopt.race.data`): one run at a time, the tuner's proposal (a full run, or a
pilot at the study's ``pilot_fraction`` when the table has pilots there, at most ``pilots`` of
them), its answer (the posterior-mean maximizer at the full budget) before each scored level. The
study terms are those of ``studies/tiny.toml`` (or ``$ALLOCOPT_TINY_STUDY``): ``pilots``,
``pilot_fraction``. A run the world finds infeasible costs nothing and is not proposed again
(a study's planner refuses it before it runs).
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.tuners.methods import Method, tiny_study
from benchmarks.tuners.scoring import OWN
from benchmarks.tuners.session import Session



def missing() -> str | None:
    try:
        from allocopt.tuner.study import KGTuner  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"allocopt.tuner does not import ({type(e).__name__}: {e})"
    return None


PILOTS_ABLATION = 70
"""The ``allocopt-pilots`` ablation's pilot cap: the study file's before the measured worlds
turned pilots off (``pilots = 70`` at ``pilot_fraction = 0.1``)."""


def study_terms(world: Any, pilots: int | None = -1) -> tuple[float, int | None, str]:
    """``(pilot fraction, most pilots, note)`` of the study file on ``world`` (``pilots``, when
    not -1, replaces the file's cap): no pilots where the world has none at the study's
    fraction."""
    from allocopt.spec import StudySpec

    study = StudySpec.from_toml(tiny_study())
    f = round(study.pilot_fraction, 4)
    cap = study.pilots if pilots == -1 else pilots
    if cap == 0 or f in world.fractions:
        return f, cap, ""
    return f, 0, f"no pilots: the world has none at {f:g}"


def make_tuner(session: Session, pilots: int | None = -1, **settings: Any) -> Any:
    """The study's :class:`~allocopt.tuner.study.KGTuner` on the session's world; ``settings``:
    other keyword arguments of ``KGTuner`` (an ablation's design change)."""
    from allocopt.race.data import Budgets
    from allocopt.tuner.study import KGTuner

    w = session.world
    f, max_pilots, session.note = study_terms(w, pilots)
    refused: set = set()
    tuner = KGTuner(w.space, Budgets(w.full_budget_flops, f), max_pilots=max_pilots,
                    seed=session.replication, feasible=lambda a, frac: (a, round(frac, 4)) not in refused,
                    **settings)
    tuner.refused = refused
    return tuner


def run_allocopt(session: Session, pilots: int | None = -1, **settings: Any) -> None:
    """The study's loop on the session (module docstring); ``pilots`` as :func:`study_terms`,
    ``settings`` as :func:`make_tuner`."""
    from allocopt.race.data import Observation, Run

    tuner = make_tuner(session, pilots, **settings)
    w = session.world
    obs: list[Observation] = []
    runs: list[Run] = []
    while not session.done:
        props = tuner.propose(obs, runs, q=1)
        if not props:
            break
        p = props[0]
        frac = 1.0 if p.fidelity == "full" else tuner.budgets.pilot_fraction
        if session.answer_due(frac) and any(o.fidelity == "full" for o in obs):
            session.recommend(tuner.answer(obs)[0].allocation)
        y = session.observe(p.allocation, frac)
        if y is None:
            tuner.refused.add((p.allocation, round(frac, 4)))
            continue
        runs.append(Run(p.allocation, p.fidelity))
        obs.append(Observation(len(obs), p.allocation, y, frac * w.full_budget_flops, frac, p.fidelity,
                               math.nan))
    if any(o.fidelity == "full" for o in obs):
        session.recommend(tuner.answer(obs)[0].allocation)


def time_proposal(world: Any, n_trials: int, repeats: int) -> dict[str, float]:
    """Seconds of one proposal with ``n_trials`` observations, as a study runs it: ``allocopt``
    with full runs only (the shipped ``pilots = 0``), ``allocopt-pilots`` with 60 % of them
    pilots at the world's smallest fraction and pilots among the candidates (the ablation);
    wall clock under each name, CPU time as ``<name> cpu``; the median of ``repeats`` calls
    after one untimed call, the initial design left out (the knowledge-gradient step is timed)."""
    out = _time_kg(world, n_trials, repeats, pilots=False)
    if world.fractions:
        out.update(_time_kg(world, n_trials, repeats, pilots=True))
    return out


def _time_kg(world: Any, n_trials: int, repeats: int, pilots: bool) -> dict[str, float]:
    import random
    import statistics

    from allocopt.race.data import Budgets, Observation
    from allocopt.tuner.study import KGTuner
    from benchmarks.tuners.timings import _clocks, _since, random_allocations
    from benchmarks.tuners.truth import draw_key, truth_for

    truth = truth_for(world, "pass_at_1", "seedmean", 0)
    f = min(world.fractions) if pilots else 1.0
    obs: list[Observation] = []
    for i, a in enumerate(random_allocations(world.space, 2 * n_trials, random.Random(f"timing|{n_trials}"))):
        frac = f if i < 0.6 * n_trials else 1.0
        y = truth.draw(a, frac, draw_key(0, "seedmean", a, frac, i))
        if y is not None and len(obs) < n_trials:
            obs.append(Observation(len(obs), a, y, frac * world.full_budget_flops, frac,
                                   "pilot" if frac < 1 else "full", math.nan))
    tuner = KGTuner(world.space, Budgets(world.full_budget_flops, f if pilots else 0.1),
                    max_pilots=None if pilots else 0)
    tuner.initial = []
    ts = []
    for _ in range(repeats + 1):  # the first, untimed, warms up imports and caches
        t0 = _clocks()
        tuner.propose(obs, [], q=1)
        ts.append(_since(t0))
    name = "allocopt-pilots" if pilots else "allocopt"
    return {name: statistics.median(t[0] for t in ts[1:]), f"{name} cpu": statistics.median(t[1] for t in ts[1:])}


METHODS = {
    "allocopt": Method("allocopt", "allocopt", OWN, run_allocopt, missing, weight=30),
    # replayed before the answer rule among tried cells was chosen, before the initial design took
    # the middle group size and before it was dropped: it answers over every cell and makes its
    # first runs one per reward system, their G in turn, as then
    "allocopt-pilots": Method("allocopt-pilots", "allocopt with pilots (ablation)", OWN,
                              lambda s: run_allocopt(s, PILOTS_ABLATION, among="all", layout="g-in-turn",
                                                     initial=True), missing,
                              weight=30),
    # the tuner as shipped until 2026-12-06: its first runs one per reward system at the middle
    # of rho and G, the rows the pages' prose then described
    "allocopt-design": Method("allocopt-design", "allocopt with the middle design (shipped until 2026-12-06)", OWN,
                              lambda s: run_allocopt(s, initial=True, layout="middle"), missing, weight=30),
    # the tuner as shipped from 2026-12-06 to 2026-12-07: no initial design, every run the
    # knowledge gradient's (allocopt.tuner.study.INITIAL_DESIGN)
    "allocopt-no-design": Method("allocopt-no-design", "allocopt without an initial design (2026-12-06 to 12-07)",
                                 OWN, lambda s: run_allocopt(s, initial=False), missing, weight=30),
}
