"""A multi-fidelity Gaussian-process surrogate of the target over allocations, pilots and full runs.

torch, GPyTorch and BoTorch are imported here only; ``import allocopt`` and the CLI stay light.
Fits run on one thread (``torch.set_num_threads(1)``: several times faster on 2 shared cores).

Inputs. One row per trial, ``n x d``, every column in [0, 1] (only the dimensions that vary in
the search space are encoded; :class:`Encoding`):

* ρ, scaled to its range: ``(rho - lo) / (hi - lo)``;
* G as ``log2 G`` scaled to the range of the space's group sizes;
* the reward system, one-hot (one column per reward system of the space);
* the policy model, one-hot (when the space names several);
* the **fidelity** ``s`` (last column): ``s = 1 + log10(budget / budget_flops) / FIDELITY_DECADES``,
  clamped to [0, 1], so a full-budget run has ``s = 1`` and a pilot at 10 % of the budget
  ``s = 0.5``.

Model (ours: the kernel, the δ mixture, the encoding; GPyTorch/BoTorch's: the machinery). A
``gpytorch.models.ExactGP`` (zero mean, :class:`MultiFidelityKernel`, ``GaussianLikelihood``) on
standardized targets, with a kernel that is a sum of first-order terms and one interaction term,
plus a fidelity part::

    k(x, x') =   σ0²                                   constant
               + σr² [r = r'] + σm² [m = m']           reward system, model: additive levels
               + σg² M(u - u'; ℓg')                    G: one curve shared by every cell
               + σj² M(ρw - ρw'; ℓρ) M(u - u'; ℓg) C(x, x')              the interaction
               + (1 - s)(1 - s') (σb0² + σb1² M(ρw - ρw'; ℓρ) C(x, x')
                                  + σbc² [r = r'][m = m'])             the pilots' bias
    C(x, x') = (ζr + (1 - ζr)[r = r']) (ζm + (1 - ζm)[m = m'])
    ρw       = ρ + δ · FIDELITY_DECADES · (1 - s) / (hi - lo)   (ρ scaled; ``u`` is scaled log2 G)

``M`` is the Matérn-5/2 correlation; ``[·]`` is 1 when the categories agree. The bias term
vanishes at the full budget, so pilots inform the full-budget prediction through the other terms
without being taken for full runs, and may differ from them in level: shared (σb0), per cell
and ρ (σb1, through ``C``), and per cell (reward system × model) as a constant (σbc): a reward
system whose full runs sit higher or lower than its pilots predict (pilots that rank the reward
systems differently from the full budget) is learned from that cell's full runs, and until it has
one, its full-budget prediction carries σbc of extra uncertainty.

**Budget drift.** ``δ`` is how far the optimum in ρ moves per decade of budget (ρ units): a pilot
at ρ is compared with full runs at ρ + δ × (decades below the full budget). δ is not fitted by
gradient (its likelihood is multimodal and flat while there is no full run); the posterior is a
mixture over a grid of δ values, each weighted by its marginal likelihood (the other
hyperparameters fixed at their fit) times a Gaussian prior ``N(0, DRIFT_PRIOR_SD²)``. With pilots
only, the weights are the prior, so proposals explore across the possible shift; a few full runs
pin it down. Predictions and samples are the mixture's.

Hyperparameters: registered GPyTorch parameters (exp-transformed ``Positive``/``GreaterThan``
constraints for the variances, lengthscales and noise; a sigmoid ``Interval(0, 1)`` for ζ), MAP
under weak log-normal priors: a ``gpytorch.priors.NormalPrior`` on each log value (on the logit for
ζ), i.e. a log-normal prior on the value with its density taken on the log scale the fit moves in
(``LogNormalPrior`` on the value would add a −log value term that moves each mode down by sd² on the
log scale, e^-4 for sd 2: not this design). Fitted with ``botorch.fit.fit_gpytorch_mll`` (L-BFGS-B
on GPyTorch's ``ExactMarginalLogLikelihood``, priors included) from a default start and from
``init``, the previous fit's, when given; the better is kept. δ is a buffer of the kernel (one
value per batch member): the mixture weights come from one batched ``ExactMarginalLogLikelihood``
over the δ grid (other hyperparameters fixed), and predictions, samples and covariances from the
GPyTorch posterior of a batched model with one member per kept δ (Cholesky throughout:
``gpytorch.settings.fast_computations(False, False, False)``).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass
from typing import Sequence

import gpytorch
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models.gpytorch import GPyTorchModel
from gpytorch.constraints import GreaterThan, Interval, Positive
from gpytorch.distributions import MultivariateNormal
from gpytorch.priors import NormalPrior
from torch import Tensor

torch.set_num_threads(1)

FIDELITY_DECADES = 2.0
"""Decades of budget that span the fidelity axis: ``s = 0`` at 1 % of the budget, 1 at 100 %."""
DRIFT_PRIOR_SD = 0.05
"""Prior standard deviation of the drift δ of the optimal ρ per decade of budget (ρ units)."""
DRIFT_GRID: tuple[float, ...] = tuple(round(-0.15 + 0.01 * i, 4) for i in range(31))
"""δ values (ρ per decade of budget) of the mixture: -0.15 … 0.15, step 0.01 (± 3 prior sd)."""
MIN_WEIGHT = 1e-3
"""Mixture components below this weight are dropped (the rest renormalized)."""


def fidelity_of(budget_fraction: float) -> float:
    """The fidelity ``s`` in [0, 1] of a run at ``budget_fraction`` of the full budget."""
    return min(1.0, max(0.0, 1.0 + math.log10(budget_fraction) / FIDELITY_DECADES))


def drift_support(drifts: Sequence[float], pad: int = 1) -> tuple[float, ...]:
    """The ``DRIFT_GRID`` values within ``pad`` grid steps of any of ``drifts`` (a mixture's kept
    δ values): the δ grid a refit-free update of that mixture evaluates."""
    idx = {DRIFT_GRID.index(min(DRIFT_GRID, key=lambda g: abs(g - float(d)))) for d in drifts}
    return tuple(DRIFT_GRID[j] for j in sorted({min(max(i + k, 0), len(DRIFT_GRID) - 1)
                                                for i in idx for k in range(-pad, pad + 1)}))


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


# ---------------------------------------------------------------------------- the kernel
# name: (start value, prior mean, prior sd), all on the log scale (zeta: logit scale)
_HYPERS: dict[str, tuple[float, float, float]] = {
    "const": (math.log(0.3), math.log(0.3), 2.0),
    "reward": (math.log(0.3), math.log(0.3), 2.0),
    "model": (math.log(0.1), math.log(0.1), 2.0),
    "g_var": (math.log(0.05), math.log(0.05), 2.0),
    "g_ls": (math.log(0.5), math.log(0.5), 1.0),
    "joint": (math.log(0.5), math.log(0.5), 1.5),
    "rho_ls": (math.log(0.2), math.log(0.2), 1.0),
    "joint_g_ls": (math.log(0.7), math.log(0.7), 1.0),
    "zeta_reward": (0.0, 0.0, 1.5),
    "zeta_model": (0.0, 0.0, 1.5),
    "bias0": (math.log(0.05), math.log(0.05), 2.0),
    "bias1": (math.log(0.05), math.log(0.05), 2.0),
    "bias_cell": (math.log(0.05), math.log(0.05), 2.0),
    "noise": (math.log(0.05), math.log(0.05), 2.0),
}
_NAMES = tuple(_HYPERS)
_KERNEL_NAMES = _NAMES[:-1]
_SQRT5 = math.sqrt(5.0)
_NOISE_FLOOR = 1e-6 + 1e-8
"""Least noise variance (standardized): a 1e-6 floor and 1e-8 of jitter, as the kernel matrix had."""


def _settings() -> contextlib.ExitStack:
    """GPyTorch settings of every call here (fresh context managers, so nesting is safe):
    Cholesky for solves, log-likelihoods and sample roots (``n`` is small: exact, deterministic);
    no per-call input checks (the inputs are built here)."""
    stack = contextlib.ExitStack()
    stack.enter_context(gpytorch.settings.fast_computations(False, False, False))
    stack.enter_context(gpytorch.settings.debug(False))
    return stack


def _matern52(d: Tensor, ls: Tensor) -> Tensor:
    r = _SQRT5 * d.abs() / ls
    return (1.0 + r + r * r / 3.0) * torch.exp(-r)


def _log_prior(name: str) -> NormalPrior:
    """The prior of hyperparameter ``name``: normal on its raw (log / logit) value."""
    _, mu, sd = _HYPERS[name]
    return NormalPrior(torch.tensor(mu, dtype=torch.double), torch.tensor(sd, dtype=torch.double))


class MultiFidelityKernel(gpytorch.kernels.Kernel):
    """The kernel of the module docstring for one encoding, as a GPyTorch kernel.

    Hyperparameters are GPyTorch parameters ``raw_<name>`` (``_HYPERS``) with exp-transformed
    ``Positive`` constraints (ζ: sigmoid ``Interval(0, 1)``) and a ``NormalPrior`` on the raw (log /
    logit) value. δ is the buffer ``drift``: one value per batch member (``batch_shape``), not fitted.

    Args:
        encoding: the input encoding (which columns hold G, the reward system, the model, s).
        drift: ``batch_shape`` δ values (ρ per decade of budget); a 0-d tensor for one model.
    """

    has_lengthscale = False

    def __init__(self, encoding: Encoding, drift: Tensor | float = 0.0):
        drift = torch.as_tensor(drift, dtype=torch.double)
        super().__init__(batch_shape=drift.shape)
        self.enc = encoding
        cols = encoding.columns
        self.g_col = cols.index("log2_group_size") if "log2_group_size" in cols else None
        self.r_span = encoding._span("reward=")
        self.m_span = encoding._span("model=")
        self.f_col = encoding.fidelity_column
        lo, hi = encoding.rho_range
        self.drift_scale = FIDELITY_DECADES / (hi - lo) if hi > lo else 0.0
        self.register_buffer("drift", drift.clone())
        for name in _KERNEL_NAMES:
            raw = f"raw_{name}"
            self.register_parameter(raw, torch.nn.Parameter(torch.tensor(_HYPERS[name][0], dtype=torch.double)))
            self.register_constraint(raw, Interval(0.0, 1.0) if name.startswith("zeta")
                                     else Positive(transform=torch.exp, inv_transform=torch.log))
            self.register_prior(f"{name}_prior", _log_prior(name), lambda m, r=raw: getattr(m, r),
                                lambda m, v, r=raw: m.initialize(**{r: v}))

    def value(self, name: str) -> Tensor:
        """The constrained value of hyperparameter ``name`` (a 0-d tensor)."""
        raw = f"raw_{name}"
        return getattr(self, f"{raw}_constraint").transform(getattr(self, raw))

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        """``... x n x m`` covariance (``... x n`` with ``diag``) of ``... x n x d`` and ``... x m x d``."""
        p = {k: self.value(k) for k in _KERNEL_NAMES}
        if diag:
            def pair_diff(a, b):
                return a - b

            def same(a, b):
                return (a * b).sum(-1)
        else:
            def pair_diff(a, b):
                return a[..., :, None] - b[..., None, :]

            def same(a, b):
                return a @ b.transpose(-1, -2)
        fa, fb = x1[..., self.f_col], x2[..., self.f_col]
        shift = self.drift[..., None] * self.drift_scale
        wa = x1[..., 0] + shift * (1.0 - fa)
        wb = x2[..., 0] + shift * (1.0 - fb)
        k_rho = _matern52(pair_diff(wa, wb), p["rho_ls"])
        same_r = same_m = None
        cat = torch.ones_like(k_rho)
        if self.r_span is not None:
            same_r = same(x1[..., self.r_span], x2[..., self.r_span])
            cat = cat * (p["zeta_reward"] + (1 - p["zeta_reward"]) * same_r)
        if self.m_span is not None:
            same_m = same(x1[..., self.m_span], x2[..., self.m_span])
            cat = cat * (p["zeta_model"] + (1 - p["zeta_model"]) * same_m)
        joint = k_rho * cat
        K = p["const"] * torch.ones_like(k_rho)
        if self.g_col is not None:
            du = pair_diff(x1[..., self.g_col], x2[..., self.g_col])
            joint = joint * _matern52(du, p["joint_g_ls"])
            K = K + p["g_var"] * _matern52(du, p["g_ls"])
        if same_r is not None:
            K = K + p["reward"] * same_r
        if same_m is not None:
            K = K + p["model"] * same_m
        K = K + p["joint"] * joint
        low = (1.0 - fa) * (1.0 - fb) if diag else (1.0 - fa)[..., :, None] * (1.0 - fb)[..., None, :]
        cell = 1.0
        if same_r is not None:
            cell = same_r
        if same_m is not None:
            cell = cell * same_m
        return K + low * (p["bias0"] + p["bias1"] * k_rho * cat + p["bias_cell"] * cell)


class _ExactGP(gpytorch.models.ExactGP, GPyTorchModel):
    """Zero mean and :class:`MultiFidelityKernel`; batched over δ when the kernel is. A BoTorch
    ``GPyTorchModel`` too, so ``botorch.fit.fit_gpytorch_mll`` fits it."""

    _num_outputs = 1

    def __init__(self, X: Tensor, y: Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood,
                 kernel: MultiFidelityKernel):
        super().__init__(X, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x: Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def _get_test_prior_mean_and_covariances(self, train_inputs, test_inputs, **kwargs):
        """GPyTorch's hook for the test-set prior, overridden only to leave ``K(test, test)`` lazy:
        the posterior variance then evaluates the kernel's diagonal, not ``m x m`` entries."""
        (train,), (test,) = train_inputs, test_inputs
        batch = torch.broadcast_shapes(train.shape[:-2], test.shape[:-2])
        train = train.expand(*batch, *train.shape[-2:])
        test = test.expand(*batch, *test.shape[-2:])
        test_train = self.covar_module(test, train).evaluate_kernel()
        return (self.mean_module(test), self.covar_module(test), test_train, batch,
                torch.Size([test.shape[-2]]), MultivariateNormal)


