"""Test-only closed-form reference of the multi-fidelity GP surrogate, used to check the GPyTorch port.

This is the hand-written exact GP that :mod:`allocopt.surrogate` was before it was ported to
GPyTorch/BoTorch (commit 02eee56), kept verbatim below the line as an independent second method:
its own Cholesky, marginal likelihood, L-BFGS fit and posterior. ``tests/test_surrogate.py`` sets
both to the same hyperparameters and drift and checks the port's posterior mean, variance and
δ-mixture weights against this file. Not used by the package.

The model it implements is documented in :mod:`allocopt.surrogate` (same kernel, drift mixture,
priors). The encoding, constants and hyperparameter table are imported from there (they are
inputs, not the GP math under test).
"""

from __future__ import annotations

import math
import time
import warnings

import torch
from torch import Tensor

torch.set_num_threads(1)

from allocopt.surrogate import (DRIFT_GRID, DRIFT_PRIOR_SD, FIDELITY_DECADES, MIN_WEIGHT,  # noqa: F401
                                Encoding, budget_fraction_of, fidelity_of)
from allocopt.surrogate.kernel import _HYPERS

_NAMES = tuple(_HYPERS)
_SQRT5 = math.sqrt(5.0)


def _matern52(d: Tensor, ls: Tensor) -> Tensor:
    r = _SQRT5 * d.abs() / ls
    return (1.0 + r + r * r / 3.0) * torch.exp(-r)


class _Kernel:
    """The kernel of the module docstring for one encoding (hyperparameters as a raw vector)."""

    def __init__(self, enc: Encoding):
        self.enc = enc
        cols = enc.columns
        self.g_col = cols.index("log2_group_size") if "log2_group_size" in cols else None
        self.r_span = enc._span("reward=")
        self.m_span = enc._span("model=")
        self.f_col = enc.fidelity_column
        lo, hi = enc.rho_range
        self.drift_scale = FIDELITY_DECADES / (hi - lo) if hi > lo else 0.0

    @staticmethod
    def unpack(raw: Tensor) -> dict[str, Tensor]:
        p = {k: raw[i] for i, k in enumerate(_NAMES)}
        out = {k: torch.exp(v) for k, v in p.items() if not k.startswith("zeta")}
        out["noise"] = out["noise"] + 1e-6
        out["zeta_reward"] = torch.sigmoid(p["zeta_reward"])
        out["zeta_model"] = torch.sigmoid(p["zeta_model"])
        return out

    @staticmethod
    def log_prior(raw: Tensor) -> Tensor:
        mu = torch.tensor([v[1] for v in _HYPERS.values()], dtype=raw.dtype)
        sd = torch.tensor([v[2] for v in _HYPERS.values()], dtype=raw.dtype)
        return -0.5 * (((raw - mu) / sd) ** 2).sum()

    def __call__(self, A: Tensor, B: Tensor, p: dict[str, Tensor], drift: float) -> Tensor:
        """``n x m`` covariance between ``n x d`` rows ``A`` and ``m x d`` rows ``B``."""
        fa, fb = A[:, self.f_col], B[:, self.f_col]
        wa = A[:, 0] + drift * self.drift_scale * (1.0 - fa)
        wb = B[:, 0] + drift * self.drift_scale * (1.0 - fb)
        k_rho = _matern52(wa[:, None] - wb[None, :], p["rho_ls"])
        same_r = same_m = None
        cat = torch.ones_like(k_rho)
        if self.r_span is not None:
            same_r = A[:, self.r_span] @ B[:, self.r_span].T
            cat = cat * (p["zeta_reward"] + (1 - p["zeta_reward"]) * same_r)
        if self.m_span is not None:
            same_m = A[:, self.m_span] @ B[:, self.m_span].T
            cat = cat * (p["zeta_model"] + (1 - p["zeta_model"]) * same_m)
        joint = k_rho * cat
        K = p["const"] * torch.ones_like(k_rho)
        if self.g_col is not None:
            du = A[:, self.g_col][:, None] - B[:, self.g_col][None, :]
            joint = joint * _matern52(du, p["joint_g_ls"])
            K = K + p["g_var"] * _matern52(du, p["g_ls"])
        if same_r is not None:
            K = K + p["reward"] * same_r
        if same_m is not None:
            K = K + p["model"] * same_m
        K = K + p["joint"] * joint
        low = (1.0 - fa)[:, None] * (1.0 - fb)[None, :]
        cell = torch.ones_like(k_rho)  # 1 when both rows are the same reward system and model
        if same_r is not None:
            cell = cell * same_r
        if same_m is not None:
            cell = cell * same_m
        return K + low * (p["bias0"] + p["bias1"] * k_rho * cat + p["bias_cell"] * cell)


