"""The scoring rules: what a method would answer at each compute level, three ways.

At a compute level ``c`` (full-run equivalents, pilots included) every method is scored on what
it had spent by ``c``:

* **own rule** (``regret_pct``): the method's own recommendation. Grid, random search and the
  Optuna samplers: the best *observed* full-budget trial (Optuna's ``study.best_trial``);
  allocopt: its own answer; Ax: the best arm by model prediction; SMAC3: its incumbent;
  BoTorch's multi-fidelity loop: the argmax of the posterior mean at full fidelity.
* **common rule** (``regret_pct_common``): one model for every method, fitted on the
  full-budget trials that method ran by ``c`` (pilots are not used), and its recommendation
  the argmax of its posterior mean over the world's candidates (every feasible cell at the full
  budget; :mod:`benchmarks.tuners.world`). The model is BoTorch's ``SingleTaskGP`` with its
  defaults of BoTorch 0.18 (an RBF kernel with one length scale per input and their
  dimension-scaled log-normal prior, a Gaussian likelihood with its log-normal noise prior, a
  constant mean) and ``Standardize`` on the outcome, fitted by ``fit_gpytorch_mll`` with
  ``torch.manual_seed(0)``, on the inputs of :meth:`World.encode` (ρ and log2 G scaled to [0,
  1], one-hot reward system and model). With a single full run, or full runs that all observed
  the same value, the rule answers the best observed one; if the fit raises, likewise. A win
  under this rule is the search's, not the recommendation's.
* **oracle** (``regret_pct_oracle``): the best *true* value among the allocations the method
  ran at the full budget by ``c`` (Ax's benchmark calls it the oracle trace): what its search
  found, whatever it then recommends.

Regret in % of the truth's range over the candidates (:func:`benchmarks.tuners.truth.regret_pct`);
NaN where a method has nothing to answer yet (no full run; allocopt before its pilots end) or
``c`` lies beyond the method's cap.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.session import EPS, Session
from benchmarks.tuners.truth import Truth, regret_pct, value_pct
from benchmarks.tuners.world import World

RULES: tuple[str, ...] = ("own", "common", "oracle")
BEST_OBSERVED = "best_observed"
OWN = "own"


def best_observed(full: Sequence[tuple[Allocation, float]]) -> Allocation | None:
    """The allocation of the best observed full run (the first on a tie)."""
    best = None
    for a, y in full:
        if best is None or y > best[1]:
            best = (a, y)
    return best[0] if best else None


class CommonRule:
    """The common rule over ``world``'s candidates (module docstring); fits are cached by data."""

    def __init__(self, world: World):
        self.world = world
        self.candidates = list(world.candidates)
        self._cache: dict[tuple, Allocation | None] = {}
        self.fits = 0

    def __call__(self, full: Sequence[tuple[Allocation, float]]) -> Allocation | None:
        if len(full) < 2 or len({y for _, y in full}) < 2:
            return best_observed(full)
        key = tuple((a, round(y, 12)) for a, y in full)
        if key not in self._cache:
            try:
                self._cache[key] = self.candidates[self.argmax(full)]
            except Exception:  # noqa: BLE001 - a failed fit answers as the best observed
                self._cache[key] = best_observed(full)
        return self._cache[key]

    def argmax(self, full: Sequence[tuple[Allocation, float]]) -> int:
        """Index in ``candidates`` of the posterior mean's maximum (the first on a tie)."""
        import torch
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms.outcome import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        self.fits += 1
        x = torch.tensor([self.world.encode(a) for a, _ in full], dtype=torch.float64)
        y = torch.tensor([[v] for _, v in full], dtype=torch.float64)
        torch.manual_seed(0)
        gp = SingleTaskGP(x, y, outcome_transform=Standardize(m=1))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        cand = torch.tensor([self.world.encode(a) for a in self.candidates], dtype=torch.float64)
        with torch.no_grad():
            mean = gp.posterior(cand).mean.squeeze(-1)
        return int(torch.argmax(mean))


def own_answer(session: Session, rule: str, level: float) -> Allocation | None:
    """The method's own recommendation with at most ``level`` compute."""
    if rule == BEST_OBSERVED:
        return best_observed(session.full_runs(level))
    out = None
    for spent, a in session.answers:
        if spent > level + EPS:
            break
        out = a
    return out


def _alloc_fields(a: Allocation | None) -> dict[str, Any]:
    if a is None:
        return {"rho": math.nan, "group_size": "", "reward": "", "model": ""}
    return {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model or ""}


def score(session: Session, rule: str, truth: Truth, common: CommonRule) -> list[dict[str, Any]]:
    """One record per level of ``session.levels``: the three regrets (module docstring), the
    compute used, the own answer's allocation and the counts of full runs and pilots."""
    out = []
    for level in session.levels:
        if level > session.cap + EPS:
            out.append({"level": level, "regret_pct": math.nan, "regret_pct_common": math.nan,
                        "regret_pct_oracle": math.nan, "compute_used": math.nan, **_alloc_fields(None)})
            continue
        full = session.full_runs(level)
        own = own_answer(session, rule, level)
        oracle = max((truth.value(a) for a, _ in full), default=None)
        evs = [e for e in session.events if e.cost <= level + EPS]
        out.append({
            "level": level, "regret_pct": regret_pct(truth, own),
            "regret_pct_common": regret_pct(truth, common(full)),
            "regret_pct_oracle": math.nan if oracle is None else value_pct(truth, oracle),
            "compute_used": max((e.cost for e in evs), default=0.0),
            "num_full": len(full), "num_pilots": sum(1 for e in evs if e.fraction < 1 and e.value is not None),
            **_alloc_fields(own)})
    return out
