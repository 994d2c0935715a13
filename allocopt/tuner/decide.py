"""What to run next, and the answer: decisions over plain observations (no study, no Optuna).

:func:`next_run` picks the run (an allocation and a budget fraction: a pilot or a full run, a
new cell or a replicate) whose knowledge gradient per unit of cost is largest
(:func:`allocopt.tuner.kg.kg_per_cost`): its expected rise of the full-budget answer's value per
full-budget run of compute. A pilot is run only when the runs so far say pilots predict the full
budget well enough to be worth their FLOPs (the model's pilot-to-full correlation is learned,
:mod:`allocopt.tuner.model`). :func:`answer` is the posterior-mean maximizer at the full budget
(among the cells with a full run, :data:`ANSWER_AMONG`),
the allocations within noise of it, and the value of one more full run (the largest one-run
knowledge gradient), which a study's stop rule compares with its cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from allocopt.plan.allocation import Allocation
from allocopt.tuner.kg import Pool, kg_per_cost
from allocopt.tuner.model import Data, HyperGrid, Points, Posterior, posterior
from allocopt.tuner.toptwo import top_two

Feasible = Callable[[Allocation, float], bool]


@dataclass(frozen=True)
class TunerSpace:
    """The finite candidate set: ρ levels × group sizes × reward systems × models, at the full
    budget and at each pilot fraction."""

    rho: tuple[float, float]
    group_sizes: tuple[int, ...]
    rewards: tuple[str, ...]
    models: tuple[str | None, ...] = (None,)
    pilot_fractions: tuple[float, ...] = ()
    """Budget fractions a pilot may run at (each in (0, 1)); empty: full runs only."""
    rho_levels: int = 8
    """Evenly spaced ρ levels over ``rho`` (ends included) a run may be placed at (8: kept
    leave-one-world-out against 15, ``benchmarks/tuner_ablation.py --design``)."""

    def __post_init__(self) -> None:
        lo, hi = self.rho
        if not 0 < lo <= hi < 1:
            raise ValueError(f"rho={self.rho!r}: must be [low, high] with 0 < low <= high < 1")
        if not isinstance(self.rho_levels, int) or not 2 <= self.rho_levels <= 101:
            raise ValueError(f"rho_levels={self.rho_levels!r}: must be an integer from 2 to 101")
        if not self.group_sizes or not self.rewards or not self.models:
            raise ValueError("group_sizes, rewards and models must each name at least one value")
        if any(not 0 < f < 1 for f in self.pilot_fractions):
            raise ValueError(f"pilot_fractions={self.pilot_fractions!r}: each must be in (0, 1)")

    @property
    def levels(self) -> tuple[float, ...]:
        lo, hi = self.rho
        if hi == lo:
            return (lo,)
        return tuple(round(lo + (hi - lo) * i / (self.rho_levels - 1), 6) for i in range(self.rho_levels))

    def cells(self) -> list[Allocation]:
        return [Allocation(r, g, w, m) for m in self.models for w in self.rewards
                for g in self.group_sizes for r in self.levels]

    @property
    def fractions(self) -> tuple[float, ...]:
        """Budget fractions, the full budget first."""
        return (1.0,) + tuple(sorted(set(self.pilot_fractions), reverse=True))

    def points(self, allocations: Sequence[Allocation], fractions: Sequence[float]) -> Points:
        lo, hi = self.rho
        span = (hi - lo) or 1.0
        frac_index = {f: i for i, f in enumerate(self.fractions)}

        def code(values: Sequence, allowed: Sequence) -> np.ndarray:
            index = {v: i for i, v in enumerate(allowed)}
            return np.asarray([index.get(v, len(allowed)) for v in values], dtype=int)

        fid = [frac_index.get(f, _nearest_fraction(f, self.fractions)) for f in fractions]
        return Points(code([a.model for a in allocations], self.models),
                      code([a.reward for a in allocations], self.rewards),
                      code([a.group_size for a in allocations], self.group_sizes),
                      (np.asarray([a.rho for a in allocations], dtype=float) - lo) / span,
                      np.asarray(fid, dtype=int))


def _nearest_fraction(f: float, fractions: Sequence[float]) -> int:
    return int(np.argmin([abs(math.log(f / g)) for g in fractions]))


@dataclass(frozen=True)
class Observed:
    """One finished run as the tuner reads it."""

    allocation: Allocation
    fraction: float
    """Its budget over the full budget (1: a full run)."""
    value: float
    """The target, oriented so that larger is better."""
    eval_var: float = math.nan
    """The known variance of its evaluation (``p(1 - p) / n_eval``); NaN: unknown."""


@dataclass(frozen=True)
class Run:
    """A run to start: an allocation at a budget fraction."""

    allocation: Allocation
    fraction: float
    score: float = 0.0
    """Its knowledge gradient per full-budget run of cost (target units)."""


@dataclass(frozen=True)
class Answer:
    """The full-budget answer from the runs so far."""

    allocation: Allocation
    mean: float
    """Predicted full-budget value (target units, larger is better)."""
    sd: float
    near: tuple[Allocation, ...]
    """Allocations whose predicted value is within one standard deviation of the difference."""
    gain_of_one_more_run: float
    """Expected rise of the answer's true value from the best next full run (target units)."""
    best_next: Allocation | None = None


