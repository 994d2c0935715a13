"""A worker's hold on its trials: its heartbeat, its name on the trial, and when a hold lapses.

Each trial a worker runs carries Optuna's heartbeat (:class:`optuna.storages.RDBStorage` with
``heartbeat_interval`` and ``grace_period``, opened by :func:`allocopt.store.connect.make_storage`):
the worker records it every :data:`HEARTBEAT_INTERVAL_S` seconds while the trial runs
(:func:`heartbeat`, inside :func:`worker_trial`), and names itself on the trial
(:data:`WORKER_ATTR`, ``<host>:<pid>``). A worker that dies (SIGKILL, lost host) stops beating;
the next worker that asks for a trial (:func:`fail_stale`, Optuna's public
``optuna.storages.fail_stale_trials``) finds its trial silent for more than
:data:`GRACE_PERIOD_S` and fails it; what happens to its work then is
:mod:`allocopt.store.settle`'s. Trials RUNNING without any heartbeat are trials reserved by
``allocopt ask`` for runs launched elsewhere: they stay RUNNING until ``allocopt tell`` records
them.

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
from typing import Any, Callable, Iterator, Mapping

from allocopt.errors import StorageError
from allocopt.record import RELEASED
from allocopt.store.handles import _STORAGES, sqlite_file_lock

HEARTBEAT_INTERVAL_S = 10
"""Seconds between two heartbeats of a running trial (``ALLOCOPT_HEARTBEAT_S``)."""
GRACE_PERIOD_S = 60
"""Seconds without a heartbeat after which a trial's worker is taken for dead
(``ALLOCOPT_GRACE_S``)."""
WORKER_ATTR = "allocopt.worker"
"""System attribute of a trial: ``<host>:<pid>`` of the worker that runs it."""
ASKING_ATTR = "allocopt.asking"
"""System attribute of a trial reserved by ``allocopt ask``: ``<host>:<pid>`` of the ``ask``
that reserved it (a reservation whose ``asked`` record is missing and whose ``ask`` is gone
was cut short: :func:`allocopt.store.settle.reconcile_on_open` fails it)."""
DEVICES_ATTR = "allocopt.cuda_visible_devices"
"""System attribute of a trial: the ``CUDA_VISIBLE_DEVICES`` of the worker that runs it, when
set (``allocopt workers --gpus`` sets one per worker)."""


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


def owner_gone(trial: Any) -> bool:
    """Whether a RUNNING trial's worker (system attribute ``allocopt.worker``, ``<host>:<pid>``)
    ran on this host and its process no longer exists. A trial without the attribute (reserved
    by ``allocopt ask``) or of another host is never taken for gone here: the grace period
    decides for those. (A pid reused by an unrelated process reads as alive: the grace period
    then fails the trial, later.)"""
    return process_gone(trial.system_attrs.get(WORKER_ATTR))


def process_gone(who: Any) -> bool:
    """Whether ``who`` (``<host>:<pid>``) names a process of this host, not this one, that no
    longer exists; ``False`` for anything else (another host, not such a string)."""
    import socket

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


_HEARTBEAT_THREAD = threading.local()


def in_heartbeat_thread() -> bool:
    """Whether this code runs in a trial's heartbeat thread (:func:`heartbeat`)."""
    return getattr(_HEARTBEAT_THREAD, "active", False)


def fail_stale(study: Any) -> None:
    """Fail the trials of dead workers (no heartbeat for the grace period) and enqueue their
    retries; a no-op without heartbeats. Called before ``study.ask()`` and, while a trial runs,
    at each of its heartbeats (:func:`heartbeat`). Outside a heartbeat thread it then runs
    what the stale-trial callback deferred from those threads (its ``flush``: MLflow's side)."""
    import optuna

    if study not in _STORAGES:
        return
    # SQLite reads a trial's state outside the transaction that fails it: two workers failing
    # one stale trial at once would both succeed and queue two retries; one at a time per file
    with warnings.catch_warnings(), sqlite_file_lock(_STORAGES[study]):
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    flush = getattr(getattr(_STORAGES[study], "heartbeat_stale_trial_callback", None), "flush", None)
    if flush is not None and not in_heartbeat_thread():
        flush()


