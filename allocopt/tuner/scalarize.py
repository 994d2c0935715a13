"""Several targets as one, a fresh weighting per proposal: how the knowledge-gradient tuner
searches a Pareto front.

Each proposal draws weights ``w`` uniformly from the simplex and maximizes the augmented
Chebyshev scalarization of the targets (Knowles 2006, "ParEGO: a hybrid algorithm with on-line
landscape approximation for expensive multiobjective optimization problems"; Paria, Kandasamy
& Póczos 2019, "A flexible framework for multi-objective Bayesian optimization using random
scalarizations"): with each target ``z_k`` scaled to [0, 1] over the runs so far (1 the best
seen, larger is better),

    s = -max_k w_k (1 - z_k) - AUGMENT · Σ_k w_k (1 - z_k)

whose maximizers over a fixed ``w`` are Pareto optimal, and every Pareto-optimal point whose
trade-offs the small augmentation does not cut off (on a convex front or not) maximizes it for
some ``w``. Over many proposals the random weights
spread the runs along the front. The tuner then models ``s`` as one target; its known
evaluation variances do not carry over (a maximum of scaled targets has none), so the model
learns the noise from the values.

Pure numpy: plain observations in, plain observations out.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from allocopt.race.data import Observation

AUGMENT = 0.05
"""Weight of the sum beside the maximum: ParEGO's value; it breaks ties on weakly dominated
points (without it, a point better in one target only scores as well as one that is not)."""


def weights(k: int, seed: int, number: int) -> np.ndarray:
    """``k`` weights drawn uniformly from the simplex, from ``(seed, number)`` (``number``: the
    trial being proposed, so that each proposal, and each worker's, draws its own)."""
    if k < 1:
        raise ValueError(f"k={k!r}: at least one target")
    return np.random.default_rng([seed % 2**32, number % 2**32]).dirichlet(np.ones(k))


def chebyshev(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The augmented Chebyshev scalarization (module docstring) of ``n x k`` values (larger is
    better in every column), each column scaled over its own ``n`` values (a column with one
    value throughout scales to 1)."""
    values = np.asarray(values, dtype=float)
    lo, hi = values.min(axis=0), values.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    gap = 1.0 - np.where(hi > lo, (values - lo) / span, 1.0)
    return -(gap * w).max(axis=1) - AUGMENT * (gap * w).sum(axis=1)


def scalarized(per_target: Sequence[Sequence[Observation]], signs: Sequence[float],
               w: np.ndarray) -> list[Observation]:
    """One observation per run that has every target, its value the scalarization of
    ``sign × value`` over the targets (``per_target[k]``: the runs' observations of target
    ``k``, matched by trial number), in the first target's order."""
    if len(per_target) != len(signs) or len(signs) != len(w):
        raise ValueError(f"{len(per_target)} targets, {len(signs)} signs, {len(w)} weights: must match")
    by_number = [{o.number: o for o in obs} for obs in per_target]
    runs = [o for o in per_target[0] if all(o.number in b for b in by_number[1:])]
    if not runs:
        return []
    values = np.asarray([[s * b[o.number].value for s, b in zip(signs, by_number)] for o in runs])
    return [replace(o, value=float(v), variance=math.nan) for o, v in zip(runs, chebyshev(values, w))]


__all__ = ["AUGMENT", "chebyshev", "scalarized", "weights"]
