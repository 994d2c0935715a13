"""MLflow tracking of a study: one experiment, one parent run, one nested run per trial.

Built on MLflow's client API (:class:`mlflow.MlflowClient`), never on the global
``mlflow.start_run`` state, so several trackers (and Optuna's own threads) do not interfere.
``mlflow`` is imported when a :class:`StudyTracker` is made, not when this module is imported,
and it loads no torch.

Layout in MLflow
================

* **Store.** ``tracking_uri=None`` means ``$MLFLOW_TRACKING_URI`` if set, else a SQLite file of
  its own, ``sqlite:///mlflow.db`` in the working folder (made absolute when the tracker is
  made). Optuna's ``allocopt.db`` cannot be shared: both keep an ``alembic_version`` table.
  Artifacts of a SQLite store go beside the database file, to
  ``<db folder>/mlruns/allocopt-<study>-<hash of the name>/<run id>/artifacts`` (set when the
  experiment is created; MLflow's own default would be ``./mlruns`` of whatever folder the
  process runs in). A server (``http://host:port``) keeps its own artifact default
  (``mlflow-artifacts:/`` when it proxies artifacts).
* **Experiment** ``allocopt/<study_name>``, created or reused (restored if it was deleted);
  tags ``allocopt.study`` and ``mlflow.experimentKind=custom_model_development`` (MLflow 3's
  UI reads this tag to choose an experiment's first page). MLflow 3.17's UI decides by its
  global GenAI / "Model training" switch instead (kept in the browser's local storage, GenAI
  by default); a link with ``?workflowType=machine_learning`` opens the runs table:
  ``http://127.0.0.1:5000/#/experiments/<id>?workflowType=machine_learning``
  (:func:`runs_view_url`).
* **Parent run** named ``<study_name>``, tags ``allocopt.study=<name>``, ``allocopt.role=study``.
  A resumed study finds it by these tags and reuses it; N workers starting at once keep exactly
  one (``StudyTracker._parent_run``: the oldest wins, the others' are deleted). It is RUNNING
  while a tracker is open and ends when one closes (with several workers: by the latest of
  them). It carries the study spec (:meth:`StudyTracker.log_spec`: params and ``spec.json``),
  the recommendation (:meth:`StudyTracker.log_recommendation`: tags ``allocopt.recommended.*``,
  metrics and ``recommendation.json``), text artifacts such as the regime table and the report
  (:meth:`StudyTracker.log_text`, :meth:`StudyTracker.log_file`) and the study's final metrics
  (:meth:`StudyTracker.log_study_summary`).
* **Trial runs**, nested (tag ``mlflow.parentRunId``), named ``trial-<number>``, tags
  ``allocopt.study``, ``allocopt.role=trial``, ``allocopt.trial_number``, ``allocopt.state``
  (``RUNNING``, then ``COMPLETE``, ``FAIL`` or ``INFEASIBLE``), ``allocopt.objective``,
  ``allocopt.fidelity`` (``full`` or ``pilot``) and any caller tag (a key without a dot gets the
  ``allocopt.`` prefix). MLflow status: FAILED for ``FAIL``, FINISHED otherwise, KILLED for a
  trial still open when the tracker closes.

Keys, values and limits
=======================

Every param, metric and tag key passes :func:`mlflow_key`: ``@`` becomes ``_at_``, ``:`` and any
character MLflow (or Windows) rejects becomes ``_`` (``pass@1:gsm8k`` -> ``pass_at_1_gsm8k``,
the spelling of ``shared/DESIGN.md`` §2), at most 250 characters. Nested dicts are flattened
with ``.`` (``lora.rank``). Params are strings (``None`` values are not logged; lists and dicts
as JSON), cut to MLflow's 6000 characters; tags to 8000 (``allocopt.error`` keeps its head and
tail, the full text is the ``error.txt`` artifact). Metrics are doubles: exact integer FLOP
counts above 2**53 are rounded to the nearest double (relative error < 1.2e-16; rounding is
monotonic, so ``total_flops <= budget_flops`` survives it). Non-finite metric values (NaN, ±inf:
a target a failed trial never measured) are **not** logged: MLflow would keep NaN but clip
inf to ±1.8e308, and a missing metric reads "not measured" in the UI and in searches. Their
keys are listed in the tag ``allocopt.skipped_metrics``. Everything is sent with ``log_batch``,
in chunks within MLflow's limits (1000 metrics, 100 params, 100 tags per call).

Trial metrics (:meth:`StudyTracker.finish_trial`): whatever the caller passes, by convention
the targets (``native_reward``, ``pass_at_1``, ``judge``, ...), the executed breakdown
(``search_flops``, ``learning_flops``, ``reward_flops``, ``total_flops``, ``rho``, per-item
``<phase>_<item>_flops``) and its ``useful_*`` counterparts, ``budget_flops``,
``budget_utilization``, ``eval_flops`` and ``<phase>_wall_seconds``, all at step 0.
:func:`result_metrics` builds that dict from a :class:`objectives.grpo.TrialResult`.

Curves
======

MLflow steps are 64-bit integers and FLOP counts reach 1e19 and more, so FLOPs are never a
step. Each curve point (a :class:`allocopt.meter.IterationRecord` or a dict with the same
fields) is logged at ``step = iteration`` as the metrics

* ``curve/cumulative_flops``: executed FLOPs spent up to and including this iteration (raw
  FLOPs as a double, no scaling);
* ``curve/executed_flops``: executed FLOPs of this iteration;
* ``curve/reward_mean``: mean training reward of the iteration's rollouts (skipped if NaN);
* ``curve/rows_trained``: rollouts trained on in this iteration (μ·N);
* ``curve/wall_seconds``: wall time of the iteration;
* ``curve/budget_fraction``: ``cumulative_flops / budget_flops`` (when the trial's
  ``budget_flops`` is known from its params, plan or metrics), which puts pilots and full runs
  on one axis;
* ``train/<key>``: the trainer's own logged curves of the iteration (the record's ``train``
  dict, TRL's names: ``train/loss``, ``train/kl``, ``train/entropy``,
  ``train/completions/mean_length``, ``train/reward``, ``train/reward_std``,
  ``train/frac_reward_zero_std`` (share of groups with zero reward variance),
  ``train/clip_ratio/region_mean``, ...), at the same step as ``curve/cumulative_flops``.

To plot reward against compute in the MLflow UI, choose ``curve/cumulative_flops`` (or
``curve/budget_fraction``) as the chart's x-axis metric.

Faults
======

:meth:`StudyTracker.finish_trial` tries every part (state tags, metrics, curves, params from the
plan, ``plan.json``, ``error.txt``) on its own, ends the run in any case, then raises
:class:`TrackingError` naming the parts that failed; what was logged stays logged.

Against a server, MLflow prints a "View run … at: <url>" line to stdout whenever a run ends;
``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=true`` silences it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

STATES = ("COMPLETE", "FAIL", "INFEASIBLE")
"""Trial states :meth:`StudyTracker.finish_trial` accepts."""
FIDELITIES = ("full", "pilot")
CURVE_FIELDS = ("cumulative_flops", "executed_flops", "reward_mean", "rows_trained", "wall_seconds")
"""Fields of one curve point (``IterationRecord``), besides ``iteration``."""
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
"""Experiment tag the MLflow 3 UI reads (``server/js`` of mlflow 3.x): a classic-ML kind opens
the experiment on its runs table instead of the GenAI overview."""

MAX_KEY_LENGTH = 250
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 8000
_BATCH_METRICS = 1000
_BATCH_PARAMS_TAGS = 100
_BATCH_BYTES = 900_000  # MLflow rejects log_batch requests over 1 MB
_PARENT_SETTLE_S = 0.5  # how long a worker that created a parent run waits before re-reading

TAG_STUDY = "allocopt.study"
TAG_ROLE = "allocopt.role"
TAG_TRIAL = "allocopt.trial_number"
TAG_STATE = "allocopt.state"
TAG_OBJECTIVE = "allocopt.objective"
TAG_FIDELITY = "allocopt.fidelity"
TAG_ERROR = "allocopt.error"
TAG_SKIPPED = "allocopt.skipped_metrics"
TAG_PARENT = "mlflow.parentRunId"

_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "INFEASIBLE": "FINISHED"}
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


class TrackingError(RuntimeError):
    """Part of what a trial or study should log did not reach MLflow (the message says what)."""


# ============================================================================ keys, values
def mlflow_key(name: str) -> str:
    """A name MLflow accepts as a param, metric or tag key, readable and stable.

    ``@`` -> ``_at_``; ``:``, spaces and every other character outside ``[A-Za-z0-9_.-/]`` ->
    ``_``; empty, ``.`` and ``..`` path segments are dropped or replaced (MLflow rejects names
    that a file system would normalize); at most 250 characters.

    >>> mlflow_key("pass@1:gsm8k")
    'pass_at_1_gsm8k'
    """
    key = _BAD_CHARS.sub("_", str(name).replace("@", "_at_"))
    parts = ["_" if p in (".", "..") else p for p in key.split("/") if p]
    key = "/".join(parts) or "_"
    return key[:MAX_KEY_LENGTH]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{name}."))
        else:
            out[name] = v
    return out


def _sanitized(d: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten and sanitize keys; two names that clash get ``_2``, ``_3``… unless equal values."""
    out: dict[str, Any] = {}
    for raw, v in _flatten(d).items():
        key = mlflow_key(raw)
        if key in out and out[key] != v:
            n = 2
            while f"{key}_{n}" in out:
                n += 1
            key = mlflow_key(f"{key}_{n}")
        out.setdefault(key, v)
    return out


