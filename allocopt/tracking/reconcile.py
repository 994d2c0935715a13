"""Reconciling MLflow with Optuna: trial runs left RUNNING by a worker that stopped mid-trial
(killed, or a second Ctrl-C cut its clean-up short) are ended to match the trial's state in
Optuna. One path for both moments it is needed: when another worker fails a dead worker's
trial (the stale-heartbeat callback, :func:`allocopt.store.settle.on_stale`) and when a study's
tracker closes (:func:`allocopt.tracking.lifecycle.close_tracker`).
"""

from __future__ import annotations

from typing import Any

from allocopt.record import TrialRecord, records
from allocopt.tracking.layout import ROLE_TRIAL, STATES, TAG_ROLE, TAG_STUDY, TAG_TRIAL, mlflow_key


def reconcile(tracker: Any, study: Any) -> list[int]:
    """End the open MLflow runs of trials that Optuna has finished: a worker killed
    mid-trial leaves its run RUNNING while another worker fails the trial (stale
    heartbeat, :mod:`allocopt.store.heartbeat`). ``FAIL`` -> FAILED with an ``allocopt.error`` naming
    the retry; ``COMPLETE``/``INFEASIBLE`` (a worker killed between Optuna's tell and
    MLflow, or a full disk cut its recording short and the run was ended KILLED; the trial
    was finished from its record when the study was opened) -> FINISHED with the targets and
    metrics Optuna kept. Runs of trials still
    RUNNING (or WAITING) in Optuna, another live worker's, are left alone, and so are the runs
    ``tracker`` has open itself (:meth:`allocopt.tracking.StudyTracker.finish_trial` ends those).

    Args:
        tracker: a :class:`allocopt.tracking.StudyTracker`.
        study: the Optuna study (a loaded one will do).

    Returns:
        the trial numbers whose runs were ended, ascending.
    """
    trials: dict[int, TrialRecord] = {r.number: r for r in records(study)}
    retried = {r.retried_from: r.number for r in trials.values() if r.retried_from is not None}
    runs = [r for status in ("RUNNING", "KILLED") for r in tracker.client.search_runs(
        [tracker.experiment_id], max_results=5000,
        filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and attributes.status = '{status}'")]
    ended = []
    for r in runs:
        if r.info.run_id in tracker._open or r.data.tags.get(TAG_STUDY) != tracker.study_name:
            continue
        t = trials.get(int(r.data.tags.get(TAG_TRIAL, -1)))
        if t is None or t.optuna_state in ("RUNNING", "WAITING"):
            continue
        if r.info.status == "KILLED" and t.optuna_state != "COMPLETE":
            continue  # a KILLED run of a failed trial is already what it is
        state = t.state if t.state in STATES else ("COMPLETE" if t.optuna_state == "COMPLETE" else "FAIL")
        error = t.error
        if state == "FAIL" and not error:
            again = retried.get(t.number)
            error = ("worker lost (gone, or no heartbeat within the grace period); failed when the "
                     "study was next opened" + (f", retried as trial {again}" if again is not None else ""))
        metrics = {**{mlflow_key(k): v for k, v in t.targets.items()}, **t.metrics}
        tracker.finish_trial(r.info.run_id, state=state, metrics=metrics, error=error)
        ended.append(t.number)
    return sorted(ended)
