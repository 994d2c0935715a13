"""Trial runs of :mod:`allocopt.tracking`: one nested MLflow run per trial, opened with its
params (:meth:`TrialRuns.start_trial`) and ended with its outcome, metrics, curves, plan and
error (:meth:`TrialRuns.finish_trial`; every part tried on its own, the run ended in any case),
and the batched writes every run of the tracker uses.

A mixin of :class:`allocopt.tracking.StudyTracker`, which provides ``client``,
``experiment_id``, ``parent_run_id``, ``study_name``, ``_open`` and ``_check_parent``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Mapping, Sequence

from allocopt.tracking.layout import (_BATCH_METRICS, _BATCH_PARAMS_TAGS, FIDELITIES, ROLE_TRIAL, STATES,
                                    TAG_ERROR, TAG_FIDELITY, TAG_OBJECTIVE, TAG_PARENT, TAG_ROLE, TAG_SKIPPED,
                                    TAG_STATE, TAG_STUDY, TAG_TRIAL, TrackingError, _chunks,
                                    _curve_metrics, _cut, _metric_value, _param_value, _sanitized,
                                    mlflow_key)

_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "INFEASIBLE": "FINISHED"}


class TrialRuns:
    """Writing runs: batched params, tags and metrics; the trials' nested runs."""

    client: Any
    experiment_id: str
    parent_run_id: str
    study_name: str
    _open: dict[str, dict[str, Any]]

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
                    TAG_ROLE: ROLE_TRIAL, TAG_TRIAL: str(int(number)), TAG_STATE: "RUNNING",
                    TAG_OBJECTIVE: objective, TAG_FIDELITY: fidelity}
        for k, v in tags.items():
            all_tags[k if "." in k else f"allocopt.{k}"] = v
        all_tags = {mlflow_key(k): _cut(str(v)) for k, v in all_tags.items()}
        first = dict(list(all_tags.items())[:_BATCH_PARAMS_TAGS])
        # the runs table shows names and a green check for every ended run: the name says pilot
        name = f"trial-{int(number)}" + (" pilot" if fidelity == "pilot" else "")
        run = self.client.create_run(self.experiment_id, run_name=name, tags=first)
        run_id = run.info.run_id
        self._open[run_id] = {"params": {}, "number": int(number), "name": name}
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
        if st == "INFEASIBLE":  # ends FINISHED like a complete run: the name says it never ran
            name = (self._open.get(run_id) or {}).get("name")
            attempt("name", lambda: self.client.update_run(
                run_id, name=f"infeasible {name or self.client.get_run(run_id).info.run_name}"))
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
