"""The trial record: the only code that reads and writes what allocopt keeps on an Optuna trial.

A trial's allocopt state lives in Optuna's user attributes (and two system attributes Optuna
itself writes). :class:`TrialRecord` reads them (``TrialRecord.of(frozen_trial)``); the
``write_*`` functions write them. Every other module goes through here, so each attribute has
one name, one default and one rule:

===================  ======================================================================
user attribute       meaning
===================  ======================================================================
``fidelity``         ``full`` (the study's budget) or ``pilot`` (a RACE pilot)
``budget_flops``     FLOPs the trial may spend
``plan``             ``TrialPlan.to_dict()``
``state``            ``COMPLETE``, ``INFEASIBLE`` or ``FAIL`` (Optuna tells an infeasible
                     plan as complete with a violated ``budget`` constraint)
``targets``          target key -> value (``pass_at_1``)
``metrics``          the executed breakdown (``search_flops``, ..., ``rho``) and run metrics
``error``            a failure's or infeasibility's text; ``interrupted`` after Ctrl-C
``asked``            a trial reserved by ``allocopt ask`` (its format and whole-pass run)
``source``           ``tell`` for a run recorded by ``allocopt tell``
``over_budget``      a told run that spent more than its budget
``race_pilot``       a RACE pilot's grid key; ``race_validation``: a surrogate's proposal
``released``         why a worker gave an asked trial back unsampled (Optuna ``PRUNED``):
                     no run, so no record (:func:`records` skips it)
===================  ======================================================================

System attributes read (Optuna writes them): ``fixed_params`` (the parameters an enqueued trial
waits with) and ``failed_trial`` (the trial a retried one repeats).

Standard library only: Optuna trials and studies are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

FIDELITY = "fidelity"
BUDGET = "budget_flops"
PLAN = "plan"
STATE = "state"
TARGETS = "targets"
METRICS = "metrics"
ERROR = "error"
ASKED = "asked"
SOURCE = "source"
OVER_BUDGET = "over_budget"
RACE_PILOT = "race_pilot"
RACE_VALIDATION = "race_validation"
FIXED_PARAMS = "fixed_params"
"""System attribute: the parameters an enqueued trial waits with (Optuna's)."""
RETRIED_FROM = "failed_trial"
"""System attribute: the number of the failed trial a retried one repeats (Optuna's)."""
RELEASED = "released"
INTERRUPTED = "interrupted"
"""The ``error`` of a trial stopped by Ctrl-C / SIGTERM (it runs again on resume)."""


def _system_attrs(t: Any) -> Mapping[str, Any]:
    return getattr(t, "system_attrs", None) or {}  # a live optuna.Trial has none


def params_of(t: Any) -> dict[str, Any]:
    """A trial's parameters: its own, or for a trial still waiting in the queue the ones it was
    enqueued with (system attribute ``fixed_params``; tests/test_sampler.py checks that Optuna
    still keeps them there). Includes the ``fidelity`` parameter of a RACE trial."""
    return dict(t.params) or dict(_system_attrs(t).get(FIXED_PARAMS) or {})


def fidelity_of(t: Any) -> str:
    """``pilot`` or ``full``: the trial's ``fidelity`` parameter (set by the RACE sampler; an
    enqueued trial's too), else its ``fidelity`` user attribute, else ``full``."""
    return str(params_of(t).get(FIDELITY) or t.user_attrs.get(FIDELITY) or "full")


def is_interrupted(t: Any) -> bool:
    """Whether a trial was stopped by Ctrl-C / SIGTERM (or its worker killed before it began)
    rather than failing: it is ``FAIL`` in Optuna and its error says ``interrupted``, or it has
    neither a ``fidelity`` user attribute nor parameters (stopped right after it was asked for,
    before the sampler's decision was written). Such a trial runs again: it is not a failure,
    and it claims no run (:func:`allocopt.study.observe.runs`)."""
    if t.state.name != "FAIL":
        return False
    ua = t.user_attrs
    return str(ua.get(ERROR, "")).startswith(INTERRUPTED) or (FIDELITY not in ua and not t.params)


def is_released(t: Any) -> bool:
    """Whether a worker gave the trial back unsampled (``PRUNED`` with a ``released`` reason:
    two workers asked for the last full run at once): it ran nothing and is no trial of the
    study's, in counts, tables or MLflow."""
    return getattr(getattr(t, "state", None), "name", "") == "PRUNED" and RELEASED in t.user_attrs


@dataclass
class TrialRow:
    """One trial as the study and the queries report it (from Optuna or from MLflow).

    ``params`` holds the allocation (for a query row the whole of it: ``rho``, ``group_size``,
    ``reward``, ``model``, also the dimensions a study kept fixed); ``metrics`` the executed
    breakdown as the study logs it (FLOPs as floats; its ``rho`` is the realized ρ).
    """

    number: int
    state: str
    """``COMPLETE``, ``INFEASIBLE``, ``FAIL`` or ``RUNNING``."""
    params: dict[str, Any]
    targets: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    fidelity: str = "full"
    """``full`` (the study's budget) or ``pilot`` (a RACE pilot at a fraction of it)."""
    study: str = ""
    """Study name (Optuna study; MLflow experiment ``allocopt/<study>``); ``""`` when unknown."""
    plan: dict[str, Any] = field(default_factory=dict)
    """``TrialPlan.to_dict()`` where known (budget, iterations, update passes, ...)."""
    run_id: str | None = None
    """MLflow run id of the trial, for rows read from MLflow."""
    source: str | None = None
    """``tell`` for a run recorded by ``allocopt tell`` (launched elsewhere), else ``None``."""

    @property
    def value(self) -> float:
        """The first target's value (``metrics["value"]``); NaN when the trial has none."""
        return self.metrics.get("value", math.nan)


@dataclass(frozen=True)
class TrialRecord:
    """What allocopt keeps on one Optuna trial, read at once (:meth:`of`)."""

    number: int
    optuna_state: str
    """Optuna's state name (``COMPLETE``, ``FAIL``, ``RUNNING``, ``WAITING``, ...)."""
    state: str
    """allocopt's state (user attribute ``state``), else Optuna's: an infeasible plan is
    ``INFEASIBLE`` here and ``COMPLETE`` in Optuna."""
    params: dict[str, Any]
    """The trial's own parameters (``fidelity`` included for a RACE trial)."""
    given_params: dict[str, Any]
    """:func:`params_of`: its own parameters, else those it was enqueued with."""
    fidelity: str
    """:func:`fidelity_of`."""
    has_fidelity: bool
    """Whether the ``fidelity`` user attribute is written (the trial's decision was)."""
    budget_flops: float | None
    """FLOPs the trial may spend; ``None`` when not written (:meth:`budget` gives a default)."""
    plan: dict[str, Any]
    targets: dict[str, Any]
    metrics: dict[str, Any]
    """The executed breakdown (FLOPs) and run metrics."""
    error: str | None
    interrupted: bool
    """:func:`is_interrupted`."""
    asked: dict[str, Any] | None
    """The ``allocopt ask`` reservation (format and whole-pass run); ``None`` otherwise."""
    source: str | None
    over_budget: bool | None
    race_pilot: str | None
    race_validation: bool
    retried_from: int | None
    """The failed trial this one repeats (Optuna's retry), else ``None``."""
    values: tuple[float, ...] | None

    @classmethod
    def of(cls, t: Any) -> "TrialRecord":
        """The record of ``t``: an Optuna ``FrozenTrial`` (or anything with ``number``,
        ``state``, ``params``, ``user_attrs`` and optionally ``system_attrs`` and ``values``;
        a live ``optuna.Trial`` has no system attributes and no state: ``RUNNING``)."""
        ua = t.user_attrs
        sa = _system_attrs(t)
        optuna_state = t.state.name if hasattr(t, "state") else "RUNNING"
        budget = ua.get(BUDGET)
        values = getattr(t, "values", None)
        return cls(
            number=t.number, optuna_state=optuna_state, state=str(ua.get(STATE, optuna_state)),
            params=dict(t.params), given_params=params_of(t), fidelity=fidelity_of(t),
            has_fidelity=FIDELITY in ua, budget_flops=float(budget) if budget is not None else None,
            plan=dict(ua.get(PLAN) or {}), targets=dict(ua.get(TARGETS) or {}),
            metrics=dict(ua.get(METRICS) or {}), error=ua.get(ERROR),
            interrupted=hasattr(t, "state") and is_interrupted(t),
            asked=ua.get(ASKED), source=ua.get(SOURCE), over_budget=ua.get(OVER_BUDGET),
            race_pilot=ua.get(RACE_PILOT), race_validation=bool(ua.get(RACE_VALIDATION, False)),
            retried_from=sa.get(RETRIED_FROM), values=tuple(values) if values else None)

    def budget(self, default: float) -> float:
        """``budget_flops``, else ``default`` (FLOPs; the study's budget at the trial's fidelity)."""
        return self.budget_flops if self.budget_flops is not None else float(default)

    @property
    def plan_with_budget(self) -> dict[str, Any]:
        """``plan`` with the trial's own ``budget_flops`` where the plan has none."""
        plan = dict(self.plan)
        if self.budget_flops is not None:
            plan.setdefault(BUDGET, self.budget_flops)
        return plan

    def row(self, study: str = "") -> TrialRow:
        """The trial as a :class:`TrialRow`: its own parameters without the fidelity (a field of
        its own), ``metrics`` plus ``value`` (the first objective's, NaN when none)."""
        params = {k: v for k, v in self.params.items() if k != FIDELITY}
        value = self.values[0] if self.values else math.nan
        return TrialRow(self.number, self.state, params, dict(self.targets), {**self.metrics, "value": value},
                        self.error, self.fidelity, study=study, source=self.source)


def observed_rho(source: str | None, asked: Any, spent: Any) -> Any:
    """The ρ a finished trial's result belongs to: a run launched elsewhere and recorded by
    ``allocopt tell`` (``source`` ``tell``) at the ρ it spent (its metric ``rho``, from the
    executed FLOPs: TRL and verl train whole passes, so such a run may land far from the asked
    ρ, 0.70 for an asked 0.55 in the tiny world), every other trial at the ``asked`` ρ. The one
    rule behind the tuner's observations and the report's figures."""
    if source == "tell" and isinstance(spent, (int, float)) and not isinstance(spent, bool) and 0 < spent < 1:
        return float(spent)
    return asked


def records(study: Any) -> list[TrialRecord]:
    """Every trial of an Optuna study as a :class:`TrialRecord`, by number; trials given back
    unsampled (:func:`is_released`) are none."""
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False) if not is_released(t)]


