"""Optuna storage for one worker or many: heartbeats, dead workers' trials retried once, redaction.

Several ``allocopt study`` processes (on one machine or many) share a study through one Optuna
RDB storage (``postgresql://user:pass@host/db``; SQLite works on one machine). Each trial a
worker runs carries Optuna's heartbeat (:class:`optuna.storages.RDBStorage` with
``heartbeat_interval`` and ``grace_period``): the worker records it every
:data:`HEARTBEAT_INTERVAL_S` seconds while the trial runs (:func:`heartbeat`). A worker that
dies (SIGKILL, lost host) stops beating; the next worker that asks for a trial
(:func:`fail_stale`, Optuna's public ``optuna.storages.fail_stale_trials``) finds its trial
silent for more than :data:`GRACE_PERIOD_S`, fails it, and
:class:`optuna.storages.RetryHeartbeatStaleTrialCallback` (``max_retry=1``) enqueues a copy
(same parameters and user attributes, so a pilot stays a pilot) that the next ``ask`` of any
worker runs. Opening a study never touches another live worker's RUNNING trial.

Every opening of a study settles what stopped workers left (:func:`reconcile_on_open`): a
trial whose worker ran on this host and is gone is settled at once (no grace period to wait),
stale ones after the grace period; a trial recorded whole before its worker died (a full disk
failed Optuna's ``tell`` after allocopt wrote the result) is finished from its record, any
other is failed and its work run again once; a trial stopped by Ctrl-C is enqueued to run
again. So a study whose ``--trials`` are done still settles its last killed trial when it is
opened again (``study``, ``race``, ``ask``, ``best``, ``report``). Trials RUNNING without any
heartbeat are trials reserved by ``allocopt ask`` for runs launched elsewhere: they stay
RUNNING until ``allocopt tell`` records them.

``ALLOCOPT_HEARTBEAT_S`` and ``ALLOCOPT_GRACE_S`` (whole seconds) override the defaults; a
worker's trial is taken for dead after ``grace`` seconds without a heartbeat, so keep it well
above the interval and above the longest pause a loaded machine may show.

Optuna is imported inside functions: ``import allocopt`` stays light.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Iterator, Mapping

DEFAULT_STORAGE = "sqlite:///allocopt.db"
"""The Optuna storage URL when none is given (a SQLite file in the working folder)."""
HEARTBEAT_INTERVAL_S = 10
"""Seconds between two heartbeats of a running trial (``ALLOCOPT_HEARTBEAT_S``)."""
GRACE_PERIOD_S = 60
"""Seconds without a heartbeat after which a trial's worker is taken for dead
(``ALLOCOPT_GRACE_S``)."""
MAX_RETRY = 1
"""How often a dead worker's trial is run again (by another worker, or on resume)."""

WORKER_ATTR = "allocopt.worker"
"""System attribute of a trial: ``<host>:<pid>`` of the worker that runs it."""

DEVICES_ATTR = "allocopt.cuda_visible_devices"
"""System attribute of a trial: the ``CUDA_VISIBLE_DEVICES`` of the worker that runs it, when
set (``allocopt workers --gpus`` sets one per worker)."""

_STORAGES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_SETTLED: "weakref.WeakKeyDictionary[Any, dict[str, list[int]]]" = weakref.WeakKeyDictionary()


from allocopt.errors import StorageError  # noqa: E402,F401  (defined there; imported from here too)
from allocopt.redact import redact_url, without_password  # noqa: E402,F401  (imported from here too)


