"""The RACE surrogate of a study: :func:`fit_surrogate` on its observations, and
:class:`SurrogateCache`, which refits the hyperparameters only when the study has grown enough.

The surrogate is :class:`allocopt.surrogate.MultiFidelitySurrogate` (pilots and full runs
together; the budget fraction is its fidelity). torch is imported inside functions.
"""

from __future__ import annotations

from typing import Any, Sequence

from allocopt.flops import ConfigError
from allocopt.race.data import Observation
from allocopt.spec import SearchSpace


def _encoding(space: SearchSpace):
    from allocopt.surrogate import Encoding

    return Encoding(space.rho, space.group_sizes, space.rewards, tuple(space.models) or (None,))


def fit_surrogate(obs: Sequence[Observation], space: SearchSpace, seed: int = 0, init: Any = None,
                  fit: bool = True, drift_grid: Sequence[float] | None = None):
    """The :class:`allocopt.surrogate.MultiFidelitySurrogate` over all observations (pilots and
    full runs; the budget fraction is the fidelity); ``init``: an earlier fit's ``raw``
    hyperparameters to start from as well (``fit=False``: taken as they are; only the data
    change — new runs, or pending trials conditioned on — and the posterior and the drift
    mixture's weights are recomputed, over ``drift_grid`` when given: a subset of
    ``allocopt.surrogate.DRIFT_GRID``). Raises ``ValueError`` with < 2 observations."""
    import torch

    from allocopt.surrogate import MultiFidelitySurrogate

    enc = _encoding(space)
    X = enc.tensor([enc.row(o.allocation.rho, o.allocation.group_size, o.allocation.reward,
                            o.allocation.model, o.budget_fraction) for o in obs])
    Y = torch.tensor([[o.value] for o in obs], dtype=torch.double)
    return MultiFidelitySurrogate(enc, X, Y, seed=seed, init=init, fit=fit or init is None, drift_grid=drift_grid)


class SurrogateCache:
    """The surrogate of a growing study, refitted only when worth it: the loop calls it once per
    proposal (``cache(obs)``) and gets a surrogate conditioned on every observation.

    The hyperparameters are refitted (L-BFGS-B from the defaults and from the last fit, the
    better kept) when the number of observations has grown by ``refit_growth`` (a share) since
    the last fit, or when the first full-budget run arrives; in between they are kept and only
    the posterior and the drift mixture's weights are recomputed, the latter only over the δ
    values the last surrogate kept and their neighbours (:func:`allocopt.surrogate.drift_support`;
    the rest had weight below ``MIN_WEIGHT``), a few hundredths of the fit's cost at 200 trials.
    Attributes ``fits`` and ``reuses`` count both kinds.
    """

    def __init__(self, space: SearchSpace, seed: int = 0, refit_growth: float = 0.2):
        if not refit_growth >= 0:
            raise ConfigError(f"refit_growth={refit_growth!r}: must be a number >= 0")
        self.space, self.seed, self.refit_growth = space, seed, refit_growth
        self.raw, self.n_fit, self.full_fit, self.fits, self.reuses = None, 0, False, 0, 0
        self.support: tuple[float, ...] | None = None

    def __call__(self, obs: Sequence[Observation]):
        from allocopt.surrogate import drift_support

        has_full = any(o.budget_fraction >= 1 - 1e-9 for o in obs)
        refit = (self.raw is None or len(obs) >= (1 + self.refit_growth) * self.n_fit
                 or has_full != self.full_fit)
        sur = fit_surrogate(obs, self.space, seed=self.seed + len(obs), init=self.raw, fit=refit,
                            drift_grid=None if refit else self.support)
        self.support = drift_support(sur.drifts.tolist()) if sur.drift_identifiable else None
        if refit:
            self.raw, self.n_fit, self.full_fit = sur.raw, len(obs), has_full
            self.fits += 1
        else:
            self.reuses += 1
        return sur
