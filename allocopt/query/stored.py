"""What a study stored for its queries: its targets, its answer and its MLflow parent run.

The defaults of ``allocopt best`` / ``pareto`` / ``report`` (:mod:`allocopt.cli.query`)
read these: the Optuna study's user attributes (``spec``, ``recommendation``) and metric
names, or, for one ``--from-mlflow`` experiment, its parent run (tag ``allocopt.role=study``).
Errors are :class:`allocopt.query.pareto.QueryError` (one line, exit 2).
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

from allocopt.query.pareto import QueryError
from allocopt.tracking.layout import (EXPERIMENT_PREFIX, METRIC_RECOMMENDED, PARAM_TARGET, ROLE_STUDY,
                                      TAG_RECOMMENDED, TAG_ROLE, TAG_STUDY)


def stored_vocabulary(study: Optional[str], storage: str, from_mlflow: Optional[List[str]],
                      mlflow_uri: Optional[str]) -> Any:
    """The :class:`~allocopt.vocabulary.Vocabulary` the study was run with (its stored spec's, or
    for one ``--from-mlflow`` experiment its parent run's ``spec.json``); the built-ins when
    none is stored or it cannot be read."""
    from allocopt.errors import ConfigError
    from allocopt.vocabulary import Vocabulary

    data: Any = None
    if study:
        from allocopt.query.sources import open_study_for_query

        data = (open_study_for_query(storage, study).user_attrs.get("spec") or {}).get("vocabulary")
    else:
        for run in parent_runs(from_mlflow, mlflow_uri):
            data = _spec_artifact(run, mlflow_uri).get("vocabulary")
            if data:
                break
    try:
        return Vocabulary.of(data if isinstance(data, dict) else None)
    except ConfigError:
        return Vocabulary()


def _spec_artifact(run: Any, mlflow_uri: Optional[str]) -> dict:
    """A parent run's ``spec.json`` (:meth:`allocopt.tracking.tracker.StudyTracker.log_spec`);
    ``{}`` when it cannot be read."""
    import os
    import tempfile

    from mlflow import MlflowClient

    from allocopt.tracking.tracker import _resolve_uri

    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one small file: no bar on stderr
    try:
        client = MlflowClient(_resolve_uri(mlflow_uri))
        path = client.download_artifacts(run.info.run_id, "spec.json", tempfile.mkdtemp(prefix="allocopt-spec-"))
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except Exception:  # noqa: BLE001 - a missing or unreadable artifact: the built-ins
        return {}


def stored_targets(study: Optional[str], storage: str, from_mlflow: Optional[List[str]],
                    mlflow_uri: Optional[str]) -> list[str]:
    """The targets the study was run for, as spelled for people (``pass@1``): the stored spec
    (user attribute ``spec``, as ``report`` reads it), else the objectives' names
    (``study.metric_names``, set by ``allocopt study``); for one ``--from-mlflow`` experiment its
    parent run's ``target`` param. ``[]`` when nothing is stored."""
    vocab = stored_vocabulary(study, storage, from_mlflow, mlflow_uri)
    known = {t.name for t in vocab.targets}
    if study:
        from allocopt.query.sources import open_study_for_query

        st = open_study_for_query(storage, study)
        stored = (st.user_attrs.get("spec") or {}).get("target")
        names = [stored] if isinstance(stored, str) else list(stored or []) or list(st.metric_names or [])
    else:
        raw = next((r.data.params[PARAM_TARGET] for r in parent_runs(from_mlflow, mlflow_uri)
                    if r.data.params.get(PARAM_TARGET)), "")
        try:
            names = json.loads(raw) if raw.startswith("[") else [raw] if raw else []
        except ValueError:
            names = []
    return [str(n) for n in names if n in known]


def stored_target(study: Optional[str], storage: str, from_mlflow: Optional[List[str]],
                   mlflow_uri: Optional[str]) -> str:
    """``best``'s target when ``--target`` is not given: the study's one stored target.

    Raises:
        QueryError: none stored (several ``--from-mlflow`` experiments, a study run elsewhere) or
            several (a multi-objective study: ``best`` of which one is a choice, ``pareto`` shows
            the trade-off).
    """
    names = stored_targets(study, storage, from_mlflow, mlflow_uri)
    if len(names) == 1:
        return names[0]
    where = f"study {study}" if study else f"MLflow {', '.join(from_mlflow or [])}"
    if names:
        raise QueryError(f"--target: not given, and {where} has {len(names)} targets ({', '.join(names)}); give "
                       "--target one of them, or see them together with `allocopt pareto`")
    raise QueryError(f"--target: not given, and {where} stores no target; give --target (native_reward, pass@1, "
                   "pass@1:gsm8k, pass@1:math500, judge or a field such as total_flops)")


def stored_objectives(study: Optional[str], storage: str, from_mlflow: Optional[List[str]],
                       mlflow_uri: Optional[str]) -> list[str]:
    """``pareto``'s objectives when ``--objectives`` is not given: the study's stored targets.

    Raises:
        QueryError: fewer than two stored.
    """
    names = stored_targets(study, storage, from_mlflow, mlflow_uri)
    if len(names) >= 2:
        return names
    where = f"study {study}" if study else f"MLflow {', '.join(from_mlflow or [])}"
    has = f"one target ({names[0]})" if names else "no target"
    raise QueryError(f"objectives: not given, and {where} stores {has}; give --objectives with two or more, "
                   "e.g. pass@1,judge or judge,total_flops")


def parent_runs(from_mlflow: Optional[List[str]], mlflow_uri: Optional[str]) -> list[Any]:
    """The study's parent runs (tag ``allocopt.role=study``, at most 5) of the one
    ``--from-mlflow`` experiment; ``[]`` for several experiments or none found."""
    if not from_mlflow or len(from_mlflow) != 1:
        return []
    from mlflow import MlflowClient

    from allocopt.tracking.requests import short_mlflow_requests
    from allocopt.tracking.tracker import _resolve_uri

    name = from_mlflow[0] if from_mlflow[0].startswith(EXPERIMENT_PREFIX) else f"{EXPERIMENT_PREFIX}{from_mlflow[0]}"
    with short_mlflow_requests():
        client = MlflowClient(_resolve_uri(mlflow_uri))
        exp = client.get_experiment_by_name(name)
        runs = [] if exp is None else client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_STUDY}'", max_results=5)
    return list(runs)


