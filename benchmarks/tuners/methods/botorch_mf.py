"""A stock BoTorch multi-fidelity loop over the world's finite candidate set, pilots included.

The loop of BoTorch's multi-fidelity tutorials, on a discrete set:

* **inputs**: :meth:`World.encode` of the allocation (ρ and log2 G in [0, 1], one-hot reward
  system and model) and the budget fraction ``f`` as the last column (the fidelity);
* **choices**: every candidate cell (a measured ρ level) at every fidelity the world offers
  (its pilot fractions and 1), but those a table measured infeasible;
* **start**: ``N_INIT`` = 4 choices drawn at random (seeded with the replication);
* **model**: ``SingleTaskMultiFidelityGP(X, Y, data_fidelities=[f column],
  outcome_transform=Standardize(m=1))`` (its default kernel: a product of an RBF over the
  design inputs and BoTorch's linear truncated fidelity kernel), rebuilt on all the data after
  every trial; its hyperparameters refitted by ``fit_gpytorch_mll`` while it has fewer than
  ``REFIT_BELOW`` = 10 trials and then whenever the data have grown by ``REFIT_GROWTH`` = 20 %
  since the last fit, else kept from the last fit (the acquisition mostly buys 10 % pilots, a
  few hundred trials by 40 runs; a fit after each would cost over ten minutes a replication on
  the 2 shared cores);
* **acquisition**: ``qMultiFidelityMaxValueEntropy`` with the full-fidelity candidates as its
  max-value set, ``project_to_target_fidelity`` at ``f = 1`` and the cost-aware utility
  ``InverseCostWeightedUtility(AffineFidelityCostModel({f: 1.0}, fixed_cost=0))`` (a run at
  ``f`` costs ``f``: information per unit of compute); the next trial is its maximizer over
  the choices (``optimize_acqf_discrete``), so the decision "pilot or full run" is the
  acquisition's;
* **own rule**: the argmax of the posterior mean at ``f = 1`` over the candidates
  (``PosteriorMean`` of the projected point), computed when the harness scores it.

Torch on one thread, float64, ``torch.manual_seed(replication)``.
"""

from __future__ import annotations

import random
from typing import Any

from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import OWN
from benchmarks.tuners.session import Session
from benchmarks.tuners.world import FULL

N_INIT = 4
REFIT_BELOW = 10
REFIT_GROWTH = 0.2


def missing() -> str | None:
    try:
        from botorch.acquisition.max_value_entropy_search import qMultiFidelityMaxValueEntropy  # noqa: F401
        from botorch.models import SingleTaskMultiFidelityGP  # noqa: F401
    except ImportError as e:
        return f"BoTorch's multi-fidelity parts do not import ({e})"
    return None


def choices(world: Any) -> list[tuple[Any, float]]:
    """``(allocation, fraction)`` of every candidate at every fidelity, but the infeasible."""
    out = []
    for f in (*world.fractions, FULL):
        for a in world.candidates:
            if world.kind != "table" or world.neighbours(a, f) is not None:
                out.append((a, f))
    return out


def _fit(x: Any, y: Any, last: Any = None) -> Any:
    """The GP on ``x, y``: hyperparameters fitted, or those of ``last`` (its outcome
    standardization recomputed on ``y``)."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskMultiFidelityGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    gp = SingleTaskMultiFidelityGP(x, y, data_fidelities=[x.shape[-1] - 1], outcome_transform=Standardize(m=1))
    if last is None:
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    else:
        keep = {k: v for k, v in last.state_dict().items() if not k.startswith("outcome_transform")}
        gp.load_state_dict(keep, strict=False)
    gp.eval()
    return gp


def _next(gp: Any, x_full: Any, x_choices: Any) -> int:
    """Row of ``x_choices`` (``n x (d + 1)``, the fidelity last) that maximizes the cost-aware
    multi-fidelity max-value entropy; ``x_full``: the candidates at full fidelity (``m x (d + 1)``)."""
    import torch
    from botorch.acquisition.cost_aware import InverseCostWeightedUtility
    from botorch.acquisition.max_value_entropy_search import qMultiFidelityMaxValueEntropy
    from botorch.acquisition.utils import project_to_target_fidelity
    from botorch.models.cost import AffineFidelityCostModel
    from botorch.optim import optimize_acqf_discrete

    d = x_choices.shape[-1] - 1
    cost = AffineFidelityCostModel(fidelity_weights={d: 1.0}, fixed_cost=0.0)
    acq = qMultiFidelityMaxValueEntropy(
        gp, candidate_set=x_full, cost_aware_utility=InverseCostWeightedUtility(cost),
        project=lambda X: project_to_target_fidelity(X, target_fidelities={d: 1.0}, d=d + 1))
    with torch.no_grad():
        best, _ = optimize_acqf_discrete(acq, q=1, choices=x_choices, unique=False)
    return int(torch.nonzero((x_choices == best[0]).all(-1))[0, 0])


def run(session: Session) -> None:
    import torch

    torch.manual_seed(session.replication)
    w = session.world
    opts = choices(w)
    enc = [w.encode(a) + [f] for a, f in opts]
    x_choices = torch.tensor(enc, dtype=torch.float64)
    x_full = torch.tensor([w.encode(a) + [FULL] for a in w.candidates], dtype=torch.float64)
    alive = list(range(len(opts)))
    rng = random.Random(session.replication)
    xs, ys = [], []
    gp, fitted_at = None, 0
    while not session.done:
        if gp is not None and session.answer_due():
            session.recommend(w.candidates[_posterior_argmax(gp, x_full)])
        if len(ys) < N_INIT or gp is None:
            i = rng.choice(alive)
        else:
            i = alive[_next(gp, x_full, x_choices[alive])]
        a, f = opts[i]
        y = session.observe(a, f)
        if y is None:
            alive.remove(i)
            continue
        xs.append(enc[i])
        ys.append([y])
        if len(ys) >= N_INIT:
            refit = gp is None or len(ys) < REFIT_BELOW or len(ys) >= (1 + REFIT_GROWTH) * fitted_at
            gp = _fit(torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64),
                      None if refit else gp)
            fitted_at = len(ys) if refit else fitted_at
    if gp is not None:
        session.recommend(w.candidates[_posterior_argmax(gp, x_full)])


def _posterior_argmax(gp: Any, x_full: Any) -> int:
    import torch

    with torch.no_grad():
        return int(torch.argmax(gp.posterior(x_full).mean.squeeze(-1)))


METHOD = Method("botorch-mf", "BoTorch MF (MES)", OWN, run, missing, weight=150)
