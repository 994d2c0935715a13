"""Recording trials: one asked trial planned, run (quietly unless ``verbose``), scored and told
to Optuna (infeasible plans as violated constraints, failures as FAIL with their error) and to
MLflow; the study's trials read back as rows, counts and the best full-budget trial; the study's
final metrics on MLflow's parent run. Optuna is imported inside functions.
"""

from __future__ import annotations

import math
import traceback
from typing import Any, Callable

from allocopt.plan.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.record import (TrialRecord, TrialRow, is_interrupted, records, write_complete, write_failed,
                             write_infeasible, write_interrupted, write_start)
from allocopt.spec import StudySpec, allocation_of
from allocopt.tracking.layout import BUDGET_GPU_HOURS, EXPECTED_GPU_HOURS, GPU_HOURS
from allocopt.study.open import StudyError


from allocopt.errors import TrialScoreError  # noqa: E402,F401  (defined there; imported from here too)


def best_row(study: Any) -> TrialRow | None:
    """The complete full-budget trial with the best (first) target, in the study's direction;
    ``None`` when there is none."""
    done = [r for r in records(study) if r.fidelity == "full" and r.state == "COMPLETE"]
    best = [row for row in (r.row() for r in done) if not math.isnan(row.value)]
    sign = -1.0 if str(getattr(study.directions[0], "name", "MAXIMIZE")) == "MINIMIZE" else 1.0
    return max(best, key=lambda r: sign * r.value) if best else None


