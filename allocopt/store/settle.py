"""Settling what stopped workers left: dead workers' trials finished from their record or retried once.

When a worker's hold on a trial lapses (:mod:`allocopt.store.heartbeat`), the storage's
stale-heartbeat callback (:class:`StaleTrialCallback`) settles it:
:class:`optuna.storages.RetryHeartbeatStaleTrialCallback` (``max_retry=1``) enqueues a copy
(same parameters and decision attributes, so a pilot stays a pilot) that the next ``ask`` of any
worker runs. Opening a study never touches another live worker's RUNNING trial.

Every opening of a study settles what stopped workers left (:func:`reconcile_on_open`): a
trial whose worker ran on this host and is gone is settled at once (no grace period to wait),
stale ones after the grace period; a trial recorded whole before its worker died (a full disk
failed Optuna's ``tell`` after allocopt wrote the result) is finished from its record, any
other is failed and its work run again once; a trial stopped by Ctrl-C is enqueued to run
again. So a study whose ``--trials`` are done still settles its last killed trial when it is
opened again (``study``, ``race``, ``ask``, ``best``, ``report``).

Optuna is imported inside functions: ``import allocopt`` stays light.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any, Callable, Mapping

from allocopt.store.handles import _STORAGES
from allocopt.store.heartbeat import fail_stale, in_heartbeat_thread, owner_gone, release_cut_reservations

MAX_RETRY = 1
"""How often a dead worker's trial is run again (by another worker, or on resume)."""
_SETTLED: "weakref.WeakKeyDictionary[Any, dict[str, list[int]]]" = weakref.WeakKeyDictionary()
_RESULT_ATTRS = ("state", "targets", "metrics", "error", "plan", "asked", "source", "over_budget")
"""User attributes of a trial's result (:mod:`allocopt.record`): not copied onto its re-run."""


class StaleTrialCallback:
    """Optuna's ``heartbeat_stale_trial_callback``: retry the dead worker's trial once
    (:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), then tell the listeners (an
    MLflow tracker ends the trial's run as FAILED: :meth:`StudyTracker.reconcile`)."""

    def __init__(self, max_retry: int = MAX_RETRY):
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-API warning
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        self.listeners: dict[Any, Callable[[Any, Any], None]] = {}
        self._owed: list[tuple[Any, Any]] = []  # listener calls deferred from heartbeat threads

    def __call__(self, study: Any, trial: Any) -> None:
        values = recorded_values(study, trial)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if values is not None:  # its result was recorded whole before the worker died
                _add_recorded(study, trial, values)
            else:  # retried once with its decision only (not a dead run's half-written result)
                self._retry(study, _decision_only(trial))
        if in_heartbeat_thread():  # the tracker is the main thread's: told at its next fail_stale
            self._owed.append((study, trial))
            return
        self._tell(study, trial)

    def flush(self) -> None:
        """Tell the listeners what was failed in heartbeat threads since the last call."""
        owed, self._owed = self._owed, []
        for study, trial in owed:
            self._tell(study, trial)

    def _tell(self, study: Any, trial: Any) -> None:
        for fn in list(self.listeners.values()):
            fn(study, trial)


def _decision_only(trial: Any) -> Any:
    """A copy of the FrozenTrial ``trial`` whose user attributes keep the decision only
    (fidelity, budget, RACE's pilot key): what a re-run of the same work starts from."""
    import copy

    t = copy.deepcopy(trial)
    t.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in _RESULT_ATTRS}
    return t


