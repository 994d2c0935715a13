"""The pilot grid's plans: which pilots are usable at the pilot budget, and the move of the
others to the nearest usable ρ.

A pilot is *usable* when its plan (:func:`allocopt.plan.allocation.make_plan` at
``pilot_fraction × budget_flops``)

* exists (the budget buys one iteration),
* is realizable over the iterations the budget meter is expected to admit: the meter admits
  an iteration only when the spent total plus the worst case of its generation and learning
  (every completion at ``max_completion_length``; after the first iteration, at the fewest
  rows it may be cut to, plus the reward of an earlier batch) fits (:mod:`allocopt.plan.meter`,
  stage 1), so a plan's last iterations may never run; the realized ρ of the admitted ones
  must be within :data:`allocopt.plan.allocation.RHO_TOLERANCE` of the asked ρ (a plan of 1–2
  iterations often cannot realize a fractional rows schedule),
* spends at least :data:`MIN_PILOT_USE` of the pilot budget over those iterations, at the
  workload's expected lengths.

Each pilot is priced at the batch its plan runs (:func:`allocopt.plan.allocation.plan_workload`:
``make_plan`` may take fewer prompts per iteration than the workload's so that the iterations
fill the pilot budget, or more when the set-up's ``target_steps`` raises the batch of a large
budget), with its last iteration cut as the plan cuts it.

A grid of IsoFLOP pilots at one budget cannot always make every ρ usable: an iteration's cost
grows as ``1 / (1 - ρ)``, so at high ρ a pilot buys one or two iterations, and a smaller batch
or a cut last iteration do not always realize ρ over so few. :func:`fit_pilots` moves each unusable pilot to the nearest ρ within half the grid's ρ
spacing (its Latin-hypercube stratum) where it is usable, so the pilots still cover the ρ range
and every one of them measures what it says.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from allocopt.plan.allocation import (RHO_TOLERANCE, Allocation, InfeasiblePlan, TrialPlan, Workload,
                                 expected_flops, iteration_flops, make_plan, min_last_rows,
                                 plan_workload, rows_schedule)
from allocopt.flops import ConfigError, FlopAccount
from allocopt.race.design import PilotPoint, pilot_grid  # noqa: F401  (docs)

MIN_PILOT_USE = 0.85
"""Least share of the pilot budget a usable pilot's plan spends: at high ρ a pilot buys one or
two iterations, which can leave much of its budget unspent (high-ρ pilots of the tiny world spent
~55 % of theirs)."""
RHO_STEP = 0.0025
"""Resolution (ρ units) of the search for a usable ρ near an unusable pilot."""


@dataclass(frozen=True)
class PilotPlan:
    """A pilot's plan at the pilot budget and what the meter is expected to let it run."""

    point: PilotPoint
    plan: TrialPlan | None
    """``None``: the pilot budget buys no iteration."""
    admitted_iterations: int
    """Iterations of the plan whose stage-1 admission (worst case of generation + learning on
    top of the expected spend so far) fits the budget."""
    realized_rho: float
    """ρ of the admitted iterations' expected executed FLOPs (NaN when none)."""
    budget_use: float
    """Expected executed FLOPs of the admitted iterations / pilot budget."""
    note: str = ""
    """Why it is not usable ("" when it is)."""

    @property
    def realizable(self) -> bool:
        return self.admitted_iterations > 0 and abs(self.realized_rho - self.point.allocation.rho) <= RHO_TOLERANCE

    @property
    def usable(self) -> bool:
        return self.realizable and self.budget_use >= MIN_PILOT_USE


@functools.lru_cache(maxsize=64)
def _at_limit(workload: Workload) -> Workload:
    """``workload`` with every completion at its generation limit."""
    c = workload.setup.max_completion_length
    return workload.with_setup(completion_tokens=c, padded_completion_tokens=c)


def _worst_search_learning(workload: Workload, allocation: Allocation, rows: int) -> int:
    """Stage-1 bound of one iteration: search + learning with every completion at
    ``workload.setup.max_completion_length``."""
    e = iteration_flops(_at_limit(workload), allocation, rows).executed
    return e.search_flops + e.learning_flops


def _stage_one(workload: Workload, allocation: Allocation, rows: int, first: bool) -> int:
    """What the driver's stage 1 admits an iteration scheduled to train ``rows`` with
    (:meth:`allocopt.grpo.hooks._Hooks.before_iteration`): the worst case of its search and
    learning, at the fewest rows it may be cut to after the first iteration, plus (after the
    first) the reward of an earlier batch, at the expected lengths its plan's reward."""
    if first:
        return _worst_search_learning(workload, allocation, rows)
    reward = iteration_flops(workload, allocation, 0).executed.reward_flops
    return _worst_search_learning(workload, allocation, min_last_rows(rows)) + reward


