"""The one translator from a study's Optuna trials to the tuner's plain values.

Beside the sampler (:mod:`allocopt.study.sampler`), as Optuna's ``GPSampler`` reads its trials
in one place and hands arrays to ``optuna._gp``: nothing below it (:mod:`allocopt.race`,
:mod:`allocopt.surrogate`) reads a trial or imports Optuna.

* :func:`observations` — every complete trial with a finite value, as an
  :class:`~allocopt.race.data.Observation`: the allocation it ran (a run recorded by ``allocopt
  tell`` at the ρ it really spent, :func:`observed_params`), its value (a target's, or the
  study's objective), its budget and budget fraction (over its allocation's full budget), its
  fidelity, reward share and, when the trial reports it, the variance of its evaluation;
* :func:`runs` — every trial that ran, runs or waits, as a :class:`~allocopt.race.data.Run`
  (what no proposal may repeat; the pending ones are conditioned on);
* :func:`budgets_of` — a study's :class:`~allocopt.race.data.Budgets` (FLOPs per fidelity).

One rule for every caller (the sampler, ``allocopt race``'s diagnosis, the report): a trial
counts when Optuna and allocopt both hold it complete (an infeasible plan is complete in Optuna
with a violated constraint: not an observation); its budget is its ``budget_flops`` user
attribute, else its fidelity's budget; its budget fraction is that over the full budget of the
allocation it was asked for (priced per allocation under a time budget; without the workload
to price it, its fidelity's fraction).

Standard library only: trials are passed in (``study.get_trials(deepcopy=False)``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from allocopt.flops import ConfigError
from allocopt.plan.allocation import Allocation
from allocopt.plan.budget import Budget
from allocopt.race.data import Budgets, Observation, Run
from allocopt.record import TrialRecord, fidelity_of, is_interrupted, observed_rho, params_of
from allocopt.spec import SearchSpace, StudySpec, allocation_in, target_key

VARIANCE_SUFFIX = "_variance"
"""A trial reports the variance of a target's evaluation as metric ``<target key>_variance``
(e.g. ``pass_at_1_variance``, ``p (1 - p) / n_eval`` over ``n_eval`` problems)."""


def observed_params(t: Any) -> dict[str, Any]:
    """The parameters a finished trial's result belongs to: :func:`allocopt.record.params_of`,
    except that a run launched elsewhere and recorded by ``allocopt tell`` (user attribute
    ``source=tell``) is placed at the ρ it really spent (its ``metrics["rho"]``, executed FLOPs):
    TRL and verl train whole passes, so such a run may realize a ρ far from the one asked (0.70
    for an asked 0.55 in the tiny world), and the surrogate must learn from where the run was."""
    return _observed_params(TrialRecord.of(t))


def _observed_params(r: TrialRecord) -> dict[str, Any]:
    p = r.given_params
    rho = observed_rho(r.source, p.get("rho"), r.metrics.get("rho"))
    return p if rho == p.get("rho") else {**p, "rho": rho}


def _variance(metrics: Mapping[str, Any], key: str | None) -> float:
    v = metrics.get(f"{key}{VARIANCE_SUFFIX}") if key else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 \
        else math.nan


def observations(trials: Iterable[Any], space: SearchSpace, budgets: Budgets, *,
                 key: str | None = None, objective_key: str | None = None, sign: float = 1.0) -> list[Observation]:
    """Every complete trial of ``trials`` with a finite value, as the tuner reads it (module
    docstring), in trial order.

    Args:
        trials: Optuna ``FrozenTrial`` (``study.get_trials(deepcopy=False)``).
        space: the study's search space (dimensions it fixes are filled from it).
        budgets: the study's budgets (:func:`budgets_of`).
        key: the value is the trial's target ``key`` (user attribute ``targets``); ``None``:
            its first objective value (``FrozenTrial.values[0]``) times ``sign``.
        objective_key: the target key of the first objective, for the evaluation variance when
            ``key`` is ``None``.
        sign: 1 for a maximized objective, -1 for a minimized one.
    """
    out = []
    for t in trials:
        r = TrialRecord.of(t)
        if r.optuna_state != "COMPLETE" or r.state != "COMPLETE":
            continue
        if key is not None:
            if key not in r.targets:
                continue
            value = float(r.targets[key])
        elif r.values:
            value = sign * float(r.values[0])
        else:
            continue
        if not math.isfinite(value):
            continue
        asked = allocation_in(space, r.given_params)  # the budget was priced for it
        full = budgets.full_flops(asked) if budgets.priced else math.nan
        budget = r.budget(budgets.fraction(r.fidelity) * full if budgets.priced else math.nan)
        m = r.metrics
        total = m.get("total_flops") or 0
        out.append(Observation(
            number=r.number, allocation=allocation_in(space, _observed_params(r)), value=value,
            budget_flops=budget, budget_fraction=budget / full if budgets.priced else budgets.fraction(r.fidelity),
            fidelity=r.fidelity, reward_share=(m.get("reward_flops", 0) / total) if total else math.nan,
            variance=_variance(m, key or objective_key)))
    return out


def runs(trials: Iterable[Any], space: SearchSpace, skip: int | None = None) -> list[Run]:
    """Every trial of ``trials`` that ran, runs or waits with its parameters set, as a
    :class:`~allocopt.race.data.Run` at the allocation it was asked for (pending: running or
    waiting). A trial stopped by an interrupt is left out (it may run again), and so is trial
    number ``skip`` (the one being sampled) and one whose parameters no allocation accepts."""
    out = []
    for t in trials:
        params = params_of(t)
        if t.number == skip or not params or is_interrupted(t):
            continue
        try:
            a = allocation_in(space, params)
        except ConfigError:
            continue
        out.append(Run(a, fidelity_of(t), pending=t.state.name in ("RUNNING", "WAITING")))
    return out


def budgets_of(budget: Budget, pilot_fraction: float, workload: Any = None) -> Budgets:
    """The tuner's :class:`~allocopt.race.data.Budgets` of a study's ``budget``: its FLOPs for
    every allocation; under a time budget each allocation's FLOPs in the hours on ``workload``
    (cached; not priced without a workload); pilots at ``pilot_fraction``."""
    if budget.time is None:
        return Budgets(budget.flops, pilot_fraction)
    if workload is None:
        return Budgets(None, pilot_fraction)
    priced: dict[Allocation, float] = {}

    def full(a: Allocation) -> float:
        if a not in priced:
            priced[a] = budget.for_allocation(a, workload)
        return priced[a]

    return Budgets(full, pilot_fraction)


def study_observations(study: Any, spec: StudySpec, target: str | None = None,
                       workload: Any = None) -> list[Observation]:
    """:func:`observations` of every trial of ``study`` for ``target`` (default the study's
    first), budgets priced on ``workload`` (:func:`budgets_of`)."""
    key = target_key(target or spec.targets[0])
    return observations(study.get_trials(deepcopy=False), spec.space,
                        budgets_of(spec.budget, spec.pilot_fraction, workload), key=key)


__all__ = ["VARIANCE_SUFFIX", "budgets_of", "observations", "observed_params", "runs", "study_observations"]
