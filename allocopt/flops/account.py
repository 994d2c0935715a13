"""FLOP breakdowns by phase (:class:`ComputeBreakdown`) and useful vs executed accounts
(:class:`FlopAccount`). Part of :mod:`allocopt.flops` (standard library only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from allocopt.flops.shapes import ConfigError

PHASES = ("search", "learning", "reward")


@dataclass(frozen=True)
class ComputeBreakdown:
    """FLOPs of a run by phase, each phase split into named items.

    ``search``: rollout generation (``prefill``, ``decode``). ``learning``: everything the update
    needs (``old_logprobs``, ``ref_logprobs``, ``forward``, ``backward``, ``recompute``).
    ``reward``: reward-model inference (``reward_model``). All values are FLOPs (int).
    ``rho = learning / (search + learning + reward)`` (the update fraction ρ).
    Breakdowns add (``a + b``) and scale (``a * k``, rounded down per item).
    """

    search: Mapping[str, int] = field(default_factory=dict)
    learning: Mapping[str, int] = field(default_factory=dict)
    reward: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for phase in PHASES:
            for item, v in getattr(self, phase).items():
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ConfigError(f"{phase}.{item}={v!r}: FLOPs must be a non-negative int")

    @property
    def search_flops(self) -> int:
        return sum(self.search.values())

    @property
    def learning_flops(self) -> int:
        return sum(self.learning.values())

    @property
    def reward_flops(self) -> int:
        return sum(self.reward.values())

    @property
    def total_flops(self) -> int:
        return self.search_flops + self.learning_flops + self.reward_flops

    @property
    def rho(self) -> float:
        """Update fraction ρ = learning / total (NaN for an empty breakdown)."""
        t = self.total_flops
        return self.learning_flops / t if t else math.nan

    def __add__(self, other: "ComputeBreakdown") -> "ComputeBreakdown":
        if not isinstance(other, ComputeBreakdown):
            return NotImplemented
        return ComputeBreakdown(**{p: _add(getattr(self, p), getattr(other, p)) for p in PHASES})

    def __radd__(self, other: Any) -> "ComputeBreakdown":  # sum() starts at 0
        return self if other == 0 else NotImplemented

    def __mul__(self, k: float) -> "ComputeBreakdown":
        if k < 0 or math.isnan(k):
            raise ConfigError(f"scale={k!r}: must be a non-negative number")
        return ComputeBreakdown(**{p: {i: int(v * k) for i, v in getattr(self, p).items()}
                                   for p in PHASES})

    __rmul__ = __mul__

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat dict for tracking: ``search_flops``, ``learning_flops``, ``reward_flops``,
        ``total_flops``, ``rho`` and one ``<phase>_<item>_flops`` per item, each key prefixed."""
        out: dict[str, float] = {}
        for p in PHASES:
            out[f"{prefix}{p}_flops"] = getattr(self, f"{p}_flops")
        out[f"{prefix}total_flops"] = self.total_flops
        out[f"{prefix}rho"] = self.rho
        for p in PHASES:
            for item, v in sorted(getattr(self, p).items()):
                out[f"{prefix}{p}_{item}_flops"] = v
        return out


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


@dataclass(frozen=True)
class FlopAccount:
    """Useful and executed FLOPs of the same work. Budgets are charged ``executed``."""

    useful: ComputeBreakdown
    """FLOPs of the actual tokens (no padding, causal attention, only needed logits)."""
    executed: ComputeBreakdown
    """FLOPs the engine in use computes (padding, masked attention, extra logits)."""

    def __add__(self, other: "FlopAccount") -> "FlopAccount":
        if not isinstance(other, FlopAccount):
            return NotImplemented
        return FlopAccount(self.useful + other.useful, self.executed + other.executed)

    def __radd__(self, other: Any) -> "FlopAccount":
        return self if other == 0 else NotImplemented

    def __mul__(self, k: float) -> "FlopAccount":
        return FlopAccount(self.useful * k, self.executed * k)

    __rmul__ = __mul__

    def to_dict(self) -> dict[str, float]:
        """Executed numbers under the plain names, useful ones prefixed ``useful_``."""
        return {**self.executed.to_dict(), **self.useful.to_dict("useful_")}


__all__ = ["ComputeBreakdown", "FlopAccount", "PHASES"]
