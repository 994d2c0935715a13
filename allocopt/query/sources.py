"""Where query rows come from: an Optuna study's storage, or MLflow experiments across studies.

:func:`load_rows_from_study` and :func:`load_rows_from_mlflow` give :class:`allocopt.record.TrialRow`
(the queries of :mod:`allocopt.query.pareto` and the report read those); :func:`resolve_tracking_uri`
is the MLflow store they and the report's artifact logging use. A store that cannot be opened,
an unknown study or experiment raise :class:`allocopt.query.pareto.QueryError` with one line.

Optuna and MLflow are imported inside the functions; no torch.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from allocopt.query.pareto import ALLOCATION, TARGET_KEYS, QueryError, _finite
from allocopt.record import TrialRow, records
from allocopt.tracking.layout import (CURVE_PREFIX, EXPERIMENT_PREFIX, ROLE_TRIAL, TAG_ERROR, TAG_FIDELITY,
                                      TAG_ROLE, TAG_STATE, TAG_STUDY, TAG_TRIAL)


def missing_sqlite_file(url: str) -> str | None:
    """The absolute path a ``sqlite:///path`` URL names when no file is there (opening it would
    create an empty one), else ``None`` (the file exists, in memory, or not SQLite)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and ":memory:" not in url and not os.path.exists(url[len(prefix):]):
        return os.path.abspath(url[len(prefix):])
    return None


def _check_sqlite(url: str, what: str) -> None:
    """A ``sqlite:///path`` URL must name an existing file (:func:`missing_sqlite_file`)."""
    missing = missing_sqlite_file(url)
    if missing:
        raise QueryError(f"{what}={url!r}: no such database file ({missing}); run where "
                         f"the study was made, or give --{what.replace('_', '-')} with its file")


def study_names(storage: str) -> list[str]:
    """The names of the Optuna studies in ``storage``, sorted (nothing is created).

    Raises:
        QueryError: the storage cannot be opened (a missing SQLite file, a bad URL, an
            unreachable server, a missing driver).
    """
    _check_sqlite(storage, "storage")
    from allocopt.errors import StorageError
    from allocopt.store.connect import check_storage_url

    try:
        check_storage_url(storage)  # an in-memory or another tool's SQLite database: one line
    except StorageError as e:
        raise QueryError(str(e)) from None
    import optuna  # only once the URL is known to be usable: a refusal imports nothing heavy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return sorted(s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False))
    except Exception as e:  # bad URL, unreachable server, missing driver
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        from allocopt.redact import redact_url

        raise QueryError(f"storage={redact_url(storage)!r}: cannot be opened ({redact_url(msg)})") from None


def open_study_for_query(storage: str, study_name: str) -> Any:
    """The Optuna study ``study_name`` in ``storage``, loaded (never created), with what
    stopped workers left settled first (:func:`allocopt.store.settle.reconcile_on_open`; best
    effort: a store that cannot be written is read as it is).

    Raises:
        QueryError: the storage cannot be opened or has no such study (the message lists the
            studies it has).
    """
    names = study_names(storage)
    import optuna

    if study_name not in names:
        from allocopt.redact import redact_url

        raise QueryError(f"study={study_name!r}: not found in {redact_url(storage)}; known: {', '.join(names) or 'none'}")
    try:  # settle what stopped workers left, as every opening does (best effort: a read-only
        from allocopt.store.handles import register  # store is still read)
        from allocopt.store.settle import reconcile_on_open
        from allocopt.store.connect import make_storage

        store = make_storage(storage)
        study = optuna.load_study(study_name=study_name, storage=store)
        register(study, store)
        reconcile_on_open(study)
        return study
    except Exception:  # noqa: BLE001 - the query reads what is there
        return optuna.load_study(study_name=study_name, storage=storage)


def load_rows_from_study(storage: str, study_name: str) -> list[TrialRow]:
    """Every trial of an Optuna study as a :class:`~allocopt.record.TrialRow` (:func:`rows_of_study`).

    Raises:
        QueryError: the storage cannot be opened or has no such study (the message lists the
            studies it has).
    """
    return rows_of_study(open_study_for_query(storage, study_name))