def _likelihood() -> gpytorch.likelihoods.GaussianLikelihood:
    lik = gpytorch.likelihoods.GaussianLikelihood(
        noise_constraint=GreaterThan(_NOISE_FLOOR, transform=torch.exp, inv_transform=torch.log))
    lik.noise_covar.register_prior("noise_prior", _log_prior("noise"), lambda m: m.raw_noise,
                                   lambda m, v: m.initialize(raw_noise=v))
    return lik.double()


def _set_raw(model: _ExactGP, raw: Tensor) -> None:
    """Load a raw hyperparameter vector (``_NAMES`` order) into ``model``."""
    with torch.no_grad():
        for i, name in enumerate(_KERNEL_NAMES):
            getattr(model.covar_module, f"raw_{name}").copy_(raw[i])
        model.likelihood.noise_covar.raw_noise.fill_(float(raw[-1]))


def _get_raw(model: _ExactGP) -> Tensor:
    k = model.covar_module
    vals = [getattr(k, f"raw_{name}").detach().reshape(()) for name in _KERNEL_NAMES]
    return torch.stack(vals + [model.likelihood.noise_covar.raw_noise.detach().reshape(())]).clone()


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


__all__ = ["DRIFT_GRID", "DRIFT_PRIOR_SD", "Encoding", "FIDELITY_DECADES", "MultiFidelityKernel",
           "MultiFidelitySurrogate", "budget_fraction_of", "drift_support", "fidelity_of"]