def recorded_values(study: Any, trial: Any, targets: Any = None) -> list[float] | None:
    """The Optuna values of a trial whose result allocopt recorded whole before its worker
    stopped (killed, or a full disk failed ``study.tell``): user attribute ``state``
    ``COMPLETE`` with the plan (written last, :func:`allocopt.record.write_complete` after the
    ``budget`` constraint) and a finite value of every target of the study, in the study's
    objective order; ``INFEASIBLE`` with its error: the placeholder 0 per target. ``None`` when
    the record is partial or absent: then the work is run again instead.

    The study's targets: ``targets`` (names such as ``pass@1``, in objective order), else its
    metric names, else its ``spec`` user attribute.
    """
    import math

    from allocopt.record import TrialRecord
    from allocopt.spec import target_key

    names = list(targets or study.metric_names or [])
    if not names:
        t = (study.user_attrs.get("spec") or {}).get("target")
        names = [t] if isinstance(t, str) else list(t or [])
    if not names or len(names) != len(study.directions):
        return None
    rec = TrialRecord.of(trial)
    if rec.state == "INFEASIBLE" and rec.error:
        return [0.0] * len(names)
    if rec.state != "COMPLETE" or not rec.plan:
        return None
    vals = [rec.targets.get(target_key(n)) for n in names]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
        return None
    return [float(v) for v in vals]


def _add_recorded(study: Any, trial: Any, values: list[float]) -> None:
    """The failed ``trial``'s recorded result as a COMPLETE trial of its own (Optuna cannot
    complete a failed trial): same parameters, attributes and constraint, system attribute
    ``failed_trial`` naming the one it finishes, so it counts once and the failed one not."""
    import optuna

    system_attrs = {**trial.system_attrs, "failed_trial": trial.number,
                    "retry_history": [*trial.system_attrs.get("retry_history", []), trial.number]}
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.COMPLETE, values=values,
                                        params=trial.params, distributions=trial.distributions,
                                        user_attrs=trial.user_attrs, system_attrs=system_attrs))


