"""RACE proposals: the next runs, by Thompson sampling of the surrogate's full-budget maximizer.

The surrogate (:mod:`allocopt.surrogate`, fitted by :mod:`allocopt.race.fit`) is fitted on pilots and full runs together (the budget
fraction is its fidelity; it learns how far the optimal ρ drifts with the budget, so the pilots'
bias is corrected once a few full runs exist). :func:`propose` picks full runs by Thompson
sampling of the full-budget maximizer (or extra pilots, when their variance reduction per FLOP
is worth it); infeasible plans and repeats of existing trials are never proposed.
:func:`allocopt.race.recommend.recommend` gives the allocation to run at the full budget. See
:mod:`allocopt.race`.

The loop (a study's sampler, through :class:`allocopt.race.tuner.RaceTuner`) calls, whenever a
worker is free and the pilots are done::

    cache = SurrogateCache(space, seed)               # once per study
    sur = cache(obs)                                  # every run so far (pilots and full)
    [p] = propose(obs, runs, space, budgets, settings, feasible=feasible, surrogate=sur,
                  q=1, allow_pilots=..., seed=seed)

with ``obs`` the finished runs' :class:`~allocopt.race.data.Observation` and ``runs`` every
:class:`~allocopt.race.data.Run` done, running or queued, so pending full runs are conditioned
on; it answers for as long as the study has trials left (no fixed count). A
``Proposal.replicate`` is run even though its allocation ran before (with a new seed). Plain
data in, proposals out: no study, no Optuna (the translator is :mod:`allocopt.study.observe`).

torch is imported (through the surrogate) inside functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from allocopt.plan.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.plan.engines import trl_grpo_config
from allocopt.flops import ConfigError
from allocopt.race.data import Budgets, Feasible, Observation, Run
from allocopt.race.design import RaceSettings
from allocopt.race.fit import fit_surrogate
from allocopt.race.recommend import _full_candidates
from allocopt.spec import SearchSpace

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
    """The plan the budget buys, attached by the caller that holds the workload
    (:meth:`with_plan`); ``None`` from :func:`propose`, which sees only a feasibility test."""
    acquisition: float
    """Share of the round's posterior samples in which this allocation (for an extra pilot: the
    full-budget allocation it informs) is the full-budget maximizer (Thompson sampling)."""
    cost: float
    """Compute in full-budget runs of its allocation (1, or the pilot fraction)."""
    predicted_mean: float
    """Surrogate mean of the target at the full budget, at this allocation (for an extra pilot:
    at the full-budget allocation it informs)."""
    predicted_sd: float
    replicate: bool = False
    """A repeat (another seed) of a full run already made: the leaders are within one
    evaluation's noise of each other and the noise is measured by repeating the leader
    (``RaceSettings.replicates``). The loop must run it even though the same allocation ran."""

    def with_plan(self, plans: Callable[[float, Allocation], TrialPlan | None] | None) -> "Proposal":
        """This proposal with the plan ``plans(budget_flops, allocation)`` makes (a
        :class:`PlanCache`); unchanged without ``plans``."""
        return self if plans is None else replace(self, plan=plans(self.budget_flops, self.allocation))

    def trl(self) -> dict[str, Any]:
        """TRL ``GRPOConfig`` values of the plan (as the allocopt driver sets them).

        ``learning_rate_scale`` is 1: the learning rate is per optimizer step and not scaled
        (each pass over a rollout batch is one step at the full rate, as TRL's
        ``num_iterations`` and verl's ``ppo_epochs`` run it; :func:`allocopt.grpo.driver.step_learning_rate`).
        """
        p = self.plan
        if p is None:
            return {}
        cfg = trl_grpo_config(p)
        return {**{k: cfg[k] for k in ("num_generations", "num_iterations", "generation_batch_size")},
                "rows_trained_per_iteration": p.rows_trained_per_iteration,
                "update_passes": p.update_passes, "iterations": p.iterations,
                "learning_rate_scale": 1.0}

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        return {"fidelity": self.fidelity, "budget_flops": self.budget_flops, "cost_full_runs": self.cost,
                "allocation": {"rho": a.rho, "group_size": a.group_size, "reward": a.reward,
                               "model": a.model or (self.plan.policy if self.plan else None)},
                "predicted_full_budget": {"mean": self.predicted_mean, "sd": self.predicted_sd},
                "acquisition": self.acquisition, "replicate": self.replicate, "trl": self.trl(),
                "plan": {k: v for k, v in self.plan.to_dict().items() if k in _PLAN_KEYS} if self.plan else {}}


def same_run(a: Allocation, fa: str, b: Allocation, fb: str, tol: float) -> bool:
    """Whether two runs repeat each other: same fidelity, G, reward, model, ρ within ``tol``."""
    return (fa == fb and a.group_size == b.group_size and a.reward == b.reward
            and a.model == b.model and abs(a.rho - b.rho) <= tol)


class PlanCache:
    """make_plan with a cache (make_plan costs ~0.1 s per call): ``plans(budget_flops,
    allocation)`` is the realizable plan, or ``None`` (infeasible, unrealizable, unpriceable)."""

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

    def feasible(self, budgets: Budgets) -> Feasible:
        """:func:`feasible_by` these plans."""
        return feasible_by(self, budgets)


def feasible_by(plans: Callable[[float, Allocation], TrialPlan | None], budgets: Budgets) -> Feasible:
    """The feasibility test of :func:`propose` from ``plans(budget_flops, allocation)`` (a
    :class:`PlanCache`): a run of an allocation at a budget fraction has a plan whose expected
    executed FLOPs fit its budget (``budgets``)."""
    def fits(a: Allocation, fraction: float) -> bool:
        budget = budgets.flops(a, fraction)
        plan = plans(budget, a)
        return plan is not None and plan.expected.executed.total_flops <= budget
    return fits


def _replicate(sur: Any, existing: Sequence[tuple[Allocation, str]], settings: RaceSettings,
               feasible: Feasible | None, budgets: Budgets) -> "Proposal | None":
    """A repeat of the leading full run when the surrogate cannot separate it from the best full
    run of another cell or G (posterior means within one evaluation's noise) and it has run at
    most ``settings.replicates`` times; else ``None``."""
    enc = sur.encoding
    full = [b for b, fb in existing if fb == "full"]
    if len(full) < 2:
        return None
    mean, sd = sur.predict(enc.tensor([enc.row(b.rho, b.group_size, b.reward, b.model, 1.0) for b in full]))
    order = sorted(range(len(full)), key=lambda k: -float(mean[k]))
    lead = full[order[0]]
    key = (lead.reward, lead.model, lead.group_size)
    rival = next((k for k in order[1:] if (full[k].reward, full[k].model, full[k].group_size) != key), None)
    if rival is None or float(mean[rival]) < float(mean[order[0]]) - sur.noise_sd:
        return None
    copies = sum(1 for b in full if same_run(b, "full", lead, "full", settings.rho_match))
    if copies > settings.replicates:
        return None
    if feasible is not None and not feasible(lead, 1.0):
        return None
    return Proposal(lead, "full", budgets.flops(lead, 1.0), None, 0.0, 1.0, float(mean[order[0]]),
                    float(sd[order[0]]), replicate=True)


def with_pending(sur: Any, obs: Sequence[Observation], runs: Sequence[Run], space: SearchSpace,
                 seed: int = 0) -> Any:
    """``sur`` conditioned on the pending full runs of ``runs`` by a **constant liar**
    (Ginsbourger, Le Riche & Carraro 2010, "CL-min"): each enters the surrogate, at its fitted
    hyperparameters, as observed at the lowest value of ``obs``, so the posterior there is low
    and near-certain and parallel proposals go to other allocations. ``sur`` itself when none is
    pending."""
    pending = [r for r in runs if r.pending and r.fidelity == "full"]
    if not pending or not obs:
        return sur
    lie = min(o.value for o in obs)
    lies = [Observation(-1, r.allocation, lie, math.nan, 1.0, "full") for r in pending]
    return fit_surrogate(list(obs) + lies, space, seed=seed + len(obs) + len(lies), init=sur.raw, fit=False)


def propose(obs: Sequence[Observation], runs: Sequence[Run], space: SearchSpace, budgets: Budgets,
            settings: RaceSettings = RaceSettings(), *, feasible: Feasible | None = None,
            surrogate: Any = None, q: int = 1, allow_pilots: bool = True, seed: int = 0) -> list[Proposal]:
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

    Pending full runs (``Run.pending``) are conditioned on by a constant liar
    (:func:`with_pending`). Replicates (``settings.replicates`` > 0): when the leading full
    run's cell and G and the best full run of another cell or G are within one evaluation's
    noise (posterior means), the first proposal repeats the leader (``Proposal.replicate``), at
    most ``replicates`` extra times.

    Cells first: once ``settings.explore_cells_after`` full runs exist, cells (reward system ×
    model) without a full run (in ``runs``) are the only candidates, each proposed at its
    best posterior mean (cells by that mean, one per cell and batch), until each has one.

    It answers whenever asked (no fixed count): call it once per free slot of the study. None
    repeats a run of ``runs`` or another proposal of the batch (same G, reward, model, fidelity,
    ρ within ``settings.rho_match``); with ``feasible``, every one passes it.

    Args:
        obs: the finished runs with a value (the surrogate is fitted on them when ``surrogate``
            is not given).
        runs: every run done, running or queued (failed ones included).
        space: the search space.
        budgets: FLOPs of a run per fidelity (a proposal's ``budget_flops``).
        settings: the RACE settings (``rho_grid``, ``thompson_samples``, ``rho_match``,
            ``explore_cells_after``, ``replicates``).
        feasible: ``feasible(allocation, fraction)``; ``None``: feasibility unchecked.
        surrogate: a fitted surrogate on ``obs`` (:func:`fit_surrogate`).
        q: proposals wanted.
        allow_pilots: offer pilot-fidelity runs too.
        seed: seed of a fit made here.

    Returns:
        up to ``q`` :class:`Proposal`, ``plan`` ``None`` (:meth:`Proposal.with_plan`).
    """
    sur = surrogate if surrogate is not None else fit_surrogate(obs, space, seed=seed)
    sur = with_pending(sur, obs, runs, space, seed)
    existing = [(r.allocation, r.fidelity) for r in runs]
    pool = _candidate_pool(sur, space, existing, settings)
    picker = _Picker(sur, pool, space, settings, feasible, budgets, existing, allow_pilots)
    if settings.replicates and not pool.exploring and q >= 1:
        rep = _replicate(sur, existing, settings, feasible, budgets)
        if rep is not None:
            picker.out.append(rep)
            picker.taken.append((rep.allocation, "full"))
    _pick_by_samples(picker, q)
    if len(picker.out) < q:  # the likely maximizers are all repeats or infeasible: the rest by upper bound
        _pick_by_upper_bound(picker, q)
    return picker.out


@dataclass
class _Pool:
    """The full-budget candidates of a round and what the surrogate says of them (``n`` of them;
    ``k`` kept; ``S`` posterior samples)."""

    cands: list[Allocation]
    X: Any
    """Encoded candidates, ``n x d``."""
    mean: Any
    """Posterior mean of each candidate's full-budget target, ``n``."""
    sd: Any
    """Posterior sd, ``n``."""
    keep: Any
    """Indices into ``cands`` of the candidates in play, by upper bound, ``k`` (at most 400)."""
    draws: Any
    """Joint posterior samples over the kept candidates, ``S x k`` (the posterior mean
    repeated while exploring cells)."""
    wins: Any
    """Share of the samples in which each kept candidate is the maximizer, ``k``."""
    exploring: bool
    """Cells without a full run are the only candidates (``settings.explore_cells_after``)."""


def _candidate_pool(sur: Any, space: SearchSpace, existing: Sequence[tuple[Allocation, str]],
                    settings: RaceSettings) -> _Pool:
    """Steps 1 and 2 of :func:`propose`: the full-budget grid, pruned to the candidates whose
    upper bound (mean + 2.5 sd) reaches the best lower bound (or, exploring, to the untested
    cells), at most 400 by upper bound, and ``settings.thompson_samples`` joint samples over them."""
    import torch

    enc = sur.encoding
    cands = _full_candidates(space, settings)
    X = enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0) for a in cands])
    mean, sd = sur.predict(X)
    full_cells = {(b.reward, b.model) for b, fb in existing if fb == "full"}
    missing = {(a.reward, a.model) for a in cands} - full_cells
    n_full = sum(1 for _, fb in existing if fb == "full")
    exploring = bool(missing) and settings.explore_cells_after is not None and n_full >= settings.explore_cells_after
    if exploring:
        # cells without a full run first: the pilots' ranking of the cells is not trusted untested
        keep = torch.tensor([k for k, a in enumerate(cands) if (a.reward, a.model) in missing])
    else:
        keep = torch.nonzero(mean + 2.5 * sd >= float((mean - 2.5 * sd).max()))[:, 0]
    keep = keep[torch.argsort((mean + 2.5 * sd)[keep], descending=True)[:400]]
    draws = sur.sample(X[keep].unsqueeze(0), settings.thompson_samples)[:, 0, :]  # S x k
    wins = torch.bincount(draws.argmax(-1), minlength=len(keep)).double() / draws.shape[0]
    if exploring:  # an untested cell is tested at its best posterior mean (not at one sample's
        # maximizer: a run off a sharp peak would make the cell look worse than it is)
        draws = mean[keep].expand(draws.shape[0], -1)
    return _Pool(cands, X, mean, sd, keep, draws, wins, exploring)


