"""Run a study: Bayesian optimization of the allocation under a hard FLOP budget.

An Optuna study (any Optuna storage URL; default ``sqlite:///allocopt.db``) proposes
allocations (ρ, G, reward system, optionally the model) with a BoTorch sampler
(``optuna_integration.BoTorchSampler``) or Optuna's ``GPSampler``. Each proposal is turned into
a :class:`~allocopt.allocation.TrialPlan` first: an infeasible one is never run, costs no
compute, and is told to Optuna with a violated constraint (``trial.set_constraint``) and the
worst possible target value (0: every target is a share in [0, 1]), so the sampler learns to
avoid it. A feasible one runs the objective; its targets and breakdown go into the trial's
user attributes and into MLflow (:mod:`allocopt.tracking`). A trial that raises is failed in
Optuna and MLflow with its error and the study goes on. Running the same study name again
resumes it: finished trials are kept; Ctrl-C marks the running trial failed, a killed worker's
trial is failed and retried once when its heartbeat is stale (:mod:`allocopt.storage`).

torch (through the samplers and objectives), Optuna and MLflow are imported inside functions.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from allocopt.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.flops import ConfigError
from allocopt.spec import StudySpec, allocation_of  # noqa: F401  (allocation_of: old import path)

DEFAULT_STORAGE = "sqlite:///allocopt.db"


class TrialScoreError(RuntimeError):
    """The objective returned a target that is not a finite number (NaN, inf, None); the trial
    fails, with what it spent (``result``)."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class StudyError(ValueError):
    """The study cannot start (bad storage URL, objective unavailable); one line, exit 2."""


@dataclass
class TrialRow:
    """One trial as the study reports it."""

    number: int
    state: str
    """``COMPLETE``, ``INFEASIBLE``, ``FAIL`` or ``RUNNING``."""
    params: dict[str, Any]
    targets: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    fidelity: str = "full"
    """``full`` (the study's budget) or ``pilot`` (a RACE pilot at a fraction of it)."""

    @property
    def value(self) -> float:
        return self.metrics.get("value", math.nan)


def make_sampler(spec: StudySpec, *, workload: Workload | None = None, race_settings: Any = None) -> Any:
    """The Optuna sampler of the study: :class:`allocopt.sampler.RaceSampler` (RACE pilots, then
    surrogate proposals) unless ``spec.pilots == 0`` or the study has several targets; else the
    one ``spec.sampler`` names (several targets: BoTorch's qLogNEHVI hypervolume acquisition).
    torch fits run on one thread (5–12× faster on 2 cores).

    Args:
        spec: the study.
        workload: what plans are made for (RACE proposes feasible plans only when given).
        race_settings: :class:`allocopt.race.RaceSettings` (default: ``max_pilots = spec.pilots``).
    """
    import optuna

    if spec.pilots != 0 and not spec.multi_objective:
        from allocopt.race import RaceSettings
        from allocopt.sampler import RaceSampler

        settings = race_settings or RaceSettings(max_pilots=spec.pilots)
        return RaceSampler(spec.space, budget_flops=spec.budget_flops, pilot_fraction=spec.pilot_fraction,
                           workload=workload, settings=settings, seed=spec.seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    import torch

    torch.set_num_threads(1)
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=spec.seed, n_startup_trials=spec.startup_trials)
    from optuna_integration import BoTorchSampler

    if spec.multi_objective:  # noisy targets: qLogNEHVI (log noisy expected hypervolume improvement)
        from optuna_integration.botorch import qnehvi_candidates_func

        return BoTorchSampler(seed=spec.seed, n_startup_trials=spec.startup_trials,
                              candidates_func=qnehvi_candidates_func)
    return BoTorchSampler(seed=spec.seed, n_startup_trials=spec.startup_trials)


def distributions(spec: StudySpec, *, fidelity: bool = False) -> dict[str, Any]:
    """Optuna distributions of the search space (and the ``fidelity`` parameter of RACE)."""
    from allocopt.sampler import space_distributions

    return space_distributions(spec.space, fidelity=fidelity)


