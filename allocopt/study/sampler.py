"""RaceSampler: RACE as an Optuna sampler (pilot grid first, then surrogate proposals).

Any Optuna code can run RACE::

    sampler = RaceSampler(space, 1e19)                       # workload= checks feasibility
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial):
        d = sampler.suggest(trial)          # allocation, fidelity, budget_flops of this trial
        return train_and_score(d.allocation, d.budget_flops)

    study.optimize(objective, n_trials=70)

Each trial gets an allocation (``rho``, ``group_size``, ``reward``, ``model``: the dimensions
the space varies) and a **fidelity** parameter, ``pilot`` (a run at ``pilot_fraction ×
budget_flops``; under a time budget (a :class:`~allocopt.plan.budget.Budget` in GPU-hours),
``pilot_fraction ×`` the FLOPs that allocation executes in the hours: an iso-time grid) or ``full``. ``fidelity`` is an ordinary Optuna parameter
(``CategoricalDistribution(("pilot", "full"))``), so it is stored with the trial, seen by every
worker on the same storage and kept by a retry. :meth:`RaceSampler.suggest` suggests them all
and writes the user attributes ``fidelity``, ``budget_flops`` and ``race_pilot`` (a grid
point's key) or ``race_validation`` (a surrogate proposal).

The sampler is an adapter: it reads the study's trials through the one translator
(:mod:`allocopt.study.observe`) and hands plain observations and runs to its tuner
(:class:`allocopt.race.tuner.RaceTuner`), which holds the pilot grid, the surrogate and the
proposals. What a trial gets (:meth:`RaceSampler.sample_relative`):

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
says which way is better; :func:`allocopt.study.observe.observations`); trials whose user
attribute ``state`` is ``INFEASIBLE`` or ``FAIL`` (:mod:`allocopt.study.loop` records an
infeasible plan as a complete trial with a violated constraint) are not observations. One
objective only. :func:`race_sampler` is the one constructor of a study's sampler.

This module imports Optuna; torch is imported (through the surrogate) at the first proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from allocopt.flops import ConfigError
from allocopt.plan.allocation import Allocation, Workload
from allocopt.plan.budget import Budget
from allocopt.race.data import Budgets, Observation
from allocopt.race.design import FIDELITIES, PilotPoint, RaceSettings, check_pilot_fraction, pilot_grid
from allocopt.race.propose import PlanCache, Proposal
from allocopt.race.tuner import RaceTuner, Tuner
from allocopt.record import TrialRecord, decision_attrs, params_of, write_missing
from allocopt.spec import SearchSpace, StudySpec, allocation_in
from allocopt.study import observe
from allocopt.store.claims import CLAIM_ATTR, clashes, with_claims, write_claim

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


class RaceSampler(optuna.samplers.BaseSampler):
    """RACE as an Optuna sampler (module docstring): an adapter from the study's trials to its
    :class:`~allocopt.race.tuner.RaceTuner`.

    Args:
        space: the search space (:class:`allocopt.spec.SearchSpace`); its ρ range must be a range.
        budget: the full budget of a run: a :class:`~allocopt.plan.budget.Budget` or FLOPs.
            Under a time budget (GPU-hours at a throughput profile) each allocation's full
            budget is the FLOPs it executes in those hours (:meth:`full_budget`), a pilot's is
            ``pilot_fraction`` of its own, and observations, proposals and the recommendation
            put every run at its share of its own allocation's budget (full runs at 1, pilots
            at ``pilot_fraction``), so allocations are compared under the same rule; it needs
            ``workload``, and ``budget.flops`` is only the ceiling.
        pilot_fraction: pilots run at this fraction of the full budget, in (0, 1).
        workload: what plans are made for; given, proposals are feasible plans within their
            budget (:func:`allocopt.plan.allocation.make_plan`); ``None``: feasibility unchecked.
        settings: :class:`allocopt.race.RaceSettings` (grid size, repeats, thresholds,
            extra-pilot budget, proposal grid).
        seed: seed of the pilot design, the surrogate and the random fallback.
        target_key: the target key of the objective (``pass_at_1``): a trial's metric
            ``<target_key>_variance`` is its evaluation's variance
            (:data:`allocopt.study.observe.VARIANCE_SUFFIX`); ``None``: not read.
        tuner: the algorithm the sampler asks (:class:`allocopt.race.tuner.Tuner`: pilot
            design, proposals, answer over plain data); default a
            :class:`~allocopt.race.tuner.RaceTuner` of ``space``, the budgets, ``settings`` and
            ``seed``, its proposals checked for feasibility on ``workload``; a function
            ``tuner(budgets, feasible)`` is called with the sampler's budgets
            (:class:`~allocopt.race.data.Budgets`) and feasibility test (``None`` without a
            workload) to make one.
        targets: a study of several targets: each target's key and sign (+1 maximized, -1
            minimized), in the study's order; each proposal is then made on a fresh random
            weighting of them (:mod:`allocopt.tuner.scalarize`, weights drawn from ``seed``
            and the trial's number), and there is no one answer (:meth:`answer`: ``(None,
            None)``; the study's answer is its Pareto front). Empty: one target.

    Attributes:
        tuner: the :class:`~allocopt.race.tuner.RaceTuner` (pilot grid, surrogate, proposals).
        decisions: this sampler's :class:`RaceDecision` by trial number.

    Raises:
        ConfigError: bad budget, pilot fraction, settings or a space without a ρ range; a
            time budget without a workload.
    """

    def __init__(self, space: SearchSpace, budget: Budget | float, *, pilot_fraction: float = 0.1,
                 workload: Workload | None = None, settings: RaceSettings | None = None,
                 seed: int = 0, target_key: str | None = None,
                 tuner: Tuner | Callable[[Budgets, Any], Tuner] | None = None,
                 targets: tuple[tuple[str, float], ...] = ()) -> None:
        self.space, self.target_key = space, target_key
        self.targets = tuple(targets) if len(targets) > 1 else ()
        self.budget = budget if isinstance(budget, Budget) else Budget(budget)
        self.pilot_fraction = check_pilot_fraction(pilot_fraction)
        self.settings = settings or RaceSettings()
        self.seed = seed
        self.workload = workload
        if self.budget.time is not None and workload is None:
            raise ConfigError("time_budget: RACE under a time budget needs the workload (each "
                              "allocation's FLOPs come from its plan's phase shares)")
        self.budgets = observe.budgets_of(self.budget, self.pilot_fraction, workload)
        self._plans = PlanCache(workload) if workload is not None else None
        feasible = self._plans.feasible(self.budgets) if self._plans else None
        if tuner is None:
            tuner = RaceTuner(space, self.budgets, self.settings, seed, feasible=feasible,
                              design=_design(space, self.settings, seed, workload, self.budgets))
        elif not isinstance(tuner, Tuner):  # a factory of the budgets and feasibility test
            tuner = tuner(self.budgets, feasible)
        self.tuner: Tuner = tuner
        self.distributions = space_distributions(space, fidelity=True)
        self._random = optuna.samplers.RandomSampler(seed=self.seed)
        self.decisions: dict[int, RaceDecision] = {}

    @property
    def budget_flops(self) -> float:
        """FLOPs of a full run (a time budget: the ceiling)."""
        return self.budget.flops

    @property
    def design(self) -> list[PilotPoint]:
        """The tuner's pilot grid."""
        return self.tuner.design

    @property
    def timings(self) -> dict[str, list[float]]:
        """``fit_seconds`` per surrogate fit, ``proposal_seconds`` per proposal (the tuner's)."""
        return self.tuner.timings

    @property
    def recommendations(self) -> list[tuple[int, Allocation]]:
        """``(last trial number seen, allocation)`` after each fit: RACE's answer had the study
        stopped there (the tuner's)."""
        return self.tuner.recommendations

    # ------------------------------------------------------------------ Optuna's sampler API
    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        if len(study.directions) != max(1, len(self.targets)):
            made = f"{len(self.targets)} targets" if self.targets else "one objective only"
            raise ValueError(f"RaceSampler: {made} (this study has {len(study.directions)}); give the "
                             "sampler the study's targets (targets=) or use a multi-objective sampler")
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
        """FLOPs of a full-budget run of ``allocation``: the FLOP budget; under a time budget the
        FLOPs it executes in the hours (:meth:`allocopt.plan.budget.Budget.for_allocation`;
        ``allocation=None``: the ceiling). Raises :class:`ConfigError` (a profile of another
        set-up)."""
        if allocation is None:
            return self.budget.flops
        return self.budgets.full_flops(allocation)

    def budget_of(self, fidelity: str, allocation: Allocation | None = None) -> float:
        """FLOPs of a run of ``allocation`` at ``fidelity`` (``pilot`` or ``full``):
        ``pilot_fraction`` (pilots) or 1 × :meth:`full_budget`."""
        if fidelity not in FIDELITIES:
            raise ValueError(f"fidelity={fidelity!r}: allowed: {', '.join(FIDELITIES)}")
        return self.full_budget(allocation) * self.budgets.fraction(fidelity)

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
        trials = with_claims(study.get_trials(deepcopy=False), self.distributions)
        return self.tuner.unclaimed(observe.runs(trials, self.space))

    def pilots_left(self, study: optuna.Study) -> int:
        """How many grid points no trial of ``study`` has claimed yet."""
        return len(self.pilots_to_run(study))

    def proposals(self, study: optuna.Study, q: int) -> list[Proposal]:
        """Up to ``q`` proposals from the study's complete trials, pending ones conditioned on,
        without asking any trial (``allocopt race --propose-only``), each with its plan."""
        trials = with_claims(study.get_trials(deepcopy=False), self.distributions)
        return self._propose(study, trials, q=q, skip=None)

    def surrogate(self, study: optuna.Study) -> tuple[Any, list[Observation]]:
        """The surrogate fitted on the study's complete trials (cached while they do not change)
        and those observations; ``(None, obs)`` with fewer than two."""
        obs = self.observations(study)
        return (self.tuner.surrogate(obs) if len(obs) >= 2 else None), obs  # RaceTuner's

    def observations(self, study: optuna.Study, trials: list[FrozenTrial] | None = None, *,
                     number: int = 0) -> list[Observation]:
        """Complete, feasible trials of ``study`` (or ``trials`` of it) as the tuner sees them
        (:func:`allocopt.study.observe.observations`; value: the study's objective, higher is
        better; several :attr:`targets`: their scalarization with the weights of trial
        ``number``)."""
        trials = study.get_trials(deepcopy=False) if trials is None else trials
        if self.targets:
            from allocopt.tuner.scalarize import scalarized, weights

            per = [observe.observations(trials, self.space, self.budgets, key=k) for k, _ in self.targets]
            return scalarized(per, [s for _, s in self.targets], weights(len(self.targets), self.seed, number))
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        return observe.observations(trials, self.space, self.budgets, sign=sign, objective_key=self.target_key)

    def answer(self, study: optuna.Study) -> tuple[Any, Any]:
        """The study's one answer from its trials alone: ``(recommendation, surrogate)``
        (:meth:`allocopt.race.tuner.RaceTuner.answer`), or ``(None, None)`` before two trials,
        one of them at the full budget, and in a study of several targets (its answer is the
        Pareto front of its trials)."""
        if self.targets:
            return None, None
        return self.tuner.answer(self.observations(study))

    # ------------------------------------------------------------------ internals
    def _claimed_decision(self, study: optuna.Study, trial: FrozenTrial) -> RaceDecision:
        """Decide, claim the decision in one write, and decide again while another running
        trial holds the same claim (:mod:`allocopt.store.claims`; at most 8 rounds)."""
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
        todo = self.tuner.unclaimed(observe.runs(trials, self.space, skip=trial.number))
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

    def _propose(self, study: optuna.Study, trials: list[FrozenTrial], *, q: int,
                 skip: int | None) -> list[Proposal]:
        """The tuner's proposals from ``trials`` (trial ``skip``, being sampled, left out of the
        runs), each with its plan."""
        obs = self.observations(study, trials, number=len(trials) if skip is None else skip)
        props = self.tuner.propose(obs, observe.runs(trials, self.space, skip), q=q)
        return [p.with_plan(self._plans) for p in props]