class _Picker:
    """Step 3 of :func:`propose`: offers candidates of ``pool`` one at a time, each as a full
    run or an extra pilot, and keeps the accepted ones (``out``) and every run taken so far
    (``taken``: existing, queued and proposed) so that none repeats another."""

    def __init__(self, sur: Any, pool: _Pool, space: SearchSpace, settings: RaceSettings,
                 feasible: Feasible | None, budgets: Budgets, taken: list[tuple[Allocation, str]],
                 allow_pilots: bool):
        self.sur, self.pool, self.space, self.settings = sur, pool, space, settings
        self.feasible, self.budgets = feasible, budgets
        self.taken, self.out = taken, []
        self.allow_pilots = allow_pilots
        self.tried: set[int] = set()  # offered (accepted or refused): never offered again

    def try_run(self, a: Allocation, fidelity: str) -> bool:
        """Take a run of ``a`` at ``fidelity``; ``False`` for a repeat of a run taken or one
        that is not feasible."""
        if any(same_run(a, fidelity, b, fb, self.settings.rho_match) for b, fb in self.taken):
            return False
        if self.feasible is not None and not self.feasible(a, self.budgets.fraction(fidelity)):
            return False
        self.taken.append((a, fidelity))
        return True

    def offer(self, i: int, p_best: float) -> bool:
        """Propose candidate ``i`` (as a pilot when its variance reduction per unit of compute
        beats the full run's); ``False`` when it is a repeat or has no feasible plan."""
        pool, sur, frac = self.pool, self.sur, self.budgets.pilot_fraction
        a = pool.cands[i]
        mean, sd = float(pool.mean[i]), float(pool.sd[i])
        if self.allow_pilots:
            lo, hi = self.space.rho
            drift = sur.drift[0]
            z = replace(a, rho=round(min(max(a.rho - drift * math.log10(1.0 / frac), lo), hi), 4))
            zrow = sur.encoding.tensor([sur.encoding.row(z.rho, z.group_size, z.reward, z.model, frac)])
            cov, var_z = sur.covariance_with(pool.X[i:i + 1], zrow)
            noise2 = sur.noise_sd ** 2
            v = sd ** 2
            gain_full = v * v / (v + noise2)
            gain_pilot = float(cov[0]) ** 2 / (float(var_z[0]) + noise2) / frac
            if gain_pilot > gain_full and self.try_run(z, "pilot"):
                self.out.append(Proposal(z, "pilot", self.budgets.flops(z, frac), None, p_best, frac, mean, sd))
                return True
        if not self.try_run(a, "full"):
            return False
        self.out.append(Proposal(a, "full", self.budgets.flops(a, 1.0), None, p_best, 1.0, mean, sd))
        return True


