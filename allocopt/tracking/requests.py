"""Bounded MLflow requests: a first request to an unreachable tracking server fails in seconds.

Standard library only (MLflow reads the environment variables set here).
"""

from __future__ import annotations

from typing import Any

PROBE_TIMEOUT_S = 5
"""Seconds the first request to an MLflow server may take (``MLFLOW_HTTP_REQUEST_TIMEOUT``
for the probe, with ``MLFLOW_HTTP_REQUEST_MAX_RETRIES = 0``), unless those are set already."""


class short_mlflow_requests:
    """Within the block, MLflow's HTTP requests time out after :data:`PROBE_TIMEOUT_S` and are
    not retried (``MLFLOW_HTTP_REQUEST_TIMEOUT``, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``), unless
    the user set those variables: a first request to an unreachable server fails in seconds,
    not after MLflow's default 7 retries with backoff (minutes)."""

    NAMES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(PROBE_TIMEOUT_S)}

    def __enter__(self) -> None:
        import os

        self.saved = {k: os.environ.get(k) for k in self.NAMES}
        for k, v in self.NAMES.items():
            os.environ.setdefault(k, v)

    def __exit__(self, *exc: Any) -> None:
        import os

        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def short_reason(e: BaseException) -> str:
    """The telling part of an MLflow / SQLAlchemy / requests error, at most 200 characters, any
    URL in it with its password redacted (``Connection refused``, ``Read timed out``, ...)."""
    import re

    from allocopt.redact import redact_url

    text = str(e)
    for pattern in (r"\(\w+(?:\.\w+)*Error\) ([^\n]+)",  # (sqlite3.OperationalError) attempt to write...
                    r"(Connection refused)", r"(Read timed out)", r"(Name or service not known)",
                    r"(Failed to establish a new connection)", r"(Max retries exceeded)"):
        m = re.search(pattern, text)
        if m:
            return redact_url(m.group(1)[:200])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return redact_url((lines[0] if lines else type(e).__name__)[:200])
