"""A Gaussian process over allocations and budget fractions, averaged over its hyperparameters.

Pure numpy: no torch, no fitting loop. Built for the few, noisy runs a team can pay for: with 4
to 16 full runs, maximizing the marginal likelihood over a dozen hyperparameters overfits, so
this model instead weighs a small grid of hyperparameter settings by their marginal likelihood
(Bayesian model averaging, uniform prior over the grid) and predicts with the mixture.

Inputs are the cells of a finite candidate set: a policy model ``m``, a reward system ``r``, a
group size ``g``, an update fraction ρ, and a budget fraction ``f`` (1 is the full budget, a
pilot is ``f < 1``). The latent full-budget response is a GP with the product kernel::

    k(x, x') = s² · exp(-(ρ - ρ')² / (2 ℓ²)) · C(r, r'; c_r) · C(g, g'; c_g) · C(m, m'; c_m)
    C(a, a'; c) = c + (1 - c) · [a = a']

so every cell shares a smooth curve in ρ, and each reward system, group size and model adds its
own curve on top of it with weight ``1 - c`` (``c`` near 1: the categories behave alike). A run
at budget fraction ``f < 1`` (a pilot) observes the latent response plus a discrepancy
``d(x) ~ GP(0, τ² k)`` shared by all pilot fractions, plus an unknown offset per fraction; so
the correlation of a pilot with the full run at the same cell is ``1 / sqrt(1 + τ²)``, learned
from runs at both budgets (across the measured grids' cells, ``benchmarks/stage_a.py``: 0.12
to 0.41 on pass@1, 0.96 to 0.99 on the native reward, so it cannot be assumed). An unknown overall level is integrated out (a constant
kernel term of variance ``MEAN_VAR_SCALE · s²``).

Noise: a run's known evaluation variance (``p(1 - p) / n_eval`` for a share over ``n_eval``
problems) times ``1 + λ``, ``λ`` the training noise on top of it (seed to seed); without a known
evaluation variance, a noise variance that is a share of the observed values' variance
(:attr:`HyperGrid.noise_share`).

The grid (``HyperGrid``): ``s²`` relative to a scale (the median known evaluation variance, or
the observed values' variance), ``ℓ``, ``c_r``, ``c_g``, ``c_m``, ``τ²``, the variances ``a_r``,
``a_g`` of offsets per reward system and group size constant in ρ (``+ s² (a_r [r = r'] + a_g
[g = g'])``, none as shipped), the variance ``a_c`` of each cell's own deviation (``+ s² a_c
[same cell]``), ``λ``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

MEAN_VAR_SCALE = 4.0
"""Variance of the unknown overall level, in units of ``s²`` (wide: it is learned from the data)."""
OFFSET_VAR_SCALE = 4.0
"""Variance of each pilot fraction's unknown offset from the full budget, in units of ``s²``."""
JITTER = 1e-9