def rows_of_study(st: Any) -> list[TrialRow]:
    """Every trial of a loaded Optuna study ``st`` (any storage, in-memory too) as a
    :class:`~allocopt.record.TrialRow` (read through :class:`allocopt.record.TrialRecord`).

    Dimensions the study kept fixed are filled into ``params`` from the trial's plan or the
    study's spec; ``fidelity`` is the record's (:func:`allocopt.record.fidelity_of`);
    ``plan`` is the trial's plan with ``budget_flops`` (the trial's own budget).
    """
    study_name = st.study_name
    space = (st.user_attrs.get("spec") or {}).get("space") or {}
    fixed = {"rho": (space.get("rho") or [None])[0], "group_size": (space.get("group_sizes") or [None])[0],
             "reward": (space.get("rewards") or [None])[0], "model": (space.get("models") or [None])[0]}
    recs = records(st)
    if fixed["model"] is None:  # no models searched: every trial trains the objective's own policy
        fixed["model"] = next((m for rec in recs if (m := rec.plan.get("model"))), None)
    out = []
    for rec in recs:
        r = rec.row()
        plan = rec.plan_with_budget
        params = dict(r.params)
        for k in ALLOCATION:
            if params.get(k) is None:
                params[k] = plan.get(k, fixed[k])
        metrics = {k: float(v) for k, v in r.metrics.items()
                   if k != "value" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        out.append(TrialRow(r.number, r.state, params, {k: float(v) for k, v in r.targets.items()}, metrics,
                            r.error, fidelity=r.fidelity, study=study_name, plan=plan, source=r.source))
    return out


def resolve_tracking_uri(uri: str | None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``; SQLite paths made absolute."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + os.path.abspath(uri[len(prefix):])
    return uri


def load_rows_from_mlflow(experiments: Sequence[str], tracking_uri: str | None = None) -> list[TrialRow]:
    """Every trial run of some MLflow experiments as a :class:`~allocopt.record.TrialRow`
    (across studies).

    Layout (:mod:`allocopt.tracking.layout`): experiment ``allocopt/<study>``, nested trial runs
    with tags ``allocopt.role=trial``, ``allocopt.trial_number``, ``allocopt.state``,
    ``allocopt.fidelity``, ``allocopt.study``; params ``rho``, ``group_size``, ``reward``,
    ``model`` (strings); metrics: targets (``pass_at_1``, ...) and the breakdown. Metrics with
    target keys become ``targets``, the rest ``metrics``; params other than the allocation
    become ``plan``.

    Args:
        experiments: experiment names; a study name ``S`` also finds ``allocopt/S``.
        tracking_uri: see :func:`resolve_tracking_uri`.

    Raises:
        QueryError: the store cannot be opened or an experiment does not exist (the message
            lists the experiments it has).
    """
    from mlflow import MlflowClient

    uri = resolve_tracking_uri(tracking_uri)
    _check_sqlite(uri, "mlflow_uri")
    from allocopt.redact import redact_url
    from allocopt.tracking.requests import short_mlflow_requests, short_reason

    try:
        client = MlflowClient(tracking_uri=uri)
        with short_mlflow_requests():
            all_exps = {e.name: e for e in client.search_experiments()}
    except Exception as e:  # noqa: BLE001 - bad URI, unreachable server
        raise QueryError(f"mlflow_uri={redact_url(uri)!r}: cannot be opened ({short_reason(e)})") from None
    out: list[TrialRow] = []
    for name in experiments:
        exp = all_exps.get(name) or all_exps.get(f"{EXPERIMENT_PREFIX}{name}")
        if exp is None:
            raise QueryError(f"experiment={name!r}: not found in {redact_url(uri)}; known: "
                             f"{', '.join(sorted(all_exps)) or 'none'}")
        token = None
        runs = []
        while True:
            page = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'",
                                      max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
        study = exp.name.removeprefix(EXPERIMENT_PREFIX)
        for run in runs:
            out.append(_mlflow_row(run, study))
    out.sort(key=lambda r: (r.study, r.number))
    return out


def _mlflow_row(run: Any, study: str) -> TrialRow:
    tags, params, metrics = run.data.tags, dict(run.data.params), dict(run.data.metrics)
    alloc: dict[str, Any] = {k: params.pop(k, None) for k in ALLOCATION}
    for k, cast in (("rho", float), ("group_size", int)):
        try:
            alloc[k] = cast(float(alloc[k])) if cast is int else cast(alloc[k])
        except (TypeError, ValueError):
            pass
    targets = {k: float(v) for k, v in metrics.items() if k in TARGET_KEYS}
    rest = {k: float(v) for k, v in metrics.items() if k not in TARGET_KEYS and not k.startswith(CURVE_PREFIX)}
    plan: dict[str, Any] = {}
    for k, v in params.items():
        plan[k] = float(v) if _finite(v) and k != "objective" else v
    try:
        num = int(tags.get(TAG_TRIAL, "-1"))
    except ValueError:
        num = -1
    return TrialRow(num, tags.get(TAG_STATE, run.info.status), alloc, targets, rest,
                    tags.get(TAG_ERROR), fidelity=tags.get(TAG_FIDELITY, "full"),
                    study=tags.get(TAG_STUDY, study), plan=plan, run_id=run.info.run_id,
                    source=params.get("source"))


__all__ = ["load_rows_from_mlflow", "load_rows_from_study", "open_study_for_query", "resolve_tracking_uri",
           "rows_of_study"]