def plan_pilot(point: PilotPoint, budget_flops: float, workload: Workload) -> PilotPlan:
    """:class:`PilotPlan` of ``point`` at ``budget_flops`` (the pilot budget). Raises
    :class:`allocopt.flops.ConfigError` for an allocation the workload cannot price."""
    a = point.allocation
    try:
        plan = make_plan(budget_flops, a, workload)
    except InfeasiblePlan as e:
        return PilotPlan(point, None, 0, float("nan"), 0.0,
                         f"needs {e.min_budget_flops:.3e} FLOPs for one iteration")
    w = plan_workload(workload, plan)  # the batch the plan runs
    k = plan.rows_trained_per_iteration
    cut = plan.last_iteration_rows

    def spent(n: int) -> FlopAccount:
        """The plan's first ``n`` iterations (its cut last one included when n is all)."""
        return expected_flops(w, a, k, n, cut if n == plan.iterations else None)

    # iterations whose admission fits whatever their rows (k0 or k0 + 1): all those before
    # the last n with spent(n) + the larger bound <= budget (spent grows with n; bisection)
    k0 = int(k + 1e-9)
    most = max(_stage_one(w, a, k0, False), _stage_one(w, a, k0 + 1, False))
    lo, hi = 0, plan.iterations  # invariant: iterations < lo are admitted
    if _stage_one(w, a, rows_schedule(k, 0), True) <= budget_flops:
        lo = 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if spent(mid - 1).executed.total_flops + most <= budget_flops:
                lo = mid
            else:
                hi = mid - 1
    n = lo
    while 0 < n < plan.iterations:  # the meter stops at its first refusal
        if spent(n).executed.total_flops + _stage_one(w, a, rows_schedule(k, n), False) > budget_flops:
            break
        n += 1
    if n == 0:
        return PilotPlan(point, plan, 0, float("nan"), 0.0,
                         "the meter's worst case refuses the first iteration")
    done = spent(n).executed
    out = PilotPlan(point, plan, n, done.rho, done.total_flops / budget_flops)
    note = ("" if out.usable else
            f"realizes rho {out.realized_rho:.3f} in {n} iteration(s)" if not out.realizable else
            f"spends {out.budget_use:.0%} of its budget ({n} iteration(s))")
    return dataclasses.replace(out, note=note)


def rho_spacing(points: Sequence[PilotPoint], lo: float, hi: float) -> float:
    """ρ spacing of the design: the ρ range over the most distinct points any cell (reward
    system × model) has, the width of a Latin-hypercube stratum of :func:`pilot_grid`."""
    per: dict[tuple, int] = {}
    for p in points:
        if p.repeat == 0:
            key = (p.allocation.reward, p.allocation.model)
            per[key] = per.get(key, 0) + 1
    return (hi - lo) / max(1, max(per.values(), default=1))


def fit_pilots(points: Sequence[PilotPoint], rho_range: tuple[float, float],
               budget_flops: float | Callable[[Allocation], float], workload: Workload) -> list[PilotPoint]:
    """``points`` with each unusable pilot moved to the nearest usable ρ at most half the
    design's ρ spacing away (:func:`rho_spacing`) and inside ``rho_range``, searched in steps of
    :data:`RHO_STEP`; a pilot with no usable ρ there, or one the workload cannot price (a
    :class:`~allocopt.flops.ConfigError`), stays where it is. Repeats of one point move
    together. Deterministic. ``budget_flops``: the pilot budget (FLOPs), or a function of the
    allocation (a time budget gives each allocation its own)."""
    lo, hi = rho_range
    radius = rho_spacing(points, lo, hi) / 2
    moved: dict[Allocation, Allocation] = {}
    out = []
    for p in points:
        a = p.allocation
        if a not in moved:
            moved[a] = a
            if not _usable(a, budget_flops, workload):
                steps = int(radius / RHO_STEP + 1e-9)
                for i in range(1, steps + 1):
                    hit = None
                    for rho in (a.rho - i * RHO_STEP, a.rho + i * RHO_STEP):
                        rho = round(rho, 4)
                        if lo <= rho <= hi and _usable(dataclasses.replace(a, rho=rho), budget_flops,
                                                       workload):
                            hit = dataclasses.replace(a, rho=rho)
                            break
                    if hit is not None:
                        moved[a] = hit
                        break
        out.append(PilotPoint(moved[a], p.repeat))
    return out


def _usable(a: Allocation, budget_flops: float | Callable[[Allocation], float], workload: Workload) -> bool:
    try:
        b = budget_flops(a) if callable(budget_flops) else budget_flops
        return plan_pilot(PilotPoint(a), b, workload).usable
    except ConfigError:
        return True  # not priceable here: leave it where it is


def usable_share(plans: Sequence[PilotPlan]) -> float:
    """Share of ``plans`` that are usable (1.0 for none)."""
    return sum(p.usable for p in plans) / len(plans) if plans else 1.0


__all__ = ["MIN_PILOT_USE", "PilotPlan", "fit_pilots", "plan_pilot", "rho_spacing", "usable_share"]
