"""Every error type of allocopt, in one place, and :func:`short_error`, how a message is
shortened to one line. Standard library only.

Bad input is a :class:`ValueError` with a one-line message naming the field, the value and
what is allowed (the command line prints it and exits with code 2); what goes wrong while
running is a :class:`RuntimeError`. The modules that raise them re-export them, so
``from allocopt.flops import ConfigError`` and the like keep working.

=========================  ==============  ===================================================
error                      base            raised when
=========================  ==============  ===================================================
:class:`ConfigError`       ValueError      a model configuration, FLOP query or setting is bad
:class:`InfeasiblePlan`    ValueError      the budget cannot buy one iteration
:class:`QueryError`        ConfigError     a query cannot be answered as asked
:class:`StorageError`      ValueError      a storage setting is wrong
:class:`StudyError`        ValueError      a study cannot start
:class:`TellError`         ValueError      a tell cannot be recorded
:class:`RunLogError`       ValueError      a run's logs cannot be accounted
:class:`ObjectiveUnavailable`  RuntimeError  an objective cannot run on this machine
:class:`TrialFailed`       RuntimeError    a trial crashed (``result``: what it spent)
:class:`TrialScoreError`   RuntimeError    a trial returned a target that is not a number
:class:`BudgetExhausted`   RuntimeError    the next iteration could pass the budget
:class:`TrackingError`     RuntimeError    something did not reach MLflow
:class:`StorageUnreachable`  RuntimeError  the study's database server stayed away too long
:class:`DiskFull`          RuntimeError    a disk under the study's records filled up
:class:`ProbeInterrupted`  KeyboardInterrupt  Ctrl-C while the MLflow store was probed
=========================  ==============  ===================================================
"""

from __future__ import annotations

from typing import Any

__all__ = ["BudgetExhausted", "ConfigError", "DiskFull", "InfeasiblePlan", "ObjectiveUnavailable", "QueryError",
           "ProbeInterrupted", "RunLogError", "StorageError", "StorageUnreachable", "StudyError", "TellError",
           "TrackingError", "TrialFailed", "TrialScoreError", "disk_full"]


class ConfigError(ValueError):
    """A model configuration or a FLOP query is invalid; the message names the field."""


class InfeasiblePlan(ValueError):
    """The budget cannot buy one iteration of this allocation (message gives the minimum)."""

    def __init__(self, message: str, min_budget_flops: int):
        super().__init__(message)
        self.min_budget_flops = min_budget_flops
        """The least budget (FLOPs) that buys one iteration."""


class QueryError(ConfigError):
    """A query cannot be answered as asked (unknown study, target or field; malformed filter).

    One line naming the value and what is allowed. A :class:`ValueError` (through
    :class:`ConfigError`, so the CLI prints it as one line with exit code 2).
    """


class StorageError(ValueError):
    """A storage setting is wrong (one line naming the field, value and what is allowed)."""


class StudyError(ValueError):
    """The study cannot start (bad storage URL, objective unavailable); one line, exit 2."""


class TellError(ValueError):
    """A tell that cannot be recorded (unknown or finished trial, missing targets); one line."""


class RunLogError(ValueError):
    """A run's logs cannot be accounted; the one-line message names the file, the field and
    what is wrong."""


class ObjectiveUnavailable(RuntimeError):
    """This objective cannot run on this machine; the message says what to use instead."""


class TrialFailed(RuntimeError):
    """A trial crashed; ``result`` (:class:`allocopt.objective.TrialResult`) holds what it had
    spent until then."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class TrialScoreError(RuntimeError):
    """The objective returned a target that is not a finite number (NaN, inf, None); the trial
    fails, with what it spent (``result``)."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


class BudgetExhausted(RuntimeError):
    """The next iteration could pass the budget; the run stops before it."""


class TrackingError(RuntimeError):
    """Part of what a trial or study should log did not reach MLflow (the message says what)."""


class StorageUnreachable(RuntimeError):
    """The study's database server (PostgreSQL, MySQL) did not answer for the bounded wait
    (:mod:`allocopt.store.reconnect`); the message is one line saying what to do (resume)."""


class DiskFull(RuntimeError):
    """A disk under the study's records (Optuna's SQLite file, MLflow's store, the spool) filled
    up mid-study; the message is one line naming the files, their free space and what to do
    (free space, run the same command: finished trials are kept, the cut-short one is settled
    and run again when the study is next opened, :mod:`allocopt.store.settle`)."""


class ProbeInterrupted(KeyboardInterrupt):
    """Ctrl-C while the MLflow store was being probed, before anything was recorded
    (:func:`allocopt.tracking.lifecycle.probe_tracking`); the message is one line saying so.
    A :class:`KeyboardInterrupt`, so it stops a Python caller as Ctrl-C does."""


_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")


def disk_full(error: BaseException) -> bool:
    """Whether a full disk is in ``error``'s chain (``__cause__`` / ``__context__``): an
    :class:`OSError` with ``errno`` ENOSPC or EDQUOT, or SQLite's ``database or disk is full``
    (SQLAlchemy, Optuna and MLflow wrap it in their own errors)."""
    import errno

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(f in str(e).lower() for f in _FULL):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def short_error(text: str, room: int) -> str:
    """The first line of ``text`` within ``room`` characters, cut at a word boundary, keeping
    the last clause (after the last ``;``), which holds the number that matters (``the smallest
    feasible plan needs 1.2e+12 FLOPs``)."""
    line = (text or "").splitlines()[0] if text else ""
    if len(line) <= room:
        return line
    head, sep, tail = line.rpartition("; ")
    tail = tail if sep else ""
    if tail and len(tail) + 2 <= room:
        keep = room - len(tail) - 3
        cut = head[:max(0, keep)].rsplit(" ", 1)[0] if keep > 0 else ""
        return (cut + "…; " + tail) if cut else tail
    cut = line[:room].rsplit(" ", 1)[0]  # a word that ends at room - 1 stays; with … at most room
    return cut + "…"
