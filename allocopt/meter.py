"""Runtime FLOP ledger of one trial: charges each iteration, never lets the run pass its budget.

Standard library only. The driver asks :meth:`FlopMeter.admit` before every iteration with the
most that iteration can cost (worst case: longest prompt of the batch, every completion at
the generation limit); the meter admits it only if the spent total plus that bound stays
within the budget. After the iteration the driver charges what was really executed, computed
by :func:`allocopt.grpo_flops.grpo_step_flops` from the actual token counts. So the realized
total is never above the budget, by construction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from allocopt.flops import ComputeBreakdown, FlopAccount


class BudgetExhausted(RuntimeError):
    """The next iteration could pass the budget; the run stops before it."""


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
    """The worst-case bound of the iteration :meth:`admit` refused (``None``: none refused)."""

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
        """Allow an iteration that costs at most ``worst_case_flops`` (executed).

        Raises:
            BudgetExhausted: the spent total plus the bound would pass the budget.
        """
        if self.executed_flops + worst_case_flops > self.budget_flops:
            self.refused_flops = worst_case_flops
            self.stopped_reason = (
                f"budget: {self.executed_flops:.3e} spent + up to {worst_case_flops:.3e} for the "
                f"next iteration > {self.budget_flops:.3e}")
            raise BudgetExhausted(self.stopped_reason)

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
