"""The storage object each opened study uses, and a trial's ``(storage, trial_id)`` handle.

:func:`allocopt.study.open.open_study` (and :func:`allocopt.query.sources.open_study_for_query`)
remember the storage they opened a study with (:func:`register`); the heartbeat
(:mod:`allocopt.store.heartbeat`), the settling of stopped workers' trials
(:mod:`allocopt.store.settle`), RACE's claims and ask/tell reach a trial's row through it
(:func:`trial_handle`: public storage methods only); :func:`sqlite_file_lock` serialises
writes to one SQLite file across processes.

Standard library only: ``import allocopt`` stays light.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any, Iterator

_STORAGES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register(study: Any, storage: Any) -> None:
    """Remember the storage object a study was opened with (for :func:`allocopt.store.heartbeat.heartbeat`)."""
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


__all__ = ["register", "sqlite_file_lock", "storage_of", "trial_handle"]
