"""The :class:`StudyTracker` of :mod:`allocopt.tracking` (its docstring: layout, keys, curves,
faults): the store and experiment, the study's one parent run (race-safe for N workers) and what
it carries (spec, recommendation, summaries, artifacts), closing; the trial runs come from
:class:`allocopt.tracking.trials.TrialRuns`, reconciliation from
:mod:`allocopt.tracking.reconcile`. ``mlflow`` is imported when a tracker is made.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from allocopt.tracking.layout import (DEFAULT_TRACKING_URI, EXPERIMENT_KIND, EXPERIMENT_PREFIX, METRIC_RECOMMENDED,
                                    ROLE_STUDY, TAG_RECOMMENDED, TAG_ROLE, TAG_STATE, TAG_STUDY, TAG_SUMMARY_STEP,
                                    TrackingError, _flatten, _metric_value, _sanitized, mlflow_key)
from allocopt.tracking.trials import TrialRuns

_PARENT_SETTLE_S = 0.5  # how long a worker that created a parent run waits before re-reading


class StudyTracker(TrialRuns):
    """Logs one Optuna study to MLflow (module docstring: layout, keys, curves, faults).

    Args:
        study_name: the study; the experiment is ``allocopt/<study_name>``.
        tracking_uri: MLflow tracking URI; ``None``: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db`` in the working folder.
        spool_dir: where writes go while an ``http(s)://`` server does not answer
            (:mod:`allocopt.tracking.spool`); ``None``: ``$TMPDIR/allocopt-spool``.

