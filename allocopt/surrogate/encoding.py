"""The surrogate's inputs: how an allocation and a budget fraction become one row of the GP's
``n x d`` inputs, every column in [0, 1] (:class:`Encoding`; see :mod:`allocopt.surrogate`),
and the fidelity axis (:func:`fidelity_of`, :func:`budget_fraction_of`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

FIDELITY_DECADES = 2.0
"""Decades of budget that span the fidelity axis: ``s = 0`` at 1 % of the budget, 1 at 100 %."""


def fidelity_of(budget_fraction: float) -> float:
    """The fidelity ``s`` in [0, 1] of a run at ``budget_fraction`` of the full budget."""
    return min(1.0, max(0.0, 1.0 + math.log10(budget_fraction) / FIDELITY_DECADES))


def budget_fraction_of(s: Tensor) -> Tensor:
    """Inverse of :func:`fidelity_of`: the cost of a run in full-budget runs, elementwise."""
    return torch.pow(10.0, (s - 1.0) * FIDELITY_DECADES)


@dataclass(frozen=True)
class Encoding:
    """How an allocation and a budget fraction become one row of the GP's ``n x d`` inputs."""

    rho_range: tuple[float, float]
    group_sizes: tuple[int, ...]
    rewards: tuple[str, ...]
    models: tuple[str | None, ...] = (None,)

    @property
    def columns(self) -> list[str]:
        cols = ["rho"]
        if len(self.group_sizes) > 1:
            cols.append("log2_group_size")
        if len(self.rewards) > 1:
            cols += [f"reward={r}" for r in self.rewards]
        if len(self.models) > 1:
            cols += [f"model={m}" for m in self.models]
        return cols + ["fidelity"]

    @property
    def dim(self) -> int:
        """``d``, the number of input columns (fidelity last)."""
        return len(self.columns)

    @property
    def fidelity_column(self) -> int:
        return self.dim - 1

    def _span(self, prefix: str) -> slice | None:
        idx = [i for i, c in enumerate(self.columns) if c.startswith(prefix)]
        return slice(idx[0], idx[-1] + 1) if idx else None

    def row(self, rho: float, group_size: int, reward: str, model: str | None,
            budget_fraction: float) -> list[float]:
        """One input row (length ``d``)."""
        lo, hi = self.rho_range
        out = [(rho - lo) / (hi - lo) if hi > lo else 0.0]
        if len(self.group_sizes) > 1:
            g0, g1 = math.log2(min(self.group_sizes)), math.log2(max(self.group_sizes))
            out.append((math.log2(group_size) - g0) / (g1 - g0))
        if len(self.rewards) > 1:
            out += [float(reward == r) for r in self.rewards]
        if len(self.models) > 1:
            out += [float(model == m) for m in self.models]
        return out + [fidelity_of(budget_fraction)]

    def tensor(self, rows: Sequence[Sequence[float]]) -> Tensor:
        """``n x d`` double tensor of rows made by :meth:`row`."""
        return torch.tensor([list(r) for r in rows], dtype=torch.double).reshape(-1, self.dim)