def _pick_by_samples(picker: _Picker, q: int) -> None:
    """Sample ``j``'s maximizer is pick ``j``: a candidate already offered, refused or (while
    exploring) in a cell the batch already tests passes to that sample's next best."""
    import torch

    pool = picker.pool
    for j in range(pool.draws.shape[0]):
        if len(picker.out) >= q:
            break
        for k in torch.argsort(pool.draws[j], descending=True).tolist():
            i = int(pool.keep[k])
            cell = (pool.cands[i].reward, pool.cands[i].model)
            if pool.exploring and any(p.fidelity == "full" and (p.allocation.reward, p.allocation.model)
                                      == cell for p in picker.out):
                continue  # one full run per untested cell and batch
            if i not in picker.tried:
                picker.tried.add(i)
                if picker.offer(i, float(pool.wins[k])):
                    break


def _pick_by_upper_bound(picker: _Picker, q: int) -> None:
    """The candidates not yet offered, by upper bound (mean + 2.5 sd), until ``q`` proposals or
    200 offers past the kept ones."""
    import torch

    pool = picker.pool
    for i in torch.argsort(pool.mean + 2.5 * pool.sd, descending=True).tolist():
        if len(picker.out) >= q or len(picker.tried) >= len(pool.keep) + 200:
            break
        if i not in picker.tried:
            picker.tried.add(i)
            picker.offer(i, 0.0)
