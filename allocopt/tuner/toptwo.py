"""Top-two Thompson sampling over a finite set of cells: which cell to run next when the goal is
to name the best one.

Thompson sampling runs the maximizer of one joint posterior draw. For naming the best cell
(simple regret, not the sum of rewards along the way) it spends too many runs on the leader once
the leader is clear; the top-two variant (Russo 2016, "Simple Bayesian algorithms for best arm
identification") runs the leader ``I`` with probability ``beta`` and otherwise the maximizer of
further draws that is not ``I``, the challenger. ``beta = 1/2`` is the paper's default, within a
factor two of the optimal rate whatever the optimal share is; nothing here is fitted.

The belief is the tuner's mixture of Gaussians over the cells (one component per kept
hyperparameter combination, with its weight); a draw first picks a component by weight.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from allocopt.tuner.model import joint_draws

BETA = 0.5
"""Probability of running the leader (Russo 2016's default); else the challenger."""
TRIES = 100
"""Draws spent looking for a challenger before the leader is run after all (the belief then puts
almost all its mass on the leader)."""


def _draws(weights: np.ndarray, means: np.ndarray, covs: np.ndarray, n: int,
           rng: np.random.Generator) -> np.ndarray:
    """``n`` joint draws (``n x t``) from the mixture, each from a component drawn by weight (row
    ``i`` from the ``i``-th component drawn, so the draws are in the order they were made)."""
    comp = rng.choice(len(weights), size=n, p=np.asarray(weights) / np.sum(weights))
    out = np.empty((n, means.shape[1]))
    out[np.argsort(comp, kind="stable")] = joint_draws(means, covs, np.bincount(comp, minlength=len(weights)), rng)
    return out


def top_two(weights: np.ndarray, means: np.ndarray, covs: np.ndarray, rng: np.random.Generator,
            allowed: Sequence[bool] | None = None, beta: float = BETA) -> int:
    """Index of the cell to run: the leader of one draw with probability ``beta``, else the
    first other maximizer among :data:`TRIES` more draws (the leader when none differs).

    Args:
        weights, means, covs: the mixture's ``k`` weights, ``k x t`` means, ``k x t x t``
            covariances.
        rng: the draws' generator (a study seeds it, so a proposal is reproducible).
        allowed: ``t`` flags, the cells a run may be made at (``None``: all): leader and
            challenger are the maximizers of a draw among them.
    """
    ok = np.ones(means.shape[1], dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    if not ok.any():
        raise ValueError("no cell may be run")
    first = _draws(weights, means, covs, 1, rng)[0]
    leader = int(np.argmax(np.where(ok, first, -np.inf)))
    if rng.random() < beta:
        return leader
    more = np.where(ok[None, :], _draws(weights, means, covs, TRIES, rng), -np.inf)
    others = np.argmax(more, axis=1)
    differ = others[others != leader]
    return int(differ[0]) if len(differ) else leader


__all__ = ["BETA", "TRIES", "top_two"]
