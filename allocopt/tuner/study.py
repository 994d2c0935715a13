"""The tuner behind a study's sampler: :class:`KGTuner`, the sampler's tuner protocol
(:class:`allocopt.race.tuner.Tuner`) over :class:`~allocopt.tuner.decide.Tuner`.

The sampler hands it the study's runs as plain data (:mod:`allocopt.race.data`); it answers
with the runs to start (each a full run or a pilot, the one whose knowledge gradient per FLOP
is largest, other workers' pending runs conditioned on, after a short initial design of one
full run per reward system, :data:`INITIAL_DESIGN`) and with the answer: the posterior-mean
maximizer at the full budget, its credible interval, the posterior probability that its reward
system (and model) holds the best allocation, the allocations within noise of it, and the value
of one more full run. No fixed pilot grid (:attr:`KGTuner.design` is empty): a pilot is run
only when its value per FLOP beats a full run's.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from allocopt.plan.allocation import Allocation
from allocopt.race.data import Budgets, Feasible, Observation, Run
from allocopt.tuner.decide import (ACQUISITION, ANSWER_AMONG, ANSWER_CAUTION, KG_POOL, Answer, Observed, Tuner,
                                   TunerSpace)
from allocopt.tuner.decide import Run as TunerRun
from allocopt.tuner.model import HyperGrid, joint_draws

SAMPLES = 512
"""Joint posterior draws behind the answer's probability of being best (per mixture weight)."""
LEVEL = 0.9
"""The answer's credible level."""


def one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs on one thread: the tuner's matrices (a few hundred
    rows) gain nothing from more, and on a machine whose cores are busy (a study's trials, other
    workers) threads that wait on each other cost up to 9x the CPU time of one (a 200-run
    proposal: 1.16 s against 0.13 s on 2 loaded cores). Without ``threadpoolctl``: as it is."""
    import contextlib

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _z(level: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


INITIAL_DESIGN = True
"""Whether a one-target study's first full runs are :func:`initial_design` (one per reward
system, laid out as :data:`INITIAL_LAYOUT`) before the knowledge gradient places the rest.
``True`` since 2026-12-07, with the wide middle layout: a test fixed before its data on a
seventh world (``tiny`` at 2e11 FLOPs; ``benchmarks/tuner_results/seventh_world``) asked it
against no design, the default from 2026-12-06 (chosen then on a sixth world, ``small`` at
1.5e11, against the middle layout), and it passed all three conditions: mean regret at 8-16
runs 7.68 -> 5.66 % (154 pairs lower, 80 higher, Wilcoxon p = 1.7e-7), lower under each truth
(held-out seed 9.00 -> 8.12, seed-mean 6.36 -> 3.20), and at 24-40 runs 5.86 -> 4.56. Over all
seven measured worlds it is lower at 4 runs (24.63 -> 20.90, p = 8.2e-12) and at 8-16 runs
lower more often but higher in mean (17.09 -> 17.51, 1012 pairs lower, 806 higher, p = 0.034).
No design, the leave-one-world-out choice at 8-16 runs, was then asked on an eighth world
(``medium`` at 1e11) under the same rule fixed before its data and failed it: lower at 8-16 runs
(15.39 -> 11.51, p = 0.00017) but only under the held-out truth (seed-mean 11.90 -> 12.66), and
far higher at 4 runs (16.83 -> 23.61)."""
INITIAL_LAYOUT = "wide-middle"
"""Where a one-target study's initial design places ρ and G (:data:`INITIAL_LAYOUTS`)."""
INITIAL_DESIGN_SEVERAL_TARGETS = True
"""The same for a study of two or more targets (each run on a fresh random weighting of them):
``True``, laid out as :data:`INITIAL_LAYOUT_SEVERAL_TARGETS`. On the Pareto replay of the three
first measured worlds (``benchmarks/pareto_replay.py``, 50 replications a world,
``kg-no-design``) the median hypervolume regret without the design is higher at 4-12 runs on
every world (tiny at 4 / 8 runs: 35.8 / 24.1 % against 13.9 / 7.9 with it)."""
INITIAL_LAYOUT_SEVERAL_TARGETS = "middle"
"""Where a study of several targets places its initial design: the middle layout its Pareto
replay measured (the wide middle one was asked of one target only)."""


def initial_layout(several_targets: bool) -> str:
    """The initial design's layout a study of one target, or of several, has by default."""
    return INITIAL_LAYOUT_SEVERAL_TARGETS if several_targets else INITIAL_LAYOUT


