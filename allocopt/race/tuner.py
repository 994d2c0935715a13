"""RACE as one object over plain data: :class:`RaceTuner`, what a study's sampler asks.

The sampler (:class:`allocopt.study.sampler.RaceSampler`) turns the study's trials into
observations and runs (:mod:`allocopt.study.observe`) and asks the tuner three things:

* :attr:`RaceTuner.design` — the pilot grid to run first (claimed by trials one by one);
* :meth:`RaceTuner.propose` — the next runs once the grid is claimed;
* :meth:`RaceTuner.answer` — the study's one recommendation.

It keeps what lives across asks: the surrogate cache (hyperparameters refitted as the study
grows), the fit and proposal timings, and the recommendation after each fit. Another tuning
algorithm plugs in by offering the same attributes and methods (:class:`Tuner`; the sampler's
``tuner=``). No study, no Optuna; torch is imported (through the surrogate) at the first fit.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Protocol, Sequence, runtime_checkable

from allocopt.plan.allocation import Allocation
from allocopt.race.data import Budgets, Feasible, Observation, Run
from allocopt.race.design import PilotPoint, RaceSettings, pilot_grid
from allocopt.race.fit import SurrogateCache
from allocopt.race.propose import Proposal, propose
from allocopt.race.recommend import Recommendation, final_surrogate, recommend, recommendation
from allocopt.spec import SearchSpace


@runtime_checkable
class Tuner(Protocol):
    """What :class:`allocopt.study.sampler.RaceSampler` asks of a tuner (``tuner=``): plain data
    in (:mod:`allocopt.race.data`), plain data out. :class:`RaceTuner` is RACE's."""

    design: list[PilotPoint]
    """Pilot points to run first, one trial each, in order (empty: none)."""
    timings: dict[str, list[float]]
    """Seconds per fit and per proposal (``fit_seconds``, ``proposal_seconds``), for display."""
    recommendations: list[tuple[int, Allocation]]
    """``(last trial number seen, allocation)`` after each fit, for display."""

    def unclaimed(self, runs: Sequence[Run]) -> list[PilotPoint]:
        """Points of :attr:`design` no run of ``runs`` has claimed yet, in order."""
        ...

    def propose(self, obs: Sequence[Observation], runs: Sequence[Run], q: int = 1) -> list[Proposal]:
        """Up to ``q`` runs to do next (``[]``: the sampler falls back to a random full run)."""
        ...

    def answer(self, obs: Sequence[Observation]) -> tuple[Recommendation | None, Any]:
        """The study's one answer and the model behind it, ``(None, None)`` when there is none."""
        ...


def _slot(a: Allocation) -> tuple:
    return (a.reward, a.model, a.group_size, round(a.rho, 4))


class RaceTuner:
    """RACE's pilot grid, proposals and answer over plain data (module docstring).

    Args:
        space: the search space; its ρ range must be a range.
        budgets: FLOPs of a run per fidelity (:class:`~allocopt.race.data.Budgets`).
        settings: :class:`~allocopt.race.design.RaceSettings`.
        seed: seed of the pilot design and the surrogate.
        feasible: ``feasible(allocation, fraction)``; ``None``: proposals unchecked.
        design: the pilot grid (default :func:`~allocopt.race.design.pilot_grid`; a caller with
            the workload passes it moved to usable ρ, :func:`allocopt.race.pilot_plans.fit_pilots`).

    Attributes:
        timings: ``fit_seconds`` per surrogate fit, ``proposal_seconds`` per proposal.
        recommendations: ``(last trial number seen, allocation)`` after each fit: RACE's answer
            (:func:`~allocopt.race.recommend.recommend`) had the study stopped there.

    Raises:
        ConfigError: a space without a ρ range, too few pilots for the space.
    """

    def __init__(self, space: SearchSpace, budgets: Budgets, settings: RaceSettings | None = None,
                 seed: int = 0, feasible: Feasible | None = None,
                 design: Sequence[PilotPoint] | None = None) -> None:
        self.space, self.budgets, self.seed, self.feasible = space, budgets, seed, feasible
        self.settings = settings or RaceSettings()
        self.design: list[PilotPoint] = list(design) if design is not None else pilot_grid(space, self.settings, seed)
        self._cache = SurrogateCache(space, seed)  # hyperparameters refitted as the study grows
        self._fit: tuple[tuple[int, ...], Any] | None = None
        self.timings: dict[str, list[float]] = {"fit_seconds": [], "proposal_seconds": []}
        self.recommendations: list[tuple[int, Allocation]] = []

    def unclaimed(self, runs: Sequence[Run]) -> list[PilotPoint]:
        """Grid points no pilot of ``runs`` has claimed yet, in grid order (a pilot run claims
        one grid point at its ρ, G, reward and model)."""
        claims = Counter(_slot(r.allocation) for r in runs if r.fidelity == "pilot")
        out = []
        for p in self.design:
            s = _slot(p.allocation)
            if claims[s] > 0:
                claims[s] -= 1
            else:
                out.append(p)
        return out

    def extra_pilots(self, runs: Sequence[Run]) -> int:
        """Pilots of ``runs`` beyond the grid (proposed as extra pilots)."""
        claims = Counter(_slot(r.allocation) for r in runs if r.fidelity == "pilot")
        claims.subtract(Counter(_slot(p.allocation) for p in self.design))
        return sum(v for v in claims.values() if v > 0)

    def surrogate(self, obs: Sequence[Observation]) -> Any:
        """The surrogate on ``obs`` (two at least): conditioned anew when they changed, its
        hyperparameters refitted only when the study has grown enough
        (:class:`~allocopt.race.fit.SurrogateCache`)."""
        key = tuple(sorted(o.number for o in obs))
        if self._fit is None or self._fit[0] != key:
            sur = self._cache(obs)
            self._fit = (key, sur)
            self.timings["fit_seconds"].append(sur.fit_seconds)
            self.recommendations.append((max(o.number for o in obs),
                                         recommend(sur, obs, self.space, self.settings)[0]))
        return self._fit[1]

    def propose(self, obs: Sequence[Observation], runs: Sequence[Run], q: int = 1) -> list[Proposal]:
        """Up to ``q`` runs to do next (:func:`~allocopt.race.propose.propose`), pending runs
        conditioned on; extra pilots only within ``settings.extra_pilot_budget``. ``[]`` with
        fewer than two observations."""
        if len(obs) < 2:
            return []
        sur = self.surrogate(obs)
        t0 = time.perf_counter()
        f = self.budgets.pilot_fraction
        allow = (self.extra_pilots(runs) + 1) * f <= self.settings.extra_pilot_budget + 1e-12
        out = propose(obs, runs, self.space, self.budgets, self.settings, feasible=self.feasible,
                      surrogate=sur, q=q, allow_pilots=allow, seed=self.seed)
        self.timings["proposal_seconds"].append(time.perf_counter() - t0)
        return out

    def answer(self, obs: Sequence[Observation]) -> tuple[Recommendation | None, Any]:
        """The study's one answer from ``obs`` alone: ``(recommendation, surrogate)``
        (:func:`~allocopt.race.recommend.recommendation` on a fresh fit,
        :func:`~allocopt.race.recommend.final_surrogate`), or ``(None, None)`` before two
        observations, one of them at the full budget."""
        if len(obs) < 2 or not any(o.fidelity == "full" for o in obs):
            return None, None
        sur = final_surrogate(obs, self.space, self.seed)
        return recommendation(sur, obs, self.space, self.settings), sur


__all__ = ["RaceTuner", "Tuner"]
