"""The knowledge gradient over a finite set of cells: what one more run is worth.

For a Gaussian belief ``N(μ, Σ)`` over the target cells and a run whose observed value ``y`` has
variance ``v`` (response and noise) and covariance ``σ_y`` with the cells, the posterior mean after
the run is ``μ + σ_y / sqrt(v) · Z``, ``Z ~ N(0, 1)``, and its knowledge gradient is

    KG = E[max_i (μ_i + b_i Z)] - max_i μ_i,        b = σ_y / sqrt(v)

(Frazier, Powell & Dayanik 2009, "The knowledge-gradient policy for correlated normal beliefs"):
the expected rise of the best posterior mean, i.e. of the true value of the answer when the model
is right. The expectation is taken on ``NODES`` equal-probability quantiles of ``Z`` (midpoints),
vectorized over candidates; the maximum of lines is convex in ``Z``, so the quadrature is slightly
low, by the same small share for every candidate.

Several runs at once: ``m`` runs at one candidate shrink its noise variance ``m`` times; the value
per unit of cost of a candidate is the best over ``m`` of ``KG_m / (m · cost)`` (Frazier & Powell's
KG(*)), so cheap, noisy runs (pilots) are not undervalued because one of them alone tells little.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

NODES = 32
_Z = norm.ppf((np.arange(NODES) + 0.5) / NODES)
_Z32 = _Z.astype(np.float32)


Pool = tuple[np.ndarray, np.ndarray]
"""Where the answer may be: ``(now, own)``, a ``t`` mask of the cells it may be now and, per
candidate, the index of the cell its run adds to them (-1: none, e.g. a pilot)."""


def knowledge_gradient(mu: np.ndarray, b: np.ndarray, pool: Pool | None = None) -> np.ndarray:
    """``c`` knowledge gradients, one per row of ``b``.

    Args:
        mu: ``t`` current posterior means of the target cells.
        b: ``c x t`` change of each cell's mean per unit of ``Z`` after one candidate's run.
        pool: the cells the answer is chosen among, now and after each candidate's run
            (:data:`Pool`; ``None``: every cell): the gain is the rise of the best mean among them.
    """
    mu32, b32 = mu.astype(np.float32), b.astype(np.float32)
    lines = mu32[None, :, None] + b32[:, :, None] * _Z32[None, None, :]  # c x t x q
    if pool is None:
        return lines.max(axis=1).mean(axis=1, dtype=np.float64) - float(mu32.max())
    now, own = pool
    allowed = now[None, :] | (np.arange(len(mu))[None, :] == np.asarray(own)[:, None])
    lines = np.where(allowed[:, :, None], lines, -np.inf)
    return lines.max(axis=1).mean(axis=1, dtype=np.float64) - float(mu32[now].max())


def kg_per_cost(mu: np.ndarray, cov_ct: np.ndarray, var_c: np.ndarray, noise_c: np.ndarray,
                cost: np.ndarray, repeats: tuple[int, ...] = (1, 4),
                pool: Pool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """KG(*) per unit of cost and the one-run KG, for ``c`` candidates.

    Args:
        mu: ``t`` posterior means of the target cells.
        cov_ct: ``c x t`` covariance of each candidate's response with the cells.
        var_c, noise_c: ``c`` response and noise variances of a candidate run.
        cost: ``c`` cost of one run (full-budget runs: 1).
        pool: as :func:`knowledge_gradient`.
    Returns:
        ``(score, kg1)``: ``c`` values of ``max_m KG_m / (m · cost)`` and ``c`` one-run KGs.
    """
    best = np.full(len(cost), -np.inf)
    kg1 = np.zeros(len(cost))
    for m in repeats:
        v = np.maximum(var_c + noise_c / m, 1e-300)
        kg = knowledge_gradient(mu, cov_ct / np.sqrt(v)[:, None], pool)
        if m == 1:
            kg1 = kg
        best = np.maximum(best, kg / (m * cost))
    return best, kg1


__all__ = ["NODES", "Pool", "kg_per_cost", "knowledge_gradient"]