def stored_recommendation(study: Optional[str], storage: str, from_mlflow: Optional[List[str]],
                    mlflow_uri: Optional[str]) -> dict | None:
    """The study's recommendation (:func:`allocopt.answer.recommendation_dict`, stored by a RACE
    study): the Optuna study's user attribute ``recommendation``, or for one ``--from-mlflow``
    experiment its parent run's ``allocopt.recommended.*`` tags and ``recommended_*`` metrics.
    ``None`` when there is none (plain BO, several experiments, nothing recorded yet)."""
    if study:
        import optuna

        return optuna.load_study(study_name=study, storage=storage).user_attrs.get("recommendation")
    for run in parent_runs(from_mlflow, mlflow_uri):
        tags, metrics = run.data.tags, run.data.metrics
        a = {k[len(TAG_RECOMMENDED):]: v for k, v in tags.items() if k.startswith(TAG_RECOMMENDED)}
        if {"rho", "group_size", "reward"} <= set(a):
            rec: dict[str, Any] = {"allocation": {"rho": float(a["rho"]), "group_size": int(a["group_size"]),
                                                  "reward": a["reward"], **({"model": a["model"]} if a.get("model") else {})}}
            for k in ("mean", "lower", "upper", "level", "prob_best"):
                if f"{METRIC_RECOMMENDED}{k}" in metrics:
                    rec[k] = metrics[f"{METRIC_RECOMMENDED}{k}"]
            spec = run.data.params.get(PARAM_TARGET)
            if spec:
                rec["target"] = spec
            return rec
    return None


def parent_run_id(study: Optional[str], mlflow_uri: Optional[str]) -> str:
    """The run id of ``study``'s parent run in its MLflow experiment ``allocopt/<study>`` (the
    latest, when workers made several). Raises :class:`QueryError` (one line) when there is none."""
    if not study:
        raise QueryError("mlflow_run='parent': needs --study (the study whose parent run gets the report)")
    from allocopt.tracking.requests import short_mlflow_requests
    from allocopt.tracking.tracker import _resolve_uri

    from allocopt.redact import redact_url

    uri = _resolve_uri(mlflow_uri)
    try:
        from mlflow import MlflowClient

        with short_mlflow_requests():
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(f"{EXPERIMENT_PREFIX}{study}")
            runs = [] if exp is None else client.search_runs(
                [exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_STUDY}'", max_results=100)
    except Exception as e:  # noqa: BLE001 - unreachable server, unreadable store
        from allocopt.tracking.requests import short_reason

        raise QueryError(f"mlflow_uri={redact_url(uri)!r}: cannot be read ({short_reason(e)})") from None
    runs = [r for r in runs if r.data.tags.get(TAG_STUDY) == study]
    if not runs:
        raise QueryError(f"mlflow_run='parent': study {study!r} has no parent run in {redact_url(uri)} (run it with MLflow on, or give --mlflow-uri)")
    return max(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id)).info.run_id


__all__ = ["parent_run_id", "parent_runs", "stored_objectives", "stored_recommendation",
           "stored_target", "stored_targets", "stored_vocabulary"]


def check_run_id(run_id: str, mlflow_uri: Optional[str]) -> str:
    """``run_id`` if the MLflow store at ``mlflow_uri`` has that run (a bounded request).

    Raises:
        QueryError: no such run, or the store cannot be read (one line).
    """
    from allocopt.tracking.requests import short_mlflow_requests
    from allocopt.tracking.tracker import _resolve_uri

    uri = _resolve_uri(mlflow_uri)
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        with short_mlflow_requests():
            MlflowClient(tracking_uri=uri).get_run(run_id)
    except MlflowException as e:
        if "RESOURCE_DOES_NOT_EXIST" in str(getattr(e, "error_code", "")) or "not found" in str(e).lower() \
                or "No run" in str(e) or "INVALID_PARAMETER_VALUE" in str(getattr(e, "error_code", "")):
            raise QueryError(f"mlflow_run={run_id!r}: no such run in {uri}; give a run id from "
                             "`mlflow runs list` or 'parent'") from None
        raise QueryError(f"mlflow_uri={uri!r}: cannot be read ({str(e).splitlines()[0][:200]})") from None
    except Exception as e:  # noqa: BLE001 - unreachable server, unreadable store
        raise QueryError(f"mlflow_uri={uri!r}: cannot be read ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})") from None
    return run_id