def check_same_study(study: Any, spec: StudySpec) -> None:
    """Refuse to resume a study under other terms: its trials would be mixed with the new ones
    (another budget, target, objective or search space). Raises :class:`StudyError`."""
    old = study.user_attrs.get("spec")
    if not old:
        return
    new = spec.to_dict()
    for key, label in (("objective", "objective"), ("budget_flops", "budget"), ("target", "target"),
                       ("space", "search space"), ("pilot_fraction", "pilot fraction")):
        a, b = old.get(key), new.get(key)
        if isinstance(a, list):
            a = tuple(a)
        if isinstance(b, list):
            b = tuple(b)
        if key == "space":
            a = {k: tuple(v) if isinstance(v, list) else v for k, v in (a or {}).items()}
            b = {k: tuple(v) if isinstance(v, list) else v for k, v in (b or {}).items()}
        if a is not None and a != b:
            raise StudyError(f"study={spec.name!r}: it was run with {label} {a!r}, not {b!r}; resume it "
                             "with the same settings or give another --study-name")


def open_study(spec: StudySpec, storage: str) -> Any:
    """Create or load the Optuna study, heartbeats on (:mod:`allocopt.storage`).

    Opening never touches a RUNNING trial: it may be another worker's live trial, or a trial
    reserved by ``allocopt ask``. A dead worker's trial is failed and retried once after the
    grace period (:func:`allocopt.storage.fail_stale`, before each ``ask``).

    Raises:
        StudyError: the storage cannot be opened (the URL in the message has its password
            redacted), or the study was run under other terms.
    """
    import optuna

    from allocopt.storage import StorageError, make_storage, redact_url, register

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shown = redact_url(storage)
    try:
        for attempt in range(4):  # workers that create one database at the same instant race
            try:  # on its schema (alembic_version, a table already there): the loser retries
                store = make_storage(storage)
                study = optuna.create_study(study_name=spec.name, storage=store, load_if_exists=True,
                                            directions=["maximize"] * len(spec.targets),
                                            sampler=make_sampler(spec))
                break
            except Exception as e:  # noqa: BLE001
                if attempt == 3 or not _creation_race(e):
                    raise
                time.sleep(1.0 + attempt)
    except StorageError as e:
        raise StudyError(str(e)) from None
    except ImportError as e:
        raise StudyError(f"storage={shown!r}: its database driver is not installed ({e})") from None
    except Exception as e:  # bad URL, unreachable server, unwritable file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StudyError(f"storage={shown!r}: cannot be opened ({redact_url(msg)})") from None
    register(study, store)
    if len(study.directions) != len(spec.targets):
        raise StudyError(f"study={spec.name!r}: it was created with {len(study.directions)} target(s), "
                         f"not {len(spec.targets)}; give the same --target(s) or another --study-name")
    check_same_study(study, spec)
    return study


def _creation_race(e: BaseException) -> bool:
    """An error of two processes creating the same database schema at once (SQLAlchemy
    IntegrityError on ``alembic_version``, a table or index that already exists, a locked
    SQLite file): the second one's retry finds the schema made."""
    text = str(e).lower()
    return any(k in text for k in ("alembic_version", "already exists", "database is locked",
                                   "duplicate column", "unique constraint failed"))


def rows(study: Any) -> list[TrialRow]:
    """Every trial of a study as :class:`TrialRow`."""
    out = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        state = ua.get("state", t.state.name)
        params = {k: v for k, v in t.params.items() if k != "fidelity"}  # the fidelity is its own field
        out.append(TrialRow(t.number, state, params, dict(ua.get("targets", {})),
                            {**ua.get("metrics", {}), "value": t.values[0] if t.values else math.nan},
                            ua.get("error"), ua.get("fidelity", "full")))
    return out


