"""Runs launched elsewhere: reserve trials of a study (ask), hand each over as a ready TRL or verl
config, and record what came back (tell).

``ask`` reserves trials with Optuna's ``study.ask()`` (the study's own sampler, so pilots and
proposals are what a worker would run) and leaves them RUNNING *without* a heartbeat, which
:mod:`allocopt.store.heartbeat` reads as "reserved for a run launched elsewhere": no worker fails them.
Each gets a plan (:func:`allocopt.plan.allocation.make_plan`) realized with whole update passes
and written into its trial folder (:mod:`allocopt.plan.handoff`); the trial keeps the asked ρ as
its parameter and ``tell`` records the ρ actually spent.

``tell`` reads the run's metrics (:mod:`allocopt.run_metrics`) and records its targets and the
compute it actually spent, exactly as a trial run by allocopt is recorded (same user attributes,
the ``budget`` constraint, ``study.tell``), so the surrogate learns from it like from any other
trial. A run that spent more than its budget is recorded and flagged (``over_budget``, a
violated ``budget`` constraint).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from allocopt.errors import TellError
from allocopt.flops import FlopAccount
from allocopt.plan.allocation import Allocation, InfeasiblePlan, Workload, make_plan
from allocopt.plan.handoff import AskedRun, whole_pass_run, write_asked_folder
from allocopt.record import TrialRecord, write_asked, write_complete, write_infeasible, write_start
from allocopt.spec import SearchSpace, StudySpec


def spec_of(study: Any) -> StudySpec:
    """The :class:`StudySpec` a study was run with (its ``spec`` user attribute).

    Raises:
        TellError: the study has no spec (it was not made by ``allocopt study``/``race``).
    """
    d = dict(study.user_attrs.get("spec") or {})
    if not d:
        raise TellError(f"study={study.study_name!r}: has no allocopt spec; start it with "
                        "`allocopt study` (e.g. --trials 0) first")
    d["space"] = SearchSpace(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in (d.get("space") or {}).items()})
    if isinstance(d.get("target"), list):
        d["target"] = tuple(d["target"])
    return StudySpec(**d)


def reserve(study: Any, spec: StudySpec, workload: Workload, n: int, fmt: str,
            distributions: Mapping[str, Any], max_tries: int = 20,
            reserved: list[int] | None = None) -> tuple[list[AskedRun], int]:
    """Reserve ``n`` runnable trials with the study's sampler.

    A proposal the budget cannot buy is recorded at once as INFEASIBLE with a violated
    ``budget`` constraint, as a worker would, and another is asked (at most ``max_tries`` per
    trial). Whole passes realize ρ in steps (one pass more is a jump in learning FLOPs): the
    run's ``expected_rho`` may differ from the asked ρ (shown by ``ask``, and ``allocopt tell``
    records the ρ the run really spent); the trial keeps the asked ρ as its parameter.

    ``reserved`` (a list) gets each asked trial's number as soon as it is asked, so a caller
    that fails half-way can :func:`release` them (those already told INFEASIBLE are skipped).

    Returns:
        ``(runs, infeasible)``: the reserved runs and how many proposals were infeasible.
    """
    import os
    import socket

    from allocopt.store.claims import reserving
    from allocopt.store.heartbeat import ASKING_ATTR, suggest_all

    runs: list[AskedRun] = []
    infeasible = 0
    while len(runs) < n:
        if infeasible >= max_tries * n:
            break
        with reserving():  # no heartbeat: reserved for a run elsewhere, never failed as stale
            trial = study.ask()  # sampled below, once recorded: a sampler that raises leaves
            # a reserved trial the caller gives back, not one RUNNING for ever
        if reserved is not None:
            reserved.append(trial.number)
        # who reserves it: a reservation cut short (no `asked` record) whose ask is gone is
        # failed when the study is next opened (allocopt.store.settle.reconcile_on_open)
        trial.storage.set_trial_system_attr(trial._trial_id, ASKING_ATTR, f"{socket.gethostname()}:{os.getpid()}")
        with reserving():
            suggest_all(trial, distributions)
        if hasattr(study.sampler, "suggest"):  # RaceSampler: fidelity and budget of this trial
            with reserving():
                study.sampler.suggest(trial)
        rec = TrialRecord.of(trial)
        from allocopt.spec import allocation_of

        alloc: Allocation = allocation_of(spec, trial.params)
        budget = rec.budget(spec.budget_for(alloc, workload))
        fidelity = rec.fidelity
        try:
            plan = make_plan(budget, alloc, workload)
            run = whole_pass_run(plan, workload, trial.number, fidelity)
        except InfeasiblePlan as e:
            from allocopt.study.trial import set_dashboard_constraint

            excess = math.log10(max(e.min_budget_flops, 1) / budget) if e.min_budget_flops else 1.0
            trial.set_constraint("budget", max(excess, 1e-6))
            # both forms, as a worker and tell record them: a constrained sampler (BoTorch)
            # refuses a study whose trials name different constraints
            set_dashboard_constraint(study, trial, max(excess, 1e-6))
            write_infeasible(trial, str(e))
            write_start(trial, budget_flops=budget, fidelity=fidelity)
            study.tell(trial, [0.0] * len(spec.targets))
            infeasible += 1
            continue
        write_start(trial, budget_flops=budget, fidelity=fidelity)
        write_asked(trial, plan.to_dict(), {"format": fmt, **run.to_dict()})
        runs.append(run)
    return runs, infeasible


def release(study: Any, numbers: list[int]) -> list[int]:
    """Give back trials reserved by a command that then failed (an unwritable ``--out``, an
    error, Ctrl-C): each still RUNNING is failed as interrupted
    (:func:`allocopt.record.write_interrupted`), so the next opening of the study enqueues its
    work to be asked again (:func:`allocopt.store.settle.requeue_interrupted`) instead of
    leaving it RUNNING for ever. Best effort per trial.

    Returns:
        the numbers released.
    """
    import optuna
    from optuna.trial import TrialState

    from allocopt.record import write_interrupted
    from allocopt.store.handles import trial_handle

    done = []
    for number in numbers:
        try:
            if study.get_trials(deepcopy=False)[number].state != TrialState.RUNNING:
                continue
            handle = trial_handle(study, number)
            if handle is not None:
                write_interrupted(optuna.trial.Trial(study, handle[1]))
            study.tell(number, state=TrialState.FAIL)
            done.append(number)
        except Exception:  # noqa: BLE001 - the others are still given back
            continue
    return done


# ----------------------------------------------------------------------------- tell
def check_tellable(study: Any, number: int) -> Any:
    """The FrozenTrial ``number`` if it is reserved by ask and still RUNNING.

    Raises:
        TellError: unknown trial, already finished, or a worker's live trial.
    """
    trials = study.get_trials(deepcopy=False)
    match = [t for t in trials if t.number == number]
    if not match:
        raise TellError(f"trial={number}: no such trial in study {study.study_name!r} "
                        f"({len(trials)} trials, numbers 0..{len(trials) - 1})")
    t = match[0]
    rec = TrialRecord.of(t)
    if rec.optuna_state != "RUNNING":
        raise TellError(f"trial={number}: already finished ({rec.state}); nothing changed")
    if rec.asked is None:
        who = t.system_attrs.get("allocopt.worker", "a worker")
        raise TellError(f"trial={number}: is being run by {who}, not reserved by allocopt ask; "
                        "nothing changed")
    return t


def record(study: Any, frozen: Any, spec: StudySpec, targets: Mapping[str, float],
           spent: FlopAccount, *, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record a reserved trial as COMPLETE with the writer :func:`allocopt.study.trial.run_one_trial`
    uses (:func:`allocopt.record.write_complete`: ``state``, ``targets``, ``metrics``), the
    ``budget`` constraint, plus ``over_budget`` and ``source=tell``.

    Returns:
        the metrics dict recorded.

    Raises:
        TellError: another ``tell`` of the same trial finished it first (two at once: one wins,
            the other gets this one line). On SQLite the check and the writes hold an exclusive
            ``flock`` on the database file, so the loser writes nothing; on a server database
            Optuna's row lock refuses the loser's finishing write.
    """
    import optuna

    from allocopt.store.handles import sqlite_file_lock, trial_handle

    rec = TrialRecord.of(frozen)
    budget = rec.budget(spec.budget_flops)
    used = spent.executed.total_flops
    metrics = {**spent.to_dict(), "budget_utilization": used / budget, "eval_flops": 0,
               "planned_rho": (rec.asked or {}).get("expected_rho", rec.plan.get("realized_rho", math.nan)),
               **dict(extra or {})}
    handle = trial_handle(study, frozen.number)
    if handle is None:
        raise KeyError(f"study {study.study_name!r} was not opened by open_study")
    storage, tid = handle
    trial = optuna.trial.Trial(study, tid)
    over = used > budget
    constraint = math.log10(used / budget) if over else -1.0
    finished = TellError(f"trial={frozen.number}: already finished (told by another tell at the same "
                         "time); nothing changed")
    with sqlite_file_lock(storage):  # one tell at a time per SQLite file: re-read, then write
        if storage.get_trial(tid).state.is_finished():
            raise finished
        _write_told(study, trial, frozen.number, spec, targets, metrics, over, constraint, finished)
    return metrics


