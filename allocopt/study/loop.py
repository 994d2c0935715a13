"""Run a study: Bayesian optimization of the allocation under a hard FLOP budget.

An Optuna study (any Optuna storage URL; default ``sqlite:///allocopt.db``) proposes
allocations (ρ, G, reward system, optionally the model) with a BoTorch sampler
(``optuna_integration.BoTorchSampler``) or Optuna's ``GPSampler``. Each proposal is turned into
a :class:`~allocopt.plan.allocation.TrialPlan` first: an infeasible one is never run, costs no
compute, and is told to Optuna with a violated constraint (``trial.set_constraint``) and the
worst possible target value (0: every target is a share in [0, 1]), so the sampler learns to
avoid it. A feasible one runs the objective; its targets and breakdown go into the trial's
user attributes and into MLflow (:mod:`allocopt.tracking`). A trial that raises is failed in
Optuna and MLflow with its error and the study goes on. Running the same study name again
resumes it: finished trials are kept; Ctrl-C marks the running trial failed, a killed worker's
trial is failed and retried once when its heartbeat is stale (:mod:`allocopt.store.heartbeat`, :mod:`allocopt.store.settle`).

Several workers on one study (``allocopt workers``, or ``allocopt study`` started on each
host) share the count: a worker asks for a new full-budget trial only while the finished ones
and those other workers are running (:func:`running_full`) are short of ``spec.trials``, else
it waits for them (:func:`wait_for_others`; a killed worker's trial is re-run); two workers
asking for the last trial at once are told apart by trial number, the later one gives its
trial back unsampled (Optuna ``PRUNED``, user attribute ``released``). So ``spec.trials``
full-budget trials finish in all, not one more per worker.

The loop is here (:func:`run_study`, and :func:`dry_run`); opening a study is
:mod:`allocopt.study.open`, running and recording one trial :mod:`allocopt.study.trial`.
torch (through the samplers and objectives), Optuna and MLflow are imported inside functions.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Any, Callable

from allocopt.plan.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.flops import ConfigError
from allocopt.spec import StudySpec
from allocopt.store.connect import DEFAULT_STORAGE
from allocopt.study.open import StudyError, distributions, make_sampler, name_objectives, open_study
from allocopt.record import TrialRecord, TrialRow, params_of, records
from allocopt.study.trial import log_final, run_one_trial


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
    on_pilots: Callable[[Any], None] | None = None,
    on_answer: Callable[[Any, Any], None] | None = None,
    on_wait: Callable[[int, int], None] | None = None,
    verbose: bool = False,
) -> Any:
    """The one study loop: ask the sampler, run the trial, tell the result, until the study has
    ``spec.trials`` finished full-budget trials (complete or failed; an infeasible proposal never
    runs and does not count, :func:`finished_full`), then store the study's final answer.

    With :class:`allocopt.study.sampler.RaceSampler` (``tuner = "race"`` with pilots, one
    target) the sampler decides each trial's fidelity: RACE pilots (at
    ``spec.pilot_fraction`` of the budget) come first and do not count towards ``spec.trials``,
    then surrogate proposals (full runs, or extra pilots within the RACE settings' budget). The
    loop has two phases then: the pilots, until every grid point is claimed and no re-run waits
    (``on_pilots(study)`` is called once there; ``pilots_only`` stops there), then the full runs.
    Several workers on one study share the count (see the module's docstring). With
    ``spec.until_gain`` (the kg tuner) the loop also ends once one more full run is worth less
    than it (:func:`gain_stop`), the reason in the study's user attribute ``stopped``.

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
        on_pilots: called with the study once RACE's pilot phase is over (before the first
            full-budget ask; at the end when the loop stopped before).
        on_answer: called as ``(recommendation, surrogate)`` once RACE's final answer is stored.
        on_wait: called as ``(finished, running)`` (full-budget trials) when this worker starts
            waiting for other workers' trials (:func:`wait_for_others`).
        verbose: show the libraries' warnings and log lines during trials (hidden by default,
            :mod:`allocopt.quiet`).

    Returns:
        the Optuna study, its final answer stored (:func:`finish_study`).

    Raises:
        StudyError: the storage cannot be opened, or the objective does not report the target.
        ConfigError: RACE on a space without a ρ range.
        KeyboardInterrupt: after marking the running trial failed (it is re-run on resume).
    """
    check_targets(spec, objective)
    study, race = _ready_study(spec, storage, study, sampler, workload=workload, tracker=tracker,
                               needs_race=bool(pilots_only or on_pilots))
    run_trial = partial(run_one_trial, spec=spec, objective=objective, workload=workload, tracker=tracker,
                        on_trial_start=on_trial_start, on_trial_end=on_trial_end, progress=progress,
                        verbose=verbose)
    piloting = _run_trials(study, spec, race, run_trial, pilots_only=pilots_only, on_pilots=on_pilots,
                           on_wait=on_wait)
    if piloting and on_pilots and not pilots_only:  # the loop stopped in the pilot phase
        on_pilots(study)
    finish_study(study, spec, race if not pilots_only else None, tracker, on_answer)
    return study


def _ready_study(spec: StudySpec, storage: str | None, study: Any, sampler: Any, *, workload: Workload,
                 tracker: Any, needs_race: bool) -> tuple[Any, Any]:
    """The study opened (unless given) and prepared with its sampler: ``(study, RaceSampler or None)``."""
    from allocopt.study.sampler import RaceSampler

    given = sampler is not None
    sampler = sampler if given else make_sampler(spec, workload=workload)
    race = isinstance(sampler, RaceSampler)
    if needs_race and not race:
        raise ValueError("pilots_only and on_pilots need a RaceSampler")
    study, sampler = prepare_study(spec, study if study is not None else open_study(spec, storage, sampler),
                                   sampler, resample=not given and not race, workload=workload,
                                   tracker=tracker)
    return study, sampler if race else None


def _run_trials(study: Any, spec: StudySpec, race: Any, run_trial: Callable[[Any, Any], Any], *,
                pilots_only: bool, on_pilots: Callable[[Any], None] | None,
                on_wait: Callable[[int, int], None] | None) -> bool:
    """Ask and run trials until the count, the stop rule or the cap; True when still piloting."""
    from allocopt.store.heartbeat import worker_trial

    dists = distributions(spec, fidelity=race is not None)
    admit = partial(_admit, study=study, spec=spec, race=race, pilots_only=pilots_only)
    piloting = race is not None  # the pilot phase: every grid point claimed and no re-run waiting ends it
    infeasible_at_start = infeasible_full(study)
    for _ in range(trial_cap(study, spec, race) + 1):  # a killed or interrupted trial's re-run (queued) is
        # run even when the count is reached: the work it stood for runs exactly once
        if _infeasible_stop(study, spec, infeasible_at_start):
            break
        if piloting and not retries_waiting(study) and race.pilots_left(study) == 0:
            if pilots_only:
                break
            piloting = False
            if on_pilots:
                on_pilots(study)
        if not piloting and _full_runs_done(study, spec, race, on_wait):
            break
        with worker_trial(study, dists, admit) as trial:  # stale trials failed first; heartbeat on
            if trial is None:  # another worker asked first for the last trial(s): released
                continue
            if race is not None:
                race.suggest(trial)  # user attributes: fidelity, budget_flops, race_pilot / race_validation
            run_trial(study, trial)
    return piloting


def _infeasible_stop(study: Any, spec: StudySpec, at_start: int) -> bool:
    """Whether this run asked :data:`MAX_INFEASIBLE` infeasible proposals (then the reason is
    stored): a sampler that keeps proposing what the budget cannot buy ends the study, short of
    its count, instead of asking forever."""
    n = infeasible_full(study) - at_start
    if n < MAX_INFEASIBLE:
        return False
    study.set_user_attr(STOPPED_ATTR, f"the sampler proposed {n} allocations the budget cannot buy "
                        f"(infeasible, never run): stopped after {finished_full(study)} of "
                        f"{spec.trials} full runs; narrow the space (rho, group_sizes) to what "
                        "`allocopt study --dry-run` shows feasible")
    return True


def _admit(trial: Any, *, study: Any, spec: StudySpec, race: Any, pilots_only: bool) -> str | None:
    """None: run the asked ``trial``; a reason: give it back unsampled (the count is reached)."""
    given = params_of(study.get_trials(deepcopy=False)[trial.number])  # a retry or enqueued trial
    if pilots_only or given or (race is not None and race.pilots_left(study)):
        return None  # always run (RACE pilots do not count)
    ahead = finished_full(study) + running_full(study, below=trial.number)
    return (f"the study had its {spec.trials} full-budget trial(s), finished or running on other "
            "workers") if ahead >= spec.trials else None


def _full_runs_done(study: Any, spec: StudySpec, race: Any, on_wait: Callable[[int, int], None] | None) -> bool:
    """After waiting for other workers' full runs: whether the count or the stop rule ends the loop."""
    wait_for_others(study, spec, on_wait=on_wait)  # other workers' running trials complete the count
    if not retries_waiting(study) and finished_full(study) >= spec.trials:
        return True
    return race is not None and not retries_waiting(study) and gain_stop(study, spec, race)