def best_row(study: Any) -> TrialRow | None:
    """The complete full-budget trial with the best (first) target; ``None`` when there is none."""
    full = {t.number for t in study.get_trials(deepcopy=False)
            if (t.params.get("fidelity") or t.user_attrs.get("fidelity") or "full") == "full"}
    done = [r for r in rows(study) if r.state == "COMPLETE" and not math.isnan(r.value) and r.number in full]
    return max(done, key=lambda r: r.value) if done else None


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
    from optuna.trial import TrialState

    ua = trial.user_attrs
    budget = float(budget_flops if budget_flops is not None else ua.get("budget_flops", spec.budget_flops))
    fidelity = fidelity or ua.get("fidelity", "full")
    trial.set_user_attr("budget_flops", budget)
    trial.set_user_attr("fidelity", fidelity)
    keys = spec.target_keys
    alloc = allocation_of(spec, trial.params)
    params = {"rho": alloc.rho, "group_size": alloc.group_size, "reward": alloc.reward,
              "model": alloc.model or workload.policy.name, "budget_flops": budget,
              "objective": spec.objective, "target": spec.target}
    run_id = tracker.start_trial(trial.number, params, {"allocopt.objective": spec.objective,
                                                        "allocopt.fidelity": fidelity}) if tracker else None
    row = TrialRow(trial.number, "RUNNING", {k: v for k, v in trial.params.items() if k != "fidelity"},
                   fidelity=fidelity)

    def _infeasible(e: InfeasiblePlan, plan: TrialPlan | None) -> tuple[TrialRow, None]:
        """Record a plan the budget cannot buy: a violated constraint, nothing spent."""
        excess = math.log10(max(e.min_budget_flops, 1) / budget) if e.min_budget_flops else 1.0
        trial.set_constraint("budget", max(excess, 1e-6))
        set_dashboard_constraint(study, trial, max(excess, 1e-6))
        trial.set_user_attr("state", "INFEASIBLE")
        trial.set_user_attr("error", str(e))
        study.tell(trial, [0.0] * len(keys))
        row.state, row.error = "INFEASIBLE", str(e)
        if tracker:
            tracker.finish_trial(run_id, state="INFEASIBLE", metrics={}, curves=[],
                                 plan=plan.to_dict() if plan is not None else None, error=str(e))
        if on_trial_end:
            on_trial_end(row, None)
        return row, None

    try:
        plan = make_plan(budget, alloc, workload)
        if not plan.realizable:
            raise InfeasiblePlan(f"rho={alloc.rho:.4f} is not realizable (nearest {plan.realized_rho:.4f})",
                                 min_budget_flops=0)
    except InfeasiblePlan as e:
        return _infeasible(e, None)
    if on_trial_start:
        on_trial_start(trial.number, alloc, plan)
    from allocopt.quiet import quiet

    try:
        with quiet(verbose):
            result = objective.run(plan, seed=spec.seed + trial.number, progress=progress)
        bad = {k: result.targets[k] for k in keys if k in result.targets
               and not (isinstance(result.targets[k], (int, float)) and math.isfinite(result.targets[k]))}
        if bad:  # a NaN score is a failed trial everywhere (Optuna would fail it; so do we)
            raise TrialScoreError(f"target {', '.join(f'{k}={v!r}' for k, v in bad.items())}: "
                                  "not a finite number", result)
    except InfeasiblePlan as e:  # the run's meter refused even the first iteration: nothing spent
        return _infeasible(e, plan)
    except KeyboardInterrupt:
        trial.set_user_attr("error", "interrupted")
        trial.set_user_attr("state", "FAIL")
        study.tell(trial, state=TrialState.FAIL)
        if tracker:
            tracker.finish_trial(run_id, state="FAIL", metrics={}, curves=[], plan=plan.to_dict(),
                                 error="interrupted (KeyboardInterrupt)")
        raise
    except Exception as e:  # the objective failed: record it and go on
        spent = getattr(getattr(e, "result", None), "spent", None)
        err = f"{type(e).__name__}: {e}"
        metrics = spent.to_dict() if spent is not None else {}
        trial.set_user_attr("error", err)
        trial.set_user_attr("state", "FAIL")
        trial.set_user_attr("metrics", metrics)
        study.tell(trial, state=TrialState.FAIL)
        row.state, row.error, row.metrics = "FAIL", err, metrics
        if tracker:
            tracker.finish_trial(run_id, state="FAIL", metrics=metrics, curves=[], plan=plan.to_dict(),
                                 error=err + "\n" + traceback.format_exc())
        if on_trial_end:
            on_trial_end(row, None)
        return row, None
    if any(k not in result.targets for k in keys):
        raise StudyError(f"target={spec.target!r}: the {spec.objective} objective reports "
                         f"{', '.join(result.targets)}")
    metrics = {**result.spent.to_dict(), "budget_utilization": result.spent.executed.total_flops / budget,
               "eval_flops": result.eval_flops, "planned_rho": plan.realized_rho,
               **{f"{k}_wall_seconds": v for k, v in result.wall_seconds.items()}}
    trial.set_constraint("budget", -1.0)
    set_dashboard_constraint(study, trial, -1.0)
    trial.set_user_attr("state", "COMPLETE")
    trial.set_user_attr("targets", result.targets)
    trial.set_user_attr("metrics", metrics)
    trial.set_user_attr("plan", plan.to_dict())
    study.tell(trial, [float(result.targets[k]) for k in keys])
    row.state, row.targets, row.metrics = "COMPLETE", dict(result.targets), {**metrics, "value": result.targets[keys[0]]}
    if tracker:
        tracker.finish_trial(run_id, state="COMPLETE", metrics={**result.targets, **metrics},
                             curves=[c.__dict__ for c in result.curves], plan=plan.to_dict(), error=None)
    if on_trial_end:
        on_trial_end(row, result)
    return row, result