def worker_name() -> str:
    """``<host>:<pid>``: who runs a trial (the trial's ``allocopt.worker`` system attribute)."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _env_seconds(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v <= 0:
        raise StorageError(f"{name}={raw!r}: must be a whole number of seconds > 0")
    return v


def heartbeat_settings() -> tuple[int, int]:
    """``(interval, grace)`` in seconds, from the environment or the defaults.

    Raises:
        StorageError: a value is not a positive whole number, or grace <= interval.
    """
    interval = _env_seconds("ALLOCOPT_HEARTBEAT_S", HEARTBEAT_INTERVAL_S)
    grace = _env_seconds("ALLOCOPT_GRACE_S", max(GRACE_PERIOD_S, 3 * interval))
    if grace <= interval:
        raise StorageError(f"ALLOCOPT_GRACE_S={grace}: must be above ALLOCOPT_HEARTBEAT_S={interval} "
                           "(a live worker would be taken for dead)")
    return interval, grace


class StaleTrialCallback:
    """Optuna's ``heartbeat_stale_trial_callback``: retry the dead worker's trial once
    (:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), then tell the listeners (an
    MLflow tracker ends the trial's run as FAILED: :meth:`StudyTracker.reconcile`)."""

    def __init__(self, max_retry: int = MAX_RETRY):
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-API warning
            self._retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        self.listeners: dict[Any, Callable[[Any, Any], None]] = {}

    def __call__(self, study: Any, trial: Any) -> None:
        values = recorded_values(study, trial)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if values is not None:  # its result was recorded whole before the worker died
                _add_recorded(study, trial, values)
            else:  # retried once with its decision only (not a dead run's half-written result)
                self._retry(study, _decision_only(trial))
        for fn in list(self.listeners.values()):
            fn(study, trial)


_RESULT_ATTRS = ("state", "targets", "metrics", "error", "plan", "asked", "source", "over_budget")
"""User attributes of a trial's result (:mod:`allocopt.record`): not copied onto its re-run."""


def _decision_only(trial: Any) -> Any:
    """A copy of the FrozenTrial ``trial`` whose user attributes keep the decision only
    (fidelity, budget, RACE's pilot key): what a re-run of the same work starts from."""
    import copy

    t = copy.deepcopy(trial)
    t.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in _RESULT_ATTRS}
    return t


def recorded_values(study: Any, trial: Any, targets: Any = None) -> list[float] | None:
    """The Optuna values of a trial whose result allocopt recorded whole before its worker
    stopped (killed, or a full disk failed ``study.tell``): user attribute ``state``
    ``COMPLETE`` with the plan (written last, :func:`allocopt.record.write_complete` after the
    ``budget`` constraint) and a finite value of every target of the study, in the study's
    objective order; ``INFEASIBLE`` with its error: the placeholder 0 per target. ``None`` when
    the record is partial or absent: then the work is run again instead.

    The study's targets: ``targets`` (names such as ``pass@1``, in objective order), else its
    metric names, else its ``spec`` user attribute.
    """
    import math

    from allocopt.record import TrialRecord
    from allocopt.spec import target_key

    names = list(targets or study.metric_names or [])
    if not names:
        t = (study.user_attrs.get("spec") or {}).get("target")
        names = [t] if isinstance(t, str) else list(t or [])
    if not names or len(names) != len(study.directions):
        return None
    rec = TrialRecord.of(trial)
    if rec.state == "INFEASIBLE" and rec.error:
        return [0.0] * len(names)
    if rec.state != "COMPLETE" or not rec.plan:
        return None
    vals = [rec.targets.get(target_key(n)) for n in names]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
        return None
    return [float(v) for v in vals]


def _add_recorded(study: Any, trial: Any, values: list[float]) -> None:
    """The failed ``trial``'s recorded result as a COMPLETE trial of its own (Optuna cannot
    complete a failed trial): same parameters, attributes and constraint, system attribute
    ``failed_trial`` naming the one it finishes, so it counts once and the failed one not."""
    import optuna

    system_attrs = {**trial.system_attrs, "failed_trial": trial.number,
                    "retry_history": [*trial.system_attrs.get("retry_history", []), trial.number]}
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.COMPLETE, values=values,
                                        params=trial.params, distributions=trial.distributions,
                                        user_attrs=trial.user_attrs, system_attrs=system_attrs))