def reconcile_on_open(study: Any, targets: Any = None) -> dict[str, list[int]]:
    """Settle the trials a stopped worker left behind; called whenever a study is opened
    (:func:`allocopt.study.open.open_study`, :func:`allocopt.query.sources.open_study_for_query`):

    1. a RUNNING trial whose worker ran on this host and is gone (killed: SIGKILL, OOM, a
       full disk) is settled at once, without waiting for the grace period: finished from its
       record when the record is whole (:func:`recorded_values`: told COMPLETE with the
       recorded targets), else failed and its work enqueued to run again once (the
       stale-heartbeat callback, :class:`StaleTrialCallback`);
    2. a reservation of ``allocopt ask`` cut short (no ``asked`` record: the ``ask`` failed
       half-way, e.g. on a full disk, and could not give it back) whose ``ask`` is gone or that
       is older than the grace period is failed as interrupted
       (:func:`allocopt.store.heartbeat.release_cut_reservations`); RUNNING trials silent for the
       grace period (any host) are failed the same way
       (Optuna's ``fail_stale_trials``; a whole record becomes a COMPLETE trial of its own);
    3. a trial stopped by Ctrl-C / SIGTERM (:func:`allocopt.record.is_interrupted`) with
       parameters and no re-run yet is enqueued to run again (:func:`requeue_interrupted`).

    Trials RUNNING without a heartbeat (reserved by ``allocopt ask``) and other live workers'
    trials are left alone. A no-op for a study without heartbeats (in memory). When anything
    was settled, one line on stderr says what (:func:`settled_line`).

    Returns:
        ``{"finished": [...], "failed": [...], "requeued": [...]}``: trial numbers.
    """
    import copy

    import optuna
    from optuna.trial import TrialState

    out: dict[str, list[int]] = {"finished": [], "failed": [], "requeued": []}
    storage = _STORAGES.get(study)
    if storage is None or not getattr(storage, "heartbeat_interval", None):
        return out
    sid = storage.get_study_id_from_name(study.study_name)
    count_before = len(study.get_trials(deepcopy=False))
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not owner_gone(t):
            continue
        tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
        values = recorded_values(study, t, targets)
        try:
            if values is not None:
                study.tell(t.number, values)
                out["finished"].append(t.number)
            elif storage.set_trial_state_values(tid, state=TrialState.FAIL):
                out["failed"].append(t.number)
                cb = storage.get_heartbeat_stale_trial_callback()
                if cb is not None:
                    cb(study, copy.deepcopy(storage.get_trial(tid)))
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another process settled it first
    out["failed"] += release_cut_reservations(study, storage)
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    fail_stale(study)
    out["failed"] += sorted({t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
                            - before - set(out["failed"]))
    out["requeued"] = requeue_interrupted(study)
    _SETTLED[study] = out
    line = settled_line(study.study_name, out, len(study.get_trials(deepcopy=False)) - count_before)
    if line:
        sys.stderr.write(line + "\n")
    return out


def settled_line(study_name: str, out: Mapping[str, list[int]], queued: int) -> str | None:
    """The line :func:`reconcile_on_open` prints, or ``None`` when nothing was settled; ``queued``
    is the number of trials it enqueued to run again (the failed ones' and the interrupted ones').

    >>> settled_line("s", {"finished": [4], "failed": [5, 6], "requeued": []}, 2)
    "study 's': settled 3 stale trial(s) a stopped worker left: 1 finished from its record (trial 4), 2 failed (trials 5, 6); re-queued 2 to run again"
    """
    stale = len(out["finished"]) + len(out["failed"])
    if not stale and not queued:
        return None
    def numbers(xs: list[int]) -> str:
        return ("trial " if len(xs) == 1 else "trials ") + ", ".join(map(str, xs))

    stale_parts = []
    if out["finished"]:
        stale_parts.append(f"{len(out['finished'])} finished from its record ({numbers(out['finished'])})")
    if out["failed"]:
        stale_parts.append(f"{len(out['failed'])} failed ({numbers(out['failed'])})")
    # an interrupted trial was stopped by Ctrl-C, not left by a stopped worker: counted apart
    parts = [f"settled {stale} stale trial(s) a stopped worker left: {', '.join(stale_parts)}"] if stale else []
    if out["requeued"]:
        parts.append(f"{len(out['requeued'])} interrupted ({numbers(out['requeued'])})")
    body = "; ".join(parts) if stale else "settled: " + ("; ".join(parts) or "nothing")
    return f"study {study_name!r}: {body}; re-queued {queued} to run again"


def settled(study: Any) -> dict[str, list[int]]:
    """What :func:`reconcile_on_open` did when ``study`` was opened (empty lists if nothing)."""
    return _SETTLED.get(study) or {"finished": [], "failed": [], "requeued": []}


def requeue_interrupted(study: Any) -> list[int]:
    """Enqueue, once, the work of each trial stopped by Ctrl-C / SIGTERM (it "runs again",
    before any new proposal: Optuna's ``ask`` takes the queue first): same parameters and
    decision attributes, system attribute ``failed_trial`` naming the trial it repeats (as
    Optuna's ``RetryFailedTrialCallback`` writes it). A trial stopped before its parameters
    were written has nothing to repeat (the sampler decides anew). Two workers opening the
    same study at the same instant may both enqueue one; RACE's claims keep a pilot from
    running twice, a full run may.

    Returns:
        the numbers of the interrupted trials enqueued now.
    """
    import optuna
    from optuna.trial import TrialState

    from allocopt.record import is_interrupted

    trials = study.get_trials(deepcopy=False)
    repeated = {t.system_attrs.get("failed_trial") for t in trials}
    done = []
    for t in trials:
        if t.state != TrialState.FAIL or not t.params or t.number in repeated or not is_interrupted(t):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.RetryFailedTrialCallback(max_retry=None)(study, _decision_only(t))
        done.append(t.number)
    return done


def stale_callback(study: Any) -> StaleTrialCallback | None:
    """The :class:`StaleTrialCallback` of the study's storage, to add listeners to."""
    storage = _STORAGES.get(study)
    cb = getattr(storage, "heartbeat_stale_trial_callback", None)
    return cb if isinstance(cb, StaleTrialCallback) else None


def on_stale(study: Any, tracker: Any) -> None:
    """Have ``tracker`` (a :class:`~allocopt.tracking.StudyTracker`) end the MLflow runs of the
    trials this worker fails as stale (:meth:`StudyTracker.reconcile`); once per tracker."""
    cb = stale_callback(study)
    if cb is not None and tracker is not None:
        cb.listeners[id(tracker)] = lambda st, _trial: tracker.reconcile(st)


__all__ = ["MAX_RETRY", "StaleTrialCallback", "on_stale", "reconcile_on_open", "recorded_values",
           "requeue_interrupted", "settled", "settled_line", "stale_callback"]