def rows(study: Any) -> list[TrialRow]:
    """Every trial of an Optuna study as a :class:`TrialRow` (:meth:`TrialRecord.row`)."""
    return [r.row() for r in records(study)]


# ============================================================================ writing
def decision_attrs(fidelity: str, budget_flops: float, *, race_pilot: str | None = None,
                   race_validation: bool = False) -> dict[str, Any]:
    """The user attributes of a sampler's decision: fidelity, budget and (RACE) the pilot's
    grid key or the validation flag."""
    d: dict[str, Any] = {FIDELITY: fidelity, BUDGET: budget_flops}
    if race_pilot is not None:
        d[RACE_PILOT] = race_pilot
    elif race_validation:
        d[RACE_VALIDATION] = True
    return d


def write_missing(trial: Any, attrs: Mapping[str, Any]) -> None:
    """Write the user attributes ``attrs`` (:func:`decision_attrs`) that ``trial`` (an
    ``optuna.Trial``) does not have yet: what it was enqueued with wins."""
    for k, v in attrs.items():
        if k not in trial.user_attrs:
            trial.set_user_attr(k, v)


def write_start(trial: Any, *, budget_flops: float, fidelity: str) -> None:
    """A trial about to be planned: its budget (FLOPs) and fidelity."""
    trial.set_user_attr(BUDGET, float(budget_flops))
    trial.set_user_attr(FIDELITY, fidelity)


