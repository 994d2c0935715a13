"""The fitted surrogate: :class:`MultiFidelitySurrogate`, a mixture over the budget drift δ of
GPs with the kernel of :mod:`allocopt.surrogate.kernel` (model and fit: :mod:`allocopt.surrogate`).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Sequence

import gpytorch
import torch
from botorch.fit import fit_gpytorch_mll
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from allocopt.surrogate.encoding import Encoding
from allocopt.surrogate.kernel import (_HYPERS, _KERNEL_NAMES, _NAMES, MultiFidelityKernel, _ExactGP, _get_raw,
                                       _likelihood, _set_raw, _settings)

DRIFT_PRIOR_SD = 0.05
"""Prior standard deviation of the drift δ of the optimal ρ per decade of budget (ρ units)."""
DRIFT_GRID: tuple[float, ...] = tuple(round(-0.15 + 0.01 * i, 4) for i in range(31))
"""δ values (ρ per decade of budget) of the mixture: -0.15 … 0.15, step 0.01 (± 3 prior sd)."""
MIN_WEIGHT = 1e-3
"""Mixture components below this weight are dropped (the rest renormalized)."""


def drift_support(drifts: Sequence[float], pad: int = 1) -> tuple[float, ...]:
    """The ``DRIFT_GRID`` values within ``pad`` grid steps of any of ``drifts`` (a mixture's kept
    δ values): the δ grid a refit-free update of that mixture evaluates."""
    idx = {DRIFT_GRID.index(min(DRIFT_GRID, key=lambda g: abs(g - float(d)))) for d in drifts}
    return tuple(DRIFT_GRID[j] for j in sorted({min(max(i + k, 0), len(DRIFT_GRID) - 1)
                                                for i in idx for k in range(-pad, pad + 1)}))


class MultiFidelitySurrogate:
    """The fitted multi-fidelity GP (module docstring): a mixture over the budget drift δ.

    Args:
        encoding: the input encoding.
        X: ``n x d`` inputs (:meth:`Encoding.tensor`), fidelity in the last column.
        Y: ``n x 1`` target values (higher is better).
        seed: seeds the posterior samples (a private generator; torch's global one is untouched).
        init: raw hyperparameters of an earlier fit (:attr:`raw`) to start from as well.
        fit: ``False``: take ``init`` as the hyperparameters, unfitted (tests compare at fixed ones).
        drift_grid: the δ values whose marginal likelihood is computed for the mixture (a subset
            of ``DRIFT_GRID``; default all of it). A caller that keeps the hyperparameters of an
            earlier fit passes the δ values that fit kept and their neighbours
            (:func:`drift_support`): the others had weight below ``MIN_WEIGHT`` and are left out
            (the 31 batched likelihoods are most of a proposal's cost at 200 trials).

    Attributes:
        fit_seconds: wall time of the fit (hyperparameters and the δ mixture).
        raw: the fitted raw hyperparameters, a length-14 vector in ``_NAMES`` order (log values;
            logits for ζ); pass as ``init`` to warm-start a refit.
        drifts, weights: the mixture's δ values (ρ per decade of budget) and their weights.
        model: the GPyTorch ``ExactGP`` at the most likely δ (its hyperparameters are :attr:`raw`).

    Raises:
        ValueError: shapes that do not match the encoding, fewer than 2 observations, or
            ``fit=False`` without an ``init`` of the right length.
    """

    def __init__(self, encoding: Encoding, X: Tensor, Y: Tensor, *, seed: int = 0,
                 init: Tensor | None = None, fit: bool = True, drift_grid: Sequence[float] | None = None):
        if X.dim() != 2 or X.shape[-1] != encoding.dim or Y.shape != (X.shape[0], 1):
            raise ValueError(f"X must be n x {encoding.dim} and Y n x 1; got {tuple(X.shape)} and "
                             f"{tuple(Y.shape)}")
        if X.shape[0] < 2:
            raise ValueError(f"{X.shape[0]} observation(s): the surrogate needs at least 2")
        if not fit and (init is None or init.shape != (len(_NAMES),)):
            raise ValueError(f"fit=False needs init, a vector of {len(_NAMES)} raw hyperparameters")
        grid = DRIFT_GRID if drift_grid is None else tuple(sorted({float(d) for d in drift_grid}))
        if not grid or any(d not in DRIFT_GRID for d in grid):
            raise ValueError(f"drift_grid={drift_grid!r}: must be a non-empty subset of DRIFT_GRID")
        t0 = time.perf_counter()
        self.grid = torch.tensor(grid, dtype=torch.double)
        self.encoding, self.seed = encoding, seed
        self.X, self.Y = X.to(torch.double), Y.to(torch.double)
        y = self.Y[:, 0]
        self.y_mean = float(y.mean())
        self.y_std = float(y.std()) if X.shape[0] > 1 and float(y.std()) > 1e-9 else 1.0
        self.y = (y - self.y_mean) / self.y_std
        has_full = bool((self.X[:, -1] >= 1.0 - 1e-9).any())
        has_low = bool((self.X[:, -1] < 1.0 - 1e-9).any())
        self.drift_identifiable = has_full and has_low
        self.model = _ExactGP(self.X, self.y, _likelihood(), MultiFidelityKernel(encoding))
        with _settings(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            if fit:
                self._fit([self._default(), init])
            else:
                _set_raw(self.model, init.to(torch.double))
            self._mixture(refit=fit)
        self.fit_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ fitting
    @staticmethod
    def _default() -> Tensor:
        return torch.tensor([v[0] for v in _HYPERS.values()], dtype=torch.double)

    def _neg_log_post(self, model: _ExactGP) -> Tensor:
        """``-(log marginal likelihood + log prior)`` of ``model`` (batch-shaped for a batch)."""
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        out = model(*model.train_inputs)
        return -mll(out, model.train_targets) * self.X.shape[0]

    def _fit(self, starts: list[Tensor | None]) -> None:
        """MAP hyperparameters of :attr:`model` at its δ, from each start; the best is kept."""
        best, best_val = None, math.inf
        for s in starts:
            if s is None or s.shape != (len(_NAMES),):
                continue
            _set_raw(self.model, s.to(torch.double))
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.model.likelihood, self.model)
            try:
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 60}}, max_attempts=1,
                                 warning_handler=lambda w: True)
            except Exception as e:  # noqa: BLE001 - a failed fit keeps its start
                warnings.warn(f"surrogate fit failed ({type(e).__name__}: {e}); keeping the start",
                              RuntimeWarning, stacklevel=3)
                _set_raw(self.model, s.to(torch.double))
            try:
                with torch.no_grad():
                    val = float(self._neg_log_post(self.model))
            except Exception:  # noqa: BLE001 - not positive definite at these values
                val = math.inf
            if math.isfinite(val) and val < best_val:
                best, best_val = _get_raw(self.model), val
        _set_raw(self.model, best if best is not None else self._default())

    def _batch(self, drifts: Tensor) -> _ExactGP:
        """A batch of models, one per δ in ``drifts``, with :attr:`model`'s hyperparameters."""
        c = drifts.shape[0]
        m = _ExactGP(self.X.expand(c, *self.X.shape), self.y.expand(c, -1), _likelihood(),
                     MultiFidelityKernel(self.encoding, drifts))
        _set_raw(m, self.raw)
        return m

    def _log_weights(self) -> Tensor:
        """Normalized log mixture weights over :attr:`grid` (``DRIFT_GRID`` or the subset asked
        for) at :attr:`raw` (marginal likelihood from GPyTorch × the δ prior)."""
        drifts = self.grid
        with torch.no_grad(), _settings():
            try:
                nlp = self._neg_log_post(self._batch(drifts))
            except Exception:  # noqa: BLE001 - one δ not positive definite: one at a time
                nlp = torch.stack([self._safe_nlp(d) for d in drifts])
        lp = -nlp - 0.5 * (drifts / DRIFT_PRIOR_SD) ** 2
        return lp - torch.logsumexp(lp, 0)

    def _safe_nlp(self, drift: Tensor) -> Tensor:
        try:
            return self._neg_log_post(self._batch(drift.reshape(1)))[0]
        except Exception:  # noqa: BLE001
            return torch.tensor(1e10, dtype=torch.double)

    @property
    def raw(self) -> Tensor:
        """The raw hyperparameters (length 14, ``_NAMES`` order; log values, logits for ζ)."""
        return _get_raw(self.model)

    def _mixture(self, refit: bool) -> None:
        if not self.drift_identifiable:  # the likelihood does not depend on δ: the whole grid's prior
            self.grid = torch.tensor(DRIFT_GRID, dtype=torch.double)
        drifts = self.grid
        if self.drift_identifiable:
            lw = self._log_weights()
            top = float(drifts[int(lw.argmax())])
            if top != 0.0 and refit:  # refit the other hyperparameters at the most likely drift
                self.model.covar_module.drift.fill_(top)
                self._fit([self.raw])
                lw = self._log_weights()
        else:  # the likelihood does not depend on δ: the prior
            lw = -0.5 * (drifts / DRIFT_PRIOR_SD) ** 2
            lw = lw - torch.logsumexp(lw, 0)
        w = lw.exp()
        keep = torch.nonzero(w >= MIN_WEIGHT)[:, 0]
        if len(keep) == 0:
            keep = w.argmax().reshape(1)
        self.drifts = drifts[keep]
        self.weights = w[keep] / w[keep].sum()
        k = self.model.covar_module
        self.params = {name: k.value(name).detach() for name in _KERNEL_NAMES}
        self.params["noise"] = self.model.likelihood.noise.detach().reshape(())
        self.model.covar_module.drift.fill_(float(self.drifts[int(self.weights.argmax())]))
        self.model.eval()
        self._mix = self._batch(self.drifts).eval()

    # ------------------------------------------------------------------ the posterior
    @property
    def noise_sd(self) -> float:
        """Observation noise standard deviation (target units)."""
        return math.sqrt(float(self.params["noise"])) * self.y_std

    @property
    def drift(self) -> tuple[float, float]:
        """Posterior mean and standard deviation of δ (optimal ρ shift per decade of budget)."""
        m = float((self.weights * self.drifts).sum())
        return m, math.sqrt(max(0.0, float((self.weights * (self.drifts - m) ** 2).sum())))

    def _posterior(self, X: Tensor) -> MultivariateNormal:
        """GPyTorch's noise-free posterior of every mixture component at ``m x d`` inputs: a
        batch ``c x m`` ``MultivariateNormal`` (standardized units)."""
        Xb = X.to(torch.double).expand(len(self.drifts), *X.shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            return self._mix(Xb)

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and standard deviation (noise-free, target units) of the mixture at
        ``m x d`` inputs; two ``m``-shaped tensors."""
        with (torch.no_grad(), _settings(), gpytorch.settings.min_variance(0.0),
              gpytorch.settings.max_eager_kernel_size(0), warnings.catch_warnings()):
            warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
            post = self._posterior(X)
            M, V = post.mean, post.variance.clamp_min(0.0)
            w = self.weights[:, None]
            mean = (w * M).sum(0)
            var = (w * (V + M * M)).sum(0) - mean * mean
        return mean * self.y_std + self.y_mean, var.clamp_min(0).sqrt() * self.y_std

    def sample(self, X: Tensor, num_samples: int) -> Tensor:
        """Joint posterior samples of the target: ``b x g x d`` inputs (``b`` curves of ``g``
        points) give ``num_samples x b x g`` values; each sample draws its δ from the mixture
        (GPyTorch's ``rsample`` of that component, on base samples from a seeded generator)."""
        gen = torch.Generator().manual_seed(self.seed)
        shape = X.shape[:-1]
        flat = X.reshape(-1, X.shape[-1]).to(torch.double)
        comp = torch.multinomial(self.weights, num_samples, replacement=True, generator=gen)
        out = torch.empty(num_samples, flat.shape[0], dtype=torch.double)
        with torch.no_grad(), _settings(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
            post = self._posterior(flat)
            for k in range(len(self.drifts)):
                idx = (comp == k).nonzero()[:, 0]
                if len(idx) == 0:
                    continue
                z = torch.randn(flat.shape[0], len(idx), dtype=torch.double, generator=gen).T
                mvn = MultivariateNormal(post.mean[k], post.lazy_covariance_matrix[k])
                out[idx] = mvn.rsample(torch.Size([len(idx)]), base_samples=z)
        return (out * self.y_std + self.y_mean).reshape(num_samples, *shape)

    def covariance_with(self, x: Tensor, Z: Tensor) -> tuple[Tensor, Tensor]:
        """For one ``1 x d`` input ``x`` and ``m x d`` inputs ``Z``, under the most likely δ:
        ``(posterior covariance of f(x) with f(Z), posterior variance of f(Z))``, two ``m``
        tensors in target units squared (what observing ``Z`` would teach about ``f(x)``)."""
        with torch.no_grad(), _settings(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            cov = self.model(torch.cat([x, Z]).to(torch.double)).covariance_matrix
        s2 = self.y_std ** 2
        return cov[0, 1:] * s2, torch.diagonal(cov)[1:] * s2
