"""What the tuner works on: plain values, no study, no Optuna.

The sampler's translator (:mod:`allocopt.study.observe`) turns a study's trials into these; the
tuner (:mod:`allocopt.race`, :mod:`allocopt.surrogate`) reads nothing else:

* :class:`Observation` — a finished run with its value;
* :class:`Run` — a run that ran, runs or waits (finished, failed or pending): the tuner never
  proposes it again, and conditions on the pending ones;
* :class:`Budgets` — FLOPs of a run per fidelity (one budget, or one per allocation under a
  time budget);
* :data:`Feasible` — whether an allocation's plan fits at a budget fraction;
* the search space, :class:`allocopt.spec.SearchSpace` (already plain).

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

from allocopt.flops import ConfigError
from allocopt.plan.allocation import FIDELITIES, Allocation

Feasible = Callable[[Allocation, float], bool]
"""``feasible(allocation, fraction)``: whether a run of ``allocation`` at ``fraction`` of its
full budget has a plan that fits (realizable, expected executed FLOPs within the budget)."""


@dataclass(frozen=True)
class Observation:
    """A finished run of the study, as the tuner reads it."""

    number: int
    """The trial's number (its order in the study)."""
    allocation: Allocation
    """Where the run was: ρ, G, reward system, model (a run recorded by ``allocopt tell`` at
    the ρ it really spent)."""
    value: float
    """The target (a share in [0, 1]; higher is better)."""
    budget_flops: float
    """FLOPs the run was allowed."""
    budget_fraction: float
    """``budget_flops`` over its allocation's full budget (1 for a full run, the pilot fraction
    for a pilot): the surrogate's fidelity."""
    fidelity: str
    """``pilot`` or ``full``."""
    reward_share: float = math.nan
    """Executed reward FLOPs / total FLOPs of the run (NaN when not recorded)."""
    variance: float = math.nan
    """The known variance of ``value``'s evaluation (target units squared) when the trial
    reports it (metric ``<target key>_variance``, e.g. ``p (1 - p) / n_eval`` for a pass rate
    over ``n_eval`` problems); NaN when unknown."""


@dataclass(frozen=True)
class Run:
    """A run of the study that ran, runs or waits: finished (with a value or not: failed,
    infeasible) or pending. A run stopped by an interrupt is none: it may run again."""

    allocation: Allocation
    """The allocation it was asked for."""
    fidelity: str
    """``pilot`` or ``full``."""
    pending: bool = False
    """Running or waiting in the queue: no value yet."""

    def __post_init__(self) -> None:
        if self.fidelity not in FIDELITIES:
            raise ConfigError(f"fidelity={self.fidelity!r}: allowed: {', '.join(FIDELITIES)}")


FullBudget = Union[float, Callable[[Allocation], float], None]


@dataclass(frozen=True)
class Budgets:
    """FLOPs of a run per fidelity: a full run gets its allocation's full budget, a pilot
    ``pilot_fraction`` of it."""

    full: FullBudget
    """The full budget (FLOPs): one number for every allocation, or a function of the
    allocation (a time budget: the FLOPs it executes in the hours); ``None`` when it cannot be
    priced here (a time budget without the workload): a run then sits at its fidelity's
    fraction (:meth:`fraction_of`)."""
    pilot_fraction: float = 0.1
    """A pilot's share of its allocation's full budget, in (0, 1)."""

    def __post_init__(self) -> None:
        f = self.pilot_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
            raise ConfigError(f"pilot_fraction={f!r}: must be a number strictly between 0 and 1 "
                              "(pilots run at pilot_fraction x budget_flops)")
        if isinstance(self.full, (int, float)) and not (self.full > 0 and math.isfinite(self.full)):
            raise ConfigError(f"budget_flops={self.full!r}: must be a positive, finite number of FLOPs")

    @property
    def priced(self) -> bool:
        """Whether an allocation's full budget is known here (:attr:`full` is not ``None``)."""
        return self.full is not None

    def fraction(self, fidelity: str) -> float:
        """The budget fraction of a run at ``fidelity``: ``pilot_fraction`` or 1."""
        if fidelity not in FIDELITIES:
            raise ConfigError(f"fidelity={fidelity!r}: allowed: {', '.join(FIDELITIES)}")
        return self.pilot_fraction if fidelity == "pilot" else 1.0

    def full_flops(self, allocation: Allocation) -> float:
        """FLOPs of a full run of ``allocation``. Raises :class:`ConfigError` when unpriced."""
        if self.full is None:
            raise ConfigError("budget: the full budget of an allocation is not known here (a time "
                              "budget needs the workload to be priced)")
        return float(self.full(allocation)) if callable(self.full) else float(self.full)

    def flops(self, allocation: Allocation, fraction: float) -> float:
        """FLOPs of a run of ``allocation`` at ``fraction`` of its full budget."""
        return fraction * self.full_flops(allocation)

    def fraction_of(self, allocation: Allocation, budget_flops: float, fidelity: str) -> float:
        """The budget fraction of a run of ``allocation`` allowed ``budget_flops``: over its full
        budget when priced, else its fidelity's (:meth:`fraction`)."""
        if not self.priced:
            return self.fraction(fidelity)
        return budget_flops / self.full_flops(allocation)


__all__ = ["Budgets", "Feasible", "Observation", "Run"]