class MultiFidelitySurrogate:
    """The fitted multi-fidelity GP (module docstring): a mixture over the budget drift δ.

    Args:
        encoding: the input encoding.
        X: ``n x d`` inputs (:meth:`Encoding.tensor`), fidelity in the last column.
        Y: ``n x 1`` target values (higher is better).
        seed: seeds torch for posterior samples.
        init: raw hyperparameters of an earlier fit (:attr:`raw`) to start from as well.

    Attributes:
        fit_seconds: wall time of the fit (hyperparameters and the δ mixture).
        raw: the fitted raw hyperparameters (a vector; pass as ``init`` to warm-start a refit).
        drifts, weights: the mixture's δ values (ρ per decade of budget) and their weights.

    Raises:
        ValueError: shapes that do not match the encoding, or fewer than 2 observations.
    """

    def __init__(self, encoding: Encoding, X: Tensor, Y: Tensor, *, seed: int = 0,
                 init: Tensor | None = None):
        if X.dim() != 2 or X.shape[-1] != encoding.dim or Y.shape != (X.shape[0], 1):
            raise ValueError(f"X must be n x {encoding.dim} and Y n x 1; got {tuple(X.shape)} and "
                             f"{tuple(Y.shape)}")
        if X.shape[0] < 2:
            raise ValueError(f"{X.shape[0]} observation(s): the surrogate needs at least 2")
        t0 = time.perf_counter()
        self.encoding, self.seed = encoding, seed
        self.X, self.Y = X.to(torch.double), Y.to(torch.double)
        y = self.Y[:, 0]
        self.y_mean = float(y.mean())
        self.y_std = float(y.std()) if X.shape[0] > 1 and float(y.std()) > 1e-9 else 1.0
        self.y = (y - self.y_mean) / self.y_std
        self.kernel = _Kernel(encoding)
        has_full = bool((self.X[:, -1] >= 1.0 - 1e-9).any())
        has_low = bool((self.X[:, -1] < 1.0 - 1e-9).any())
        self.drift_identifiable = has_full and has_low
        start = self._fit(0.0, [self._default(), init])
        self._mixture(start)
        self.fit_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ fitting
    @staticmethod
    def _default() -> Tensor:
        return torch.tensor([v[0] for v in _HYPERS.values()], dtype=torch.double)

    def _neg_log_post(self, raw: Tensor, drift: float) -> Tensor:
        p = self.kernel.unpack(raw)
        n = self.X.shape[0]
        K = self.kernel(self.X, self.X, p, drift) + (p["noise"] + 1e-8) * torch.eye(n, dtype=torch.double)
        L, info = torch.linalg.cholesky_ex(K)
        if int(info) != 0:
            return torch.tensor(1e10, dtype=torch.double) + 0.0 * raw.sum()
        a = torch.cholesky_solve(self.y[:, None], L)[:, 0]
        nll = 0.5 * self.y @ a + torch.log(torch.diagonal(L)).sum() + 0.5 * n * math.log(2 * math.pi)
        return nll - self.kernel.log_prior(raw)

    def _fit(self, drift: float, starts: list[Tensor | None]) -> Tensor:
        best, best_val = None, math.inf
        for s in starts:
            if s is None or s.shape != (len(_NAMES),):
                continue
            raw = s.detach().clone().to(torch.double).requires_grad_(True)
            opt = torch.optim.LBFGS([raw], lr=1.0, max_iter=60, tolerance_grad=1e-5,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = self._neg_log_post(raw, drift)
                loss.backward()
                return loss

            try:
                opt.step(closure)
            except Exception as e:  # noqa: BLE001 - a failed fit keeps its start
                warnings.warn(f"surrogate fit failed ({type(e).__name__}: {e}); keeping the start",
                              RuntimeWarning, stacklevel=3)
                raw = s.detach().clone().to(torch.double)
            with torch.no_grad():
                val = float(self._neg_log_post(raw.detach(), drift))
            if math.isfinite(val) and val < best_val:
                best, best_val = raw.detach().clone(), val
        return best if best is not None else self._default()

    def _log_weights(self, raw: Tensor) -> Tensor:
        with torch.no_grad():
            lp = torch.tensor([-float(self._neg_log_post(raw, d)) - 0.5 * (d / DRIFT_PRIOR_SD) ** 2
                               for d in DRIFT_GRID], dtype=torch.double)
        return lp - torch.logsumexp(lp, 0)

    def _mixture(self, raw: Tensor) -> None:
        drifts = torch.tensor(DRIFT_GRID, dtype=torch.double)
        if self.drift_identifiable:
            lw = self._log_weights(raw)
            top = float(drifts[int(lw.argmax())])
            if top != 0.0:  # refit the other hyperparameters at the most likely drift
                raw = self._fit(top, [raw])
                lw = self._log_weights(raw)
        else:  # the likelihood does not depend on δ: the prior
            lw = -0.5 * (drifts / DRIFT_PRIOR_SD) ** 2
            lw = lw - torch.logsumexp(lw, 0)
        w = lw.exp()
        keep = torch.nonzero(w >= MIN_WEIGHT)[:, 0]
        if len(keep) == 0:
            keep = w.argmax().reshape(1)
        self.raw = raw
        self.params = {k: v.detach() for k, v in self.kernel.unpack(raw).items()}
        self.drifts = drifts[keep]
        self.weights = w[keep] / w[keep].sum()
        n = self.X.shape[0]
        self._comps = []
        for d in self.drifts.tolist():
            K = self.kernel(self.X, self.X, self.params, d)
            K = K + (self.params["noise"] + 1e-8) * torch.eye(n, dtype=torch.double)
            L = torch.linalg.cholesky(K)
            self._comps.append((d, L, torch.cholesky_solve(self.y[:, None], L)[:, 0]))

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

    def _component(self, X: Tensor, comp, full_cov: bool):
        d, L, alpha = comp
        Ks = self.kernel(X, self.X, self.params, d)
        mean = Ks @ alpha
        V = torch.linalg.solve_triangular(L, Ks.T, upper=False)
        if full_cov:
            return mean, self.kernel(X, X, self.params, d) - V.T @ V
        return mean, (self._prior_diag(X) - (V * V).sum(0)).clamp_min(0.0)

    def _prior_diag(self, X: Tensor) -> Tensor:
        """The kernel's diagonal (every term at zero distance; the drift does not enter)."""
        p, k = self.params, self.kernel
        one = torch.ones(X.shape[0], dtype=torch.double)
        v = p["const"] * one + p["joint"] * one
        if k.g_col is not None:
            v = v + p["g_var"]
        if k.r_span is not None:
            v = v + p["reward"]
        if k.m_span is not None:
            v = v + p["model"]
        low = (1.0 - X[:, k.f_col]) ** 2
        return v + low * (p["bias0"] + p["bias1"] + p["bias_cell"])

    def predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior mean and standard deviation (noise-free, target units) of the mixture at
        ``m x d`` inputs; two ``m``-shaped tensors."""
        X = X.to(torch.double)
        with torch.no_grad():
            ms, vs = zip(*(self._component(X, c, False) for c in self._comps))
            M, V = torch.stack(ms), torch.stack(vs)
            w = self.weights[:, None]
            mean = (w * M).sum(0)
            var = (w * (V + M * M)).sum(0) - mean * mean
        return mean * self.y_std + self.y_mean, var.clamp_min(0).sqrt() * self.y_std

    def sample(self, X: Tensor, num_samples: int) -> Tensor:
        """Joint posterior samples of the target: ``b x g x d`` inputs (``b`` curves of ``g``
        points) give ``num_samples x b x g`` values; each sample draws its δ from the mixture."""
        gen = torch.Generator().manual_seed(self.seed)
        shape = X.shape[:-1]
        flat = X.reshape(-1, X.shape[-1]).to(torch.double)
        comp = torch.multinomial(self.weights, num_samples, replacement=True, generator=gen)
        out = torch.empty(num_samples, flat.shape[0], dtype=torch.double)
        with torch.no_grad():
            for k, c in enumerate(self._comps):
                idx = (comp == k).nonzero()[:, 0]
                if len(idx) == 0:
                    continue
                mean, cov = self._component(flat, c, True)
                L = _psd_cholesky(cov)
                z = torch.randn(flat.shape[0], len(idx), dtype=torch.double, generator=gen)
                out[idx] = (mean[:, None] + L @ z).T
        return (out * self.y_std + self.y_mean).reshape(num_samples, *shape)

    def covariance_with(self, x: Tensor, Z: Tensor) -> tuple[Tensor, Tensor]:
        """For one ``1 x d`` input ``x`` and ``m x d`` inputs ``Z``, under the most likely δ:
        ``(posterior covariance of f(x) with f(Z), posterior variance of f(Z))``, two ``m``
        tensors in target units squared (what observing ``Z`` would teach about ``f(x)``)."""
        c = self._comps[int(self.weights.argmax())]
        with torch.no_grad():
            _, cov = self._component(torch.cat([x, Z]).to(torch.double), c, True)
        s2 = self.y_std ** 2
        return cov[0, 1:] * s2, torch.diagonal(cov)[1:] * s2


def _psd_cholesky(cov: Tensor) -> Tensor:
    scale = float(torch.diagonal(cov).abs().mean()) or 1.0
    eye = torch.eye(cov.shape[0], dtype=cov.dtype)
    for jitter in (1e-9, 1e-7, 1e-5, 1e-3):
        L, info = torch.linalg.cholesky_ex(cov + jitter * scale * eye)
        if int(info) == 0:
            return L
    ev, U = torch.linalg.eigh(cov)
    return U * ev.clamp_min(0).sqrt()


__all__ = ["DRIFT_GRID", "DRIFT_PRIOR_SD", "Encoding", "FIDELITY_DECADES", "MultiFidelitySurrogate",
           "budget_fraction_of", "fidelity_of"]