def check_targets(spec: StudySpec, objective: Any) -> None:
    """Raises :class:`StudyError` when the objective declares its targets and one of the
    study's is not among them (an objective that declares none is not checked)."""
    from allocopt.objective import objective_targets

    try:
        declared = objective_targets(getattr(objective, "name", spec.objective))
    except ValueError:
        declared = None
    missing = [t for t, k in zip(spec.targets, spec.target_keys) if declared is not None and k not in declared]
    if missing:
        raise StudyError(f"target={missing[0]!r}: the {spec.objective} objective reports "
                         f"{', '.join(_target_name(spec, k) for k in declared or ())}")
    check_rewards(spec, objective)


def _target_name(spec: StudySpec, key: str) -> str:
    """The name a user types for target ``key`` (``pass@1`` for ``pass_at_1``), else the key."""
    from allocopt.flops import ConfigError

    try:
        return spec.vocabulary.target(key).name
    except ConfigError:
        return key


def check_rewards(spec: StudySpec, objective: Any) -> None:
    """Raises :class:`StudyError` when the objective declares the reward systems it scores and
    one of the study's space is not among them (a declared reward system priced by the study
    file but that the objective cannot run; the ``command`` objective declares none)."""
    from allocopt.objective import objective_rewards

    try:
        scores = objective_rewards(getattr(objective, "name", spec.objective))
    except ValueError:
        scores = None
    bad = [r for r in spec.space.rewards if scores is not None and r not in scores]
    if bad:
        raise StudyError(f"reward={bad[0]!r}: the {spec.objective} objective scores "
                         f"{', '.join(scores or ())} only; run a declared reward system with the "
                         "command objective (your own job) or ask/tell")


