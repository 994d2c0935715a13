"""The storage object each opened study uses, and a trial's ``(storage, trial_id)`` handle.

:func:`allocopt.study.open.open_study` (and :func:`allocopt.query.sources.open_study_for_query`)
remember the storage they opened a study with (:func:`register`); the heartbeat
(:mod:`allocopt.study.hold`), the settling of stopped workers' trials
(:mod:`allocopt.study.settle`), RACE's claims and ask/tell reach a trial's row through it
(:func:`trial_handle`: public storage methods only).

Standard library only: ``import allocopt`` stays light.
"""

from __future__ import annotations

import weakref
from typing import Any

_STORAGES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register(study: Any, storage: Any) -> None:
    """Remember the storage object a study was opened with (for :func:`allocopt.study.hold.heartbeat`)."""
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


__all__ = ["register", "storage_of", "trial_handle"]
