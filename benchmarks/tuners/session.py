"""The session one method runs in: it runs trials, pays for them, and records what happened.

A method sees only this object: the world's search space (``session.world``), the replication's
seed and target, and :meth:`Session.observe`, which runs one trial and returns its observed
target. A method whose choices depend on the order in which the space lists its reward systems
or models (Ax's centre point takes the middle of a list, the grid runs them in order) takes that
order from :meth:`Session.listed`, drawn from the replication: the world's own order (a table's
reward systems by cost) would otherwise decide which reward system such a method tries first,
and a world whose middle one happens to be its best would reward the list, not the search.

Compute is counted in **full-run equivalents**: a trial at fraction ``f`` of the full budget
costs ``f``; an infeasible trial (``None``) costs nothing, as a study records it.
A method stops when :attr:`Session.done` (its compute reached ``cap``); the trial that crosses
the cap is still recorded, and scoring counts at each level only what was spent by then.

A method whose own recommendation is not simply its best observed full run states it with
:meth:`Session.recommend`; :meth:`Session.answer_due` says when the harness will score it
(before a trial that would carry the compute past a scored level), so a costly rule is asked
only then.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.truth import Truth, draw_key
from benchmarks.tuners.world import FULL, World

EPS = 1e-9
MAX_INFEASIBLE_IN_A_ROW = 1000
"""A method that asks this many infeasible trials in a row without a feasible one is stopped."""


@dataclass(frozen=True)
class Event:
    """One trial: the compute spent after it, what ran, and what it returned."""

    cost: float
    allocation: Allocation
    fraction: float
    value: float | None


@dataclass
class Session:
    """One method's run on one replication (module docstring)."""

    world: World
    truth: Truth
    replication: int
    cap: float
    levels: Sequence[float]
    spent: float = 0.0
    events: list[Event] = field(default_factory=list)
    answers: list[tuple[float, Allocation]] = field(default_factory=list)
    """``(compute when given, allocation)`` of the method's own recommendations."""
    note: str = ""
    """What the method wants said beside its results (a design it could not run as asked)."""
    _asks: dict = field(default_factory=dict, repr=False)
    _infeasible_run: int = 0

    @property
    def target(self) -> str:
        return self.truth.target

    @property
    def done(self) -> bool:
        return self.spent >= self.cap - EPS

    def listed(self, values: Sequence[str], what: str) -> tuple[str, ...]:
        """``values`` (the space's reward systems or models, ``what`` naming which) in an order
        drawn from the replication: the same for every method of it (module docstring)."""
        out = list(values)
        random.Random(f"order|{what}|{self.replication}").shuffle(out)
        return tuple(out)

    def observe(self, a: Allocation, fraction: float = FULL) -> float | None:
        """Run ``a`` at ``fraction`` of the full budget (1.0 or one of ``world.fractions``);
        its observed target, or ``None`` when the trial is infeasible (no cost)."""
        fraction = round(float(fraction), 4)
        if fraction != FULL and fraction not in self.world.fractions:
            raise ValueError(f"fraction={fraction}: the world has {', '.join(map(str, self.world.fractions))} and 1")
        k = (a.model, a.reward, a.group_size, round(float(a.rho), 6), fraction)
        repeat = self._asks.get(k, 0)
        self._asks[k] = repeat + 1
        y = self.truth.draw(a, fraction, draw_key(self.replication, self.truth.mode, a, fraction, repeat))
        if y is None:
            self._infeasible_run += 1
            if self._infeasible_run >= MAX_INFEASIBLE_IN_A_ROW:
                raise RuntimeError(f"{MAX_INFEASIBLE_IN_A_ROW} infeasible trials in a row")
        else:
            self._infeasible_run = 0
            self.spent = round(self.spent + fraction, 9)
        self.events.append(Event(self.spent, a, fraction, y))
        return y

    def recommend(self, a: Allocation | None) -> None:
        """The method's own recommendation now (scored at every level it is the last one by)."""
        if a is not None:
            self.answers.append((self.spent, a))

    def answer_due(self, next_fraction: float = FULL) -> bool:
        """Whether the harness scores the method's answer as it is now: the compute is done, or
        the next trial (at ``next_fraction``) would carry it past a scored level."""
        return self.done or any(self.spent - EPS <= c < self.spent + next_fraction - EPS for c in self.levels)

    def full_runs(self, by: float = float("inf")) -> list[tuple[Allocation, float]]:
        """``(allocation, observed value)`` of the feasible full-budget trials made with at most
        ``by`` compute."""
        return [(e.allocation, e.value) for e in self.events
                if e.fraction == FULL and e.value is not None and e.cost <= by + EPS]