def prepare_study(spec: StudySpec, study: Any, sampler: Any, *, resample: bool, workload: Workload,
                  tracker: Any) -> tuple[Any, Any]:
    """The opened ``study`` made ready to run: what stopped workers left settled (and their
    MLflow runs ended), the spec, objective names and RACE's settings recorded, ``sampler`` set.
    ``resample``: a resumed study gets a sampler with a fresh seed (:func:`resumed_seed`), or it
    would propose the same points again. Returns ``(study, sampler)``."""
    from allocopt.study.sampler import RaceSampler
    from allocopt.store.settle import on_stale

    n = len(study.get_trials(deepcopy=False))
    if n and resample:
        sampler = make_sampler(replace(spec, seed=resumed_seed(spec.seed, n)), workload=workload)
    on_stale(study, tracker)  # its MLflow run ends FAILED with a dead worker's trial
    if tracker:  # runs of trials settled when the study was opened (killed workers) end now
        tracker.reconcile(study)
    study.sampler = sampler
    study.set_user_attr("spec", spec.to_dict())
    name_objectives(study, spec)
    if tracker:
        tracker.log_spec(spec.to_dict())
    if isinstance(sampler, RaceSampler):
        from dataclasses import asdict

        study.set_user_attr("race", {"pilot_fraction": sampler.pilot_fraction,
                                     "settings": asdict(sampler.settings)})
    return study, sampler


def trial_cap(study: Any, spec: StudySpec, race: Any = None) -> int:
    """Most asks the loop makes: every ask runs a trial (the queue's first), so the cap only
    guards against a sampler that never proposes a full run. ``race``: the RaceSampler, whose
    pilots and extra pilots come on top."""
    from optuna.trial import TrialState

    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))) + 2
    extra = (len(race.design) + 2 * spec.trials + (getattr(race.tuner, "max_pilots", None) or 0)
             + math.ceil(race.settings.extra_pilot_budget / race.pilot_fraction)) if race is not None else 0
    return spec.trials + waiting + extra + MAX_INFEASIBLE


