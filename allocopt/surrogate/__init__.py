"""A multi-fidelity Gaussian-process surrogate of the target over allocations, pilots and full runs.

torch, GPyTorch and BoTorch are imported in this package only (:mod:`~allocopt.surrogate.encoding`:
the inputs; :mod:`~allocopt.surrogate.kernel`: the kernel and its GP; :mod:`~allocopt.surrogate.model`:
the fitted δ mixture); ``import allocopt`` and the CLI stay light.
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

import torch

from allocopt.surrogate.encoding import FIDELITY_DECADES, Encoding, budget_fraction_of, fidelity_of
from allocopt.surrogate.kernel import MultiFidelityKernel
from allocopt.surrogate.model import (DRIFT_GRID, DRIFT_PRIOR_SD, MIN_WEIGHT, MultiFidelitySurrogate,
                                      drift_support)

torch.set_num_threads(1)

__all__ = ["DRIFT_GRID", "DRIFT_PRIOR_SD", "Encoding", "MIN_WEIGHT", "FIDELITY_DECADES", "MultiFidelityKernel",
           "MultiFidelitySurrogate", "budget_fraction_of", "drift_support", "fidelity_of"]