def _write_told(study: Any, trial: Any, number: int, spec: StudySpec, targets: Mapping[str, float],
                metrics: Mapping[str, Any], over: bool, constraint: float, finished: TellError) -> None:
    import optuna

    from allocopt.study.trial import set_dashboard_constraint

    try:
        trial.set_constraint("budget", constraint)
        set_dashboard_constraint(study, trial, constraint)  # as run_one_trial: optuna-dashboard's form too
        write_complete(trial, targets, metrics, over_budget=over, source="tell")  # as run_one_trial does
        study.tell(number, [float(targets[k]) for k in spec.target_keys])
    except optuna.exceptions.UpdateFinishedTrialError:  # a server database's row lock
        raise finished from None
    except ValueError as e:  # Study.tell: "Cannot tell a COMPLETE trial."
        if "Cannot tell" not in str(e):
            raise
        raise finished from None


def reserve_and_write(st: Any, spec: StudySpec, workload: Any, n: int, fmt: str, dists: Mapping[str, Any],
                      out_dir: Any, *, study: str, storage: str, learning_rate: float, micro_batch: int,
                      num_processes: int) -> tuple[list[AskedRun], int, list[dict[str, Any]]]:
    """``allocopt ask``'s work: reserve ``n`` runnable trials (:func:`reserve`) and write each
    one's folder under ``out_dir`` (:func:`write_asked_folder`, ``trial-<N>/``). A failure after
    reserving gives the reserved trials back (:func:`release`: asked again next time).

    Returns:
        ``(runs, infeasible proposals recorded, what each ask.json holds)``.

    Raises:
        ConfigError: ``out_dir`` cannot be written (one line; the trials given back).
    """
    from pathlib import Path

    from allocopt.errors import ConfigError

    reserved: list[int] = []
    try:
        runs, n_infeasible = reserve(st, spec, workload, n, fmt, dists, reserved=reserved)
        shown = [write_asked_folder(run, Path(out_dir) / f"trial-{run.trial_number}", study=study,
                                    storage=storage, fmt=fmt, setup=workload.setup, seed=spec.seed,
                                    targets=dict(zip(spec.targets, spec.directions)),
                                    learning_rate=learning_rate, micro_batch=micro_batch,
                                    num_processes=num_processes) for run in runs]
    except BaseException as e:
        given = release(st, reserved)
        if isinstance(e, OSError):
            raise ConfigError(f"out={str(out_dir)!r}: cannot be written ({e.strerror or e}); "
                              f"{len(given)} reserved trial(s) given back") from None
        raise
    return runs, n_infeasible, shown