def _design(space: SearchSpace, settings: RaceSettings, seed: int, workload: Workload | None,
            budgets: Budgets) -> list[PilotPoint]:
    """The pilot grid; given a workload (and ``settings.fit_pilots``), every pilot moved to a
    usable ρ where it can be (:func:`allocopt.race.pilot_plans.fit_pilots`)."""
    design = pilot_grid(space, settings, seed)
    if workload is not None and settings.fit_pilots:
        from allocopt.race.pilot_plans import fit_pilots

        design = fit_pilots(design, space.rho, lambda a: budgets.flops(a, budgets.pilot_fraction), workload)
    return design


def race_sampler(spec: StudySpec, workload: Workload | None = None, settings: RaceSettings | None = None,
                 pilot_fraction: float | None = None) -> RaceSampler:
    """The one constructor of a study's :class:`RaceSampler`: its space, budget (parsed once:
    :attr:`allocopt.spec.StudySpec.budget`), pilot fraction (``pilot_fraction``, default
    ``spec.pilot_fraction``) and seed; ``settings`` default the study's
    (:func:`allocopt.race.design.settings_for`: its ``[race]`` table, ``max_pilots = spec.pilots``).

    Raises:
        ConfigError: bad settings or pilot count for the space, a time budget without a workload.
    """
    from allocopt.race.design import settings_for

    return RaceSampler(spec.space, spec.budget,
                       pilot_fraction=spec.pilot_fraction if pilot_fraction is None else pilot_fraction,
                       workload=workload, settings=settings or settings_for(spec), seed=spec.seed,
                       target_key=spec.target_key)


