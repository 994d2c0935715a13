"""The study tracker's lifecycle, the same for the command line and for a Python caller.

The MLflow store is probed before anything is recorded (:func:`probe_tracking`: an unreachable
server or a read-only store fails in seconds), the tracker is made under a lock on an MLflow
SQLite file (:func:`make_tracker`), work runs with it (:func:`tracked`) and it is closed with
the work's status, its runs a stopped worker left RUNNING ended to match Optuna
(:func:`close_tracker`). A disk that fills up under the study's records is one
:class:`~allocopt.errors.DiskFull` (:func:`disk_full_line`). Everything here raises, nothing
prints or exits: the command line (:mod:`allocopt.cli.common`) turns the errors into one line.

MLflow and Optuna are imported inside functions.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ContextManager, Iterator, TypeVar

from allocopt.errors import ConfigError, DiskFull, ProbeInterrupted, StudyError, disk_full
from allocopt.tracking.requests import short_mlflow_requests, short_reason

T = TypeVar("T")


def make_tracker(study_name: str, mlflow_uri: str | None, enabled: bool = True, storage: str | None = None) -> Any:
    """An :class:`allocopt.tracking.StudyTracker`, or ``None`` when tracking is off. Writes made
    while a server is away are spooled beside the SQLite Optuna ``storage`` (else in a temp
    folder: :func:`allocopt.tracking.spool.spool_folder`) and replayed when it answers.

    Raises:
        ConfigError: the tracking URI cannot be used (unsupported scheme, unreachable server).
    """
    if not enabled:
        return None
    from allocopt.tracking import StudyTracker

    try:
        with _sqlite_lock(mlflow_uri):  # workers creating one MLflow SQLite file at once
            _probe(study_name, mlflow_uri)  # would race on its schema migrations
            from allocopt.tracking.spool import spool_folder

            with _quiet_mlflow():
                return StudyTracker(study_name, tracking_uri=mlflow_uri, spool_dir=spool_folder(storage))
    except ConfigError:
        raise
    except Exception as e:
        from allocopt.redact import redact_url

        raise ConfigError(f"mlflow_uri={redact_url(mlflow_uri)!r}: cannot be used "
                          f"({redact_url(short_reason(e))})") from None


@contextlib.contextmanager
def _sqlite_lock(mlflow_uri: str | None) -> Iterator[None]:
    """Hold an exclusive lock on ``<file>.lock`` beside an MLflow SQLite store while it is
    opened (MLflow creates and migrates its schema on first use, and two processes doing that at
    once fail with errors such as "duplicate column name"); other URIs: no lock."""
    import fcntl

    from allocopt.tracking.tracker import _resolve_uri

    uri = _resolve_uri(mlflow_uri)
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or ":memory:" in uri:
        yield
        return
    path = uri[len(prefix):]  # absolute after _resolve_uri: sqlite:////abs/path -> /abs/path
    try:
        fh = open(path + ".lock", "a")
    except OSError:  # an unwritable folder: the probe reports it
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def probe_tracking(study_name: str, mlflow_uri: str | None) -> None:
    """:func:`_probe` under the lock beside an MLflow SQLite store (:func:`_sqlite_lock`): two
    workers starting in a fresh folder would otherwise both create its schema, and the loser's
    half-done migration leaves the file unusable (``table _alembic_tmp_... already exists``)."""
    with _sqlite_lock(mlflow_uri):
        _probe(study_name, mlflow_uri)


def _probe(study_name: str, mlflow_uri: str | None) -> None:
    """Check the MLflow store before anything is recorded elsewhere: one read (the study's
    experiment) with a short timeout and no retries, then one write (the experiment, created
    when missing, gets an ``allocopt.checked_at`` tag), so an unreachable server or a
    read-only store fails in seconds, before an Optuna study is created.

    Raises:
        ConfigError: one line naming the URI and the reason.
        ProbeInterrupted: Ctrl-C during the probe (a KeyboardInterrupt whose one line says that
            nothing was recorded).
    """
    import time

    from allocopt.tracking.layout import TAG_STUDY
    from allocopt.tracking.requests import local_store_problem
    from allocopt.tracking.tracker import _artifact_location, _resolve_uri

    uri = _resolve_uri(mlflow_uri)
    problem = local_store_problem(uri)  # a read-only folder: MLflow retries ~110 s before failing
    if problem:
        from allocopt.redact import redact_url

        raise ConfigError(f"mlflow_uri={redact_url(mlflow_uri or uri)!r}: cannot be used ({problem}); "
                          "give a writable store or --no-mlflow")
    try:
        from mlflow import MlflowClient

        with _quiet_mlflow(), short_mlflow_requests():
            client = MlflowClient(tracking_uri=uri)
            name = f"allocopt/{study_name}"
            exp = client.get_experiment_by_name(name)
            if exp is None:
                try:
                    exp_id = client.create_experiment(
                        name, artifact_location=_artifact_location(uri, study_name), tags={TAG_STUDY: study_name})
                except Exception:  # another worker created it in between (unique name)
                    exp = client.get_experiment_by_name(name)
                    if exp is None:
                        raise
            if exp is not None:
                exp_id = exp.experiment_id
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            try:
                client.set_experiment_tag(exp_id, "allocopt.checked_at", stamp)
            except Exception as e:  # two workers inserted the same new tag at once (its primary key):
                if not _unique_race(e):  # the second write finds the row and updates it
                    raise
                time.sleep(0.2)
                client.set_experiment_tag(exp_id, "allocopt.checked_at", stamp)
    except KeyboardInterrupt:
        from allocopt.redact import redact_url

        raise ProbeInterrupted(f"interrupted while connecting to MLflow at {redact_url(uri)}; "
                               "nothing was recorded") from None
    except Exception as e:
        from allocopt.redact import redact_url

        raise ConfigError(f"mlflow_uri={redact_url(mlflow_uri or uri)!r}: cannot be used ({redact_url(short_reason(e))}); "
                          "check the server or path, or give --no-mlflow") from None


def _unique_race(e: BaseException) -> bool:
    """An insert that lost a race with another worker's insert of the same key (PostgreSQL
    ``UniqueViolation``, SQLite ``UNIQUE constraint failed``, MySQL ``Duplicate entry``)."""
    text = str(e).lower()
    return any(k in text for k in ("uniqueviolation", "duplicate key", "unique constraint", "duplicate entry"))


class _quiet_mlflow:
    """Silence MLflow's and alembic's loggers (they log a whole traceback at ERROR before
    raising) while a call whose error becomes one line runs."""

    NAMES = ("mlflow", "alembic", "sqlalchemy")

    def __enter__(self) -> None:
        import logging

        self.levels = {n: logging.getLogger(n).level for n in self.NAMES}
        for n in self.NAMES:
            logging.getLogger(n).setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        import logging

        for n, lvl in self.levels.items():
            logging.getLogger(n).setLevel(lvl)


def close_tracker(tracker: Any, study_name: str, storage: str, status: str) -> None:
    """End the study's MLflow records: trial runs that a stopped worker left RUNNING are ended
    to match Optuna where it no longer has their trial RUNNING (:meth:`StudyTracker.reconcile`,
    the path the stale-heartbeat callback takes too), then the parent run is closed with
    ``status`` (``FINISHED``; ``KILLED`` after an interrupt, ``FAILED`` after a crash). Safe to
    call with ``tracker=None``."""
    if tracker is None:
        return
    try:
        import optuna

        study = optuna.load_study(study_name=study_name, storage=storage)
        tracker.reconcile(study)
    except Exception:  # noqa: BLE001 - no study yet, storage gone: nothing to reconcile
        pass
    finally:
        tracker.close(status)


def tracked(tracker: Any, study_name: str, storage: str, work: Callable[[Any], T], *,
            on_interrupt: Callable[[], None] | None = None,
            closing: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> T:
    """Run ``work(tracker)`` and close ``tracker`` after it (:func:`close_tracker`): parent run
    FINISHED when ``work`` returns, FAILED when it raises, KILLED on Ctrl-C. Returns what
    ``work`` returned.

    Args:
        tracker: the study's tracker (:func:`make_tracker`), or ``None`` (nothing to close).
        study_name, storage: the study whose trials the tracker's runs are reconciled with.
        work: called with ``tracker``.
        on_interrupt: called when ``work`` is interrupted, before the tracker closes (the
            command line says so there and exits).
        closing: the context the closing runs in (the command line's: a second Ctrl-C there
            only prints, so the records are written in full).

    Raises:
        DiskFull: a disk under the study's records filled up (:func:`disk_full_line`; MLflow's
            store's own log of each failed write is silenced meanwhile).
        KeyboardInterrupt: ``work`` was interrupted (after the tracker closed).
        Exception: whatever ``work`` raised (a closing error only when ``work`` returned).
    """
    status = "FAILED"  # the parent run is FINISHED only when the work ends normally
    with quiet_disk_full_logs():
        try:
            result = work(tracker)
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            if on_interrupt is not None:
                on_interrupt()
            raise
        except StudyError:  # bad input (one line), not a disk that filled up
            raise
        except Exception as e:
            if disk_full(e):
                raise DiskFull(disk_full_line(storage, tracker)) from None
            raise
        finally:
            with closing():
                try:
                    close_tracker(tracker, study_name, storage, status)
                except Exception as e:  # noqa: BLE001
                    if status == "FINISHED":  # the work's own error (above) is the one to report
                        if disk_full(e):
                            raise DiskFull(disk_full_line(storage, tracker)) from None
                        raise
    return result


@contextlib.contextmanager
def quiet_disk_full_logs() -> Iterator[None]:
    """Within the block, MLflow's store does not log each write that failed on a full disk (with
    its traceback): the full disk is said once, as :class:`~allocopt.errors.DiskFull`."""
    import logging

    quiet = _DiskFullRecords()
    logger = logging.getLogger("mlflow.store.db.utils")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


class _DiskFullRecords:
    """A logging filter that drops records of a full disk (the one line is said once, by
    :func:`tracked`, :func:`quiet_disk_full_logs`)."""

    def filter(self, record: Any) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (disk_full(exc) if exc is not None else "database or disk is full" in record.getMessage())


def disk_full_line(storage: str, tracker: Any, again: str | None = None) -> str:
    """The one line for a disk that filled up mid-study: the local files of the study's records
    (Optuna's SQLite file, MLflow's SQLite store, the spool) on a disk with under 1 MiB free (all
    of them, when none is) with the free space left, and what to do; ``again`` says what the
    same command does then (default: a study's, the cut-short trial settled and run again)."""
    import shutil

    files = []
    uris = [storage] + ([tracker.tracking_uri] if tracker is not None else [])
    for uri in uris:
        if isinstance(uri, str) and uri.startswith("sqlite:///"):
            files.append(uri[len("sqlite:///"):].split("?", 1)[0])
    spool = getattr(getattr(tracker, "client", None), "path", None)
    if spool is not None and getattr(tracker.client, "_spool_on", False):
        files.append(str(spool))
    where, full = [], []
    for f in dict.fromkeys(files):
        try:
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(f)) or ".").free
        except OSError:
            where.append(f)
            continue
        where.append(f"{f} ({free / 2**20:.1f} MiB free)")
        if free < 2**20:  # the full one(s), when the records are on several disks
            full.append(where[-1])
    where = full or where
    return ("disk full while recording the study" + (f" in {', '.join(where)}" if where else "")
            + ": finished trials are kept; free space on that disk (or point --storage / --mlflow-uri "
            "elsewhere) and run the same command: " + (again or "the cut-short trial is settled and run again"))