def set_dashboard_constraint(study: Any, trial: Any, value: float) -> None:
    """Also store the budget constraint in the list form (system attribute ``constraints``)
    that optuna-dashboard 0.21 reads (``optuna_dashboard/_serializer.py``; it does not read
    Optuna 5's ``constraints:<name>`` keys), so the dashboard shows an infeasible plan as
    infeasible. Optuna reads both forms (``trial.constraints``: ``{"budget": v, "0": v}``)."""
    from allocopt.storage import trial_handle

    handle = trial_handle(study, trial.number)
    if handle is None:  # a study in memory or opened by the caller: Optuna's own form only
        return
    storage, tid = handle
    storage.set_trial_system_attr(tid, "constraints", [float(value)])


def run_study(
    spec: StudySpec,
    *,
    objective: Any,
    workload: Workload,
    storage: str | None = DEFAULT_STORAGE,
    tracker: Any = None,
    sampler: Any = None,
    pilots_only: bool = False,
    study: Any = None,
    on_trial_start: Callable[[int, Allocation, TrialPlan | None], None] | None = None,
    on_trial_end: Callable[[TrialRow, Any], None] | None = None,
    progress: Callable[..., None] | None = None,
    verbose: bool = False,
) -> Any:
    """The one study loop: ask the sampler, run the trial, tell the result, until the study has
    ``spec.trials`` finished full-budget trials (complete, infeasible or failed).

    With :class:`allocopt.sampler.RaceSampler` (the default unless ``spec.pilots == 0`` or
    several targets) the sampler decides each trial's fidelity: RACE pilots (at
    ``spec.pilot_fraction`` of the budget) come first and do not count towards ``spec.trials``,
    then surrogate proposals (full runs, or extra pilots within the RACE settings' budget).

    Args:
        spec: the study definition.
        objective: an :class:`allocopt.objective.Objective`.
        workload: what plans are made for (``objective.workload()``).
        storage: Optuna storage URL (``None``: in memory).
        tracker: an :class:`allocopt.tracking.StudyTracker` or ``None``.
        sampler: the Optuna sampler (default :func:`make_sampler` of ``spec`` and ``workload``).
        pilots_only: run RACE's pilot grid (what is left of it) and stop.
        study: an opened study (:func:`open_study`) to run instead of opening ``storage``.
        on_trial_start, on_trial_end, progress: callbacks for a live display.
        verbose: show the libraries' warnings and log lines during trials (hidden by default,
            :mod:`allocopt.quiet`).

    Returns:
        the Optuna study.

    Raises:
        StudyError: the storage cannot be opened, or the objective does not report the target.
        ConfigError: RACE on a space without a ρ range.
        KeyboardInterrupt: after marking the running trial failed (it is re-run on resume).
    """
    from optuna.trial import TrialState

    from allocopt.objective import objective_targets
    from allocopt.sampler import RaceSampler
    from allocopt.storage import on_stale, worker_trial

    try:
        declared = objective_targets(getattr(objective, "name", spec.objective))
    except ValueError:
        declared = None
    missing = [t for t, k in zip(spec.targets, spec.target_keys) if declared is not None and k not in declared]
    if missing:
        raise StudyError(f"target={missing[0]!r}: the {spec.objective} objective reports "
                         f"{', '.join(declared or ())}")
    given = sampler is not None
    sampler = sampler if given else make_sampler(spec, workload=workload)
    race = isinstance(sampler, RaceSampler)
    if pilots_only and not race:
        raise ValueError("pilots_only needs a RaceSampler")
    study = study if study is not None else open_study(spec, storage)
    n = len(study.get_trials(deepcopy=False))
    if n and not given and not race:  # resumed: a fresh seed, or it would propose the same points again
        sampler = make_sampler(replace(spec, seed=(spec.seed + n) % 2**32), workload=workload)
    on_stale(study, tracker)  # its MLflow run ends FAILED with a dead worker's trial
    study.sampler = sampler
    study.set_user_attr("spec", spec.to_dict())
    name_objectives(study, spec)
    if tracker:
        tracker.log_spec(spec.to_dict())
    if race:
        from dataclasses import asdict

        study.set_user_attr("race", {"pilot_fraction": sampler.pilot_fraction,
                                     "settings": asdict(sampler.settings)})
    dists = distributions(spec, fidelity=race)

    def finished() -> int:
        from allocopt.race import trial_fidelity

        # an interrupted or killed (retried) trial does not count: it is run again; a failed one
        # counts (it would fail again)
        trials = study.get_trials(deepcopy=False)
        retried = {t.system_attrs.get("failed_trial") for t in trials}
        return sum(1 for t in trials
                   if trial_fidelity(t) == "full" and (t.state == TrialState.COMPLETE or (
                       t.state == TrialState.FAIL and t.number not in retried
                       and not str(t.user_attrs.get("error", "")).startswith("interrupted"))))

    # every ask runs a trial (the queue's first); the cap only guards against a sampler that
    # never proposes a full run
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    cap = spec.trials + waiting + (len(sampler.design) + 2 * spec.trials
                                   + math.ceil(sampler.settings.extra_pilot_budget / sampler.pilot_fraction)
                                   if race else 0)
    for _ in range(cap + 1):
        if (sampler.pilots_left(study) == 0) if pilots_only else (finished() >= spec.trials):
            break
        with worker_trial(study, dists) as trial:  # stale trials failed first; heartbeat on
            if race:
                sampler.suggest(trial)  # user attributes: fidelity, budget_flops, race_pilot / race_validation
            run_one_trial(study, trial, spec, objective=objective, workload=workload, tracker=tracker,
                          on_trial_start=on_trial_start, on_trial_end=on_trial_end, progress=progress,
                          verbose=verbose)
    if tracker:
        tracker.reconcile(study)
        log_final(study, spec, tracker)
    return study


