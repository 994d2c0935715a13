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
* **Trial runs**, nested (tag ``mlflow.parentRunId``), named by their allocation
  (:func:`~allocopt.tracking.layout.trial_run_name`: ``trial-41 dense ρ0.56 G4``, ``trial-3 pilot
  sparse ρ0.20 G2`` for a pilot, ``infeasible`` put first for a plan the budget cannot buy: MLflow's runs
  table shows every ended run with the same check, and cuts long names), tags
  ``allocopt.study``, ``allocopt.role=trial``, ``allocopt.trial_number``, ``allocopt.state``
  (``RUNNING``, then ``COMPLETE``, ``FAIL`` or ``INFEASIBLE``), ``allocopt.objective``,
  ``allocopt.fidelity`` (``full`` or ``pilot``) and any caller tag (a key without a dot gets the
  ``allocopt.`` prefix). MLflow status: FAILED for ``FAIL``, FINISHED otherwise, KILLED for a
  trial still open when the tracker closes.

Keys, values and limits
=======================

Every param, metric and tag key passes :func:`mlflow_key`: ``@`` becomes ``_at_``, ``:`` and any
character MLflow (or Windows) rejects becomes ``_`` (``pass@1:gsm8k`` -> ``pass_at_1_gsm8k``),
at most 250 characters. Nested dicts are flattened
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
:func:`result_metrics` builds that dict from a :class:`allocopt.grpo.driver.TrialResult`.

Curves
======

MLflow steps are 64-bit integers and FLOP counts reach 1e19 and more, so FLOPs are never a
step. Each curve point (a :class:`allocopt.plan.meter.IterationRecord` or a dict with the same
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

Modules
=======

:mod:`~allocopt.tracking.layout` (keys, values, limits, curve metrics; standard library),
:mod:`~allocopt.tracking.tracker` (:class:`StudyTracker`: store, experiment, parent run),
:mod:`~allocopt.tracking.trials` (the trial runs), :mod:`~allocopt.tracking.reconcile` (runs a
stopped worker left RUNNING, ended to match Optuna: on another worker's stale-heartbeat
callback and when a tracker closes), :mod:`~allocopt.tracking.lifecycle` (the tracker's
lifecycle: the store probed, the tracker made, work run with it, the tracker closed).
"""

from allocopt.tracking.layout import (CURVE_FIELDS, DEFAULT_TRACKING_URI, EXPERIMENT_KIND, FIDELITIES, STATES,
                                    TrackingError, mlflow_key, result_metrics)
from allocopt.tracking.tracker import StudyTracker, runs_view_url

__all__ = ["CURVE_FIELDS", "DEFAULT_TRACKING_URI", "EXPERIMENT_KIND", "FIDELITIES", "STATES", "StudyTracker",
           "TrackingError", "mlflow_key", "result_metrics", "runs_view_url"]