LAYOUT_WORDS: dict[str, str] = {
    "middle": "alternately at the two middle levels of rho, at the middle G",
    "g-in-turn": "at the middle of rho, the group sizes in turn",
    "spread-rho": "spread over rho, the group sizes in turn",
    "spread-rho-middle-g": "spread over rho, at the middle G",
    "wide-middle": "alternately near a third and two thirds of rho's range, at the middle G",
    "kg-placed": "each in a reward system not yet run, where the knowledge gradient puts it",
}
"""Each layout in a user's words (a dry run's tuner line)."""


INITIAL_LAYOUTS: tuple[str, ...] = tuple(LAYOUT_WORDS)
"""Where :func:`initial_design` places its runs in ρ and G: ``middle`` (the design shipped until
2026-12-06, a study of several targets' since): the two middle ρ levels alternately, every run
at the middle group size (the two middles of an even count, in turn); ``g-in-turn`` (shipped
before 2026-12-06, kept for the ablations replayed with it): the same ρ, the group sizes in
turn; ``spread-rho``: ρ spread one level per stratum of the levels, the group sizes in turn;
``spread-rho-middle-g``: ρ so spread, every run at the middle group size;
``wide-middle`` (a one-target study's since 2026-12-07, :data:`INITIAL_LAYOUT`): the levels
nearest a third and two thirds of the levels alternately (near the middle, where the categories
are compared, yet far enough apart that the runs tell the slope in ρ), every run at the middle
group size; ``kg-placed``: no fixed places: while a reward system (or model) has no full run,
the next run is the knowledge gradient's best among the cells of those not yet run, so each
design run's ρ and G follow what the runs before it showed (:meth:`KGTuner.propose`)."""


def _thirds(values: Sequence[Any]) -> tuple[Any, Any]:
    k = len(values) - 1
    return values[round(k / 3)], values[round(2 * k / 3)]