CONTENDER_SDS = 3.0
"""A target cell counts in the knowledge gradient while its mean is within this many posterior
standard deviations of the best mean (the others cannot become the answer in one run)."""


ANSWER_AMONG = "tried"
"""Where the answer is chosen: ``all`` feasible full-budget cells, or only the ``tried`` ones
(cells with a full run; every cell until there is one): the posterior mean's maximum among
allocations the study has run, not one the model only extrapolates to. ``tried``: chosen
leave-one-world-out on the three measured worlds (each fold chose it; over 900 paired
replications at 8-16 runs its regret was lower in 188, higher in 119, Wilcoxon p = 0.008;
``benchmarks/tuner_ablation.py --answer-rules``)."""
AMONG = ("all", "tried")
ANSWER_CAUTION = 0.0
"""How many posterior standard deviations the answer's criterion takes off each cell's mean
(0: the posterior-mean maximizer; larger: a cell the runs have pinned down is preferred to one
the model only extrapolates to). 0: kept leave-one-world-out (``benchmarks/tuner_ablation.py
--design``, ``answer-caution-0.5`` and ``-1``)."""


KG_POOL = "all"
"""What the knowledge gradient values a run by: the rise of the best posterior mean over ``all``
target cells, or over the cells the ``answer`` may be (with :data:`ANSWER_AMONG` ``tried``: the
cells with a full run, and the candidate's own cell when it is a full run). ``all``: kept
leave-one-world-out (``benchmarks/tuner_ablation.py --design``, ``kg-for-the-answer``)."""
KG_POOLS = ("all", "answer")

ACQUISITION = "kg"
"""How :meth:`Tuner.next_run` picks the run: ``kg``, the largest knowledge gradient per unit of
cost (pilots included); ``top-two``, top-two Thompson sampling over the full-budget cells
(:mod:`allocopt.tuner.toptwo`; no pilots)."""
ACQUISITIONS = ("kg", "top-two")


REFINE_FINEST = 1.0 / 64
"""The closest two ρ of one category a refinement places runs at, as a share of the ρ range."""


def _contenders(post: Posterior) -> np.ndarray:
    mu, sd = post.mean, np.sqrt(post.var)
    return np.flatnonzero(mu + CONTENDER_SDS * sd >= mu.max())