def _owner_gone(trial: Any) -> bool:
    """Whether a RUNNING trial's worker (system attribute ``allocopt.worker``, ``<host>:<pid>``)
    ran on this host and its process no longer exists. A trial without the attribute (reserved
    by ``allocopt ask``) or of another host is never taken for gone here: the grace period
    decides for those. (A pid reused by an unrelated process reads as alive: the grace period
    then fails the trial, later.)"""
    import socket

    who = trial.system_attrs.get(WORKER_ATTR)
    if not isinstance(who, str) or ":" not in who:
        return False
    host, _, pid = who.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def reconcile_on_open(study: Any, targets: Any = None) -> dict[str, list[int]]:
    """Settle the trials a stopped worker left behind; called whenever a study is opened
    (:func:`allocopt.study.open.open_study`, :func:`allocopt.query.sources.open_study_for_query`):

    1. a RUNNING trial whose worker ran on this host and is gone (killed: SIGKILL, OOM, a
       full disk) is settled at once, without waiting for the grace period: finished from its
       record when the record is whole (:func:`recorded_values`: told COMPLETE with the
       recorded targets), else failed and its work enqueued to run again once (the
       stale-heartbeat callback, :class:`StaleTrialCallback`);
    2. RUNNING trials silent for the grace period (any host) are failed the same way
       (Optuna's ``fail_stale_trials``; a whole record becomes a COMPLETE trial of its own);
    3. a trial stopped by Ctrl-C / SIGTERM (:func:`allocopt.record.is_interrupted`) with
       parameters and no re-run yet is enqueued to run again (:func:`requeue_interrupted`).

    Trials RUNNING without a heartbeat (reserved by ``allocopt ask``) and other live workers'
    trials are left alone. A no-op for a study without heartbeats (in memory). When anything
    was settled, one line on stderr says what (:func:`settled_line`).

    Returns:
        ``{"finished": [...], "failed": [...], "requeued": [...]}``: trial numbers.
    """
    import copy

    import optuna
    from optuna.trial import TrialState

    out: dict[str, list[int]] = {"finished": [], "failed": [], "requeued": []}
    storage = _STORAGES.get(study)
    if storage is None or not getattr(storage, "heartbeat_interval", None):
        return out
    sid = storage.get_study_id_from_name(study.study_name)
    count_before = len(study.get_trials(deepcopy=False))
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _owner_gone(t):
            continue
        tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
        values = recorded_values(study, t, targets)
        try:
            if values is not None:
                study.tell(t.number, values)
                out["finished"].append(t.number)
            elif storage.set_trial_state_values(tid, state=TrialState.FAIL):
                out["failed"].append(t.number)
                cb = storage.get_heartbeat_stale_trial_callback()
                if cb is not None:
                    cb(study, copy.deepcopy(storage.get_trial(tid)))
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # another process settled it first
    before = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    fail_stale(study)
    out["failed"] += sorted({t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
                            - before - set(out["failed"]))
    out["requeued"] = requeue_interrupted(study)
    _SETTLED[study] = out
    line = settled_line(study.study_name, out, len(study.get_trials(deepcopy=False)) - count_before)
    if line:
        sys.stderr.write(line + "\n")
    return out


def settled_line(study_name: str, out: Mapping[str, list[int]], queued: int) -> str | None:
    """The line :func:`reconcile_on_open` prints, or ``None`` when nothing was settled; ``queued``
    is the number of trials it enqueued to run again (the failed ones' and the interrupted ones').

    >>> settled_line("s", {"finished": [4], "failed": [5, 6], "requeued": []}, 2)
    "study 's': settled 3 stale trial(s) a stopped worker left: 1 finished from its record (trial 4), 2 failed (trials 5, 6); re-queued 2 to run again"
    """
    stale = len(out["finished"]) + len(out["failed"])
    if not stale and not queued:
        return None
    def numbers(xs: list[int]) -> str:
        return ("trial " if len(xs) == 1 else "trials ") + ", ".join(map(str, xs))

    parts = []
    if out["finished"]:
        parts.append(f"{len(out['finished'])} finished from its record ({numbers(out['finished'])})")
    if out["failed"]:
        parts.append(f"{len(out['failed'])} failed ({numbers(out['failed'])})")
    if out["requeued"]:
        parts.append(f"{len(out['requeued'])} interrupted ({numbers(out['requeued'])})")
    head = f"study {study_name!r}: settled {stale} stale trial(s) a stopped worker left" if stale else \
        f"study {study_name!r}: settled"
    return f"{head}: {', '.join(parts)}; re-queued {queued} to run again"


def settled(study: Any) -> dict[str, list[int]]:
    """What :func:`reconcile_on_open` did when ``study`` was opened (empty lists if nothing)."""
    return _SETTLED.get(study) or {"finished": [], "failed": [], "requeued": []}


def requeue_interrupted(study: Any) -> list[int]:
    """Enqueue, once, the work of each trial stopped by Ctrl-C / SIGTERM (it "runs again",
    before any new proposal: Optuna's ``ask`` takes the queue first): same parameters and
    decision attributes, system attribute ``failed_trial`` naming the trial it repeats (as
    Optuna's ``RetryFailedTrialCallback`` writes it). A trial stopped before its parameters
    were written has nothing to repeat (the sampler decides anew). Two workers opening the
    same study at the same instant may both enqueue one; RACE's claims keep a pilot from
    running twice, a full run may.

    Returns:
        the numbers of the interrupted trials enqueued now.
    """
    import optuna
    from optuna.trial import TrialState

    from allocopt.record import is_interrupted

    trials = study.get_trials(deepcopy=False)
    repeated = {t.system_attrs.get("failed_trial") for t in trials}
    done = []
    for t in trials:
        if t.state != TrialState.FAIL or not t.params or t.number in repeated or not is_interrupted(t):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.RetryFailedTrialCallback(max_retry=None)(study, _decision_only(t))
        done.append(t.number)
    return done


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


@contextlib.contextmanager
def sqlite_file_lock(storage: Any) -> Iterator[None]:
    """An exclusive ``flock`` on a SQLite storage's database file while the block runs (one
    process or thread at a time; SQLite's own locks are POSIX record locks, which ``flock``
    does not touch, so it neither blocks nor is blocked by SQLite). Other storages: no lock
    (their row locks make a second finishing write fail: ``UpdateFinishedTrialError``)."""
    import fcntl

    url = getattr(storage, "url", None) or getattr(getattr(storage, "_backend", None), "url", None)
    path = None
    if isinstance(url, str) and url.startswith("sqlite:///"):
        from sqlalchemy.engine import make_url

        path = make_url(url).database
    if not path or not os.path.isfile(path):
        yield
        return
    with open(path, "rb") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
        else:  # a server that goes away (restarted) is waited for (allocopt.study.reconnect)
            from allocopt.study.reconnect import retrying_storage

            storage = retrying_storage(url, heartbeat_interval=interval, grace_period=grace,
                                       heartbeat_stale_trial_callback=StaleTrialCallback(),
                                       engine_kwargs={"pool_pre_ping": True})
    return storage


def register(study: Any, storage: Any) -> None:
    """Remember the storage object a study was opened with (for :func:`heartbeat`)."""
    if not isinstance(storage, str):
        _STORAGES[study] = storage


def storage_of(study: Any) -> Any:
    """The storage object a study was opened with by :func:`allocopt.study.open.open_study`.

    Raises:
        KeyError: the study was not opened that way.
    """
    return _STORAGES[study]


def trial_handle(study: Any, number: int) -> tuple[Any, int] | None:
    """``(storage, trial_id)`` of trial ``number`` through the storage object the study was
    opened with (public storage methods ``get_study_id_from_name``,
    ``get_trial_id_from_study_id_trial_number``); ``None`` for a study without one (in memory,
    or not opened by :func:`allocopt.study.open.open_study`)."""
    storage = _STORAGES.get(study)
    if storage is None or isinstance(storage, str):
        return None
    sid = storage.get_study_id_from_name(study.study_name)
    return storage, storage.get_trial_id_from_study_id_trial_number(sid, number)


def stale_callback(study: Any) -> StaleTrialCallback | None:
    """The :class:`StaleTrialCallback` of the study's storage, to add listeners to."""
    storage = _STORAGES.get(study)
    cb = getattr(storage, "heartbeat_stale_trial_callback", None)
    return cb if isinstance(cb, StaleTrialCallback) else None


def on_stale(study: Any, tracker: Any) -> None:
    """Have ``tracker`` (a :class:`~allocopt.tracking.StudyTracker`) end the MLflow runs of the
    trials this worker fails as stale (:meth:`StudyTracker.reconcile`); once per tracker."""
    cb = stale_callback(study)
    if cb is not None and tracker is not None:
        cb.listeners[id(tracker)] = lambda st, _trial: tracker.reconcile(st)


def fail_stale(study: Any) -> None:
    """Fail the trials of dead workers (no heartbeat for the grace period) and enqueue their
    retries; a no-op without heartbeats. Call it before ``study.ask()``."""
    import optuna

    if study not in _STORAGES:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)