def kg_max_pilots(spec: StudySpec) -> int:
    """The most pilots a kg study may run: ``spec.pilots``, none when not given (pilots were
    chosen off leave-one-world-out: on both measured tiny worlds the kg tuner without them had
    the lower regret)."""
    return spec.pilots or 0


def kg_initial_design(spec: StudySpec) -> bool:
    """Whether a kg study's first full runs are the tuner's initial design
    (:func:`allocopt.tuner.study.initial_design`): ``spec.initial_design`` when given, else the
    measured default for one target or several."""
    from allocopt.tuner.study import INITIAL_DESIGN, INITIAL_DESIGN_SEVERAL_TARGETS

    if spec.initial_design is not None:
        return spec.initial_design
    return INITIAL_DESIGN_SEVERAL_TARGETS if spec.multi_objective else INITIAL_DESIGN


def kg_sampler(spec: StudySpec, workload: Workload | None = None) -> RaceSampler:
    """A study's :class:`RaceSampler` asking the knowledge-gradient tuner
    (:class:`allocopt.tuner.study.KGTuner`): pilots at ``spec.pilot_fraction``, at most
    :func:`kg_max_pilots` of them (0: none); runs checked for feasibility on ``workload`` when
    given; its initial design as :func:`kg_initial_design` says, laid out as
    :func:`allocopt.tuner.study.initial_layout` has it for one target or several. A study of
    several targets: full runs only, each proposal on a fresh random weighting of the targets
    (:mod:`allocopt.tuner.scalarize`).

    Raises:
        ConfigError: as :func:`race_sampler`.
    """
    from allocopt.tuner.study import KGTuner, initial_layout

    pilots = 0 if spec.multi_objective else kg_max_pilots(spec)
    initial, layout = kg_initial_design(spec), initial_layout(spec.multi_objective)

    def tuner(budgets: Budgets, feasible: Any) -> KGTuner:
        return KGTuner(spec.space, budgets, max_pilots=pilots, seed=spec.seed, feasible=feasible,
                       initial=initial, layout=layout)

    targets = tuple((k, spec.vocabulary.target(t).sign) for k, t in zip(spec.target_keys, spec.targets))
    return RaceSampler(spec.space, spec.budget, pilot_fraction=spec.pilot_fraction, workload=workload,
                       seed=spec.seed, target_key=spec.target_key, tuner=tuner, targets=targets)


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """``trial.suggest_*`` for one of the sampler's distributions."""
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high)
    return trial.suggest_categorical(name, list(dist.choices))


__all__ = ["FIDELITY_PARAM", "RaceDecision", "RaceSampler", "kg_max_pilots", "kg_sampler", "race_sampler", "space_distributions"]
