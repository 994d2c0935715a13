"""The study's report logged into its MLflow parent run: what ``allocopt study`` does at its
end, and ``allocopt report --study NAME --mlflow-run parent`` by hand.

Optuna, MLflow and matplotlib are imported inside functions.
"""

from __future__ import annotations

import tempfile
from typing import Optional

from allocopt.query.pareto import QueryError, filter_rows, measured_targets
from allocopt.query.report_data import study_context
from allocopt.query.sources import load_rows_from_study, open_study_for_query
from allocopt.query.stored import parent_run_id


def report_into_parent(study_name: str, storage: str, mlflow_uri: Optional[str]) -> str:
    """Write the study's report (the allocation frontier per target, the compute breakdown,
    the Pareto front, RACE's regime table and the recommendation: PNGs and ``report.html``)
    into a temporary folder and log it as artifacts ``report/`` of the study's MLflow parent
    run. The targets plotted are the study's own, then every other one its trials measured;
    all trials, pilots marked.

    Args:
        study_name: the Optuna study (and MLflow experiment ``allocopt/<study_name>``).
        storage: its Optuna storage URL.
        mlflow_uri: MLflow tracking URI (``None``: ``$MLFLOW_TRACKING_URI``, else
            ``sqlite:///mlflow.db``).

    Returns:
        the parent run's id.

    Raises:
        QueryError: the study or its parent run cannot be read, or no complete trial measured
            a target (nothing to plot).
    """
    from allocopt.query.report import write_report  # looked up at call time (tests replace it)

    rows = filter_rows(load_rows_from_study(storage, study_name), [])
    context = study_context(open_study_for_query(storage, study_name))
    measured = measured_targets(rows)
    own = [k for k in context.targets if k in measured]
    keys = own + [k for k in measured if k not in own]
    if not keys:
        raise QueryError(f"targets: no complete trial of study {study_name} measured a target yet; "
                         "nothing to plot")
    run_id = parent_run_id(study_name, mlflow_uri)
    with tempfile.TemporaryDirectory() as tmp:
        write_report(rows, tmp, title=f"Study {study_name}", targets=keys, context=context,
                     run_id=run_id, tracking_uri=mlflow_uri)
    return run_id
