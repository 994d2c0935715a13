"""RACE proposals: the multi-fidelity surrogate, the recommendation, and the next runs.

The surrogate (:mod:`allocopt.surrogate`) is fitted on pilots and full runs together (the budget
fraction is its fidelity; it learns how far the optimal ρ drifts with the budget, so the pilots'
bias is corrected once a few full runs exist). :func:`propose` picks full runs by Thompson
sampling of the full-budget maximizer (or extra pilots, when their variance reduction per FLOP
is worth it); infeasible plans and repeats of existing trials are never proposed.
:func:`recommend` gives the allocation to run at the full budget. See :mod:`allocopt.race`.

Optuna and (through the surrogate) torch are imported inside functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from allocopt.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.flops import ConfigError
from allocopt.race.design import RaceSettings
from allocopt.race.diagnose import Observation, trial_fidelity, trial_params
from allocopt.spec import SearchSpace, StudySpec, allocation_in

def _encoding(space: SearchSpace):
    from allocopt.surrogate import Encoding

    return Encoding(space.rho, space.group_sizes, space.rewards, tuple(space.models) or (None,))


def fit_surrogate(obs: Sequence[Observation], space: SearchSpace, seed: int = 0, init: Any = None,
                  fit: bool = True):
    """The :class:`allocopt.surrogate.MultiFidelitySurrogate` over all observations (pilots and
    full runs; the budget fraction is the fidelity); ``init``: an earlier fit's ``raw``
    hyperparameters to start from as well (``fit=False``: taken as they are, only the data
    change: how pending trials are conditioned on). Raises ``ValueError`` with < 2 observations."""
    import torch

    from allocopt.surrogate import MultiFidelitySurrogate

    enc = _encoding(space)
    X = enc.tensor([enc.row(o.allocation.rho, o.allocation.group_size, o.allocation.reward,
                            o.allocation.model, o.budget_fraction) for o in obs])
    Y = torch.tensor([[o.value] for o in obs], dtype=torch.double)
    return MultiFidelitySurrogate(enc, X, Y, seed=seed, init=init, fit=fit)


def _rho_grid(space: SearchSpace, settings: RaceSettings) -> list[float]:
    lo, hi = space.rho
    return sorted({round(lo + (hi - lo) * i / (settings.rho_grid - 1), 4) for i in range(settings.rho_grid)})


def _full_candidates(space: SearchSpace, settings: RaceSettings) -> list[Allocation]:
    return [Allocation(r, g, w, m) for m in (space.models or (None,)) for w in space.rewards
            for g in space.group_sizes for r in _rho_grid(space, settings)]


def recommend(surrogate: Any, obs: Sequence[Observation], space: SearchSpace,
              settings: RaceSettings = RaceSettings()) -> tuple[Allocation, float, float]:
    """The allocation to run at the full budget: the argmax of the surrogate's posterior mean at
    fidelity 1 over the candidate grid (``rho_grid`` ρ × G × reward × model), restricted, once
    there are full-budget runs, to cells (reward system × model) with one and to ρ within
    ``rho_trust`` of one (the mean is not trusted far from full-budget data). G is not
    restricted: its effect is shared by every cell and learned from pilots too.

    Returns:
        ``(allocation, posterior mean, posterior sd)`` at the full budget (target units).
    """
    enc = surrogate.encoding
    full = [o.allocation for o in obs if o.fidelity == "full" or o.budget_fraction >= 1 - 1e-9]
    cands = _full_candidates(space, settings)
    if full:
        near = [a for a in cands if any(b.reward == a.reward and b.model == a.model
                                        and abs(b.rho - a.rho) <= settings.rho_trust + 1e-9 for b in full)]
        cands = near or cands
    mean, sd = surrogate.predict(enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0)
                                             for a in cands]))
    i = int(mean.argmax())
    return cands[i], float(mean[i]), float(sd[i])


_PLAN_KEYS = ("budget_flops", "model", "reward_model", "prompts_per_iteration", "rollouts_per_iteration",
              "rows_trained_per_iteration", "update_passes", "num_iterations_trl", "iterations",
              "realized_rho", "budget_utilization", "expected_search_flops", "expected_learning_flops",
              "expected_reward_flops", "expected_total_flops")


@dataclass(frozen=True)
class Proposal:
    """A proposed run: allocation, fidelity, and the plan its budget buys."""

    allocation: Allocation
    fidelity: str
    """``full`` (a validation run) or ``pilot`` (an extra pilot)."""
    budget_flops: float
    plan: TrialPlan | None
    """The plan the budget buys (``None`` when proposed without a workload: feasibility unchecked)."""
    acquisition: float
    """Share of the round's posterior samples in which this allocation (for an extra pilot: the
    full-budget allocation it informs) is the full-budget maximizer (Thompson sampling)."""
    cost: float
    """Compute in full-budget runs (``budget_flops / spec.budget_flops``)."""
    predicted_mean: float
    """Surrogate mean of the target at the full budget, at this allocation (for an extra pilot:
    at the full-budget allocation it informs)."""
    predicted_sd: float

    def trl(self) -> dict[str, Any]:
        """TRL ``GRPOConfig`` values of the plan (as the allocopt driver sets them).

        ``learning_rate_scale`` is 1: the learning rate is per optimizer step and not scaled
        (each pass over a rollout batch is one step at the full rate, as TRL's
        ``num_iterations`` and verl's ``ppo_epochs`` run it; :func:`objectives.grpo.step_learning_rate`).
        """
        p = self.plan
        if p is None:
            return {}
        return {"num_generations": p.group_size, "num_iterations": p.num_iterations_trl,
                "generation_batch_size": p.rollouts_per_iteration,
                "rows_trained_per_iteration": p.rows_trained_per_iteration,
                "update_passes": p.update_passes, "iterations": p.iterations,
                "learning_rate_scale": 1.0}

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        return {"fidelity": self.fidelity, "budget_flops": self.budget_flops, "cost_full_runs": self.cost,
                "allocation": {"rho": a.rho, "group_size": a.group_size, "reward": a.reward,
                               "model": a.model or (self.plan.policy if self.plan else None)},
                "predicted_full_budget": {"mean": self.predicted_mean, "sd": self.predicted_sd},
                "acquisition": self.acquisition, "trl": self.trl(),
                "plan": {k: v for k, v in self.plan.to_dict().items() if k in _PLAN_KEYS} if self.plan else {}}


def same_run(a: Allocation, fa: str, b: Allocation, fb: str, tol: float) -> bool:
    """Whether two runs repeat each other: same fidelity, G, reward, model, ρ within ``tol``."""
    return (fa == fb and a.group_size == b.group_size and a.reward == b.reward
            and a.model == b.model and abs(a.rho - b.rho) <= tol)


def interrupted(t: Any) -> bool:
    """A trial failed by an interrupt (Ctrl-C): it may be run again."""
    from optuna.trial import TrialState

    return t.state == TrialState.FAIL and str(t.user_attrs.get("error", "")).startswith("interrupted")


def runs_of(trials: Sequence[Any], space: SearchSpace, skip: int | None = None) -> list[tuple[Allocation, str]]:
    """``(allocation, fidelity)`` of every trial in ``trials`` that ran, runs or waits, with its
    parameters set (a failure by interrupt does not count: it may be re-run; trial number
    ``skip`` is left out)."""
    out = []
    for t in trials:
        params = trial_params(t)
        if t.number == skip or not params or interrupted(t):
            continue
        try:
            out.append((allocation_in(space, params), trial_fidelity(t)))
        except ConfigError:
            continue
    return out


def existing_runs(study: Any, spec: StudySpec) -> list[tuple[Allocation, str]]:
    """:func:`runs_of` every trial of ``study``."""
    return runs_of(study.get_trials(deepcopy=False), spec.space)


_UNCHECKED: Any = object()
"""What ``propose``'s plan lookup gives without a workload (feasibility not checked)."""


def _plan(p: Any) -> TrialPlan | None:
    return None if p is _UNCHECKED else p


class PlanCache:
    """make_plan with a cache (make_plan costs ~0.1 s per call)."""

    def __init__(self, workload: Workload):
        self.workload, self.cache = workload, {}

    def __call__(self, budget: float, a: Allocation) -> TrialPlan | None:
        k = (budget, a)
        if k not in self.cache:
            try:
                p = make_plan(budget, a, self.workload)
                self.cache[k] = p if p.realizable else None
            except (InfeasiblePlan, ConfigError):
                self.cache[k] = None
        return self.cache[k]


def propose(obs: Sequence[Observation], spec: StudySpec, workload: Workload | None, *,
            existing: Sequence[tuple[Allocation, str]] = (), q: int = 1, pilot_fraction: float = 0.1,
            allow_pilots: bool = True, settings: RaceSettings = RaceSettings(), surrogate: Any = None,
            plans: Callable[[float, Allocation], TrialPlan | None] | None = None) -> list[Proposal]:
    """Up to ``q`` runs to do next, by Thompson sampling of the full-budget maximizer.

    1. Candidates: the full-budget grid (``rho_grid`` ρ values × G × reward × model), pruned to
       those whose upper bound (mean + 2.5 sd) reaches the best lower bound (mean - 2.5 sd),
       at most 400 of them.
    2. ``thompson_samples`` joint posterior samples over them (each with its own budget drift δ,
       drawn from the surrogate's mixture); sample ``j``'s maximizer is pick ``j`` (a candidate
       already picked, a repeat or an infeasible plan passes to that sample's next best). When
       the samples run out first, the other candidates follow by upper bound (200 at most).
    3. Extra pilots (``allow_pilots``): a pick may be run as a pilot instead, at the same G and
       cell and at the ρ where the pilots' optimum sits (ρ - δ × decades below the full budget),
       when that pilot's reduction of the posterior variance of the pick's full-budget value per
       unit of compute beats the full run's (``v² / (v + σn²)`` for the full run, with ``v``
       the mixture variance, which includes the unknown drift only full runs resolve;
       ``c² / (v_z + σn²) / pilot_fraction`` for the pilot, ``c`` its covariance with the pick).

    With a ``workload`` (or ``plans``), every proposal has a feasible, realizable plan within its
    budget (:func:`make_plan`); without, feasibility is not checked (``plan`` is ``None``). None
    repeats an ``existing`` run or another proposal of the batch (same G, reward, model, fidelity,
    ρ within ``settings.rho_match``).

    Args:
        obs: observations the surrogate is fitted on (ignored when ``surrogate`` is given).
        existing: runs already done or queued (:func:`existing_runs`).
        allow_pilots: offer pilot-fidelity runs too.
        surrogate: a fitted surrogate (:func:`fit_surrogate`).
    """
    import torch

    seed = spec.seed if settings.seed is None else settings.seed
    sur = surrogate if surrogate is not None else fit_surrogate(obs, spec.space, seed=seed)
    enc = sur.encoding
    if plans is None and workload is not None:
        plans = PlanCache(workload)
    space = spec.space
    cands = _full_candidates(space, settings)
    X = enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0) for a in cands])
    mean, sd = sur.predict(X)
    keep = torch.nonzero(mean + 2.5 * sd >= float((mean - 2.5 * sd).max()))[:, 0]
    keep = keep[torch.argsort((mean + 2.5 * sd)[keep], descending=True)[:400]]
    draws = sur.sample(X[keep].unsqueeze(0), settings.thompson_samples)[:, 0, :]  # S x k
    wins = torch.bincount(draws.argmax(-1), minlength=len(keep)).double() / draws.shape[0]
    taken = list(existing)
    out: list[Proposal] = []
    decades = math.log10(1.0 / pilot_fraction)
    drift = sur.drift[0]
    noise2 = sur.noise_sd ** 2
    lo, hi = space.rho

    def try_run(a: Allocation, fidelity: str, frac: float) -> TrialPlan | None:
        if any(same_run(a, fidelity, b, fb, settings.rho_match) for b, fb in taken):
            return None
        if plans is None:  # no workload: feasibility unchecked
            taken.append((a, fidelity))
            return _UNCHECKED
        plan = plans(frac * spec.budget_flops, a)
        if plan is None or plan.expected.executed.total_flops > frac * spec.budget_flops:
            return None
        taken.append((a, fidelity))
        return plan

    def offer(i: int, p_best: float) -> bool:
        """Propose candidate ``i`` (as a pilot when that is worth more); ``False`` when it is a
        repeat or has no feasible plan."""
        a = cands[i]
        if allow_pilots:
            z = replace(a, rho=round(min(max(a.rho - drift * decades, lo), hi), 4))
            zrow = enc.tensor([enc.row(z.rho, z.group_size, z.reward, z.model, pilot_fraction)])
            cov, var_z = sur.covariance_with(X[i:i + 1], zrow)
            v = float(sd[i]) ** 2
            gain_full = v * v / (v + noise2)
            gain_pilot = float(cov[0]) ** 2 / (float(var_z[0]) + noise2) / pilot_fraction
            plan = try_run(z, "pilot", pilot_fraction) if gain_pilot > gain_full else None
            if plan is not None:
                out.append(Proposal(z, "pilot", pilot_fraction * spec.budget_flops, _plan(plan), p_best,
                                    pilot_fraction, float(mean[i]), float(sd[i])))
                return True
        plan = try_run(a, "full", 1.0)
        if plan is None:
            return False
        out.append(Proposal(a, "full", spec.budget_flops, _plan(plan), p_best, 1.0, float(mean[i]),
                            float(sd[i])))
        return True

    tried: set[int] = set()  # offered (accepted or refused): never offered again
    for j in range(draws.shape[0]):
        if len(out) >= q:
            break
        for k in torch.argsort(draws[j], descending=True).tolist():
            i = int(keep[k])
            if i not in tried:
                tried.add(i)
                if offer(i, float(wins[k])):
                    break
    if len(out) < q:  # the likely maximizers are all repeats or infeasible: the rest by upper bound
        for i in torch.argsort(mean + 2.5 * sd, descending=True).tolist():
            if len(out) >= q or len(tried) >= len(keep) + 200:
                break
            if i not in tried:
                tried.add(i)
                offer(i, 0.0)
    return out