Every request is bounded (one try, a few seconds); while a server is away the trials go on
and their runs are spooled and replayed (:class:`allocopt.tracking.spool.SpooledClient`).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, study_name: str, tracking_uri: str | None = None, spool_dir: str | os.PathLike | None = None):
        from mlflow import MlflowClient  # heavy import, kept out of `import allocopt`

        from allocopt.tracking.spool import SpooledClient, spool_folder

        if not study_name or not str(study_name).strip():
            raise ValueError(f"study_name={study_name!r}: must be a non-empty name")
        self.study_name = str(study_name)
        self.tracking_uri = _resolve_uri(tracking_uri)
        self.client = SpooledClient(MlflowClient(tracking_uri=self.tracking_uri),
                                    Path(spool_dir) if spool_dir else spool_folder(None), self.study_name,
                                    spool=self.tracking_uri.startswith(("http://", "https://")))
        self.experiment_name = f"{EXPERIMENT_PREFIX}{self.study_name}"
        self.experiment_id = self._experiment()
        self.parent_run_id = self._parent_run()
        self._open: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._summary_step = -1
        self.client.replay_left()  # runs an earlier process spooled while the server was away

    # ----------------------------------------------------------------- set-up
    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            try:
                return self.client.create_experiment(
                    self.experiment_name, artifact_location=_artifact_location(
                        self.tracking_uri, self.study_name),
                    tags={TAG_STUDY: self.study_name, EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1]})
            except MlflowException:  # another worker created it in between
                exp = self.client.get_experiment_by_name(self.experiment_name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        if exp.tags.get(EXPERIMENT_KIND[0]) is None:  # made by an older allocopt, or just now
            try:  # by a worker that has not written its tags yet
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            except MlflowException:  # that worker wrote it first (unique key): the same value
                pass
        return exp.experiment_id

    def _study_runs(self) -> list[Any]:
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_STUDY}'", max_results=1000)
        return sorted((r for r in runs if r.data.tags.get(TAG_STUDY) == self.study_name),
                      key=lambda r: (r.info.start_time or 0, r.info.run_id))

    def _parent_run(self) -> str:
        """The study's one parent run, made race-safe for N workers starting at once.

        Rule: the oldest active run tagged ``allocopt.role=study`` of this study (start time,
        then run id) is the parent. A worker that finds none creates one, waits a moment for
        the others' creations to be visible, re-reads, keeps the oldest and deletes its own if
        it lost. :meth:`start_trial` re-checks that the parent is still active (a run created a
        moment earlier on a host with a slow clock may win late) and switches to the winner.
        """
        runs = self._study_runs()
        if not runs:
            mine = self.client.create_run(
                self.experiment_id, run_name=self.study_name,
                tags={TAG_STUDY: self.study_name, TAG_ROLE: ROLE_STUDY}).info.run_id
            time.sleep(_PARENT_SETTLE_S)
            runs = self._study_runs()
            if runs and runs[0].info.run_id != mine:
                self.client.delete_run(mine)
            runs = self._study_runs() or runs
        run_id = runs[0].info.run_id
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _check_parent(self) -> None:
        """Switch to the winner if this tracker's parent run was deleted by another worker
        (skipped while the server is away)."""
        from allocopt.tracking.spool import MlflowUnreachable

        try:
            deleted = self.client.get_run(self.parent_run_id).info.lifecycle_stage == "deleted"
        except MlflowUnreachable:
            return
        if deleted:
            self.parent_run_id = self._parent_run()

    def reconcile(self, study: Any) -> list[int]:
        """End the runs of trials that Optuna has finished but MLflow has as RUNNING (a worker
        stopped mid-trial): :func:`allocopt.tracking.reconcile.reconcile`. Returns the trial
        numbers whose runs were ended (none while the server is away: done at the next open)."""
        from allocopt.tracking.reconcile import reconcile
        from allocopt.tracking.spool import MlflowUnreachable

        if self.client.down_since is not None:
            return []
        try:
            return reconcile(self, study)
        except MlflowUnreachable:
            return []

    def log_study_summary(self, best: Mapping[str, Any], metrics: Mapping[str, Any],
                          *, step: int | None = None) -> None:
        """Write the study's standing on the parent run (may be called after every trial).

        Args:
            best: e.g. ``{"native_reward": {"trial": 7, "rho": 0.72, "value": 0.61}, ...}``:
                flattened into tags ``allocopt.best.<key>`` (tags can change as the study goes
                on; params cannot) and the ``best.json`` artifact (overwritten each call).
            metrics: e.g. ``n_complete``, ``best_native_reward``; logged at ``step``.
            step: defaults to one more than the previous summary's step on this parent run
                (kept across resumes), so the history shows the study's progress.
        """
        from mlflow.entities import Metric

        from allocopt.tracking.spool import MlflowUnreachable

        if step is None:
            try:
                run = self.client.get_run(self.parent_run_id)
                step = max(int(run.data.tags.get(TAG_SUMMARY_STEP, "-1")), self._summary_step) + 1
            except MlflowUnreachable:
                step = self._summary_step + 1
        self._summary_step = int(step)
        now = int(time.time() * 1000)
        values = {k: _metric_value(v) for k, v in _sanitized(metrics).items()}
        tags = {f"allocopt.best.{k}": v for k, v in _flatten(best).items()}
        tags[TAG_SUMMARY_STEP] = str(int(step))
        self._tags(self.parent_run_id, tags)
        self._log_batch(self.parent_run_id,
                        metrics=[Metric(k, v, now, int(step)) for k, v in values.items() if v is not None])
        self.client.log_dict(self.parent_run_id, json.loads(json.dumps(dict(best), default=str)),
                             "best.json")

    def log_spec(self, spec: Mapping[str, Any]) -> None:
        """Log the study spec (``StudySpec.to_dict()``) on the parent run: params (flattened,
        ``space.rho``, ``budget_flops``, ...; a resumed study with the same spec logs the same
        values, which MLflow accepts) and the ``spec.json`` artifact."""
        spec = json.loads(json.dumps(dict(spec), default=str))
        for attempt in range(3):  # workers starting at once log the same params to one run:
            run = self.client.get_run(self.parent_run_id)  # the loser of an insert race reads
            try:  # them back and logs only what is still missing
                self._params(self.parent_run_id, spec, set(run.data.params))
                break
            except Exception as e:  # noqa: BLE001 - only a duplicate key is retried
                if attempt == 2 or not any(k in str(e).lower() for k in ("uniqueviolation", "unique constraint", "duplicate")):
                    raise
        self.client.log_dict(self.parent_run_id, spec, "spec.json")

    def log_recommendation(self, recommendation: Mapping[str, Any]) -> None:
        """Log the study's one answer on the parent run.

        Args:
            recommendation: ``allocation`` (dict: ``rho``, ``group_size``, ``reward``, ...),
                ``target`` (name), ``mean``, ``lower``, ``upper`` (credible interval, target
                units), ``level`` (e.g. 0.9), ``prob_best`` (in [0, 1]) and optionally
                ``best_trial`` (the best observed trial as evidence). Scalars become metrics
                ``recommended_<key>``, the allocation tags ``allocopt.recommended.<key>``, the
                whole dict the ``recommendation.json`` artifact, and the lines the study prints
                (:func:`allocopt.answer.recommendation_lines`) the run's description (tag
                ``mlflow.note.content``).
        """
        from mlflow.entities import Metric

        rec = json.loads(json.dumps(dict(recommendation), default=str))
        now = int(time.time() * 1000)
        tags = {f"{TAG_RECOMMENDED}{k}": v for k, v in (rec.get("allocation") or {}).items()}
        self._tags(self.parent_run_id, tags)
        values = {mlflow_key(f"{METRIC_RECOMMENDED}{k}"): _metric_value(rec.get(k))
                  for k in ("mean", "lower", "upper", "level", "prob_best")}
        self._log_batch(self.parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()
                                                     if v is not None])
        self.client.log_dict(self.parent_run_id, rec, "recommendation.json")
        try:  # the run's description, the first thing its page shows: the answer as the study prints it
            from allocopt.answer import from_dict, recommendation_lines

            lines = recommendation_lines(from_dict(rec), str(rec.get("target") or ""))
        except Exception:  # noqa: BLE001 - a partial dict: the tags, metrics and JSON above hold it
            lines = []
        if lines:
            self._tags(self.parent_run_id, {"mlflow.note.content": "\n\n".join(lines)})

    def log_text(self, text: str, name: str) -> None:
        """Write ``text`` as the parent run's artifact ``name`` (e.g. ``regime_table.txt``)."""
        self.client.log_text(self.parent_run_id, str(text), name)

    def log_file(self, path: str | os.PathLike) -> None:
        """Copy the file at ``path`` (e.g. the HTML report) into the parent run's artifacts."""
        self.client.log_artifact(self.parent_run_id, str(path))

    def close(self, status: str = "FINISHED") -> None:
        """End trial runs still open (KILLED) and the parent run (``status``); a spool left by an
        outage is tried once more, unless ``status`` is ``KILLED`` (an interrupt ends at once; the
        next open of the study sends it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for run_id in list(self._open):
            try:
                self._tags(run_id, {TAG_STATE: "KILLED"})
                self._end(run_id, "KILLED")
            except Exception as e:  # noqa: BLE001
                errors.append(f"{run_id}: {e}")
        try:
            self.client.set_terminated(self.parent_run_id, status)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{self.parent_run_id}: {e}")
        # one more try to send the spool, unless interrupted (a Ctrl-C during an outage ends the
        # study at once; a hung server would hold it for another request timeout)
        if not self.client.try_replay(force=status != "KILLED"):
            self.client._say(f"MLflow still unreachable: {self.client.pending} write(s) kept in "
                             f"{self.client.path}; they are sent the next time this study opens MLflow "
                             "(run the same command again)")
        self.client.close()
        if errors:
            raise TrackingError("close: " + "; ".join(errors))

    def __enter__(self) -> "StudyTracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")


def runs_view_url(server: str, experiment_id: str) -> str:
    """The MLflow UI link that opens an experiment on its runs table (MLflow 3.17 reads the
    ``workflowType`` query parameter; without it the UI may open on the GenAI overview)."""
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


def _resolve_uri(uri: str | None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + os.path.abspath(uri[len(prefix):])
    return uri


def _artifact_location(uri: str, study_name: str) -> str | None:
    """Artifacts of a SQLite store go beside the database file, not in the working folder.

    MLflow's default for a SQLite store is ``./mlruns/<experiment id>`` relative to wherever
    the experiment happens to be created; here ``<db folder>/mlruns/allocopt-<study>-<hash>``.
    Other stores (a server, a file store) keep their own default.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or ":memory:" in uri:
        return None
    folder = os.path.dirname(uri[len(prefix):].split("?", 1)[0])
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study_name)[:80]
    digest = hashlib.sha1(study_name.encode()).hexdigest()[:8]
    return Path(folder, "mlruns", f"allocopt-{safe}-{digest}").as_uri()
