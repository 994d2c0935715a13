"""The surrogate's kernel (:class:`MultiFidelityKernel`, the formula in :mod:`allocopt.surrogate`),
its hyperparameters' priors, and the GPyTorch ``ExactGP`` it sits in.
"""

from __future__ import annotations

import contextlib
import math

import gpytorch
import torch
from botorch.models.gpytorch import GPyTorchModel
from gpytorch.constraints import GreaterThan, Interval, Positive
from gpytorch.distributions import MultivariateNormal
from gpytorch.priors import NormalPrior
from torch import Tensor

from allocopt.surrogate.encoding import FIDELITY_DECADES, Encoding

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

    def _common(self, x: Tensor) -> Tensor:
        """``x`` without its δ batch dimension when it is one ``n x d`` tensor expanded over the
        batch (how the batched model's inputs are built): the δ-free terms are then computed
        once, not once per δ."""
        if x.dim() == 3 and self.drift.dim() == 1 and x.shape[0] == self.drift.shape[0] and \
                (x.shape[0] == 1 or x.stride(0) == 0):
            return x[0]
        return x

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params) -> Tensor:
        """``... x n x m`` covariance (``... x n`` with ``diag``) of ``... x n x d`` and ``... x m x d``.

        Computed as the δ-free terms plus the two that depend on δ (through ``ρw - ρw' = ρ - ρ'
        + δ · scale · (s' - s)``), so that a batch over δ evaluates only those per member."""
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
        a, b = self._common(x1), self._common(x2)
        fa, fb = a[..., self.f_col], b[..., self.f_col]
        d_rho = pair_diff(a[..., 0], b[..., 0])
        d_low = pair_diff(1.0 - fa, 1.0 - fb)
        same_r = same_m = None
        cat = torch.ones_like(d_rho)
        if self.r_span is not None:
            same_r = same(a[..., self.r_span], b[..., self.r_span])
            cat = cat * (p["zeta_reward"] + (1 - p["zeta_reward"]) * same_r)
        if self.m_span is not None:
            same_m = same(a[..., self.m_span], b[..., self.m_span])
            cat = cat * (p["zeta_model"] + (1 - p["zeta_model"]) * same_m)
        K = p["const"] * torch.ones_like(d_rho)
        joint = p["joint"] * cat
        if self.g_col is not None:
            du = pair_diff(a[..., self.g_col], b[..., self.g_col])
            joint = joint * _matern52(du, p["joint_g_ls"])
            K = K + p["g_var"] * _matern52(du, p["g_ls"])
        if same_r is not None:
            K = K + p["reward"] * same_r
        if same_m is not None:
            K = K + p["model"] * same_m
        low = (1.0 - fa) * (1.0 - fb) if diag else (1.0 - fa)[..., :, None] * (1.0 - fb)[..., None, :]
        cell = 1.0
        if same_r is not None:
            cell = same_r
        if same_m is not None:
            cell = cell * same_m
        K = K + low * (p["bias0"] + p["bias_cell"] * cell)
        # the δ terms: k_rho of the shifted ρ distance, in the interaction and the pilots' bias
        shift = (self.drift * self.drift_scale).reshape(*self.drift.shape, *([1] * (1 if diag else 2)))
        k_rho = _matern52(d_rho + shift * d_low, p["rho_ls"])
        return K + k_rho * (joint + low * p["bias1"] * cat)


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