def release_cut_reservations(study: Any, storage: Any) -> list[int]:
    """Fail, as interrupted (so its work is asked again once), each RUNNING trial that
    ``allocopt ask`` began to reserve (:data:`ASKING_ATTR`) but never finished reserving (no
    ``asked`` record): the ``ask`` failed half-way (a full disk, a kill) and could not give it
    back. Only when that ``ask``'s process is gone (this host) or the trial is older than the
    grace period (another host): an ``ask`` reserving right now is left alone.

    Returns:
        the numbers failed.
    """
    import datetime

    import optuna
    from optuna.trial import TrialState

    from allocopt.record import ASKED, write_interrupted

    _, grace = heartbeat_settings()
    sid = storage.get_study_id_from_name(study.study_name)
    now = datetime.datetime.now()
    done = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        who = t.system_attrs.get(ASKING_ATTR)
        if who is None or t.user_attrs.get(ASKED) is not None:
            continue
        old = t.datetime_start is not None and (now - t.datetime_start).total_seconds() > grace
        if not (process_gone(who) or old):
            continue
        tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
        try:
            write_interrupted(optuna.trial.Trial(study, tid))
            if storage.set_trial_state_values(tid, state=TrialState.FAIL):
                done.append(t.number)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
            continue  # told or settled by another process first
    return done


def live_trials(study: Any, *, below: int | None = None) -> list[Any]:
    """RUNNING trials that workers are running now: those with a worker's name
    (:data:`WORKER_ATTR`, written with the first heartbeat) whose process is not known to be
    gone (:func:`owner_gone`), and those asked less than one heartbeat interval ago that have
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
            if not owner_gone(t):
                out.append(t)
        elif t.datetime_start is not None and (now - t.datetime_start).total_seconds() < interval:
            out.append(t)
    return out


def release(study: Any, trial: Any, why: str) -> None:
    """Give back a trial asked but not to be run (it was not sampled, nothing ran): told
    ``PRUNED`` in Optuna with the user attribute ``released`` saying ``why``. It counts as no
    run anywhere (no parameters, not COMPLETE or FAIL) and has no MLflow run."""
    from optuna.trial import TrialState

    trial.set_user_attr(RELEASED, why)
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
            wait_for_earlier_proposals(study, trial.number, tuple(distributions))
            suggest_all(trial, distributions)
        yield trial
    except BaseException:
        if not beat.__exit__(*sys.exc_info()):
            raise
    else:
        beat.__exit__(None, None, None)


PROPOSAL_WAIT_S = 60.0
"""Longest wait, in seconds, for the workers' trials numbered below this one to be sampled
(:func:`wait_for_earlier_proposals`); past it the trial is sampled anyway."""


def wait_for_earlier_proposals(study: Any, number: int, names: tuple[str, ...],
                               timeout_s: float = PROPOSAL_WAIT_S, poll_s: float = 0.2) -> float:
    """Wait until every trial another worker is running now (:func:`live_trials`) numbered below
    ``number`` carries all of ``names`` as parameters, so that the sampler of trial ``number``
    sees their allocations as running (BoTorch's pending points; GPSampler and TPE read running
    trials' parameters too). Workers that ask at the same moment then propose one after another in
    trial-number order instead of twice the same allocation from the same data; a worker alone
    (nothing below it running) does not wait.

    Args:
        study: the opened study.
        number: the trial about to be sampled.
        names: the parameters every trial gets.
        timeout_s: longest wait (a stuck worker's trial is failed as stale by then or ignored).
        poll_s: seconds between looks at the storage.

    Returns:
        the seconds waited.
    """
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if all(all(n in t.params for n in names) for t in live_trials(study, below=number)):
            break
        time.sleep(poll_s)
    return time.monotonic() - t0


def suggest_all(trial: Any, distributions: Mapping[str, Any]) -> None:
    """Sample every one of ``distributions`` on an asked ``trial`` through the study's sampler,
    as ``study.ask(distributions)`` would; asking first and sampling after lets a caller record
    the trial (and give it back) before a sampler that raises can leave it RUNNING."""
    for name, dist in distributions.items():
        _suggest(trial, name, dist)


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
        _HEARTBEAT_THREAD.active = True
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(tid)
            except Exception:  # noqa: BLE001 - try again next interval
                pass
            try:  # a dead worker's trial is failed and retried within its grace, however long ours runs
                fail_stale(study)
            except Exception:  # noqa: BLE001 - next interval; the next ask does it too
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


__all__ = ["ASKING_ATTR", "DEVICES_ATTR", "GRACE_PERIOD_S", "HEARTBEAT_INTERVAL_S", "WORKER_ATTR", "fail_stale",
           "heartbeat", "heartbeat_settings", "in_heartbeat_thread", "live_trials", "owner_gone", "process_gone", "release",
           "suggest_all", "wait_for_earlier_proposals", "worker_name", "worker_trial"]
