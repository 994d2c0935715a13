"""A database server that goes away mid-study (PostgreSQL restarted, a failover, a network
blip): every Optuna storage call is retried with a bounded wait instead of failing the study.

:func:`retrying_storage` makes an :class:`optuna.storages.RDBStorage` (a subclass, so Optuna
still caches it and runs its heartbeats) whose calls, when the connection is lost (SQLAlchemy's
or the driver's ``OperationalError`` anywhere in the error's chain: refused, reset, "terminating
connection due to administrator command", "the database system is starting up"), wait and try
again: backoff 0.5, 1, 2, 4, then every 5 s, for at most :data:`WAIT_S` seconds in all
(``$ALLOCOPT_STORAGE_WAIT_S``). One line says the server is away, one that it answers again.
Past the wait: :class:`~allocopt.errors.StorageUnreachable`, one line saying that the finished
trials are kept and the same command resumes (opening the study settles the trial that was
running: :func:`allocopt.store.settle.reconcile_on_open`).

A write whose commit reached the server before the connection broke is not applied twice for
the trial's end (a retried ``set_trial_state_values`` that finds the trial already in that
state returns as if it had set it); parameters and attributes are overwrites, so a retry is
harmless. Only ``create_new_trial`` could add a second trial if its answer was lost after the
commit (a reservation with no worker, left as ``ask``'s are). SQLite files are not wrapped.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

WAIT_S = 120.0
"""Seconds a storage call waits in all for the server to answer again (``$ALLOCOPT_STORAGE_WAIT_S``)."""

_SKIP = {"upgrade", "get_current_version", "get_head_version", "get_all_versions", "remove_session",
         "get_heartbeat_interval", "get_failed_trial_callback", "is_heartbeat_enabled",
         "check_trial_is_updatable"}
_LOST = ("server closed the connection", "connection refused", "terminating connection", "could not connect",
         "connection is closed", "connection reset", "the database system is", "connection timed out",
         "ssl syscall error", "lost connection", "server has gone away", "consuming input failed",
         "no connection to the server")


def connection_lost(e: BaseException | None) -> bool:
    """Whether ``e`` (or an error in its chain) says the connection to the server was lost or
    refused, as opposed to a bad request (a constraint, a finished trial)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ in ("OperationalError", "InterfaceError") or getattr(e, "connection_invalidated", False):
            text = str(e).lower()
            if any(k in text for k in _LOST) or getattr(e, "connection_invalidated", False):
                return True
        e = e.__cause__ or e.__context__
    return False


def _reason(e: BaseException) -> str:
    from allocopt.tracking.requests import short_reason

    while e.__cause__ is not None:
        e = e.__cause__
    return short_reason(e)


def _wrap(name: str, fn: Any) -> Any:
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        deadline, delay, first = None, 0.5, None
        while True:
            try:
                out = fn(self, *args, **kw)
            except Exception as e:
                import optuna

                if first is not None and name == "set_trial_state_values" and \
                        isinstance(e, optuna.exceptions.UpdateFinishedTrialError):
                    state = kw.get("state", args[1] if len(args) > 1 else None)
                    if self.get_trial(args[0] if args else kw["trial_id"]).state == state:
                        out = True  # the lost commit had gone through
                        break
                if not connection_lost(e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    wait = float(os.environ.get("ALLOCOPT_STORAGE_WAIT_S") or WAIT_S)
                    deadline, first = now + wait, now
                    self._say(f"storage {self._shown}: connection lost ({_reason(e)}); "
                              f"retrying for up to {wait:g} s")
                if now >= deadline:
                    from allocopt.errors import StorageUnreachable

                    raise StorageUnreachable(
                        f"storage {self._shown}: no answer for {now - first:.0f} s ({_reason(e)}); finished "
                        "trials are kept there: run the same command again once it answers to resume") from None
                time.sleep(min(delay, max(deadline - now, 0.05)))
                delay = min(delay * 2, 5.0)
                continue
            break
        if first is not None:
            self._say(f"storage {self._shown}: answers again after {time.monotonic() - first:.1f} s")
        return out
    call.__name__ = call.__qualname__ = name
    call.__doc__ = fn.__doc__
    return call


_CLASS: Any = None


def retrying_storage(url: str, **kwargs: Any) -> Any:
    """An :class:`optuna.storages.RDBStorage` for ``url`` (``kwargs`` passed on) whose calls
    wait up to :data:`WAIT_S` seconds for a server that went away (module docstring).

    Raises:
        allocopt.errors.StorageUnreachable: from a call, when the server stays away longer.
    """
    global _CLASS
    import optuna

    if _CLASS is None:
        base = optuna.storages.RDBStorage
        methods = {n: _wrap(n, getattr(base, n)) for n in dir(base)
                   if (not n.startswith("_") or n == "_get_stale_trial_ids") and n not in _SKIP
                   and callable(getattr(base, n)) and not isinstance(getattr(base, n), type)}
        _CLASS = type("RetryingRDBStorage", (base,), methods)
    from allocopt.redact import redact_url

    storage = _CLASS(url, **kwargs)
    storage._shown = redact_url(url)
    storage._say = lambda line: sys.stderr.write(line + "\n")
    return storage