def _param_value(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        s = v
    elif isinstance(v, (bool, numbers.Integral)):
        s = str(v) if isinstance(v, bool) else str(int(v))
    elif isinstance(v, numbers.Real):
        s = repr(float(v))
    else:
        try:
            s = json.dumps(v, default=str)
        except (TypeError, ValueError):
            s = str(v)
    return s[:MAX_PARAM_LENGTH]


def _metric_value(v: Any) -> float | None:
    """A finite double, or None (non-numeric, NaN, ±inf)."""
    if isinstance(v, bool):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _cut(text: str, limit: int = MAX_TAG_LENGTH) -> str:
    """``text`` within ``limit`` characters: head and tail kept around a marker."""
    if len(text) <= limit:
        return text
    marker = "\n…[truncated; full text in error.txt]…\n"
    head = min(2000, (limit - len(marker)) // 2)
    tail = limit - len(marker) - head
    return text[:head] + marker + text[-tail:]


def _record_dict(rec: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(rec) and not isinstance(rec, type):
        return dataclasses.asdict(rec)
    return dict(rec)


def result_metrics(result: Any) -> dict[str, float]:
    """The flat metrics dict of one trial from a ``TrialResult`` (or its ``to_dict()``).

    Targets under their MLflow keys (``pass@1`` -> ``pass_at_1``), the executed breakdown and
    its ``useful_*`` counterparts, ``budget_flops``, ``budget_utilization``, ``eval_flops`` and
    ``<phase>_wall_seconds``.
    """
    d = result if isinstance(result, Mapping) else result.to_dict()
    out: dict[str, float] = {mlflow_key(k): v for k, v in (d.get("targets") or {}).items()}
    out.update(d.get("breakdown") or {})
    budget = d.get("budget_flops")
    if budget is not None:
        out["budget_flops"] = budget
        total = out.get("total_flops")
        if total is not None and budget:
            out["budget_utilization"] = total / budget
    out["eval_flops"] = d.get("eval_flops", 0)
    for phase, s in (d.get("wall_seconds") or {}).items():
        out[f"{phase}_wall_seconds"] = s
    return out


# ============================================================================ the tracker
class StudyTracker:
    """Logs one Optuna study to MLflow (module docstring: layout, keys, curves, faults).

    Args:
        study_name: the study; the experiment is ``allocopt/<study_name>``.
        tracking_uri: MLflow tracking URI; ``None``: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///mlflow.db`` in the working folder.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, study_name: str, tracking_uri: str | None = None):
        from mlflow import MlflowClient  # heavy import, kept out of `import allocopt`

        if not study_name or not str(study_name).strip():
            raise ValueError(f"study_name={study_name!r}: must be a non-empty name")
        self.study_name = str(study_name)
        self.tracking_uri = _resolve_uri(tracking_uri)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_name = f"allocopt/{self.study_name}"
        self.experiment_id = self._experiment()
        self.parent_run_id = self._parent_run()
        self._open: dict[str, dict[str, Any]] = {}
        self._closed = False

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
            [self.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = 'study'", max_results=1000)
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
                tags={TAG_STUDY: self.study_name, TAG_ROLE: "study"}).info.run_id
            time.sleep(_PARENT_SETTLE_S)
            runs = self._study_runs()
            if runs and runs[0].info.run_id != mine:
                self.client.delete_run(mine)
            runs = self._study_runs() or runs
        run_id = runs[0].info.run_id
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _check_parent(self) -> None:
        """Switch to the winner if this tracker's parent run was deleted by another worker."""
        if self.client.get_run(self.parent_run_id).info.lifecycle_stage == "deleted":
            self.parent_run_id = self._parent_run()

    def reconcile(self, study: Any) -> list[int]:
        """End the open MLflow runs of trials that Optuna has finished: a worker killed
        mid-trial leaves its run RUNNING while another worker fails the trial (stale
        heartbeat, :mod:`allocopt.storage`). ``FAIL`` -> FAILED with an ``allocopt.error`` naming
        the retry; ``COMPLETE``/``INFEASIBLE`` (a worker killed between Optuna's tell and
        MLflow) -> FINISHED with the targets and metrics Optuna kept. Runs this tracker has
        open itself are left to :meth:`finish_trial`.

        Returns:
            the trial numbers whose runs were ended.
        """
        from optuna.trial import TrialState

        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        retried = {t.system_attrs.get("failed_trial"): t.number for t in trials.values()
                   if t.system_attrs.get("failed_trial") is not None}
        runs = self.client.search_runs(
            [self.experiment_id], max_results=5000,
            filter_string=f"tags.`{TAG_ROLE}` = 'trial' and attributes.status = 'RUNNING'")
        ended = []
        for r in runs:
            if r.info.run_id in self._open or r.data.tags.get(TAG_STUDY) != self.study_name:
                continue
            t = trials.get(int(r.data.tags.get(TAG_TRIAL, -1)))
            if t is None or t.state in (TrialState.RUNNING, TrialState.WAITING):
                continue
            ua = t.user_attrs
            state = ua.get("state") if ua.get("state") in STATES else (
                "COMPLETE" if t.state == TrialState.COMPLETE else "FAIL")
            error = ua.get("error")
            if state == "FAIL" and not error:
                again = retried.get(t.number)
                error = ("worker lost: no heartbeat within the grace period; failed by another "
                         "worker" + (f", retried as trial {again}" if again is not None else ""))
            metrics = {**{mlflow_key(k): v for k, v in (ua.get("targets") or {}).items()},
                       **(ua.get("metrics") or {})}
            self.finish_trial(r.info.run_id, state=state, metrics=metrics, error=error)
            ended.append(t.number)
        return ended

    # ----------------------------------------------------------------- logging
    def _log_batch(self, run_id: str, metrics: Sequence[Any] = (), params: Sequence[Any] = (),
                   tags: Sequence[Any] = ()) -> None:
        """``log_batch`` in chunks within MLflow's count and size limits."""
        for chunk in _chunks(params, _BATCH_PARAMS_TAGS):
            self.client.log_batch(run_id, params=chunk, synchronous=True)
        for chunk in _chunks(tags, _BATCH_PARAMS_TAGS):
            self.client.log_batch(run_id, tags=chunk, synchronous=True)
        for chunk in _chunks(metrics, _BATCH_METRICS):
            self.client.log_batch(run_id, metrics=chunk, synchronous=True)

    def _params(self, run_id: str, params: Mapping[str, Any], skip: set[str]) -> dict[str, str]:
        from mlflow.entities import Param

        out = {k: s for k, v in _sanitized(params).items()
               if k not in skip and (s := _param_value(v)) is not None}
        self._log_batch(run_id, params=[Param(k, v) for k, v in out.items()])
        return out

    def _tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._log_batch(run_id, tags=[RunTag(mlflow_key(k), _cut(str(v))) for k, v in tags.items()])

    def start_trial(self, number: int, params: Mapping[str, Any],
                    tags: Mapping[str, Any] | None = None) -> str:
        """Open the nested run of trial ``number`` and log its params; returns the run id.

        Args:
            number: Optuna's trial number.
            params: the allocation and plan (``rho``, ``group_size``, ``reward``, ``model``,
                ``budget_flops``, ``update_passes``, ``iterations``, …); nested dicts are
                flattened with ``.``, keys sanitized (:func:`mlflow_key`), values logged as
                strings, ``None`` values left out.
            tags: ``objective`` and ``fidelity`` (``full``, the default, or ``pilot``) and any
                other tag; a key without a dot is prefixed ``allocopt.``.
        """
        self._check_parent()
        tags = dict(tags or {})
        fidelity = str(tags.pop("fidelity", tags.pop(TAG_FIDELITY, "full")))
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity={fidelity!r}: must be one of {', '.join(FIDELITIES)}")
        objective = str(tags.pop("objective", tags.pop(TAG_OBJECTIVE, "unspecified")))
        all_tags = {TAG_PARENT: self.parent_run_id, TAG_STUDY: self.study_name,
                    TAG_ROLE: "trial", TAG_TRIAL: str(int(number)), TAG_STATE: "RUNNING",
                    TAG_OBJECTIVE: objective, TAG_FIDELITY: fidelity}
        for k, v in tags.items():
            all_tags[k if "." in k else f"allocopt.{k}"] = v
        all_tags = {mlflow_key(k): _cut(str(v)) for k, v in all_tags.items()}
        first = dict(list(all_tags.items())[:_BATCH_PARAMS_TAGS])
        run = self.client.create_run(self.experiment_id, run_name=f"trial-{int(number)}", tags=first)
        run_id = run.info.run_id
        self._open[run_id] = {"params": {}, "number": int(number)}
        try:
            self._tags(run_id, dict(list(all_tags.items())[_BATCH_PARAMS_TAGS:]))
            self._open[run_id]["params"] = self._params(run_id, params, set())
        except Exception:
            self._end(run_id, "FAILED")
            raise
        return run_id

    def finish_trial(self, run_id: str, *, state: str, metrics: Mapping[str, Any] | None = None,
                     curves: Iterable[Any] = (), plan: Mapping[str, Any] | None = None,
                     error: str | None = None) -> None:
        """Log a trial's outcome and end its run (always, even if some logging fails).

        Args:
            run_id: from :meth:`start_trial`.
            state: ``COMPLETE``, ``FAIL`` or ``INFEASIBLE`` (MLflow status FAILED for ``FAIL``,
                FINISHED otherwise).
            metrics: flat name -> number (module docstring); non-finite values are skipped.
            curves: ``IterationRecord``s or dicts with ``iteration`` and :data:`CURVE_FIELDS`.
            plan: ``TrialPlan.to_dict()``: the ``plan.json`` artifact, and params for its keys
                that :meth:`start_trial` did not log.
            error: error text: tag ``allocopt.error`` (cut to 8000 characters) and ``error.txt``.

        Raises:
            ValueError: unknown ``state`` (the run is still ended, as FAILED).
            TrackingError: some parts did not reach MLflow (the run is ended regardless).
        """
        st = str(state).upper()
        failures: list[str] = []

        def attempt(what: str, fn: Any) -> None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - collect, finish the rest, report at the end
                failures.append(f"{what}: {type(e).__name__}: {e}")

        try:
            if st in STATES:
                self._finish(run_id, st, metrics or {}, curves, plan, error, attempt)
            else:
                attempt("tags", lambda: self._tags(run_id, {TAG_STATE: "FAIL", TAG_ERROR: _cut(
                    f"tracker: unknown state {state!r}" + (f"\n{error}" if error else ""))}))
        finally:
            try:
                self._end(run_id, _STATUS.get(st, "FAILED"))
            except Exception as e:  # noqa: BLE001
                failures.append(f"end run: {type(e).__name__}: {e}")
        if st not in STATES:
            raise ValueError(f"state={state!r}: must be one of {', '.join(STATES)}")
        if failures:
            raise TrackingError(f"trial run {run_id}: not logged: " + "; ".join(failures))

    def _finish(self, run_id: str, st: str, metrics: Mapping[str, Any], curves: Iterable[Any],
                plan: Mapping[str, Any] | None, error: str | None, attempt: Any) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        flat = _sanitized(metrics)
        values = {k: _metric_value(v) for k, v in flat.items()}
        skipped = sorted(k for k, v in values.items() if v is None)
        tags: dict[str, Any] = {TAG_STATE: st}
        if error:
            tags[TAG_ERROR] = _cut(str(error))
        if skipped:
            tags[TAG_SKIPPED] = ",".join(skipped)
        attempt("tags", lambda: self._tags(run_id, tags))
        attempt("metrics", lambda: self._log_batch(
            run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items() if v is not None]))
        params = dict(self._open[run_id]["params"]) if run_id in self._open else None
        if params is None:  # a run this tracker did not start (or already ended)
            params = {}
            attempt("params", lambda: params.update(self.client.get_run(run_id).data.params))
        budget = _metric_value((plan or {}).get(
            "budget_flops", params.get("budget_flops", flat.get("budget_flops"))))
        attempt("curves", lambda: self._log_batch(run_id, metrics=_curve_metrics(curves, budget, now)))
        if plan is not None:
            attempt("plan params", lambda: self._params(run_id, plan, set(params)))
            attempt("plan.json", lambda: self.client.log_dict(
                run_id, json.loads(json.dumps(dict(plan), default=str)), "plan.json"))
        if error:
            attempt("error.txt", lambda: self.client.log_text(run_id, str(error), "error.txt"))

    def _end(self, run_id: str, status: str) -> None:
        self._open.pop(run_id, None)
        self.client.set_terminated(run_id, status)

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

        if step is None:
            run = self.client.get_run(self.parent_run_id)
            step = int(run.data.tags.get("allocopt.summary_step", "-1")) + 1
        now = int(time.time() * 1000)
        values = {k: _metric_value(v) for k, v in _sanitized(metrics).items()}
        tags = {f"allocopt.best.{k}": v for k, v in _flatten(best).items()}
        tags["allocopt.summary_step"] = str(int(step))
        self._tags(self.parent_run_id, tags)
        self._log_batch(self.parent_run_id,
                        metrics=[Metric(k, v, now, int(step)) for k, v in values.items() if v is not None])
        self.client.log_dict(self.parent_run_id, json.loads(json.dumps(dict(best), default=str)),
                             "best.json")

    def end_stale_runs(self, trial_states: Mapping[int, str]) -> list[int]:
        """End the trial runs a killed worker left RUNNING, so MLflow agrees with Optuna.

        Args:
            trial_states: Optuna's state name (``COMPLETE``, ``FAIL``, ``RUNNING``, …) by trial
                number. A RUNNING trial run whose trial is no longer RUNNING there (the worker
                was killed, or a second Ctrl-C cut its clean-up short) is ended FAILED with the
                tags ``allocopt.state = FAIL`` and an error; runs of trials still RUNNING (another
                live worker's) are left alone.

        Returns:
            the trial numbers whose runs were ended.
        """
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = 'trial' and attributes.status = 'RUNNING'",
            max_results=1000)
        ended = []
        for r in runs:
            if r.data.tags.get(TAG_STUDY) != self.study_name or r.info.run_id in self._open:
                continue
            number = int(r.data.tags.get(TAG_TRIAL, -1))
            state = trial_states.get(number)
            if state is None or state == "RUNNING":
                continue
            self._tags(r.info.run_id, {TAG_STATE: "FAIL", TAG_ERROR: _cut(
                f"interrupted: the worker stopped mid-trial; Optuna has the trial as {state}; "
                "ended on resume")})
            self.client.set_terminated(r.info.run_id, "FAILED")
            ended.append(number)
        return sorted(ended)

    def log_spec(self, spec: Mapping[str, Any]) -> None:
        """Log the study spec (``StudySpec.to_dict()``) on the parent run: params (flattened,
        ``space.rho``, ``budget_flops``, ...; a resumed study with the same spec logs the same
        values, which MLflow accepts) and the ``spec.json`` artifact."""
        spec = json.loads(json.dumps(dict(spec), default=str))
        run = self.client.get_run(self.parent_run_id)
        self._params(self.parent_run_id, spec, set(run.data.params))
        self.client.log_dict(self.parent_run_id, spec, "spec.json")

    def log_recommendation(self, recommendation: Mapping[str, Any]) -> None:
        """Log the study's one answer on the parent run.

        Args:
            recommendation: ``allocation`` (dict: ``rho``, ``group_size``, ``reward``, ...),
                ``target`` (name), ``mean``, ``lower``, ``upper`` (credible interval, target
                units), ``level`` (e.g. 0.9), ``prob_best`` (in [0, 1]) and optionally
                ``best_trial`` (the best observed trial as evidence). Scalars become metrics
                ``recommended_<key>``, the allocation tags ``allocopt.recommended.<key>``, the
                whole dict the ``recommendation.json`` artifact.
        """
        from mlflow.entities import Metric

        rec = json.loads(json.dumps(dict(recommendation), default=str))
        now = int(time.time() * 1000)
        tags = {f"allocopt.recommended.{k}": v for k, v in (rec.get("allocation") or {}).items()}
        self._tags(self.parent_run_id, tags)
        values = {mlflow_key(f"recommended_{k}"): _metric_value(rec.get(k))
                  for k in ("mean", "lower", "upper", "level", "prob_best")}
        self._log_batch(self.parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()
                                                     if v is not None])
        self.client.log_dict(self.parent_run_id, rec, "recommendation.json")

    def log_text(self, text: str, name: str) -> None:
        """Write ``text`` as the parent run's artifact ``name`` (e.g. ``regime_table.txt``)."""
        self.client.log_text(self.parent_run_id, str(text), name)

    def log_file(self, path: str | os.PathLike) -> None:
        """Copy the file at ``path`` (e.g. the HTML report) into the parent run's artifacts."""
        self.client.log_artifact(self.parent_run_id, str(path))

    def close(self, status: str = "FINISHED") -> None:
        """End trial runs still open (KILLED) and the parent run (``status``). Idempotent."""
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
        if errors:
            raise TrackingError("close: " + "; ".join(errors))

    def __enter__(self) -> "StudyTracker":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")


