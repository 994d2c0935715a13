"""Runtime FLOP ledger of one trial: charges each iteration, never lets the run pass its budget.

Standard library only. Admission has two stages (charge-then-check per batch):

1. before the rollouts, :meth:`FlopMeter.admit` with the most the iteration's generation and
   learning can cost (worst case: every completion at the generation limit) — plus the reward
   model's worst case when the reward cannot price a batch before scoring it (the driver adds
   the cheapest reward of the run's earlier batches otherwise, so that stage 2 rarely refuses);
2. once the completions exist (before the reward model and the update run),
   :meth:`FlopMeter.admit_exact` with the iteration's exact cost: search and learning from the
   actual token counts (:func:`allocopt.flops.grpo.grpo_step_flops`) and the reward model's
   FLOPs for the actual texts. Refused: the generation already done is charged
   (``discarded_flops``) and the run stops.

When the exact cost of an iteration after the first does not fit, the driver may cut the rows
it trains to the most that still fit (:meth:`FlopMeter.largest_fitting`), down to
:data:`allocopt.plan.allocation.LAST_ROWS_SHARE` of its scheduled rows; stage 1 of such an
iteration bounds that least row count (the cut makes it the run's last). Refused even then:
as above.

After the iteration the driver charges what was really executed, which is never more than
what was admitted last. So the realized total is never above the budget, by construction,
and the reward model's share is bounded exactly, not by its worst case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from allocopt.flops import ComputeBreakdown, FlopAccount


def largest_fitting(cost: Callable[[int], int], lo: int, hi: int, room: float) -> int | None:
    """The largest ``r`` in ``[lo, hi]`` with ``cost(r) <= room``; ``None`` when not even
    ``cost(lo)`` fits.

    ``cost`` must not decrease with ``r`` (an iteration's FLOPs over the rows it trains). The
    search alternates a secant step (exact in one step for a cost affine in ``r``, which an
    iteration's learning is between jumps) with a bisection step, so it takes at most about
    ``2 log2(hi - lo)`` calls and 3–5 for an affine cost.

    Raises:
        ValueError: ``lo > hi``.
    """
    if lo > hi:
        raise ValueError(f"lo={lo!r} > hi={hi!r}: need lo <= hi")
    c_lo = cost(lo)
    if c_lo > room:
        return None
    c_hi = cost(hi)
    if c_hi <= room:
        return hi
    secant = True  # invariant: cost(lo) = c_lo <= room < cost(hi) = c_hi
    while hi - lo > 1:
        mid = lo + int((room - c_lo) * (hi - lo) // (c_hi - c_lo)) if secant else (lo + hi) // 2
        mid = min(hi - 1, max(lo + 1, mid))
        c = cost(mid)
        if c <= room:
            lo, c_lo = mid, c
        else:
            hi, c_hi = mid, c
        secant = not secant
    return lo


from allocopt.errors import BudgetExhausted  # noqa: E402,F401  (defined there; imported from here too)


@dataclass
class IterationRecord:
    """What one iteration spent, for curves and tracking."""

    iteration: int
    rows_trained: int
    executed_flops: int
    cumulative_flops: int
    reward_mean: float
    wall_seconds: float
    train: dict[str, float] = field(default_factory=dict)
    """The trainer's own logged metrics over this iteration's optimizer steps (mean per key),
    under TRL's names (``loss``, ``kl``, ``entropy``, ``completions/mean_length``, ``reward``,
    ``reward_std``, ``frac_reward_zero_std``, ``clip_ratio/region_mean``, ...); empty when the
    objective has no trainer (``synthetic``)."""


@dataclass
class FlopMeter:
    """Ledger of a run's FLOPs by phase against a hard budget (executed FLOPs are charged)."""

    budget_flops: float
    spent: FlopAccount = field(default_factory=lambda: FlopAccount(ComputeBreakdown(), ComputeBreakdown()))
    records: list[IterationRecord] = field(default_factory=list)
    wall_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time per phase (``search``, ``reward``, ``learning``), seconds."""
    stopped_reason: str | None = None
    refused_flops: int | None = None
    """The bound of the iteration :meth:`admit` or :meth:`admit_exact` refused (``None``: none
    refused)."""
    admitted_flops: int | None = None
    """The bound the iteration in progress was last admitted with (executed FLOPs; ``None``
    before the first admission): what its charge may be at most."""
    discarded_flops: int = 0
    """Executed FLOPs of work charged without an iteration record: the generation of a batch
    that :meth:`admit_exact` refused (spent, trained on nothing)."""

    @property
    def executed_flops(self) -> int:
        return self.spent.executed.total_flops

    @property
    def remaining_flops(self) -> float:
        return self.budget_flops - self.executed_flops

    @property
    def utilization(self) -> float:
        return self.executed_flops / self.budget_flops

    def admit(self, worst_case_flops: int) -> None:
        """Allow an iteration that costs at most ``worst_case_flops`` (executed) — stage 1.

        Raises:
            BudgetExhausted: the spent total plus the bound would pass the budget.
        """
        if self.executed_flops + worst_case_flops > self.budget_flops:
            self.refused_flops = worst_case_flops
            self.stopped_reason = (
                f"budget: {self.executed_flops:.3e} spent + up to {worst_case_flops:.3e} for the "
                f"next iteration > {self.budget_flops:.3e}")
            raise BudgetExhausted(self.stopped_reason)
        self.admitted_flops = worst_case_flops

    def admit_exact(self, exact_flops: int, *, done: FlopAccount | None = None) -> None:
        """Stage 2: allow the admitted iteration at its exact cost ``exact_flops`` (executed:
        the whole iteration, generation included), known once its completions exist; it
        replaces the stage-1 bound (it may exceed it when stage 1 left the reward model out).

        Args:
            exact_flops: the iteration's executed FLOPs (search + learning + reward).
            done: the work already executed (the generation); charged when refused.

        Raises:
            BudgetExhausted: the spent total plus ``exact_flops`` would pass the budget; ``done``
                is then charged (``discarded_flops``, no iteration record).
        """
        if self.executed_flops + exact_flops > self.budget_flops:
            self.refused_flops = exact_flops
            self.stopped_reason = (
                f"budget: {self.executed_flops:.3e} spent + {exact_flops:.3e} for the generated "
                f"batch (exact, reward included) > {self.budget_flops:.3e}")
            if done is not None:
                self.spent = self.spent + done
                self.discarded_flops += done.executed.total_flops
            raise BudgetExhausted(self.stopped_reason)
        self.admitted_flops = exact_flops

    def largest_fitting(self, cost: Callable[[int], int], lo: int, hi: int) -> int | None:
        """The most rows ``r`` in ``[lo, hi]`` whose exact cost ``cost(r)`` (executed FLOPs of
        the whole iteration, non-decreasing in ``r``) an :meth:`admit_exact` would still admit
        on top of what is spent; ``None`` when not even ``lo`` rows fit. Admits nothing
        (:func:`largest_fitting`)."""
        return largest_fitting(cost, lo, hi, self.budget_flops - self.executed_flops)

    def charge(self, acct: FlopAccount, *, rows_trained: int = 0, reward_mean: float = float("nan"),
               wall_seconds: float = 0.0) -> IterationRecord:
        """Add one iteration's FLOPs (useful and executed) and record it."""
        self.spent = self.spent + acct
        rec = IterationRecord(len(self.records), rows_trained, acct.executed.total_flops,
                              self.executed_flops, reward_mean, wall_seconds)
        self.records.append(rec)
        return rec

    def add_wall(self, phase: str, seconds: float) -> None:
        self.wall_seconds[phase] = self.wall_seconds.get(phase, 0.0) + seconds

    def timer(self, phase: str) -> "_Timer":
        """Context manager that adds its wall time to ``phase``."""
        return _Timer(self, phase)

    def to_dict(self) -> dict[str, float]:
        """Breakdown (executed and ``useful_``), utilization and wall time per phase."""
        out: dict[str, float] = dict(self.spent.to_dict())
        out["budget_flops"] = self.budget_flops
        out["budget_utilization"] = self.utilization
        out["iterations"] = len(self.records)
        if self.discarded_flops:
            out["discarded_flops"] = self.discarded_flops
        for phase, s in self.wall_seconds.items():
            out[f"{phase}_wall_seconds"] = s
        return out


class _Timer:
    def __init__(self, meter: FlopMeter, phase: str):
        self.meter, self.phase = meter, phase

    def __enter__(self) -> "_Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.meter.add_wall(self.phase, time.perf_counter() - self.t0)