def live_trials(study: Any, *, below: int | None = None) -> list[Any]:
    """RUNNING trials that workers are running now: those with a worker's name
    (:data:`WORKER_ATTR`, written with the first heartbeat) whose process is not known to be
    gone (:func:`_owner_gone`), and those asked less than one heartbeat interval ago that have
    no name yet (a worker names its trial at once; the interval leaves it time on a loaded
    machine). Trials reserved by ``allocopt ask`` (no name, older) are not counted: they are
    told whenever their runs end, or never. Stale ones are not either: :func:`fail_stale`
    (called first) has failed them. ``below``: only trials numbered below it.

    Returns:
        the FrozenTrials, by number.
    """
    import datetime

    from optuna.trial import TrialState

    fail_stale(study)
    interval = heartbeat_settings()[0]
    now = datetime.datetime.now()
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if below is not None and t.number >= below:
            continue
        if WORKER_ATTR in t.system_attrs:
            if not _owner_gone(t):
                out.append(t)
        elif t.datetime_start is not None and (now - t.datetime_start).total_seconds() < interval:
            out.append(t)
    return out


def release(study: Any, trial: Any, why: str) -> None:
    """Give back a trial asked but not to be run (it was not sampled, nothing ran): told
    ``PRUNED`` in Optuna with the user attribute ``released`` saying ``why``. It counts as no
    run anywhere (no parameters, not COMPLETE or FAIL) and has no MLflow run."""
    from optuna.trial import TrialState

    trial.set_user_attr("released", why)
    study.tell(trial, state=TrialState.PRUNED)


