"""Opening the Optuna storage one worker or many share: URL checks, heartbeats on, redaction.

Several ``allocopt study`` processes (on one machine or many) share a study through one Optuna
RDB storage (``postgresql://user:pass@host/db``; SQLite works on one machine).
:func:`check_storage_url` refuses a URL that cannot hold a study before anything is recorded;
:func:`make_storage` opens it with heartbeats on (:mod:`allocopt.store.heartbeat`) and the
stale-trial callback that settles dead workers' trials (:mod:`allocopt.store.settle`); a
PostgreSQL or MySQL server that goes away is waited for (:mod:`allocopt.store.reconnect`).
Finishing writes on a SQLite file are serialised by :func:`allocopt.store.handles.sqlite_file_lock`.
URLs in its messages are shown with the password redacted (:func:`allocopt.redact.redact_url`).

Optuna and SQLAlchemy are imported inside functions: ``import allocopt`` stays light.
"""

from __future__ import annotations

import warnings
from typing import Any

from allocopt.errors import StorageError
from allocopt.redact import redact_url
from allocopt.store.heartbeat import heartbeat_settings
from allocopt.store.settle import StaleTrialCallback

DEFAULT_STORAGE = "sqlite:///allocopt.db"
"""The Optuna storage URL when none is given (a SQLite file in the working folder)."""


def check_storage_url(url: str) -> None:
    """Refuse a storage URL SQLAlchemy cannot read or has no dialect for, without connecting
    (so a typo fails before anything is recorded, in MLflow either).

    Also refused: an in-memory SQLite database (``sqlite://``, ``sqlite:///:memory:``: the
    results would vanish with the command), and a SQLite file that is not an Optuna storage
    (another tool's database, whose tables Optuna would write into; or not SQLite at all),
    read-only, without changing it.

    Raises:
        StorageError: one line naming the URL (password redacted) and what is allowed.
    """
    from sqlalchemy.engine import make_url

    try:
        u = make_url(str(url))
        u.get_dialect()
    except Exception as e:  # ArgumentError (not a URL), NoSuchModuleError (unknown dialect)
        raise StorageError(f"storage={redact_url(url)!r}: not a database URL SQLAlchemy can use "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); allowed: "
                           "sqlite:///FILE, postgresql://USER:PASS@HOST/DB, mysql://...") from None
    if u.drivername.split("+")[0] == "sqlite":
        db = u.database or ""
        if db in ("", ":memory:") or db.startswith("file::memory:") or "memory" in str(u.query.get("mode", "")):
            raise StorageError(f"storage={redact_url(url)!r}: an in-memory SQLite database; the study's "
                               "results would vanish when the command ends; allowed: sqlite:///FILE, "
                               "postgresql://USER:PASS@HOST/DB, mysql://...")
        _check_sqlite_file(url, db)


def _check_sqlite_file(url: str, db: str) -> None:
    """Refuse an existing, non-empty SQLite file without Optuna's tables (read-only)."""
    import sqlite3
    from pathlib import Path

    p = Path(db)
    try:
        if not p.is_file() or p.stat().st_size == 0:
            return
    except OSError:
        return  # opening it says why
    try:
        con = sqlite3.connect(p.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as e:
        raise StorageError(f"storage={redact_url(url)!r}: not an Optuna storage ({e}); give another "
                           "file (sqlite:///FILE)") from None
    # Optuna's schema is created table by table: a file with some of its tables is Optuna's,
    # being created by another worker at this moment (its first table is ``studies``)
    if tables and not tables & {"studies", "trials", "version_info"}:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StorageError(f"storage={redact_url(url)!r}: another tool's SQLite database (tables: "
                           f"{shown}), not an Optuna storage; give another file (sqlite:///FILE)")


def make_storage(url: str) -> Any:
    """An Optuna storage for ``url`` with heartbeats on (RDB URLs: ``sqlite://``,
    ``postgresql://``, ``mysql://``); other URLs are returned for Optuna to handle.

    Raises:
        StorageError: bad heartbeat settings in the environment.
        ImportError: the database driver is missing (e.g. psycopg for ``postgresql://``).
        Exception: whatever SQLAlchemy raises for an unreachable server or a bad URL.
    """
    import optuna

    scheme = str(url).split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in ("sqlite", "postgresql", "postgres", "mysql"):
        return url
    interval, grace = heartbeat_settings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat_interval is an experimental argument
        if scheme == "sqlite":
            storage = optuna.storages.RDBStorage(url, heartbeat_interval=interval, grace_period=grace,
                                                 heartbeat_stale_trial_callback=StaleTrialCallback())
        else:  # a server that goes away (restarted) is waited for (allocopt.store.reconnect)
            from allocopt.store.reconnect import retrying_storage

            storage = retrying_storage(url, heartbeat_interval=interval, grace_period=grace,
                                       heartbeat_stale_trial_callback=StaleTrialCallback(),
                                       engine_kwargs={"pool_pre_ping": True})
    return storage


__all__ = ["DEFAULT_STORAGE", "check_storage_url", "make_storage"]