def name_objectives(study: Any, spec: StudySpec) -> None:
    """Name the study's objectives after its targets (``study.set_metric_names``), so Optuna's
    plots and optuna-dashboard say ``pass@1`` instead of ``Objective 0``."""
    if study.metric_names != list(spec.targets):
        study.set_metric_names(list(spec.targets))


def counts(study: Any) -> dict[str, int]:
    """Trials by fidelity and state: ``{"full_complete": 3, "pilot_infeasible": 5, ...}``
    (fidelity ``full`` or ``pilot``; state ``complete``, ``infeasible``, ``fail``, ``running``)."""
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        key = f"{ua.get('fidelity', 'full')}_{str(ua.get('state', t.state.name)).lower()}"
        out[key] = out.get(key, 0) + 1
    return out


def log_final(study: Any, spec: StudySpec, tracker: Any) -> None:
    """The study's final metrics on the parent run: trial counts by fidelity and state, the best
    full-budget value per target and the best trial's allocation (tags ``allocopt.best.*``)."""
    metrics: dict[str, float] = {f"num_{k}": v for k, v in counts(study).items()}
    best = best_row(study)
    if best is not None:
        metrics.update({f"best_{k}": best.targets.get(k, best.value) for k in spec.target_keys})
    tracker.log_study_summary(best={**(best.params if best else {}),
                                    **({"trial": best.number} if best else {})}, metrics=metrics)


def dry_run(spec: StudySpec, workload: Workload, rho_levels: int = 8) -> list[tuple[Allocation, TrialPlan | None, str]]:
    """Plans the budget buys over a grid of the space; runs nothing.

    Returns ``(allocation, plan or None, note)`` per grid point: ρ at ``rho_levels`` evenly
    spaced levels × every G × reward (× model).
    """
    lo, hi = spec.space.rho
    levels = [lo] if lo == hi else [lo + (hi - lo) * i / (rho_levels - 1) for i in range(rho_levels)]
    out = []
    for model in spec.space.models or (None,):
        for reward in spec.space.rewards:
            for g in spec.space.group_sizes:
                for rho in levels:
                    a = Allocation(round(rho, 4), g, reward, model)
                    try:
                        p = make_plan(spec.budget_flops, a, workload)
                        out.append((a, p, "" if p.realizable else "rho not realizable"))
                    except InfeasiblePlan as e:
                        out.append((a, None, f"needs {e.min_budget_flops:.3e} FLOPs"))
                    except ConfigError as e:
                        out.append((a, None, str(e)))
    return out