@dataclass(frozen=True)
class HyperGrid:
    """The hyperparameter values the mixture averages over (every combination, uniform prior)."""

    signal: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0)
    """``s²`` in units of the noise scale (median known evaluation variance)."""
    lengthscale: tuple[float, ...] = (0.15, 0.3, 0.6)
    """``ℓ`` in units of the ρ range."""
    reward_corr: tuple[float, ...] = (0.3, 0.7, 0.9)
    group_corr: tuple[float, ...] = (0.5, 0.9)
    model_corr: tuple[float, ...] = (0.3, 0.7)
    pilot_gap: tuple[float, ...] = (0.1, 1.0, 6.0)
    """``τ²``: pilot-vs-full correlation ``1/sqrt(1+τ²)`` = 0.95, 0.71, 0.38."""
    train_noise: tuple[float, ...] = (0.5, 1.5)
    """``λ``: training noise on top of the evaluation variance (``1 + λ`` times it)."""
    reward_offset: tuple[float, ...] = (0.0,)
    """Variance of an offset per reward system that is the same at every ρ and group size, in
    units of ``s²``: a kernel term ``a · s² · [r = r']`` added to the product, so a run of a
    reward system moves its whole curve, not only the ρ near it. ``(0,)``: none (kept
leave-one-world-out: ``benchmarks/tuner_ablation.py --design``, ``reward-offset``)."""
    group_offset: tuple[float, ...] = (0.0,)
    """The same per group size."""
    cell_offset: tuple[float, ...] = (0.0,)
    """Variance of each cell's own deviation from the smooth surface, in units of ``s²``: a
    kernel term ``a · s² · [same cell]`` (same model, reward system, group size and ρ, at any
    budget fraction), so that a cell's replicated runs can outweigh what its neighbours say of it.
    ``(0,)``: none (kept leave-one-world-out: ``benchmarks/tuner_ablation.py --design``,
    ``cell-offset``)."""
    noise_share: tuple[float, ...] = (0.02, 0.1, 0.5)
    """Without known evaluation variances: the noise variance as a share of the observed
    values' variance (from nearly noise-free to half of what is seen), in place of ``λ``."""
    rho_bowl: float = 1.0
    """Prior mean: how far below its top the ends of a bowl in ρ lie, in signal standard
    deviations ``s`` (``-rho_bowl · s · 4 (ρ - c_ρ)²`` in scaled ρ, ``c_ρ`` from
    :attr:`rho_center`): the response to ρ is near-unimodal with an interior peak (the paper's ρ*
    0.44-0.72; every measured world here), so before any run the middle is the better bet. 0: a
    flat prior mean."""
    rho_center: tuple[float, ...] = (0.5,)
    """Where the bowl's top sits in scaled ρ (0 the range's low end, 1 its high end); several:
    a hyperparameter the runs weigh like the others, so that the runs can move the bet."""

    def __post_init__(self) -> None:
        for name in ("signal", "lengthscale", "reward_corr", "group_corr", "model_corr",
                     "pilot_gap", "reward_offset", "group_offset", "cell_offset", "train_noise", "noise_share"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
                raise ValueError(f"{name}={values!r}: must be a non-empty list of finite numbers")
            if name.endswith("_corr") and any(not 0 <= v <= 1 for v in values):
                raise ValueError(f"{name}={values!r}: correlations must be in [0, 1]")
            if not name.endswith("_corr") and any(v < 0 or (v == 0 and name in ("signal", "lengthscale"))
                                                  for v in values):
                raise ValueError(f"{name}={values!r}: must be positive")
        if not isinstance(self.rho_bowl, (int, float)) or not 0 <= self.rho_bowl <= 10:
            raise ValueError(f"rho_bowl={self.rho_bowl!r}: must be a number from 0 to 10")
        if not self.rho_center or any(not isinstance(v, (int, float)) or not 0 <= v <= 1 for v in self.rho_center):
            raise ValueError(f"rho_center={self.rho_center!r}: must be a non-empty list of numbers from 0 to 1")

    def combos(self, with_models: bool, with_pilots: bool, known_noise: bool = True) -> list[tuple[float, ...]]:
        """Every combination ``(s², ℓ, c_r, c_g, c_m, τ², a_r, a_g, a_c, c_ρ, λ)``, leaving out the axes the
        data cannot inform (one model, no pilots); ``c_ρ`` the bowl's centre; the last entry is
        ``λ`` (``known_noise``) or the noise share."""
        return list(itertools.product(self.signal, self.lengthscale, self.reward_corr, self.group_corr,
                                      self.model_corr if with_models else (1.0,),
                                      self.pilot_gap if with_pilots else (0.0,),
                                      self.reward_offset, self.group_offset, self.cell_offset,
                                      self.rho_center if self.rho_bowl else (0.5,),
                                      self.train_noise if known_noise else self.noise_share))


@dataclass(frozen=True)
class Points:
    """Inputs as integer codes and numbers, ``n`` rows each."""

    model: np.ndarray
    reward: np.ndarray
    group: np.ndarray
    rho: np.ndarray
    """ρ scaled to [0, 1] over the space's range."""
    fidelity: np.ndarray
    """Index of the budget fraction: 0 the full budget, ``k > 0`` the k-th pilot fraction."""

    def __len__(self) -> int:
        return len(self.rho)

    def take(self, idx: np.ndarray | Sequence[int]) -> "Points":
        idx = np.asarray(idx, dtype=int)
        return Points(self.model[idx], self.reward[idx], self.group[idx], self.rho[idx], self.fidelity[idx])

    @staticmethod
    def concat(a: "Points", b: "Points") -> "Points":
        return Points(*(np.concatenate([getattr(a, f), getattr(b, f)])
                        for f in ("model", "reward", "group", "rho", "fidelity")))


class Gram:
    """The parts of the kernel between two point sets that do not depend on the hyperparameters
    (ρ distances, category matches, pilot masks), so that the grid's combinations reuse them."""

    def __init__(self, a: Points, b: Points):
        self.d2 = (a.rho[:, None] - b.rho[None, :]) ** 2
        self.same_r = a.reward[:, None] == b.reward[None, :]
        self.same_g = a.group[:, None] == b.group[None, :]
        self.same_m = a.model[:, None] == b.model[None, :]
        self.same_cell = self.same_r & self.same_g & self.same_m & (self.d2 == 0)
        pa, pb = a.fidelity[:, None] > 0, b.fidelity[None, :] > 0
        self.both_pilot = pa & pb
        self.same_pilot = (a.fidelity[:, None] == b.fidelity[None, :]) & pa
        self._exp: dict[float, np.ndarray] = {}
        self._shape: dict[tuple[float, ...], np.ndarray] = {}

    def __call__(self, hyper: tuple[float, ...], scale: float) -> np.ndarray:
        s2, ell, cr, cg, cm, tau2, ro, go, co = hyper[:9]
        shape = (ell, cr, cg, cm, tau2, ro, go, co)  # the signal only scales it: one shape serves every s² and noise
        if shape not in self._shape:
            if ell not in self._exp:
                self._exp[ell] = np.exp(-0.5 * self.d2 / ell ** 2)
            base = self._exp[ell] * (cr + (1 - cr) * self.same_r) * (cg + (1 - cg) * self.same_g)
            if cm != 1.0:
                base = base * (cm + (1 - cm) * self.same_m)
            self._shape[shape] = (base * (1.0 + tau2 * self.both_pilot) + MEAN_VAR_SCALE
                                  + OFFSET_VAR_SCALE * self.same_pilot + ro * self.same_r + go * self.same_g
                                  + co * self.same_cell)
        return (s2 * scale) * self._shape[shape]


def kernel(a: Points, b: Points, hyper: tuple[float, ...], scale: float) -> np.ndarray:
    """``len(a) x len(b)`` prior covariance of the observed responses (without noise) at
    hyperparameters ``hyper`` (a :meth:`HyperGrid.combos` entry); ``scale``: the unit of ``s²``."""
    return Gram(a, b)(hyper, scale)


@dataclass(frozen=True)
class Data:
    """Observed runs: inputs, values (higher is better) and known evaluation variances (NaN: unknown)."""

    points: Points
    values: np.ndarray
    eval_var: np.ndarray


@dataclass
class Posterior:
    """The mixture's posterior over ``t`` full-budget target cells and ``c`` candidate runs.

    Attributes:
        weights: ``k`` mixture weights (sum 1), one per kept hyperparameter combination.
        hypers: the ``k`` kept combinations (:meth:`HyperGrid.combos` entries).
        means: ``k x t`` posterior means at the target cells.
        covs: ``k x t x t`` posterior covariances at the target cells.
        cand_cov: ``k x c x t`` covariance between a candidate run's observed response and the
            target cells (empty without candidates).
        cand_var: ``k x c`` posterior variance of a candidate run's response, noise excluded.
        cand_noise: ``k x c`` a candidate run's noise variance.
    """

    weights: np.ndarray
    hypers: list[tuple[float, ...]]
    means: np.ndarray
    covs: np.ndarray
    cand_cov: np.ndarray
    cand_var: np.ndarray
    cand_noise: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        """``t`` mixture means."""
        return self.weights @ self.means

    @property
    def var(self) -> np.ndarray:
        """``t`` mixture variances (law of total variance)."""
        diag = np.einsum("kii->ki", self.covs)
        return self.weights @ (diag + (self.means - self.mean) ** 2)


def noise_scale(data: Data) -> tuple[float, bool]:
    """The unit of ``s²`` and whether runs' evaluation variances are known: the median known
    evaluation variance when every run has one; else the values' variance (1 with fewer than
    two distinct values)."""
    ev = data.eval_var
    if len(ev) and bool(np.all(np.isfinite(ev) & (ev > 0))):
        return float(np.median(ev)), True
    if len(data.values) >= 2 and np.var(data.values) > 0:
        return float(np.var(data.values)), False
    return 1.0, False


def _noise(eval_var: np.ndarray, hyper: tuple[float, ...], scale: float, known: bool) -> np.ndarray:
    lam = hyper[-1]
    return eval_var * (1.0 + lam) if known else np.full(len(eval_var), lam * scale)


def _chol(K: np.ndarray) -> np.ndarray:
    return np.linalg.cholesky(K + JITTER * max(1e-12, float(np.mean(np.diag(K)))) * np.eye(len(K)))


def _solve(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    from scipy.linalg import solve_triangular

    return solve_triangular(L, B, lower=True, check_finite=False)


def posterior(data: Data, targets: Points, grid: HyperGrid = HyperGrid(), *,
              cands: Points | None = None, pending: Points | None = None,
              keep: float = 0.99, max_combos: int = 4) -> Posterior:
    """The mixture posterior at ``targets`` (full-budget cells) and ``cands`` given ``data``.

    Combinations are weighted by marginal likelihood (uniform prior over the grid); the most
    likely ones holding ``keep`` of the weight (at most ``max_combos``) are kept and renormalized.
    ``pending`` runs (started, not finished) shrink the covariances as if observed ("kriging
    believer": the means are unchanged), so a batch is not spent on one cell. With no data, the
    prior (every combination, equal weight, at most ``max_combos`` of them).
    """
    scale, known = noise_scale(data)
    cands = cands if cands is not None else targets.take([])
    pending = pending if pending is not None else targets.take([])
    with_models = len(np.unique(np.concatenate([data.points.model, targets.model]))) > 1
    with_pilots = bool((data.points.fidelity > 0).any() or (cands.fidelity > 0).any())
    combos = grid.combos(with_models, with_pilots, known)
    bowl = grid.rho_bowl
    if len(data.values):
        logev = np.empty(len(combos))
        gram = Gram(data.points, data.points)
        for i, h in enumerate(combos):
            K = gram(h, scale) + np.diag(_noise(data.eval_var, h, scale, known))
            L = _chol(K)
            a = _solve(L, _residual(data, h, scale, bowl)[0])
            logev[i] = -0.5 * a @ a - np.log(np.diag(L)).sum()
        w = np.exp(logev - logev.max())
        w /= w.sum()
        order = np.argsort(-w, kind="stable")
        n_keep = int(min(max_combos, np.searchsorted(np.cumsum(w[order]), keep) + 1))
        kept = order[:n_keep]
    else:
        kept = np.arange(min(len(combos), max_combos)) * max(1, len(combos) // max_combos)
        w = np.ones(len(combos))
    ev_pend = np.full(len(pending), float(np.median(data.eval_var)) if known else np.nan)
    ev_cand = np.full(len(cands), float(np.median(data.eval_var)) if known else np.nan)
    S = Points.concat(data.points, pending)
    grams = (Gram(targets, targets), Gram(cands, targets), Gram(S, S), Gram(S, targets), Gram(S, cands))
    out = [_one(grams, targets, cands, combos[i], scale, known, *_residual(data, combos[i], scale, bowl),
                np.concatenate([data.eval_var, ev_pend]), ev_cand, bowl) for i in kept]
    weights = w[kept] / w[kept].sum()
    return Posterior(weights, [combos[i] for i in kept], *(np.asarray(x) for x in zip(*out)))


def _bowl(p: Points, h: tuple[float, ...], scale: float, bowl: float) -> np.ndarray:
    """The prior mean's shape in ρ (:attr:`HyperGrid.rho_bowl`), at combination ``h``."""
    return -bowl * math.sqrt(h[0] * scale) * 4.0 * (p.rho - h[9]) ** 2


def _residual(data: Data, h: tuple[float, ...], scale: float, bowl: float) -> tuple[np.ndarray, float]:
    """The values less the prior mean's shape and their level (its mean): what the GP fits."""
    r = data.values - _bowl(data.points, h, scale, bowl)
    level = float(np.mean(r)) if len(r) else 0.0
    return r - level, level


def _prior_var(p: Points, hyper: tuple[float, ...], scale: float) -> np.ndarray:
    """The diagonal of ``kernel(p, p)`` without forming it."""
    s2, tau2, offsets = hyper[0] * scale, hyper[5], hyper[6] + hyper[7] + hyper[8]
    pilot = p.fidelity > 0
    return s2 * ((1.0 + tau2 * pilot) + MEAN_VAR_SCALE + OFFSET_VAR_SCALE * pilot + offsets)


def _one(grams: tuple[Gram, ...], targets: Points, cands: Points, h: tuple[float, ...], scale: float,
         known: bool, y: np.ndarray, level: float, ev_s: np.ndarray, ev_cand: np.ndarray,
         bowl: float) -> tuple[np.ndarray, ...]:
    """Means, covariances and candidate cross-covariances at one hyperparameter combination
    (``ev_s``: evaluation variances of the finished runs, then of the pending ones)."""
    g_tt, g_ct, g_ss, g_st, g_sc = grams
    n = len(y)
    Ktt, Kct = g_tt(h, scale), g_ct(h, scale)
    kcc, cn = _prior_var(cands, h, scale), _noise(ev_cand, h, scale, known)
    prior = level + _bowl(targets, h, scale, bowl)
    if not len(ev_s):
        return prior, Ktt, Kct, kcc, cn
    L = _chol(g_ss(h, scale) + np.diag(_noise(ev_s, h, scale, known)))
    Kst = g_st(h, scale)
    Vt = _solve(L, Kst)
    Vc = _solve(L, g_sc(h, scale))
    if n:  # the mean from the finished runs only (pending ones leave it unchanged)
        Ld = L[:n, :n]
        mean = prior + _solve(Ld, Kst[:n]).T @ _solve(Ld, y)
    else:
        mean = prior
    return mean, Ktt - Vt.T @ Vt, Kct - Vc.T @ Vt, np.maximum(kcc - (Vc * Vc).sum(0), 0.0), cn


def joint_draws(means: np.ndarray, covs: np.ndarray, counts: Sequence[int],
                rng: np.random.Generator) -> np.ndarray:
    """``sum(counts)`` joint draws over the ``t`` cells (``sum(counts) x t``) from the mixture's
    components, ``counts[k]`` from component ``k`` (``means[k]``, ``covs[k]``), stacked in
    component order. A covariance that rounding left slightly indefinite is drawn from as it is
    (eigendecomposition, no check), as the posterior's own are."""
    parts = [rng.multivariate_normal(means[k], covs[k], size=int(n), method="eigh", check_valid="ignore")
             for k, n in enumerate(counts) if n > 0]
    return np.concatenate(parts) if parts else np.empty((0, means.shape[1]))


__all__ = ["Data", "HyperGrid", "Points", "Posterior", "joint_draws", "kernel", "noise_scale", "posterior"]
