"""A run's full budget, parsed and checked once: :class:`Budget`, FLOPs or GPU-hours.

A study has one budget per full run. Under a FLOP budget every allocation gets the same FLOPs;
under a time budget (GPU-hours at a measured per-phase throughput) each allocation gets the
FLOPs it executes in those hours (:meth:`allocopt.plan.throughput.TimeBudget.flops_for`), and
:attr:`Budget.flops` is only the ceiling (the hours at the fastest phase: no allocation gets
more). :class:`allocopt.spec.StudySpec` builds its :class:`Budget` once
(:attr:`~allocopt.spec.StudySpec.budget`) and every reader takes it from there.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocopt.plan.allocation import Allocation, check_budget
from allocopt.plan.throughput import THROUGHPUT_PHASES, TimeBudget


@dataclass(frozen=True)
class Budget:
    """A full run's budget: ``flops`` FLOPs, or ``time`` (GPU-hours at a throughput profile)."""

    flops: float
    """FLOPs of a full run (a time budget: the ceiling, the hours at the fastest phase)."""
    time: TimeBudget | None = None
    """The time budget; ``None``: a FLOP budget."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops", check_budget(self.flops))
        if self.time is not None and not isinstance(self.time, TimeBudget):
            raise TypeError(f"time={self.time!r}: must be a TimeBudget or None")

    @classmethod
    def of_time(cls, time: TimeBudget) -> "Budget":
        """The budget of ``time``, its ceiling in FLOPs the hours at the profile's fastest phase.
        Raises :class:`ConfigError` for a profile without any rate."""
        fastest = max(r for r in (time.profile.rate(p) for p in THROUGHPUT_PHASES) if r)
        return cls(time.gpu_hours * 3600 * fastest, time)

    def for_allocation(self, allocation: Allocation, workload: Any, fraction: float = 1.0) -> float:
        """FLOPs a run of ``allocation`` on ``workload`` may spend at ``fraction`` of the full
        budget: ``fraction × flops``; under a time budget ``fraction ×`` the FLOPs the
        allocation executes in the hours at the profile's per-phase throughput.

        Raises:
            ConfigError: the profile was measured on another set-up (fingerprint), or a phase
                the allocation spends FLOPs in has no rate.
        """
        if self.time is None:
            return fraction * self.flops
        self.time.profile.check_for(workload.fingerprint(allocation))
        return fraction * self.time.flops_for(allocation, workload)


__all__ = ["Budget"]
