"""Bounded MLflow requests: a first request to an unreachable tracking server fails in seconds.

Standard library only (MLflow reads the environment variables set here); a local store is
checked for writing before MLflow is asked (:func:`local_store_problem`).
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

    from allocopt.errors import short_error
    from allocopt.redact import redact_url

    text = str(e)
    for pattern in (r"\(\w+(?:\.\w+)*Error\) ([^\n]+)",  # (sqlite3.OperationalError) attempt to write...
                    r"(Connection refused)", r"(Read timed out)", r"(Name or service not known)",
                    r"(Failed to establish a new connection)", r"(Max retries exceeded)"):
        m = re.search(pattern, text)
        if m:
            return redact_url(short_error(m.group(1), 200))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return redact_url(short_error(lines[0], 200) if lines else type(e).__name__)


def local_store_problem(uri: str) -> str | None:
    """Why the local MLflow store ``uri`` cannot be written, in a few words, or ``None``.

    Checked before MLflow is asked, in milliseconds: MLflow retries opening a SQLite store
    whose folder is read-only ten times with backoff (``create_sqlalchemy_engine_with_retry``,
    about 110 s) before it fails. ``sqlite:///<path>``: the file, when it exists, opens for
    writing, and a file can be made in its folder (SQLite writes a journal there) or in the
    nearest existing folder above it (MLflow makes the missing ones). ``file:`` stores and plain
    paths: MLflow 3 refuses them unless ``MLFLOW_ALLOW_FILE_STORE=true``; with it, the folder
    is checked as above. Servers (``http(s)://``, ``databricks``) and in-memory SQLite:
    ``None`` (their probe is a bounded request).

    >>> local_store_problem("http://127.0.0.1:5000") is None
    True
    """
    import os
    import tempfile
    from urllib.parse import unquote, urlparse

    if uri.startswith("sqlite:///"):
        if ":memory:" in uri:
            return None
        path = uri[len("sqlite:///"):].split("?", 1)[0]
        path = path if path.startswith("/") else os.path.abspath(path)
        folder = os.path.dirname(path) or "."
    elif uri.startswith("file:") or "://" not in uri:
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
            return ("MLflow 3 refuses file stores: use sqlite:///<folder>/mlflow.db, or set "
                    "MLFLOW_ALLOW_FILE_STORE=true")
        folder = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        path = None
    else:
        return None
    existing = os.path.abspath(folder)
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            return f"{existing} is not a folder"
        existing = os.path.dirname(existing)
    if path is not None and os.path.exists(path):
        try:
            with open(path, "r+b"):
                pass
        except OSError as e:
            return f"{path} is not writable ({e.strerror or e})"
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".allocopt-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"{existing} is not writable ({e.strerror or e})"
    return None
