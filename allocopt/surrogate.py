"""A multi-fidelity BoTorch surrogate of the target over allocations, pilots and full runs.

torch, gpytorch and BoTorch are imported here (and below) only; ``import allocopt`` and the
CLI stay light. Fits run on one thread (``torch.set_num_threads(1)``: 5–12× faster on 2 cores).

Inputs. One row per trial, ``n x d``, every column in [0, 1] (only the dimensions that vary in
the search space are encoded):

* ρ, scaled to its range: ``(rho - lo) / (hi - lo)``;
* G as ``log2 G`` scaled to the range of the space's group sizes;
* the reward system, one-hot (one column per reward system of the space);
* the policy model, one-hot (when the space names several);
* the **fidelity** ``s`` (last column): ``s = 1 + log10(budget / budget_flops) / FIDELITY_DECADES``,
  clamped to [0, 1], so a full-budget run has ``s = 1`` and a pilot at 10 % of the budget
  ``s = 0.5``.

Model. :class:`botorch.models.SingleTaskMultiFidelityGP` with ``data_fidelities=[d - 1]``: a
Matérn-5/2 ARD kernel ``k0(x, x')`` over the allocation plus a fidelity kernel
(``LinearTruncatedFidelityKernel``)::

    k((x, s), (x', s')) = k0(x, x') + c(s, s') k1(x, x'),   c(s, s') = (1 - s)(1 - s')(1 + s s')^p

The bias term ``c k1`` vanishes at the full budget (``s = 1``), so pilots inform the
full-budget prediction through ``k0`` without being taken for full runs: the GP learns how far
pilots drift (the synthetic objective's optimum moves +0.03 in ρ per decade of budget).
Outcomes are standardized (``Standardize``); observation noise is inferred.

Acquisition. :class:`qMultiFidelityMaxValueEntropy` (Takeno et al. 2020): the information a run
gives about the maximum of the target *at the full budget*, divided by its cost,
``cost = budget / budget_flops = 10^((s - 1) · FIDELITY_DECADES)`` (a full run costs
``1 / pilot_fraction`` pilots), :class:`InverseCostWeightedUtility`. Candidates are a discrete
set (ρ grid × G × reward × model × fidelity); batches (``q > 1``) are chosen greedily, each
pick conditioned on the earlier ones by the *kriging believer* (the model is conditioned on
the picked point at its posterior mean, which shrinks the information left nearby). A caller's
``accept`` test (budget feasibility, no repeats) runs on candidates in order of value, so a
rejected candidate is replaced by the next best.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

torch.set_num_threads(1)

FIDELITY_DECADES = 2.0
"""Decades of budget that span the fidelity axis: ``s = 0`` at 1 % of the budget, 1 at 100 %."""


def fidelity_of(budget_fraction: float) -> float:
    """The fidelity ``s`` in [0, 1] of a run at ``budget_fraction`` of the full budget."""
    return min(1.0, max(0.0, 1.0 + math.log10(budget_fraction) / FIDELITY_DECADES))


def budget_fraction_of(s: Tensor) -> Tensor:
    """Inverse of :func:`fidelity_of`: the cost of a run in full-budget runs (``... x 1``-shaped
    input gives ``...``-shaped output when indexed by the caller)."""
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


class MultiFidelitySurrogate:
    """The fitted multi-fidelity GP (module docstring) and its cost-aware proposals.

    Args:
        encoding: the input encoding.
        X: ``n x d`` inputs (:meth:`Encoding.tensor`), fidelity in the last column.
        Y: ``n x 1`` target values (higher is better).
        seed: seeds torch for max-value sampling and posterior samples.

    Attributes:
        fit_seconds: wall time of the hyperparameter fit.
    """

    def __init__(self, encoding: Encoding, X: Tensor, Y: Tensor, *, seed: int = 0):
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskMultiFidelityGP
        from gpytorch.mlls import ExactMarginalLogLikelihood

        if X.dim() != 2 or X.shape[-1] != encoding.dim or Y.shape != (X.shape[0], 1):
            raise ValueError(f"X must be n x {encoding.dim} and Y n x 1; got {tuple(X.shape)} and "
                             f"{tuple(Y.shape)}")
        if X.shape[0] < 2:
            raise ValueError(f"{X.shape[0]} observation(s): the surrogate needs at least 2")
        self.encoding, self.seed = encoding, seed
        self.X, self.Y = X.to(torch.double), Y.to(torch.double)
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        self.model = SingleTaskMultiFidelityGP(self.X, self.Y,
                                               data_fidelities=[encoding.fidelity_column])
        mll = ExactMarginalLogLikelihood(self.model.likelihood, self.model)
        try:
            fit_gpytorch_mll(mll)
        except Exception as e:  # noqa: BLE001 - a failed fit keeps the prior hyperparameters
            warnings.warn(f"surrogate fit failed ({type(e).__name__}: {e}); using the prior "
                          "hyperparameters", RuntimeWarning, stacklevel=2)
        self.model.eval()
        self.fit_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ predictions
    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and standard deviation (noise-free) of the target at ``m x d`` inputs;
        two ``m``-shaped tensors."""
        with torch.no_grad():
            post = self.model.posterior(X.to(torch.double))
            return post.mean.squeeze(-1), post.variance.clamp_min(0).sqrt().squeeze(-1)

    def sample(self, X: Tensor, num_samples: int) -> Tensor:
        """Joint posterior samples of the target: ``b x g x d`` inputs (``b`` curves of ``g``
        points) give ``num_samples x b x g`` values."""
        torch.manual_seed(self.seed)
        with torch.no_grad():
            post = self.model.posterior(X.to(torch.double))
            return post.rsample(torch.Size([num_samples])).squeeze(-1)

    # ------------------------------------------------------------------ proposals
    def _acquisition(self, model, candidates: Tensor):
        from botorch.acquisition.cost_aware import InverseCostWeightedUtility
        from botorch.acquisition.max_value_entropy_search import qMultiFidelityMaxValueEntropy
        from botorch.acquisition.utils import project_to_target_fidelity
        from botorch.models.deterministic import GenericDeterministicModel

        f = self.encoding.fidelity_column
        cost = GenericDeterministicModel(lambda X: budget_fraction_of(X[..., f]).unsqueeze(-1))
        full = candidates[candidates[:, f] >= 1.0 - 1e-9]
        if full.shape[0] == 0:
            full = project_to_target_fidelity(candidates, {f: 1.0}, d=candidates.shape[-1])
        return qMultiFidelityMaxValueEntropy(
            model, candidate_set=full, num_mv_samples=10,
            cost_aware_utility=InverseCostWeightedUtility(cost_model=cost),
            project=lambda X: project_to_target_fidelity(X, {f: 1.0}, d=X.shape[-1]))

    def acquisition_values(self, candidates: Tensor, model=None) -> Tensor:
        """Cost-weighted information gain about the full-budget maximum, per candidate:
        ``m x d`` candidates give ``m`` values (nats per full-budget run of compute)."""
        torch.manual_seed(self.seed)
        acq = self._acquisition(model if model is not None else self.model, candidates)
        with torch.no_grad():
            return torch.cat([acq(candidates[i:i + 512].unsqueeze(-2))
                              for i in range(0, candidates.shape[0], 512)])

    def select(self, candidates: Tensor, q: int, accept: Callable[[int], bool],
               *, max_checks: int = 200) -> list[tuple[int, float]]:
        """Greedy batch of up to ``q`` candidates by cost-weighted information gain.

        Args:
            candidates: ``m x d`` candidate inputs (fidelity in the last column).
            q: batch size.
            accept: called with a candidate's index in order of value; ``False`` rejects it
                (infeasible under the budget, a repeat) and the next best is tried.
            max_checks: most ``accept`` calls per pick.

        Returns:
            ``[(index, value), ...]`` (fewer than ``q`` when candidates run out).
        """
        chosen: list[tuple[int, float]] = []
        taken: set[int] = set()
        model = self.model
        for _ in range(q):
            values = self.acquisition_values(candidates, model)
            order = torch.argsort(values, descending=True).tolist()
            pick = None
            checks = 0
            for i in order:
                if i in taken:
                    continue
                checks += 1
                ok = accept(i)
                taken.add(i)  # accepted or rejected: never offered again
                if ok:
                    pick = i
                    break
                if checks >= max_checks:
                    break
            if pick is None:
                break
            chosen.append((pick, float(values[pick])))
            x = candidates[pick:pick + 1]
            with torch.no_grad():  # kriging believer: condition on the posterior mean
                y = model.posterior(x).mean
                model = model.condition_on_observations(x, y)
        return chosen


__all__ = ["Encoding", "FIDELITY_DECADES", "MultiFidelitySurrogate", "budget_fraction_of",
           "fidelity_of"]