def interrupted_by(error: BaseException) -> bool:
    """Whether a ``KeyboardInterrupt`` is in ``error``'s chain (``__cause__`` / ``__context__``):
    a Ctrl-C or SIGTERM that a library caught and re-raised as another error (Python 3.11 turns
    one raised while a class is created into ``RuntimeError: Error calling __set_name__``). Such
    a trial is interrupted, not failed, and the study stops."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _record_interrupt(study: Any, trial: Any, tracker: Any, run_id: Any, plan: Any) -> None:
    """The interrupted trial failed in Optuna and MLflow (it runs again on resume)."""
    from optuna.trial import TrialState

    write_interrupted(trial)
    study.tell(trial, state=TrialState.FAIL)
    if tracker:
        tracker.finish_trial(run_id, state="FAIL", metrics={}, curves=[], plan=plan.to_dict(),
                             error="interrupted (KeyboardInterrupt)")


def run_one_trial(
    study: Any,
    trial: Any,
    spec: StudySpec,
    *,
    objective: Any,
    workload: Workload,
    tracker: Any = None,
    budget_flops: float | None = None,
    fidelity: str | None = None,
    on_trial_start: Callable[[int, Allocation, TrialPlan | None], None] | None = None,
    on_trial_end: Callable[[TrialRow, Any], None] | None = None,
    progress: Callable[..., None] | None = None,
    verbose: bool = False,
) -> tuple[TrialRow, Any]:
    """Plan, run, score and tell one asked trial; the piece :func:`run_study` repeats.

    The trial's budget is ``budget_flops`` if given, else its user attribute ``budget_flops``
    (set by ``study.enqueue_trial(..., user_attrs=...)``: a RACE pilot runs at a fraction of the
    study's budget), else ``spec.budget_flops``; its fidelity likewise (``fidelity`` user
    attribute, default ``full``). Both are written to the trial's user attributes and MLflow.
    The objective runs inside :func:`allocopt.quiet.quiet` (the libraries' FutureWarnings and
    log lines hidden) unless ``verbose``.

    Returns:
        ``(row, result)``: the :class:`TrialRow` (state ``COMPLETE``, ``INFEASIBLE`` or ``FAIL``)
        and the objective's result (``None`` unless complete).

    Raises:
        StudyError: the objective does not report the study's target.
        KeyboardInterrupt: after marking the trial failed.
    """
    rec = TrialRecord.of(trial)
    alloc = allocation_of(spec, trial.params)
    budget = float(budget_flops if budget_flops is not None else rec.budget(spec.budget_for(alloc, workload)))
    fidelity = fidelity or rec.fidelity
    run = _start(study, trial, spec, rec, alloc, budget, fidelity, workload, tracker, on_trial_end)
    try:
        plan = _realizable_plan(budget, alloc, workload)
    except InfeasiblePlan as e:
        return run.infeasible(e, None)
    if on_trial_start:
        on_trial_start(trial.number, alloc, plan)
    bind = getattr(objective, "bind_trial", None)  # optional: an objective that names its trial's files
    if bind is not None:
        bind(study=study.study_name, number=trial.number, fidelity=fidelity, spec=spec)
    try:
        result = _run_objective(objective, plan, trial, spec, progress, verbose)
    except InfeasiblePlan as e:  # the run's meter refused even the first iteration: nothing spent
        return run.infeasible(e, plan)
    except KeyboardInterrupt:
        _record_interrupt(study, trial, tracker, run.run_id, plan)
        raise
    except Exception as e:  # the objective failed: record it and go on
        if interrupted_by(e):  # a Ctrl-C that a library wrapped (e.g. Python 3.11's __set_name__)
            _record_interrupt(study, trial, tracker, run.run_id, plan)
            raise KeyboardInterrupt from e
        return run.failed(e, plan)
    if any(k not in result.targets for k in spec.target_keys):
        raise StudyError(f"target={spec.target!r}: the {spec.objective} objective reports "
                         f"{', '.join(result.targets)}")
    return run.complete(result, plan, _trial_metrics(result, plan, budget, spec.time_budget))


class _TrialRun:
    """One trial under way: its row, MLflow run and callback, and how it ends (infeasible,
    failed or complete), each told to Optuna, written to the trial record and finished in MLflow."""

    def __init__(self, study: Any, trial: Any, spec: StudySpec, budget: float, row: TrialRow,
                 tracker: Any, run_id: Any, on_trial_end: Callable[[TrialRow, Any], None] | None):
        self.study, self.trial, self.spec, self.budget, self.row = study, trial, spec, budget, row
        self.tracker, self.run_id, self.on_trial_end = tracker, run_id, on_trial_end

    def _end(self, state: str, result: Any, metrics: dict[str, Any], plan: TrialPlan | None,
             error: str | None, curves: list[Any] = ()) -> tuple[TrialRow, Any]:
        if self.tracker:
            self.tracker.finish_trial(self.run_id, state=state, metrics=metrics, curves=list(curves),
                                      plan=plan.to_dict() if plan is not None else None, error=error)
        if self.on_trial_end:
            self.on_trial_end(self.row, result)
        return self.row, result

    def infeasible(self, e: InfeasiblePlan, plan: TrialPlan | None) -> tuple[TrialRow, None]:
        """Record a plan the budget cannot buy: a violated constraint, nothing spent."""
        study, trial = self.study, self.trial
        excess = math.log10(max(e.min_budget_flops, 1) / self.budget) if e.min_budget_flops else 1.0
        trial.set_constraint("budget", max(excess, 1e-6))
        set_dashboard_constraint(study, trial, max(excess, 1e-6))
        dashboard_note(trial, f"**Infeasible, never run** (a violated `budget` constraint; the value 0 "
                              f"is a placeholder): {e}")
        write_infeasible(trial, str(e))
        study.tell(trial, [0.0] * len(self.spec.target_keys))
        self.row.state, self.row.error = "INFEASIBLE", str(e)
        return self._end("INFEASIBLE", None, {}, plan, str(e))

    def failed(self, e: Exception, plan: TrialPlan) -> tuple[TrialRow, None]:
        """Record an objective that raised: FAIL with its error and what it spent, if it says."""
        from optuna.trial import TrialState

        spent = getattr(getattr(e, "result", None), "spent", None)
        err = f"{type(e).__name__}: {e}"
        metrics = spent.to_dict() if spent is not None else {}
        write_failed(self.trial, err, metrics)
        self.study.tell(self.trial, state=TrialState.FAIL)
        self.row.state, self.row.error, self.row.metrics = "FAIL", err, metrics
        return self._end("FAIL", None, metrics, plan, err + "\n" + traceback.format_exc())

    def complete(self, result: Any, plan: TrialPlan, metrics: dict[str, Any]) -> tuple[TrialRow, Any]:
        """Record a scored run: its targets told, its spend against the budget as the constraint
        (allocopt's meter never overruns; a launched command can: flagged as tell does)."""
        study, trial, keys = self.study, self.trial, self.spec.target_keys
        used = result.spent.executed.total_flops
        over = used > self.budget
        constraint = math.log10(used / self.budget) if over else -1.0
        trial.set_constraint("budget", constraint)
        set_dashboard_constraint(study, trial, constraint)
        write_complete(trial, result.targets, metrics, plan=plan.to_dict(), over_budget=over or None)
        study.tell(trial, [float(result.targets[k]) for k in keys])
        self.row.state, self.row.targets = "COMPLETE", dict(result.targets)
        self.row.metrics = {**metrics, "value": result.targets[keys[0]]}
        return self._end("COMPLETE", result, {**result.targets, **metrics}, plan, None,
                         [c.__dict__ for c in result.curves])


def _start(study: Any, trial: Any, spec: StudySpec, rec: TrialRecord, alloc: Allocation, budget: float,
           fidelity: str, workload: Workload, tracker: Any,
           on_trial_end: Callable[[TrialRow, Any], None] | None) -> _TrialRun:
    """Write the trial's budget and fidelity, start its MLflow run with its parameters (and the
    time budget's, when there is one) and return it under way (row state ``RUNNING``)."""
    write_start(trial, budget_flops=budget, fidelity=fidelity)
    tb = spec.time_budget  # a time budget: expected and measured GPU-hours beside the FLOPs
    params = {"rho": alloc.rho, "group_size": alloc.group_size, "reward": alloc.reward,
              "model": alloc.model or workload.policy.name, "budget_flops": budget,
              "objective": spec.objective, "target": spec.target,
              **({BUDGET_GPU_HOURS: tb.gpu_hours, "gpus": tb.gpus} if tb is not None else {})}
    run_id = tracker.start_trial(trial.number, params, {"allocopt.objective": spec.objective,
                                                        "allocopt.fidelity": fidelity}) if tracker else None
    row = TrialRow(trial.number, "RUNNING", {k: v for k, v in rec.params.items() if k != "fidelity"},
                   fidelity=fidelity)
    return _TrialRun(study, trial, spec, budget, row, tracker, run_id, on_trial_end)


def _realizable_plan(budget: float, alloc: Allocation, workload: Workload) -> TrialPlan:
    """:func:`make_plan`; raises :class:`InfeasiblePlan` too when its ρ is not realizable."""
    plan = make_plan(budget, alloc, workload)
    if not plan.realizable:
        raise InfeasiblePlan(f"rho={alloc.rho:.4f} is not realizable (nearest {plan.realized_rho:.4f})",
                             min_budget_flops=0)
    return plan


def _run_objective(objective: Any, plan: TrialPlan, trial: Any, spec: StudySpec,
                   progress: Callable[..., None] | None, verbose: bool) -> Any:
    """The objective's result for ``plan`` (quiet unless ``verbose``). Raises :class:`TrialScoreError` for a
    target that is not a finite number, and whatever the objective raises."""
    from allocopt.quiet import quiet

    with quiet(verbose):
        result = objective.run(plan, seed=spec.seed + trial.number, progress=progress)
    bad = {k: result.targets[k] for k in spec.target_keys if k in result.targets
           and not (isinstance(result.targets[k], (int, float)) and math.isfinite(result.targets[k]))}
    if bad:  # a NaN score is a failed trial everywhere (Optuna would fail it; so do we)
        raise TrialScoreError(f"target {', '.join(f'{k}={v!r}' for k, v in bad.items())}: "
                              "not a finite number", result)
    return result


def _trial_metrics(result: Any, plan: TrialPlan, budget: float, tb: Any) -> dict[str, Any]:
    """A complete trial's metrics: its spend by phase, budget use, eval FLOPs, planned ρ, wall
    seconds per phase and, under a time budget ``tb``, its GPU-hours (:func:`gpu_hours`)."""
    return {**result.spent.to_dict(), "budget_utilization": result.spent.executed.total_flops / budget,
            "eval_flops": result.eval_flops, "planned_rho": plan.realized_rho,
            **{f"{k}_wall_seconds": v for k, v in result.wall_seconds.items()},
            **(gpu_hours(tb, plan, result) if tb is not None else {})}


def gpu_hours(tb: Any, plan: TrialPlan, result: Any) -> dict[str, float]:
    """Metrics of a finished trial under the time budget ``tb``: the plan's expected GPU-hours
    at the study's profile and, when the objective timed its training phases, the measured ones
    (:func:`allocopt.plan.throughput.measured_gpu_hours`, on ``tb.gpus`` GPUs)."""
    from allocopt.plan.throughput import measured_gpu_hours

    out = {EXPECTED_GPU_HOURS: tb.hours_of(plan.expected.executed)["total"]}
    measured = measured_gpu_hours(result.wall_seconds, tb.gpus)
    if measured is not None:
        out[GPU_HOURS] = measured
    return out


def set_dashboard_constraint(study: Any, trial: Any, value: float) -> None:
    """Also store the budget constraint in the list form (system attribute ``constraints``)
    that optuna-dashboard 0.21 reads (``optuna_dashboard/_serializer.py``; it does not read
    Optuna 5's ``constraints:<name>`` keys), so the dashboard shows an infeasible plan as
    infeasible. Optuna reads both forms (``trial.constraints``: ``{"budget": v, "0": v}``)."""
    from allocopt.store.handles import trial_handle

    handle = trial_handle(study, trial.number)
    if handle is None:  # a study in memory or opened by the caller: Optuna's own form only
        return
    storage, tid = handle
    storage.set_trial_system_attr(tid, "constraints", [float(value)])


def dashboard_note(trial: Any, body: str) -> None:
    """optuna-dashboard's note of ``trial`` (Markdown, shown above its values): its trial page
    marks every told trial ``Complete`` and shows no constraint, so an infeasible plan says so
    here. Nothing when optuna-dashboard is not installed (the ``dev`` extra has it) or the note
    cannot be written."""
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    try:
        save_note(trial, body)
    except Exception:  # noqa: BLE001 - a note is a courtesy; the constraint is the record
        pass


def counts(study: Any) -> dict[str, int]:
    """Trials by fidelity and state: ``{"full_complete": 3, "pilot_infeasible": 5, ...}``
    (fidelity ``full`` or ``pilot``; state ``complete``, ``infeasible``, ``fail``, ``running``),
    plus ``interrupted`` (:func:`allocopt.record.is_interrupted`, of any fidelity: not failures)."""
    out: dict[str, int] = {}
    for r in records(study):
        key = "interrupted" if r.interrupted else f"{r.fidelity}_{r.state.lower()}"
        out[key] = out.get(key, 0) + 1
    return out


def log_final(study: Any, spec: StudySpec, tracker: Any) -> None:
    """The study's final metrics on the parent run: trial counts by fidelity and state, the best
    full-budget value of each target in its own direction (``best_<key>``) and the allocation of
    the trial best in the first target (tags ``allocopt.best.*``)."""
    metrics: dict[str, float] = {f"num_{k}": v for k, v in counts(study).items()}
    best = best_row(study)
    done = [r.row() for r in records(study) if r.fidelity == "full" and r.state == "COMPLETE"]
    for k, d in zip(spec.target_keys, spec.directions):
        vals = [float(r.targets[k]) for r in done if isinstance(r.targets.get(k), (int, float))
                and math.isfinite(float(r.targets[k]))]
        if vals:
            metrics[f"best_{k}"] = min(vals) if d == "minimize" else max(vals)
    tracker.log_study_summary(best={**(best.params if best else {}),
                                    **({"trial": best.number} if best else {})}, metrics=metrics)