@dataclass
class Tuner:
    """The decisions on one space. Stateless between calls apart from its settings."""

    space: TunerSpace
    grid: HyperGrid = field(default_factory=HyperGrid)
    feasible: Feasible | None = None
    among: str = ANSWER_AMONG
    """Where :meth:`answer` chooses (:data:`ANSWER_AMONG`)."""
    caution: float = ANSWER_CAUTION
    """:meth:`answer` maximizes the posterior mean less this many posterior standard
    deviations (:data:`ANSWER_CAUTION`)."""
    kg_pool: str = KG_POOL
    """What the knowledge gradient is the rise of (:data:`KG_POOL`)."""
    refine: bool = False
    """Whether the candidates zoom in: besides the grid's cells, every ρ a full run was made at
    and the midpoints between the posterior-mean best cell and its neighbours in ρ (down to
    :data:`REFINE_FINEST` of the range), so a peak between two grid levels can be reached."""
    acquisition: str = ACQUISITION
    """How :meth:`next_run` picks the run (:data:`ACQUISITION`)."""

    def __post_init__(self) -> None:
        if self.among not in AMONG:
            raise ValueError(f"among={self.among!r}: allowed: {', '.join(AMONG)}")
        if not isinstance(self.caution, (int, float)) or not 0 <= self.caution <= 10:
            raise ValueError(f"caution={self.caution!r}: must be a number from 0 to 10")
        if self.kg_pool not in KG_POOLS:
            raise ValueError(f"kg_pool={self.kg_pool!r}: allowed: {', '.join(KG_POOLS)}")
        if self.acquisition not in ACQUISITIONS:
            raise ValueError(f"acquisition={self.acquisition!r}: allowed: {', '.join(ACQUISITIONS)}")

    def allows(self, a: Allocation, f: float) -> bool:
        """Whether a run of ``a`` at fraction ``f`` is feasible (every run without a ``feasible`` test)."""
        return self.feasible is None or bool(self.feasible(a, f))

    def _data(self, observed: Sequence[Observed]) -> Data:
        pts = self.space.points([o.allocation for o in observed], [o.fraction for o in observed])
        return Data(pts, np.asarray([o.value for o in observed], dtype=float),
                    np.asarray([o.eval_var for o in observed], dtype=float))

    def targets(self, observed: Sequence[Observed] = ()) -> list[Allocation]:
        """The feasible full-budget cells: what the answer is chosen among (with :attr:`refine`,
        also the cells off the grid that ``observed`` has full runs at)."""
        cells = [a for a in self.space.cells() if self.allows(a, 1.0)]
        if not self.refine:
            return cells
        known = set(cells)
        off = [o.allocation for o in observed if o.fraction >= 1.0 and o.allocation not in known]
        return cells + [a for a in dict.fromkeys(off) if self.allows(a, 1.0)]

    def _zoom(self, observed: Sequence[Observed], targets: Sequence[Allocation]) -> list[Allocation]:
        """The feasible midpoints in ρ between the posterior-mean best of ``targets`` and its
        neighbours of the same category (:attr:`refine`); none before the first full run."""
        if not self.refine or not any(o.fraction >= 1.0 for o in observed):
            return []
        best = targets[int(np.argmax(self.posterior(observed, targets).mean))]
        rhos = sorted({a.rho for a in targets
                       if (a.reward, a.group_size, a.model) == (best.reward, best.group_size, best.model)})
        i, lo, hi = rhos.index(best.rho), *self.space.rho
        near = [rhos[j] for j in (i - 1, i + 1) if 0 <= j < len(rhos)]
        mids = [round((best.rho + r) / 2, 6) for r in near if abs(best.rho - r) >= 2 * REFINE_FINEST * (hi - lo)]
        return [a for a in (Allocation(r, best.group_size, best.reward, best.model) for r in mids)
                if a not in targets and self.allows(a, 1.0)]

    def posterior(self, observed: Sequence[Observed], targets: Sequence[Allocation]) -> Posterior:
        """The model's posterior at the full-budget ``targets`` given ``observed``."""
        return self._posterior(observed, targets, (), ())

    def next_run(self, observed: Sequence[Observed], *, pending: Sequence[Run] = (),
                 compute_left: float | None = None, seed: int | Sequence[int] = 0,
                 only: Callable[[Allocation], bool] | None = None) -> Run:
        """The run with the largest knowledge gradient per unit of cost (module docstring), or
        with :attr:`acquisition` ``top-two`` the full run top-two Thompson sampling draws (its
        score is still its knowledge gradient). ``pending``: runs started and not finished;
        ``compute_left``: full-run equivalents left (runs costing more are not considered);
        ``seed``: the draws' seed; ``only``: the runs considered are of the cells it admits (the
        answer is still among every target). Raises ``ValueError`` when nothing fits."""
        targets = self.targets(observed)
        cands = [(a, f) for f in self.space.fractions for a in self.space.cells()
                 if (compute_left is None or f <= compute_left + 1e-9) and self.allows(a, f)
                 and (only is None or only(a))]
        if self.refine:
            grid = set(self.space.cells())
            extra = [a for a in targets if a not in grid] + self._zoom(observed, targets)
            targets = targets + [a for a in extra if a not in targets]
            cands += [(a, 1.0) for a in extra
                      if (compute_left is None or compute_left >= 1.0 - 1e-9) and (only is None or only(a))]
        if not targets or not cands:
            raise ValueError("no feasible run fits the budget left")
        post = self._posterior(observed, targets, cands, pending)
        cost = np.asarray([f for _, f in cands])
        score = np.zeros(len(cands))
        mu = post.mean
        live, pool = self._pool(post, targets, observed, cands)
        for w, cc, vc, nc in zip(post.weights, post.cand_cov, post.cand_var, post.cand_noise):
            s, _ = kg_per_cost(mu[live], cc[:, live], vc, nc, cost, pool=pool)
            score += w * s
        i = int(np.argmax(score)) if self.acquisition == "kg" else self._top_two(post, targets, cands, seed)
        return Run(cands[i][0], cands[i][1], float(score[i]))

    def _top_two(self, post: Posterior, targets: Sequence[Allocation],
                 cands: Sequence[tuple[Allocation, float]], seed: int | Sequence[int]) -> int:
        """Index in ``cands`` of the full run top-two Thompson sampling picks among the targets."""
        full = {a: i for i, (a, f) in enumerate(cands) if f >= 1.0}
        if not full:
            raise ValueError("no feasible full run fits the budget left")
        j = top_two(post.weights, post.means, post.covs, np.random.default_rng(seed),
                    allowed=[a in full for a in targets])
        return full[targets[j]]

    def _posterior(self, observed: Sequence[Observed], targets: Sequence[Allocation],
                   cands: Sequence[tuple[Allocation, float]], pending: Sequence[Run]) -> Posterior:
        sp = self.space
        return posterior(self._data(observed), sp.points(targets, [1.0] * len(targets)), self.grid,
                         cands=sp.points([a for a, _ in cands], [f for _, f in cands]),
                         pending=sp.points([p.allocation for p in pending], [p.fraction for p in pending]))

    def answer(self, observed: Sequence[Observed]) -> Answer:
        """The posterior-mean maximizer at the full budget (module docstring)."""
        targets = self.targets(observed)
        if not targets:
            raise ValueError("no feasible full-budget allocation")
        post = self._posterior(observed, targets, [(a, 1.0) for a in targets], ())
        mu, var = post.mean, post.var
        i = self._chosen(mu - self.caution * np.sqrt(var), targets, observed)
        kg1 = np.zeros(len(targets))
        live, pool = self._pool(post, targets, observed, [(a, 1.0) for a in targets])
        for w, cc, vc, nc in zip(post.weights, post.cand_cov, post.cand_var, post.cand_noise):
            kg1 += w * kg_per_cost(mu[live], cc[:, live], vc, nc, np.ones(len(targets)), repeats=(1,),
                                   pool=pool)[1]
        near = tuple(a for j, a in enumerate(targets)
                     if j != i and mu[j] >= mu[i] - math.sqrt(var[i] + var[j]))
        j = int(np.argmax(kg1))
        return Answer(targets[i], float(mu[i]), float(math.sqrt(var[i])), near, float(max(kg1[j], 0.0)),
                      targets[j])

    def _pool(self, post: Posterior, targets: Sequence[Allocation], observed: Sequence[Observed],
              cands: Sequence[tuple[Allocation, float]]) -> tuple[np.ndarray, Pool | None]:
        """The target cells the knowledge gradient looks at (those that can become the answer in
        one run) and where the answer may be among them (:attr:`kg_pool`; ``None``: anywhere)."""
        tried = {o.allocation for o in observed if o.fraction >= 1.0}
        now = np.asarray([a in tried for a in targets], dtype=bool)
        if self.kg_pool == "all" or self.among == "all" or not now.any():
            return _contenders(post), None
        mu, sd = post.mean, np.sqrt(post.var)
        live = np.flatnonzero(mu + CONTENDER_SDS * sd >= mu[now].max())
        index = {targets[j]: k for k, j in enumerate(live)}
        own = np.asarray([index.get(a, -1) if f >= 1.0 else -1 for a, f in cands], dtype=int)
        return live, (now[live], own)

    def _chosen(self, mu: np.ndarray, targets: Sequence[Allocation], observed: Sequence[Observed]) -> int:
        """Index of the answer among ``targets``: the largest criterion ``mu`` over :attr:`among`."""
        tried = {o.allocation for o in observed if o.fraction >= 1.0}
        pool = [j for j, a in enumerate(targets) if a in tried] if self.among == "tried" else []
        pool = pool or list(range(len(targets)))
        return max(pool, key=lambda j: (mu[j], -j))


__all__ = ["ANSWER_AMONG", "ANSWER_CAUTION", "Answer", "Observed", "Run", "Tuner", "TunerSpace"]