def write_asked(trial: Any, plan: Mapping[str, Any], asked: Mapping[str, Any]) -> None:
    """A trial reserved by ``allocopt ask``: its plan and the whole-pass run it was given."""
    trial.set_user_attr(PLAN, dict(plan))
    trial.set_user_attr(ASKED, dict(asked))


def write_infeasible(trial: Any, error: str) -> None:
    """A plan the budget cannot buy (the caller sets the ``budget`` constraint and tells)."""
    trial.set_user_attr(STATE, "INFEASIBLE")
    trial.set_user_attr(ERROR, str(error))


def write_failed(trial: Any, error: str, metrics: Mapping[str, Any]) -> None:
    """A run that failed, with what it spent (``metrics``, maybe empty)."""
    trial.set_user_attr(ERROR, str(error))
    trial.set_user_attr(STATE, "FAIL")
    trial.set_user_attr(METRICS, dict(metrics))


def write_interrupted(trial: Any) -> None:
    """A run stopped by Ctrl-C / SIGTERM (:func:`is_interrupted`)."""
    trial.set_user_attr(ERROR, INTERRUPTED)
    trial.set_user_attr(STATE, "FAIL")


def write_complete(trial: Any, targets: Mapping[str, Any], metrics: Mapping[str, Any], *,
                   plan: Mapping[str, Any] | None = None, over_budget: bool | None = None,
                   source: str | None = None) -> None:
    """A run that finished: its targets and metrics; the plan it ran (when not written yet);
    for a run recorded by ``allocopt tell`` ``over_budget`` and ``source="tell"``."""
    trial.set_user_attr(STATE, "COMPLETE")
    trial.set_user_attr(TARGETS, dict(targets))
    trial.set_user_attr(METRICS, dict(metrics))
    if plan is not None:
        trial.set_user_attr(PLAN, dict(plan))
    if over_budget is not None:
        trial.set_user_attr(OVER_BUDGET, bool(over_budget))
    if source is not None:
        trial.set_user_attr(SOURCE, source)


__all__ = ["TrialRecord", "TrialRow", "decision_attrs", "fidelity_of", "is_interrupted", "params_of",
           "observed_rho", "records", "rows", "write_asked", "write_complete", "write_failed", "write_infeasible",
           "write_interrupted", "write_missing", "write_start"]