@contextlib.contextmanager
def worker_trial(study: Any, distributions: Mapping[str, Any],
                 admit: Callable[[Any], str | None] | None = None) -> Iterator[Any]:
    """One trial of a worker: fail dead workers' trials (:func:`fail_stale`), ask a trial, keep
    its heartbeat (:func:`heartbeat`) while the block runs it, and sample ``distributions`` on
    it once it is admitted.

    Ctrl-C during the ask and the heartbeat's set-up is held until the trial carries its
    heartbeat, then raised, so the trial is failed at once rather than left RUNNING without a
    heartbeat (which would read as reserved by ``allocopt ask``).

    Args:
        study: the opened study.
        distributions: the parameters every trial gets, sampled by the study's sampler.
        admit: called with the asked trial (numbered, named for its worker, not sampled yet):
            ``None`` runs it; a reason gives it back unsampled (:func:`release`), and the block
            gets ``None``. The trial numbers of an RDB storage are the order in which workers
            asked, so a check on trials numbered below this one decides races between workers
            the same way in each of them.

    Yields:
        the asked :class:`optuna.trial.Trial` with its parameters, or ``None`` (released).
    """
    with _held_interrupts() as held:
        fail_stale(study)
        trial = study.ask()
        beat = heartbeat(study, trial)
        beat.__enter__()
    try:
        if held:
            raise KeyboardInterrupt
        why = admit(trial) if admit is not None else None
        if why is not None:
            release(study, trial, why)
            trial = None
        else:
            for name, dist in distributions.items():
                _suggest(trial, name, dist)
        yield trial
    except BaseException:
        if not beat.__exit__(*sys.exc_info()):
            raise
    else:
        beat.__exit__(None, None, None)