MAX_INFEASIBLE = 100
"""Most infeasible full-budget proposals one run of the loop asks (they cost nothing and do not
count towards ``spec.trials``); past it the study stops, the reason stored (:data:`STOPPED_ATTR`)."""


def finish_study(study: Any, spec: StudySpec, race: Any, tracker: Any,
                 on_answer: Callable[[Any, Any], None] | None) -> None:
    """The study's final answer, stored by the loop itself, so a Python caller gets it as the
    command line does: with the tracker, the counts and the best full-budget trial on the MLflow
    parent run (:func:`allocopt.study.trial.log_final`); with ``race`` (the RaceSampler, after a
    whole race, not ``pilots_only``) and at least two trials, one of them full-budget, RACE's
    recommendation (:func:`final_answer`) in the study's user attribute ``recommendation`` and
    on the parent run (:func:`store_answer`), then ``on_answer``."""
    if tracker:
        tracker.reconcile(study)
        log_final(study, spec, tracker)
    if race is not None:
        rec, sur = final_answer(study, spec, race)
        if rec is not None:
            store_answer(study, spec, rec, tracker)
            if on_answer:
                on_answer(rec, sur)


def resumed_seed(seed: int, n: int) -> int:
    """The sampler seed of a run that resumes a study of ``n`` trials: drawn from ``(seed, n)``
    by NumPy's ``SeedSequence`` (in [0, 2**32)), not ``seed + n``, which workers started at
    different moments would share (``seed + 1`` is the second worker's seed on a fresh study:
    :func:`allocopt.study.open.make_sampler` adds the worker index)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, n]).generate_state(1)[0])


def finished_full(study: Any) -> int:
    """Full-budget trials that count towards ``spec.trials``: complete ones and failed ones (a
    failed run would fail again, and it spent compute). An infeasible proposal does not count:
    it never ran and cost nothing, so ``--trials 16`` is 16 runs paid for (the benchmark's rule
    too); :data:`MAX_INFEASIBLE` bounds how many a run asks. An interrupted or killed trial that
    is run again (a trial repeats it: Optuna's ``failed_trial``) does not count, its re-run does."""
    recs = [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]
    retried = {r.retried_from for r in recs}
    return sum(1 for r in recs
               if r.fidelity == "full" and ((r.optuna_state == "COMPLETE" and r.state != "INFEASIBLE") or (
                   r.optuna_state == "FAIL" and r.number not in retried and not r.interrupted)))


def infeasible_full(study: Any) -> int:
    """Full-budget proposals recorded infeasible (never run; not counted by :func:`finished_full`)."""
    return sum(1 for r in records(study) if r.fidelity == "full" and r.state == "INFEASIBLE")


def running_full(study: Any, *, below: int | None = None) -> int:
    """Full-budget trials workers are running now (:func:`allocopt.store.heartbeat.live_trials`:
    named by a live worker, or just asked; not reserved by ``allocopt ask``, not stale), a
    RACE trial still being sampled counted as full; ``below``: numbered below it."""
    from allocopt.record import fidelity_of
    from allocopt.store.heartbeat import live_trials

    return sum(1 for t in live_trials(study, below=below) if fidelity_of(t) == "full")


def wait_for_others(study: Any, spec: StudySpec, poll_s: float | None = None,
                    on_wait: Callable[[int, int], None] | None = None) -> int:
    """Wait while other workers' running full-budget trials would complete ``spec.trials``
    (:func:`finished_full` + :func:`running_full` reach it, this worker has nothing to run):
    ``--trials T`` is the total over every worker, none starts a trial beyond it. Every poll
    (``poll_s``, default the heartbeat interval, seconds) settles dead workers' trials
    (:func:`allocopt.store.settle.reconcile_on_open`): a killed worker's trial is failed and
    its re-run queued, which this worker then runs; one interrupted, or one that fails to
    start, leaves room for a new trial. ``on_wait(finished, running)`` is called when the wait
    begins. Returns the number of polls."""
    import time

    from allocopt.store.heartbeat import heartbeat_settings
    from allocopt.store.settle import reconcile_on_open

    poll = heartbeat_settings()[0] if poll_s is None else poll_s
    polls = 0
    while not retries_waiting(study):
        done = finished_full(study)
        running = running_full(study)
        if done >= spec.trials or done + running < spec.trials:
            break
        if polls == 0 and on_wait is not None:
            on_wait(done, running)
        time.sleep(poll)
        polls += 1
        reconcile_on_open(study, spec.targets)
    return polls


STOPPED_ATTR = "stopped"
"""The study's user attribute that says why a study ended before its ``trials`` (the stop rule)."""


def gain_stop(study: Any, spec: StudySpec, sampler: Any) -> bool:
    """The stop rule (:attr:`allocopt.spec.StudySpec.until_gain`): whether one more full run is
    worth less than ``spec.until_gain`` by the answer from the study's trials; then the reason
    is stored (user attribute :data:`STOPPED_ATTR`). False without the rule or an answer, and
    while the tuner's initial design (one full run per reward system, as shipped; none with
    ``initial_design = false``) is not done: before it the model has not seen every category."""
    if spec.until_gain is None or finished_full(study) < max(1, len(getattr(sampler.tuner, "initial", ()))):
        return False
    rec, _ = sampler.answer(study)
    gain = getattr(rec, "gain_of_one_more_run", math.nan)
    if rec is None or not math.isfinite(gain) or gain >= spec.until_gain:
        return False
    study.set_user_attr(STOPPED_ATTR, f"one more full run is worth {gain:.4g} {spec.target}, less "
                        f"than until_gain = {spec.until_gain:g}: stopped after {finished_full(study)} "
                        f"of {spec.trials} full runs")
    return True


def full_runs_left(left: dict[str, int]) -> int:
    """The full runs a run of the study would make, from :func:`work_left`: a re-queued run is
    one of the full runs still missing (it counts when it finishes), and the re-queued ones all
    run even when fewer are missing, so the two overlap rather than add."""
    return max(left["full"], left["retries"])


def retries_waiting(study: Any) -> int:
    """Queued re-runs of killed or interrupted trials (WAITING with Optuna's ``failed_trial``)."""
    return sum(1 for r in records(study) if r.optuna_state == "WAITING" and r.retried_from is not None)


def work_left(study: Any, spec: StudySpec, sampler: Any = None) -> dict[str, int]:
    """What a run of the study would still do: ``full`` runs to reach ``spec.trials``
    (:func:`finished_full`), queued ``retries`` (:func:`retries_waiting`), and with a
    :class:`~allocopt.study.sampler.RaceSampler` the ``pilots`` no trial has claimed. All zero:
    the study is finished."""
    return {"full": max(0, spec.trials - finished_full(study)), "retries": retries_waiting(study),
            "pilots": sampler.pilots_left(study) if sampler is not None and hasattr(sampler, "pilots_left") else 0}


def final_answer(study: Any, spec: StudySpec, sampler: Any) -> tuple[Any, Any]:
    """RACE's one answer from the study's trials alone: ``(recommendation, surrogate)``
    (:meth:`allocopt.study.sampler.RaceSampler.answer`: a fresh fit on the trials'
    observations), or ``(None, None)`` before the study has two trials, one of them at the full
    budget.

    Args:
        study: the Optuna study.
        spec: the study definition.
        sampler: the study's :class:`allocopt.study.sampler.RaceSampler`.
    """
    return sampler.answer(study)


def store_answer(study: Any, spec: StudySpec, rec: Any, tracker: Any = None) -> dict[str, Any]:
    """Store the study's answer ``rec`` (a :class:`~allocopt.race.recommend.Recommendation`, or
    a bare :class:`~allocopt.plan.allocation.Allocation`) in the Optuna study (user attribute
    ``recommendation``) and, with a tracker, on the MLflow parent run
    (:meth:`allocopt.tracking.StudyTracker.log_recommendation`). Returns the stored dict
    (:func:`allocopt.answer.recommendation_dict`: allocation, target, interval in target
    units)."""
    from allocopt.answer import recommendation_dict

    stored = recommendation_dict(rec, spec.targets[0], spec.directions[0])
    study.set_user_attr("recommendation", stored)
    if tracker:
        tracker.log_recommendation(stored)
    return stored


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
                    budget = spec.budget_for(a, workload)  # a wrong profile: one line, at once
                    try:
                        p = make_plan(budget, a, workload)
                        out.append((a, p, "" if p.realizable else "rho not realizable"))
                    except InfeasiblePlan as e:
                        out.append((a, None, f"needs {e.min_budget_flops:.3e} FLOPs"))
                    except ConfigError as e:
                        out.append((a, None, str(e)))
    return out
