"""Pieces the CLI commands share: the objective and the MLflow tracker, with one-line errors.

Kept apart from :mod:`allocopt.cli` so that command modules (``commands_race``) can use them
without importing ``allocopt.cli`` twice under ``python -m allocopt.cli``.
"""

from __future__ import annotations

from typing import Any

from allocopt.flops import ConfigError


def load_objective(name: str, settings: dict | None = None) -> Any:
    """The objective ``name`` with its settings, ready to run on this machine.

    Raises:
        ConfigError: unknown objective, bad settings, or the objective cannot run here (the
            message says what to use instead).
    """
    from objectives import get_objective

    try:
        obj = get_objective(name, **(settings or {}))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"objective_settings for objective={name!r}: {str(e).splitlines()[0]}"
                          if isinstance(e, TypeError) else str(e).splitlines()[0]) from None
    from allocopt.objective import ObjectiveUnavailable

    try:
        obj.check_available()
    except ObjectiveUnavailable as e:
        raise ConfigError(str(e)) from None
    return obj


def make_tracker(study_name: str, mlflow_uri: str | None, enabled: bool = True) -> Any:
    """An :class:`allocopt.tracking.StudyTracker`, or ``None`` when tracking is off.

    Raises:
        ConfigError: the tracking URI cannot be used (unsupported scheme, unreachable server).
    """
    if not enabled:
        return None
    from allocopt.tracking import StudyTracker

    try:
        return StudyTracker(study_name, tracking_uri=mlflow_uri)
    except Exception as e:
        from allocopt.storage import redact_url

        raise ConfigError(f"mlflow_uri={redact_url(mlflow_uri)!r}: cannot be used "
                          f"({redact_url(str(e).splitlines()[0][:200])})") from None
