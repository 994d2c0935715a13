"""MLflow keys, values and limits of :mod:`allocopt.tracking` (its docstring: "Keys, values and
limits", "Curves"): key sanitizing, params as strings, finite metrics, tag cutting, curve
points as metrics, batches within MLflow's limits. Standard library only (``mlflow.entities``
is imported inside the curve builder).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any, Iterable, Mapping, Sequence

STATES = ("COMPLETE", "FAIL", "INFEASIBLE")
"""Trial states :meth:`StudyTracker.finish_trial` accepts."""
from allocopt.plan.allocation import FIDELITIES  # noqa: E402,F401  (defined there)
from allocopt.vocabulary import metric_key  # noqa: E402
CURVE_FIELDS = ("cumulative_flops", "executed_flops", "reward_mean", "rows_trained", "wall_seconds")
"""Fields of one curve point (``IterationRecord``), besides ``iteration``."""
EXPECTED_GPU_HOURS = "expected_gpu_hours"
"""Metric of a finished trial under a time budget: GPU-hours the trial's
plan is expected to take at the study's throughput profile (:meth:`allocopt.plan.throughput.TimeBudget.hours_of`)."""
GPU_HOURS = "gpu_hours"
"""Metric of a finished trial under a time budget: its measured GPU-hours, the training phases'
wall seconds times the GPUs (:func:`allocopt.plan.throughput.measured_gpu_hours`)."""
BUDGET_GPU_HOURS = "budget_gpu_hours"
"""Param of a trial run under a time budget: the study's GPU-hours per trial."""
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

EXPERIMENT_PREFIX = "allocopt/"
"""A study's experiment is ``allocopt/<study>``."""
TAG_STUDY = "allocopt.study"
TAG_ROLE = "allocopt.role"
ROLE_STUDY = "study"
"""``allocopt.role`` of a study's parent run."""
ROLE_TRIAL = "trial"
"""``allocopt.role`` of a trial's nested run."""
TAG_TRIAL = "allocopt.trial_number"
TAG_STATE = "allocopt.state"
TAG_OBJECTIVE = "allocopt.objective"
TAG_FIDELITY = "allocopt.fidelity"
TAG_ERROR = "allocopt.error"
TAG_SKIPPED = "allocopt.skipped_metrics"
TAG_PARENT = "mlflow.parentRunId"
TAG_SUMMARY_STEP = "allocopt.summary_step"
"""The parent run's count of study summaries logged (the next summary's step)."""
TAG_RECOMMENDED = "allocopt.recommended."
"""Prefix of the parent run's recommended-allocation tags (``allocopt.recommended.rho``, ...)."""
METRIC_RECOMMENDED = "recommended_"
"""Prefix of the parent run's recommendation metrics (``recommended_mean``, ...)."""
CURVE_PREFIX = "curve/"
"""Prefix of a trial run's curve metrics (``curve/cumulative_flops``, ...)."""
PARAM_TARGET = "target"
"""The parent run's (and a trial run's) param naming the study's target(s)."""

_STATUS = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "INFEASIBLE": "FINISHED"}


from allocopt.errors import TrackingError  # noqa: E402,F401  (defined there; imported from here too)


# ============================================================================ keys, values
def mlflow_key(name: str) -> str:
    """A name MLflow accepts as a param, metric or tag key, readable and stable.

    ``@`` -> ``_at_``; ``:``, spaces and every other character outside ``[A-Za-z0-9_.-/]`` ->
    ``_``; empty, ``.`` and ``..`` path segments are dropped or replaced (MLflow rejects names
    that a file system would normalize); at most 250 characters.

    >>> mlflow_key("pass@1:gsm8k")
    'pass_at_1_gsm8k'
    """
    key = metric_key(str(name))
    parts = ["_" if p in (".", "..") else p for p in key.split("/") if p]
    key = "/".join(parts) or "_"
    return key[:MAX_KEY_LENGTH]


def trial_run_name(number: int, params: Mapping[str, Any], fidelity: str = "full") -> str:
    """The MLflow run name of trial ``number``: its allocation, readable as the runs table opens.

    MLflow's runs table opens with no metric or param columns (the column choice is kept per
    browser), so the name carries the allocation: ``trial-41 dense ρ0.56 G4``; a pilot is
    ``trial-3 pilot sparse ρ0.20 G2``. Parts the params lack are left out (``trial-7`` when
    none is there); a ``model`` that is not the only one is not known here, so it is not named.

    Args:
        number: Optuna's trial number.
        params: the trial's params (``reward``, ``rho`` in [0, 1], ``group_size``).
        fidelity: ``full`` or ``pilot``.

    Returns:
        The name (at most ~40 characters for the space's values).
    """
    parts = [f"trial-{int(number)}"]
    if fidelity == "pilot":
        parts.append("pilot")
    reward, rho, g = params.get("reward"), params.get("rho"), params.get("group_size")
    if reward is not None:
        parts.append(str(reward))
    try:
        if rho is not None:
            parts.append(f"ρ{float(rho):.2f}")
    except (TypeError, ValueError):
        pass
    try:
        if g is not None:
            parts.append(f"G{int(g)}")
    except (TypeError, ValueError):
        pass
    return " ".join(parts)


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


def _curve_metrics(curves: Iterable[Any], budget: float | None, now: int) -> list[Any]:
    from mlflow.entities import Metric

    out = []
    for rec in curves:
        d = _record_dict(rec)
        step = int(d["iteration"])
        for f in CURVE_FIELDS:
            v = _metric_value(d.get(f))
            if v is not None:
                out.append(Metric(f"{CURVE_PREFIX}{f}", v, now, step))
        cum = _metric_value(d.get("cumulative_flops"))
        if budget and cum is not None:
            out.append(Metric(f"{CURVE_PREFIX}budget_fraction", cum / budget, now, step))
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