def _suggest(trial: Any, name: str, dist: Any) -> Any:
    """``trial.suggest_*`` for one distribution (float, int or categorical), through the study's
    sampler as ``study.ask(distributions)`` would."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    raise TypeError(f"distribution of {name!r}: {dist!r} is not float, int or categorical")


@contextlib.contextmanager
def _held_interrupts() -> Iterator[list[int]]:
    """SIGINT held (recorded, not raised) inside the block; main thread only."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    old = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def heartbeat(study: Any, trial: Any) -> Iterator[None]:
    """Record the trial's heartbeat now and every interval until the block ends; the trial's
    system attribute ``allocopt.worker`` names this worker (:func:`worker_name`) and
    ``allocopt.cuda_visible_devices`` its GPUs (when ``CUDA_VISIBLE_DEVICES`` is set).

    Uses only the storage's public methods (``get_study_id_from_name``,
    ``get_trial_id_from_study_id_trial_number``, ``record_heartbeat``). A no-op for a study
    whose storage has no heartbeat. A heartbeat that fails (database briefly unreachable) is
    retried at the next interval; the trial is failed by another worker only after the grace
    period.
    """
    storage = _STORAGES.get(study)
    interval = getattr(storage, "heartbeat_interval", None)
    if storage is None or not interval:
        yield
        return
    try:
        sid = storage.get_study_id_from_name(study.study_name)
        tid = storage.get_trial_id_from_study_id_trial_number(sid, trial.number)
        storage.set_trial_system_attr(tid, WORKER_ATTR, worker_name())
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            storage.set_trial_system_attr(tid, DEVICES_ATTR, os.environ["CUDA_VISIBLE_DEVICES"])
        storage.record_heartbeat(tid)
    except KeyboardInterrupt:
        _fail_interrupted(study, trial)
        raise
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(tid)
            except Exception:  # noqa: BLE001 - try again next interval
                pass

    t = threading.Thread(target=beat, name=f"allocopt-heartbeat-{trial.number}", daemon=True)
    t.start()
    try:
        yield
    except KeyboardInterrupt:
        _fail_interrupted(study, trial)
        raise
    finally:
        stop.set()
        t.join()


def _fail_interrupted(study: Any, trial: Any) -> None:
    """Ctrl-C outside the objective (which has its own handler): the trial is failed at once,
    best effort; if the database cannot be reached, the stale heartbeat fails it later."""
    from optuna.trial import TrialState

    from allocopt.record import write_interrupted

    try:
        if study.get_trials(deepcopy=False)[trial.number].state != TrialState.RUNNING:
            return
        write_interrupted(trial)
        study.tell(trial, state=TrialState.FAIL)
    except Exception:  # noqa: BLE001 - Ctrl-C inside a database call can leave the session
        pass  # unusable: the trial has a heartbeat, so it is failed after the grace period


__all__ = ["GRACE_PERIOD_S", "HEARTBEAT_INTERVAL_S", "MAX_RETRY", "StaleTrialCallback",
           "StorageError", "fail_stale", "reconcile_on_open", "settled_line", "recorded_values", "requeue_interrupted", "heartbeat", "on_stale", "heartbeat_settings", "make_storage",
           "redact_url", "register", "settled", "without_password", "stale_callback", "storage_of", "worker_name", "worker_trial", "live_trials", "release"]
