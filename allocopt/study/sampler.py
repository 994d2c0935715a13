"""RaceSampler: RACE as an Optuna sampler (pilot grid first, then surrogate proposals).

Any Optuna code can run RACE::

    sampler = RaceSampler(space, budget_flops=1e19)          # workload= checks feasibility
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial):
        d = sampler.suggest(trial)          # allocation, fidelity, budget_flops of this trial
        return train_and_score(d.allocation, d.budget_flops)

    study.optimize(objective, n_trials=70)

Each trial gets an allocation (``rho``, ``group_size``, ``reward``, ``model``: the dimensions
the space varies) and a **fidelity** parameter, ``pilot`` (a run at ``pilot_fraction ×
budget_flops``; under a time budget, ``time_budget=``, ``pilot_fraction ×`` the FLOPs that
allocation executes in the hours: an iso-time grid) or ``full``. ``fidelity`` is an ordinary Optuna parameter
(``CategoricalDistribution(("pilot", "full"))``), so it is stored with the trial, seen by every
worker on the same storage and kept by a retry. :meth:`RaceSampler.suggest` suggests them all
and writes the user attributes ``fidelity``, ``budget_flops`` and ``race_pilot`` (a grid
point's key) or ``race_validation`` (a surrogate proposal).

What a trial gets (:meth:`RaceSampler.sample_relative`):

1. **Pilots** while the IsoFLOP grid (:func:`allocopt.race.pilot_grid`) has points no trial
   has claimed (a trial claims a point when it runs, waits, completed, or failed other than by
   an interrupt). Concurrent asks on one storage take different points: a trial skips one
   unclaimed point per older trial that is running without parameters yet (being sampled).
2. **Proposals** after that: the multi-fidelity surrogate (:func:`allocopt.race.fit_surrogate`,
   refitted when the set of complete trials changed, warm-started from the last fit) proposes
   by Thompson sampling (:func:`allocopt.race.propose`, ``q = 1``): a full-budget run, or an
   extra pilot within ``settings.extra_pilot_budget``. Pending full-budget trials (running or
   waiting, on any worker) are conditioned on by a **constant liar** (Ginsbourger, Le Riche &
   Carraro 2010, "CL-min"): each enters the surrogate, at fixed hyperparameters, as observed at
   the lowest value seen so far, so the posterior there is low and near-certain and parallel
   proposals go to other allocations; exact repeats of any trial are never proposed.
3. A quasi-random full-budget allocation (Optuna's ``RandomSampler``) when the surrogate cannot
   propose (fewer than two complete trials, every candidate a repeat or infeasible).

Trial values are read through the public API (``FrozenTrial.values``; the study's direction
says which way is better); trials whose user attribute ``state`` is ``INFEASIBLE`` or ``FAIL``
(:mod:`allocopt.study.loop` records an infeasible plan as a complete trial with a violated
constraint) are not observations. One objective only.

This module imports Optuna; torch is imported (through the surrogate) at the first proposal.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from allocopt.flops import ConfigError
from allocopt.plan.allocation import Allocation, Workload, check_budget
from allocopt.plan.throughput import TimeBudget
from allocopt.study.claims import CLAIM_ATTR, clashes, with_claims, write_claim
from allocopt.race.design import FIDELITIES, PilotPoint, RaceSettings, check_pilot_fraction, pilot_grid
from allocopt.race.diagnose import Observation, observed_params
from allocopt.race.fit import SurrogateCache, fit_surrogate
from allocopt.race.propose import PlanCache, Proposal, propose, runs_of
from allocopt.race.recommend import recommend
from allocopt.record import TrialRecord, decision_attrs, fidelity_of, params_of, write_missing
from allocopt.spec import SearchSpace, StudySpec, allocation_in

FIDELITY_PARAM = "fidelity"
"""Name of the trial parameter that holds the fidelity (``pilot`` or ``full``)."""


def space_distributions(space: SearchSpace, *, fidelity: bool = False) -> dict[str, BaseDistribution]:
    """Optuna distributions of the dimensions ``space`` varies (``rho``, ``group_size``,
    ``reward``, ``model``), plus the fidelity parameter when ``fidelity``."""
    d: dict[str, BaseDistribution] = {"rho": FloatDistribution(*space.rho)} \
        if space.rho[0] < space.rho[1] else {}
    if len(space.group_sizes) > 1:
        d["group_size"] = CategoricalDistribution(list(space.group_sizes))
    if len(space.rewards) > 1:
        d["reward"] = CategoricalDistribution(list(space.rewards))
    if len(space.models) > 1:
        d["model"] = CategoricalDistribution(list(space.models))
    if fidelity:
        d[FIDELITY_PARAM] = CategoricalDistribution(list(FIDELITIES))
    return d


@dataclass(frozen=True)
class RaceDecision:
    """What a trial runs: allocation, fidelity, budget, and why."""

    kind: str
    """``pilot`` (a grid point), ``proposal`` (the surrogate's), ``random`` (no surrogate yet)
    or ``given`` (the trial came with its parameters: enqueued or retried)."""
    allocation: Allocation
    fidelity: str
    """``pilot`` or ``full``."""
    budget_flops: float
    """FLOPs the trial may spend: ``pilot_fraction × budget_flops`` for a pilot."""
    pilot: PilotPoint | None = None
    """The grid point of a ``pilot`` decision."""
    proposal: Proposal | None = None
    """The surrogate's proposal of a ``proposal`` decision."""

    def user_attrs(self) -> dict[str, Any]:
        """The user attributes :meth:`RaceSampler.suggest` writes on the trial."""
        return decision_attrs(self.fidelity, self.budget_flops,
                              race_pilot=self.pilot.key if self.pilot is not None else None,
                              race_validation=self.kind == "proposal")


def _slot(a: Allocation) -> tuple:
    return (a.reward, a.model, a.group_size, round(a.rho, 4))


class RaceSampler(optuna.samplers.BaseSampler):
    """RACE as an Optuna sampler (module docstring).

    Args:
        space: the search space (:class:`allocopt.spec.SearchSpace`); its ρ range must be a range.
        budget_flops: the full budget of a run (FLOPs).
        pilot_fraction: pilots run at this fraction of ``budget_flops``, in (0, 1).
        workload: what plans are made for; given, proposals are feasible plans within their
            budget (:func:`allocopt.plan.allocation.make_plan`); ``None``: feasibility unchecked.
        settings: :class:`allocopt.race.RaceSettings` (grid size, repeats, thresholds,
            extra-pilot budget, proposal grid).
        seed: seed of the pilot design, the surrogate and the random fallback
            (``settings.seed`` wins when set).
        time_budget: a :class:`~allocopt.plan.throughput.TimeBudget` (GPU-hours at a
            throughput profile) instead of one FLOP budget: each allocation's full budget is
            the FLOPs it executes in those hours (:meth:`full_budget`), a pilot's is
            ``pilot_fraction`` of its own, and observations, proposals and the recommendation
            put every run at its share of its own allocation's budget (full runs at 1, pilots
            at ``pilot_fraction``), so allocations are compared under the same rule. Needs
            ``workload``; ``budget_flops`` is then only the ceiling (the hours at the fastest
            phase).

    Attributes:
        decisions: this sampler's :class:`RaceDecision` by trial number.
        timings: ``fit_seconds`` per surrogate fit, ``proposal_seconds`` per proposal.
        recommendations: ``(last trial number seen, allocation)`` after each fit: RACE's answer
            (:func:`allocopt.race.recommend`) had the study stopped there.

    Raises:
        ConfigError: bad budget, pilot fraction, settings or a space without a ρ range; a
            time budget without a workload, or with a profile of another set-up.
    """

    def __init__(self, space: SearchSpace, *, budget_flops: float, pilot_fraction: float = 0.1,
                 workload: Workload | None = None, settings: RaceSettings | None = None,
                 seed: int = 0, time_budget: TimeBudget | None = None) -> None:
        self.space = space
        self.budget_flops = check_budget(budget_flops)
        self.pilot_fraction = check_pilot_fraction(pilot_fraction)
        self.settings = settings or RaceSettings()
        self.seed = seed if self.settings.seed is None else self.settings.seed
        self.workload = workload
        self.time_budget = time_budget
        if time_budget is not None and workload is None:
            raise ConfigError("time_budget: RACE under a time budget needs the workload (each "
                              "allocation's FLOPs come from its plan's phase shares)")
        time = {} if time_budget is None else dict(budget_gpu_hours=time_budget.gpu_hours, gpus=time_budget.gpus,
                                                  throughput=time_budget.profile.to_dict())
        self._spec = StudySpec(name="race", budget_flops=self.budget_flops, space=space,
                               seed=self.seed, pilot_fraction=self.pilot_fraction, **time)
        self._full: dict[Allocation, float] = {}
        self.design: list[PilotPoint] = pilot_grid(space, self.settings, self.seed)
        if workload is not None and self.settings.fit_pilots:  # every pilot usable where it can be
            from allocopt.race.pilot_plans import fit_pilots

            self.design = fit_pilots(self.design, space.rho, lambda a: self.budget_of("pilot", a), workload)
        self.distributions = space_distributions(space, fidelity=True)
        self._random = optuna.samplers.RandomSampler(seed=self.seed)
        self._plans = PlanCache(workload) if workload is not None else None
        self.decisions: dict[int, RaceDecision] = {}
        self._fit: tuple[tuple[int, ...], Any] | None = None
        self._cache = SurrogateCache(space, seed)  # hyperparameters refitted as the study grows
        self.timings: dict[str, list[float]] = {"fit_seconds": [], "proposal_seconds": []}
        self.recommendations: list[tuple[int, Allocation]] = []

    # ------------------------------------------------------------------ Optuna's sampler API
    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        if len(study.directions) > 1:
            raise ValueError("RaceSampler: one objective only (this study has "
                             f"{len(study.directions)}); use a multi-objective sampler")
        # a trial that came with parameters (enqueued: Optuna's fixed_params) keeps them
        d = self._given(trial) if params_of(trial) else self._claimed_decision(study, trial)
        self.decisions[trial.number] = d
        a = d.allocation
        full = {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model,
                FIDELITY_PARAM: d.fidelity}
        return {k: full[k] for k in search_space if k in full}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    # ------------------------------------------------------------------ for the trial's runner
    def full_budget(self, allocation: Allocation | None = None) -> float:
        """FLOPs of a full-budget run of ``allocation``: ``budget_flops`` under a FLOP budget;
        under a time budget the FLOPs it executes in the hours
        (:meth:`allocopt.spec.StudySpec.budget_for`; ``allocation=None``: the ceiling
        ``budget_flops``). Raises :class:`ConfigError` (a profile of another set-up)."""
        if self.time_budget is None or allocation is None:
            return self.budget_flops
        if allocation not in self._full:
            self._full[allocation] = self._spec.budget_for(allocation, self.workload)
        return self._full[allocation]

    def budget_of(self, fidelity: str, allocation: Allocation | None = None) -> float:
        """FLOPs of a run of ``allocation`` at ``fidelity`` (``pilot`` or ``full``):
        ``pilot_fraction`` (pilots) or 1 × :meth:`full_budget`."""
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity={fidelity!r}: allowed: {', '.join(FIDELITIES)}")
        return self.full_budget(allocation) * (self.pilot_fraction if fidelity == "pilot" else 1.0)

    def decision(self, trial: FrozenTrial | optuna.Trial) -> RaceDecision:
        """What ``trial`` runs: this sampler's decision for it, or for a trial that came with its
        parameters (enqueued, retried) one read from them (its ``budget_flops`` user attribute
        wins)."""
        d = self.decisions.get(trial.number)
        return d if d is not None else self._given(trial)

    def _given(self, trial: FrozenTrial | optuna.Trial) -> RaceDecision:
        r = TrialRecord.of(trial)  # a live trial: its own parameters only
        a = allocation_in(self.space, r.given_params)
        return RaceDecision("given", a, r.fidelity, r.budget(self.budget_of(r.fidelity, a)))

    def suggest(self, trial: optuna.Trial) -> RaceDecision:
        """Suggest every parameter of the space and the fidelity on ``trial`` (values chosen by
        this sampler), write the decision's user attributes (``fidelity``, ``budget_flops``,
        ``race_pilot`` or ``race_validation``), and return it."""
        for name, dist in self.distributions.items():
            _suggest(trial, name, dist)
        d = self.decision(trial)
        write_missing(trial, d.user_attrs())
        return d

    # ------------------------------------------------------------------ the race
    def pilots_to_run(self, study: optuna.Study) -> list[PilotPoint]:
        """Grid points no trial of ``study`` has claimed yet, in grid order."""
        return self._unclaimed(with_claims(study.get_trials(deepcopy=False), self.distributions))

    def pilots_left(self, study: optuna.Study) -> int:
        """How many grid points no trial of ``study`` has claimed yet."""
        return len(self.pilots_to_run(study))

    def proposals(self, study: optuna.Study, q: int) -> list[Proposal]:
        """Up to ``q`` proposals from the study's complete trials, pending ones conditioned on,
        without asking any trial (``allocopt race --propose-only``)."""
        trials = with_claims(study.get_trials(deepcopy=False), self.distributions)
        return self._propose(study, trials, q=q, skip=None)

    def surrogate(self, study: optuna.Study) -> tuple[Any, list[Observation]]:
        """The surrogate fitted on the study's complete trials (cached while they do not change)
        and those observations; ``(None, obs)`` with fewer than two."""
        obs = self.observations(study)
        return (self._surrogate(obs) if len(obs) >= 2 else None), obs

    def observations(self, study: optuna.Study) -> list[Observation]:
        """Complete, feasible trials of ``study`` as the surrogate sees them (value: the
        study's objective, higher is better)."""
        return self._observations(study, study.get_trials(deepcopy=False))

    # ------------------------------------------------------------------ internals
    def _unclaimed(self, trials: list[FrozenTrial], skip: int | None = None) -> list[PilotPoint]:
        claims = Counter(_slot(a) for a, f in runs_of(trials, self.space, skip) if f == "pilot")
        out = []
        for p in self.design:
            s = _slot(p.allocation)
            if claims[s] > 0:
                claims[s] -= 1
            else:
                out.append(p)
        return out

    def _extra_pilots(self, trials: list[FrozenTrial], skip: int | None) -> int:
        claims = Counter(_slot(a) for a, f in runs_of(trials, self.space, skip) if f == "pilot")
        claims.subtract(Counter(_slot(p.allocation) for p in self.design))
        return sum(v for v in claims.values() if v > 0)

    def _claimed_decision(self, study: optuna.Study, trial: FrozenTrial) -> RaceDecision:
        """Decide, claim the decision in one write, and decide again while another running
        trial holds the same claim (:mod:`allocopt.study.claims`; at most 8 rounds)."""
        for _ in range(8):
            d = self._decide(study, trial)
            a = d.allocation
            claim = {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model,
                     FIDELITY_PARAM: d.fidelity, "key": d.pilot.key if d.pilot is not None else None}
            if not write_claim(study, trial.number, claim):
                return d  # a study without claims: one process
            if (d.proposal is not None and d.proposal.replicate) or \
                    not clashes(study.get_trials(deepcopy=False), trial.number, claim):
                return d
        return d

    def _decide(self, study: optuna.Study, trial: FrozenTrial) -> RaceDecision:
        trials = with_claims(study.get_trials(deepcopy=False), self.distributions)
        todo = self._unclaimed(trials, skip=trial.number)
        ahead = sum(1 for t in trials if t.number < trial.number and t.state == TrialState.RUNNING
                    and not params_of(t) and not t.system_attrs.get(CLAIM_ATTR))
        if ahead < len(todo):
            p = todo[ahead]
            return RaceDecision("pilot", p.allocation, "pilot", self.budget_of("pilot", p.allocation), pilot=p)
        props = self._propose(study, trials, q=1, skip=trial.number)
        if props:
            p = props[0]
            return RaceDecision("proposal", p.allocation, p.fidelity, p.budget_flops, proposal=p)
        params = {n: self._random.sample_independent(study, trial, n, dist)
                  for n, dist in self.distributions.items() if n != FIDELITY_PARAM}
        a = allocation_in(self.space, params)
        return RaceDecision("random", a, "full", self.budget_of("full", a))

    def _observations(self, study: optuna.Study, trials: list[FrozenTrial]) -> list[Observation]:
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        out = []
        for t in trials:
            if t.state != TrialState.COMPLETE or not t.values or TrialRecord.of(t).state != "COMPLETE":
                continue
            out.append(self._observation(t, sign * float(t.values[0])))
        return [o for o in out if math.isfinite(o.value)]

    def _observation(self, t: FrozenTrial, value: float) -> Observation:
        r = TrialRecord.of(t)
        asked = allocation_in(self.space, r.given_params)  # the budget was priced for it
        full = self.full_budget(asked)
        budget = r.budget(self.budget_of(r.fidelity, asked))
        m = r.metrics
        total = m.get("total_flops") or 0
        return Observation(number=t.number, allocation=allocation_in(self.space, observed_params(t)),
                           value=value, budget_flops=budget, budget_fraction=budget / full,
                           fidelity=r.fidelity,
                           reward_share=(m.get("reward_flops", 0) / total) if total else math.nan)

    def _surrogate(self, obs: list[Observation]) -> Any:
        """The surrogate on ``obs``: conditioned anew when they changed, its hyperparameters
        refitted only when the study has grown enough (:class:`~allocopt.race.fit.SurrogateCache`)."""
        key = tuple(sorted(o.number for o in obs))
        if self._fit is None or self._fit[0] != key:
            sur = self._cache(obs)
            self._fit = (key, sur)
            self.timings["fit_seconds"].append(sur.fit_seconds)
            self.recommendations.append((max(o.number for o in obs),
                                         recommend(sur, obs, self.space, self.settings)[0]))
        return self._fit[1]

    def _propose(self, study: optuna.Study, trials: list[FrozenTrial], *, q: int,
                 skip: int | None) -> list[Proposal]:
        obs = self._observations(study, trials)
        if len(obs) < 2:
            return []
        sur = self._surrogate(obs)
        t0 = time.perf_counter()
        pending = [t for t in trials if t.number != skip and params_of(t)
                   and t.state in (TrialState.RUNNING, TrialState.WAITING)
                   and fidelity_of(t) == "full"]
        if pending:  # constant liar (CL-min) at the fitted hyperparameters
            lie = min(o.value for o in obs)
            lies = [Observation(t.number, a, lie, self.budget_of("full", a), 1.0, "full", math.nan)
                    for t in pending for a in (allocation_in(self.space, params_of(t)),)]
            sur = fit_surrogate(obs + lies, self.space, seed=self.seed + len(obs) + len(lies),
                                init=sur.raw, fit=False)
        f = self.pilot_fraction
        allow = (self._extra_pilots(trials, skip) + 1) * f <= self.settings.extra_pilot_budget + 1e-12
        out = propose(obs, self._spec, self.workload, existing=runs_of(trials, self.space, skip), q=q,
                      pilot_fraction=f, allow_pilots=allow, settings=self.settings, surrogate=sur,
                      plans=self._plans, full_budget=self.full_budget)
        self.timings["proposal_seconds"].append(time.perf_counter() - t0)
        return out


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """``trial.suggest_*`` for one of the sampler's distributions."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high)
    return trial.suggest_categorical(name, list(dist.choices))


__all__ = ["FIDELITY_PARAM", "RaceDecision", "RaceSampler", "space_distributions"]