def _middles(values: Sequence[Any]) -> tuple[Any, Any]:
    return values[(len(values) - 1) // 2], values[len(values) // 2]


def initial_design(space: TunerSpace, seed: int, layout: str = INITIAL_LAYOUT) -> list[Allocation]:
    """The first full runs of a design made before the model has anything to go on (a study's
    default, :data:`INITIAL_DESIGN`, unless :attr:`allocopt.spec.StudySpec.initial_design` turns
    it off): one per reward system (and every model at least once: ``max(rewards, models)``
    runs), each category paired with a model in turn, at two ρ levels near the middle
    alternately and the middle group size: the response peaks inside the range in ρ and in G, so
    the runs that compare the categories are made where each is near its best; the order of the
    categories shuffled by ``seed``. ``layout`` (:data:`INITIAL_LAYOUTS`) says which two ρ levels
    (by default :data:`INITIAL_LAYOUT`'s, a third and two thirds of the way), or places ρ and G
    otherwise, for the ablations.

    The middle group size was chosen against the group sizes in turn leave-one-world-out on the
    measured worlds (``benchmarks/tuner_ablation.py --design``: chosen on each pair of worlds,
    it is lower on the third in each fold)."""
    import random

    if layout not in INITIAL_LAYOUTS:
        raise ValueError(f"layout={layout!r}: allowed: {', '.join(INITIAL_LAYOUTS)}")
    if layout == "kg-placed":  # placed run by run (KGTuner.propose), nothing fixed in advance
        return []
    rng = random.Random(seed)
    rewards, models, gs = list(space.rewards), list(space.models), list(space.group_sizes)
    rng.shuffle(rewards), rng.shuffle(models), rng.shuffle(gs)
    lv = space.levels
    n = max(len(rewards), len(models))
    if layout.startswith("spread-rho"):  # run i at a level drawn from the i-th of n equal strata of the levels
        rhos = [lv[min(len(lv) - 1, int((i + rng.random()) * len(lv) / n))] for i in range(n)]
        rng.shuffle(rhos)
    else:
        mids = _thirds(lv) if layout == "wide-middle" else _middles(lv)
        rhos = [mids[i % 2] for i in range(n)]
    if layout in ("middle", "spread-rho-middle-g", "wide-middle"):
        gs = list(dict.fromkeys(_middles(sorted(space.group_sizes))))
    return [Allocation(rhos[i], gs[i % len(gs)], rewards[i % len(rewards)], models[i % len(models)])
            for i in range(n)]


class KGTuner:
    """allocopt's knowledge-gradient tuner in the protocol a study's sampler asks (module
    docstring).

    Args:
        space: the study's search space (:class:`allocopt.spec.SearchSpace`), ρ a range.
        budgets: FLOPs per fidelity (its ``pilot_fraction`` is the one pilot fraction offered).
        max_pilots: the most pilots the study may run (0: none, full runs only; ``None``: no
            limit but their value per FLOP).
        seed: seed of the answer's posterior draws.
        feasible: ``feasible(allocation, fraction)``; ``None``: every run is feasible.
        grid: the model's hyperparameter grid.
        rho_levels: ρ levels of the candidate set.
        among: where the answer is chosen (:data:`allocopt.tuner.decide.ANSWER_AMONG`).
        initial: whether the first runs are :func:`initial_design` (:data:`INITIAL_DESIGN`);
            ``False``: the knowledge gradient places every run, from the prior on.
        layout: where the initial design places ρ and G (:data:`INITIAL_LAYOUTS`; a study of
            several targets: :data:`INITIAL_LAYOUT_SEVERAL_TARGETS`).
        refine: whether the candidates zoom in between the grid's ρ levels
            (:attr:`allocopt.tuner.decide.Tuner.refine`).
        kg_pool: what the knowledge gradient is the rise of (:data:`allocopt.tuner.decide.KG_POOL`).
        caution: posterior standard deviations the answer takes off each cell's mean
            (:data:`allocopt.tuner.decide.ANSWER_CAUTION`).
        acquisition: how the runs after the initial design are picked
            (:data:`allocopt.tuner.decide.ACQUISITION`).
    """

    def __init__(self, space: Any, budgets: Budgets, *, max_pilots: int | None = None, seed: int = 0,
                 feasible: Feasible | None = None, grid: HyperGrid | None = None,
                 rho_levels: int = 8, among: str = ANSWER_AMONG, initial: bool = INITIAL_DESIGN,
                 layout: str = INITIAL_LAYOUT, refine: bool = False, kg_pool: str = KG_POOL,
                 caution: float = ANSWER_CAUTION, acquisition: str = ACQUISITION) -> None:
        lo, hi = space.rho
        self.budgets, self.seed = budgets, seed
        self.max_pilots = max_pilots
        full = TunerSpace((lo, hi), tuple(space.group_sizes), tuple(space.rewards),
                          tuple(space.models) or (None,), rho_levels=rho_levels)
        self.space = replace(full, pilot_fractions=(budgets.pilot_fraction,)) if max_pilots != 0 else full
        self.tuner = Tuner(self.space, grid or HyperGrid(), feasible, among, caution, kg_pool, refine,
                           acquisition)
        self._full_only = replace(self.tuner, space=full)
        self.initial = [a for a in initial_design(full, seed, layout) if feasible is None or feasible(a, 1.0)] \
            if initial else []
        self.cover = initial and layout == "kg-placed"
        self.design: list = []
        self.timings: dict[str, list[float]] = {"fit_seconds": [], "proposal_seconds": []}
        self.recommendations: list[tuple[int, Allocation]] = []

    def unclaimed(self, runs: Sequence[Run]) -> list:
        """Nothing: there is no fixed design."""
        return []

    @staticmethod
    def observed(obs: Sequence[Observation]) -> list[Observed]:
        return [Observed(o.allocation, o.budget_fraction, o.value, o.variance) for o in obs]

    def propose(self, obs: Sequence[Observation], runs: Sequence[Run], q: int = 1) -> list:
        """Up to ``q`` runs to start, each conditioned on the pending runs and on those proposed
        before it in this call; ``[]`` when nothing feasible is left."""
        with one_blas_thread():
            return self._propose(obs, runs, q)

    def _propose(self, obs: Sequence[Observation], runs: Sequence[Run], q: int) -> list:
        from allocopt.race.propose import Proposal

        t0 = time.perf_counter()
        observed = self.observed(obs)
        pending = [TunerRun(r.allocation, self.budgets.fraction(r.fidelity)) for r in runs if r.pending]
        pilots = sum(1 for r in runs if r.fidelity == "pilot")
        started = [r.allocation for r in runs if r.fidelity == "full"]
        # feasibility can turn out at run time (the first iteration did not fit): a design
        # point found infeasible since is skipped, not proposed again
        design = [a for a in self.initial if a not in started and self.tuner.allows(a, 1.0)]
        out = []
        for _ in range(q):
            capped = self.max_pilots is not None and pilots >= self.max_pilots
            uncovered = self._uncovered(started + [p.allocation for p in pending if p.fraction >= 1.0]) \
                if self.cover else None
            if design:
                run = TunerRun(design.pop(0), 1.0)
            else:
                seed = (self.seed, len(observed), len(pending))
                try:
                    run = self._placed(observed, pending, uncovered, seed) if uncovered else \
                        (self._full_only if capped else self.tuner).next_run(observed, pending=pending, seed=seed)
                except ValueError:
                    break
            pending.append(run)
            fidelity = "full" if run.fraction >= 1.0 else "pilot"
            pilots += fidelity == "pilot"
            a = run.allocation
            flops = self.budgets.flops(a, run.fraction) if self.budgets.priced else math.nan
            out.append(Proposal(a, fidelity, flops, None, run.score, run.fraction, math.nan, math.nan,
                                replicate=any(o.allocation == a and o.fraction == run.fraction for o in observed)))
        self.timings["proposal_seconds"].append(time.perf_counter() - t0)
        return out

    def _uncovered(self, started: Sequence[Allocation]) -> Callable[[Allocation], bool] | None:
        """With the ``kg-placed`` design: which cells a design run may take while some reward
        system (or model) has no full run started, ``None`` once every one has."""
        rewards = set(self.space.rewards) - {a.reward for a in started}
        models = set(self.space.models) - {a.model for a in started}
        if not rewards and not models:
            return None
        return lambda a: (not rewards or a.reward in rewards) and (not models or a.model in models)

    def _placed(self, observed: Sequence[Observed], pending: list[TunerRun],
                only: Callable[[Allocation], bool], seed: tuple[int, ...]) -> TunerRun:
        """The ``kg-placed`` design's next full run: the knowledge gradient's best among the
        cells ``only`` admits, or among every cell when none of those is feasible."""
        try:
            return self._full_only.next_run(observed, pending=pending, seed=seed, only=only)
        except ValueError:
            return self._full_only.next_run(observed, pending=pending, seed=seed)

    def answer(self, obs: Sequence[Observation]) -> tuple[Any, Answer | None]:
        """``(recommendation, answer)``: a :class:`allocopt.race.recommend.Recommendation` and
        the tuner's :class:`~allocopt.tuner.decide.Answer` (with the value of one more run), or
        ``(None, None)`` before the first full-budget run."""
        if not any(o.fidelity == "full" for o in obs):
            return None, None
        with one_blas_thread():
            return self._answer(obs)

    def _answer(self, obs: Sequence[Observation]) -> tuple[Any, Answer | None]:
        from allocopt.race.recommend import Recommendation

        t0 = time.perf_counter()
        observed = self.observed(obs)
        ans = self.tuner.answer(observed)
        cells = self._cell_prob_best(observed)
        key = (ans.allocation.reward, ans.allocation.model)
        z = _z(LEVEL)
        noise = [o.variance for o in obs if math.isfinite(o.variance)]
        noise_sd = math.sqrt(float(np.median(noise))) if noise else math.nan
        rec = Recommendation(ans.allocation, ans.mean, (ans.mean - z * ans.sd, ans.mean + z * ans.sd),
                             min(1.0, max(0.0, cells.get(key, 0.0))), (ans.allocation,) + ans.near,
                             noise_sd,
                             tuple((r, m, p) for (r, m), p in sorted(cells.items(), key=lambda kv: -kv[1])),
                             sum(1 for o in obs if o.fidelity == "full"), LEVEL,
                             ans.gain_of_one_more_run, ans.best_next, self._untried(obs))
        self.timings["fit_seconds"].append(time.perf_counter() - t0)
        if obs:
            self.recommendations.append((max(o.number for o in obs), ans.allocation))
        return rec, ans

    def _untried(self, obs: Sequence[Any]) -> tuple[str, ...]:
        """The space's reward systems (× models) with no full-budget run among ``obs``."""
        tried = {(o.allocation.reward, o.allocation.model) for o in obs if o.fidelity == "full"}
        models = self.space.models or (None,)
        return tuple(w if m is None else f"{w}/{m}" for m in models for w in self.space.rewards
                     if (w, m) not in tried)

    def _cell_prob_best(self, observed: Sequence[Observed]) -> dict[tuple[str, str | None], float]:
        """Posterior probability that each reward system (× model) holds the best full-budget
        allocation: the share of joint posterior draws (the mixture's components in proportion
        to their weights) whose maximizer lies in it."""
        targets = self.tuner.targets(observed)
        post = self.tuner.posterior(observed, targets)
        per_component = [max(1, int(round(w * SAMPLES))) for w in post.weights]
        draws = joint_draws(post.means, post.covs, per_component, np.random.default_rng(self.seed))
        counts: dict[tuple[str, str | None], float] = {}
        for i in np.argmax(draws, axis=1):
            k = (targets[i].reward, targets[i].model)
            counts[k] = counts.get(k, 0.0) + 1.0
        total = sum(counts.values()) or 1.0
        return {k: v / total for k, v in counts.items()}


__all__ = ["KGTuner"]