# ============================================================================ helpers
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


def _curve_metrics(curves: Iterable[Any], budget: float | None, now: int) -> list[Any]:
    from mlflow.entities import Metric

    out = []
    for rec in curves:
        d = _record_dict(rec)
        step = int(d["iteration"])
        for f in CURVE_FIELDS:
            v = _metric_value(d.get(f))
            if v is not None:
                out.append(Metric(f"curve/{f}", v, now, step))
        cum = _metric_value(d.get("cumulative_flops"))
        if budget and cum is not None:
            out.append(Metric("curve/budget_fraction", cum / budget, now, step))
        for k, v in (d.get("train") or {}).items():
            v = _metric_value(v)
            if v is not None:
                out.append(Metric(mlflow_key(f"train/{k}"), v, now, step))
    return out


def _chunks(items: Sequence[Any], n: int) -> Iterable[list[Any]]:
    """Chunks of at most ``n`` items and about ``_BATCH_BYTES`` of keys and values."""
    chunk: list[Any] = []
    size = 0
    for it in items:
        s = len(str(getattr(it, "key", ""))) + len(str(getattr(it, "value", ""))) + 64
        if chunk and (len(chunk) >= n or size + s > _BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(it)
        size += s
    if chunk:
        yield chunk


__all__ = ["CURVE_FIELDS", "DEFAULT_TRACKING_URI", "EXPERIMENT_KIND", "FIDELITIES", "STATES", "StudyTracker",
           "TrackingError", "mlflow_key", "result_metrics"]
