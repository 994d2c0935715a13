"""Claims: how concurrent workers of one study avoid running the same point twice.

Optuna writes a trial's parameters one at a time, and a surrogate proposal takes seconds to
make, so two workers that ask at the same moment can decide on the same pilot point or the same
proposal before either's parameters are visible. A :class:`~allocopt.study.sampler.RaceSampler`
therefore *claims* its decision first, in one write (the trial's system attribute
:data:`CLAIM_ATTR`: the full parameters, plus the pilot's grid key), then re-reads the study:
if another running trial holds the same claim, it decides again with that claim counted as
taken (:func:`clashes`; a proposal meant to repeat a run, a replicate, is not checked). The claim is read wherever a trial's parameters are (:func:`with_claims`),
so a trial whose parameters are still being written already counts as running its point.

Uses only the storage's public methods (``get_study_id_from_name``,
``get_trial_id_from_study_id_trial_number``, ``set_trial_system_attr``, ``record_heartbeat``:
the claim starts the trial's heartbeat, so a worker killed after claiming leaves a trial the
others fail and retry after the grace period, not a point claimed for ever). A study that
:func:`allocopt.study.open.open_study` did not open (plain Optuna code, one process) makes no
claims. Standard library and Optuna only.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterable, Iterator

from optuna.trial import TrialState

from allocopt.record import is_interrupted

CLAIM_ATTR = "allocopt.claim"
"""System attribute holding a trial's claimed parameters (``rho``, ``group_size``, ``reward``,
``model``, ``fidelity``; ``key``: the pilot grid key for a pilot)."""


class _Claimed:
    """A running trial seen with its claimed parameters (its own are not all written yet)."""

    def __init__(self, trial: Any, claim: dict[str, Any]):
        self._t, self.params = trial, {k: v for k, v in claim.items() if k != "key"}
        self.number, self.state = trial.number, trial.state
        self.system_attrs, self.user_attrs = trial.system_attrs, trial.user_attrs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


def with_claims(trials: Iterable[Any], names: Iterable[str]) -> list[Any]:
    """``trials`` with each running or waiting trial that has a claim but not yet every one of
    the parameters ``names`` replaced by a view whose ``params`` are the claimed ones."""
    names = tuple(names)
    out = []
    for t in trials:
        claim = t.system_attrs.get(CLAIM_ATTR)
        if claim and t.state in (TrialState.RUNNING, TrialState.WAITING) \
                and not all(n in t.params for n in names):
            out.append(_Claimed(t, claim))
        else:
            out.append(t)
    return out


def _key(claim: dict[str, Any]) -> tuple:
    if claim.get("key"):
        return ("pilot", claim["key"])
    return (claim.get("fidelity"), claim.get("reward"), claim.get("model"), claim.get("group_size"),
            round(float(claim.get("rho", 0.0)), 4))


def clashes(trials: Iterable[Any], number: int, claim: dict[str, Any]) -> bool:
    """Whether another trial than ``number`` holds the same claim (the same pilot key; for a
    proposal the same fidelity and allocation, ρ to 4 decimals): running, waiting, or already
    finished (a fast trial can end while a slower worker is still deciding), except a trial
    failed by an interrupt (it may be run again)."""
    mine = _key(claim)
    for t in trials:
        if t.number == number or is_interrupted(t):
            continue
        other = t.system_attrs.get(CLAIM_ATTR)
        if other and _key(other) == mine:
            return True
    return False


_RESERVING = contextvars.ContextVar("allocopt_reserving", default=False)


@contextlib.contextmanager
def reserving() -> Iterator[None]:
    """Claims written inside carry no heartbeat: ``allocopt ask`` reserves trials for runs
    launched elsewhere, which no worker may fail as stale once the grace period has passed."""
    token = _RESERVING.set(True)
    try:
        yield
    finally:
        _RESERVING.reset(token)


def write_claim(study: Any, number: int, claim: dict[str, Any]) -> bool:
    """Write ``claim`` on trial ``number``; ``False`` when the study keeps no claims (not
    opened by :func:`allocopt.study.open.open_study`)."""
    from allocopt.store.handles import trial_handle

    handle = trial_handle(study, number)
    if handle is None:  # in-memory study: one process
        return False
    storage, tid = handle
    storage.set_trial_system_attr(tid, CLAIM_ATTR, claim)
    if getattr(storage, "heartbeat_interval", None) and not _RESERVING.get():  # a worker killed from here on leaves a
        storage.record_heartbeat(tid)  # stale trial that the others fail and retry, not a claim for ever
    return True
