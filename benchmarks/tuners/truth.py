"""What is true in one replication, and what a trial observes.

Two truths (``mode``), each with its own observation rule:

* ``seedmean``: the truth of an allocation is the mean over the measured seeds of its cell at
  the full budget (interpolated in ρ); a trial observes one measured seed, drawn from all of
  them. On a synthetic world: the noise-free response, and a trial observes it plus Gaussian
  noise (:func:`objectives.synthetic.observe`).
* ``heldout``: one full-budget seed ``h`` is held out (:func:`heldout_seed`); the truth is
  seed ``h``'s value and a full-budget trial observes one of the *other* seeds, so no method
  is rewarded for matching the noise of the truth itself. Pilots are separate runs and draw
  from all of their own seeds. Tables only.

Regret is measured against the truth's best and worst over the world's candidates (every
feasible cell at the full budget; a synthetic world's exact optimum and worst,
:func:`objectives.synthetic.optimum`). A recommendation that is infeasible at the full budget
is worth the worst value.

**The draw** is a pure function of its key (:func:`draw_key`: replication seed, truth, the
allocation, the fraction and how many times this method has run that point before), so every
method of a replication that runs the same point for the k-th time sees the same measured seed
(or the same Gaussian draw): the methods are compared on one stream of noise.
"""

from __future__ import annotations

import random
import statistics
import zlib
from dataclasses import dataclass
from functools import cached_property

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.world import FULL, SyntheticWorld, TableWorld, World

TRUTHS: tuple[str, ...] = ("seedmean", "heldout")


def heldout_seed(world: TableWorld, replication: int, n_targets: int) -> int:
    """The seed held out in ``replication``: the world's held-out seeds in turn, changing every
    ``n_targets`` replications (the targets rotate fastest, so target and seed are not tied)."""
    seeds = world.heldout_seeds
    return seeds[(replication // n_targets) % len(seeds)]


def draw_key(replication: int, mode: str, a: Allocation, fraction: float, repeat: int) -> str:
    return f"{replication}|{mode}|{a.model}|{a.reward}|{a.group_size}|{float(a.rho):.6f}|{fraction:.4f}|{repeat}"


@dataclass(frozen=True)
class TableTruth:
    """The truth of one replication on a measured table (module docstring)."""

    world: TableWorld
    target: str
    mode: str
    heldout: int | None = None

    def _at(self, a: Allocation, fraction: float, pick) -> float | None:
        pts = self.world.neighbours(a, fraction)
        if pts is None:
            return None
        return sum(w * pick(self.world.seeds(a, fraction, x)) for x, w in pts)

    def _raw(self, a: Allocation) -> float | None:
        if self.mode == "heldout":
            return self._at(a, FULL, lambda seeds: seeds[self.heldout][self.target])
        return self.world.mean(a, self.target)

    @cached_property
    def _values(self) -> list[float]:
        return [self._raw(a) for a in self.world.candidates]

    @property
    def best(self) -> float:
        return max(self._values)

    @property
    def worst(self) -> float:
        return min(self._values)

    def value(self, a: Allocation) -> float:
        """True full-budget value of ``a`` (target units); the worst where it is infeasible."""
        v = self._raw(a)
        return self.worst if v is None else v

    def draw(self, a: Allocation, fraction: float, key: str) -> float | None:
        """One trial's observation of ``target`` (``None``: infeasible, as the measured trials)."""
        pts = self.world.neighbours(a, fraction)
        if pts is None:
            return None
        hide = {self.heldout} if self.mode == "heldout" and fraction == FULL else set()
        by_level = [(self.world.seeds(a, fraction, x), w) for x, w in pts]
        rng = random.Random(key)
        common = set.intersection(*(set(s) - hide for s, _ in by_level))
        if common:
            s = rng.choice(sorted(common))
            return sum(w * seeds[s][self.target] for seeds, w in by_level)
        return sum(w * seeds[rng.choice(sorted(set(seeds) - hide))][self.target] for seeds, w in by_level)


@dataclass(frozen=True)
class SyntheticTruth:
    """The noise-free response of a synthetic variant and its noisy observations."""

    world: SyntheticWorld
    target: str
    mode: str = "seedmean"
    heldout: int | None = None

    @cached_property
    def _optimum(self):
        from objectives.synthetic import optimum

        w = self.world
        return optimum(self.target, w.full_budget_flops, w.space, variant=w.variant)

    def value(self, a: Allocation) -> float:
        return self.world.mean(a, self.target)

    @property
    def best(self) -> float:
        return self._optimum.value

    @property
    def worst(self) -> float:
        return self._optimum.worst

    def draw(self, a: Allocation, fraction: float, key: str) -> float:
        from objectives.synthetic import observe

        w = self.world
        seed = zlib.crc32(key.encode())
        return observe(a.rho, a.group_size, a.reward, fraction * w.full_budget_flops, variant=w.variant,
                       model=a.model, seed=seed)[self.target]


Truth = TableTruth | SyntheticTruth


def truth_for(world: World, target: str, mode: str, replication: int, n_targets: int = 3) -> Truth:
    """The truth of ``replication`` (module docstring). Raises ``ValueError`` for a truth the
    world has not: ``heldout`` on a synthetic world or a table with no seed at every candidate."""
    if mode not in TRUTHS:
        raise ValueError(f"truth={mode!r}: allowed: {', '.join(TRUTHS)}")
    if isinstance(world, SyntheticWorld):
        if mode != "seedmean":
            raise ValueError(f"truth={mode!r}: a synthetic world has no measured seeds; only seedmean")
        return SyntheticTruth(world, target)
    if mode == "heldout":
        if not world.heldout_seeds:
            raise ValueError(f"truth=heldout: no seed of {world.name} is measured at every candidate")
        return TableTruth(world, target, mode, heldout_seed(world, replication, n_targets))
    return TableTruth(world, target, mode)


def other_seeds_answer(truth: TableTruth) -> Allocation:
    """The feasible full-budget cell with the best mean over the seeds other than the held-out
    one: the answer of a method that had measured every other seed of every cell. Its regret
    under a held-out truth is the held-out seed's own noise, which no method's runs can see: a
    reference for what that truth can reward."""
    if truth.mode != "heldout":
        raise ValueError(f"truth={truth.mode!r}: the other seeds' answer needs a held-out truth")
    def others(seeds: dict) -> float:
        return statistics.fmean(v[truth.target] for s, v in seeds.items() if s != truth.heldout)

    def mean(a: Allocation) -> float:
        v = truth._at(a, FULL, others)  # read in rho as the truth reads its own seed
        return float("-inf") if v is None else v

    return max(truth.world.candidates, key=mean)


def truths_of(world: World) -> tuple[str, ...]:
    """The truths a world offers."""
    return ("seedmean",) if isinstance(world, SyntheticWorld) else TRUTHS


def value_pct(truth: Truth, value: float) -> float:
    """``100 · (best - value) / (best - worst)``, clipped at 0: a true value's regret in % of the range."""
    span = truth.best - truth.worst
    return max(0.0, 100.0 * (truth.best - value) / span) if span > 0 else 0.0


def regret_pct(truth: Truth, a: Allocation | None) -> float:
    """:func:`value_pct` of ``a``'s true value; NaN for no allocation."""
    return float("nan") if a is None else value_pct(truth, truth.value(a))
