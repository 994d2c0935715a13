"""The former call form of :func:`allocopt.race.propose`, ``propose(obs, spec, workload,
existing=..., ...)``, kept while ``benchmarks/optimizers.py`` still calls it.

:func:`propose` (re-exported as ``allocopt.race.propose``) takes the plain form of
:func:`allocopt.race.propose.propose` and, when its second argument has a ``space`` (a study),
the former one: it reads that object's ``space``, ``seed`` and ``budget_flops`` only (no study
is imported here), prices feasibility with a :class:`~allocopt.race.propose.PlanCache` of the
workload and attaches each proposal's plan, as the former function did. Delete this module once
no caller passes a study.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from allocopt.plan.allocation import Allocation, TrialPlan, Workload
from allocopt.race.data import Budgets, Observation, Run
from allocopt.race.design import RaceSettings
from allocopt.race.propose import PlanCache, Proposal, feasible_by
from allocopt.race.propose import propose as plain_propose


def propose(obs: Sequence[Observation], *args: Any, **kw: Any) -> list[Proposal]:
    """:func:`allocopt.race.propose.propose`, or the former form (module docstring)."""
    if args and hasattr(args[0], "space"):
        return propose_for_spec(obs, *args, **kw)
    return plain_propose(obs, *args, **kw)


def propose_for_spec(obs: Sequence[Observation], spec: Any, workload: Workload | None, *,
                     existing: Sequence[tuple[Allocation, str]] = (), q: int = 1,
                     pilot_fraction: float = 0.1, allow_pilots: bool = True,
                     settings: RaceSettings = RaceSettings(), surrogate: Any = None,
                     plans: Callable[[float, Allocation], TrialPlan | None] | None = None,
                     full_budget: Callable[[Allocation], float] | None = None) -> list[Proposal]:
    """The former ``propose``: ``existing`` as ``(allocation, fidelity)`` pairs (none pending),
    ``full_budget`` (default ``spec.budget_flops``), ``plans`` or a workload's
    :class:`~allocopt.race.propose.PlanCache` for feasibility; proposals carry their plans."""
    budgets = Budgets(full_budget if full_budget is not None else spec.budget_flops, pilot_fraction)
    if plans is None and workload is not None:
        plans = PlanCache(workload)
    feasible = None if plans is None else feasible_by(plans, budgets)
    runs = [Run(a, f) for a, f in existing]
    out = plain_propose(obs, runs, spec.space, budgets, settings, feasible=feasible, surrogate=surrogate,
                        q=q, allow_pilots=allow_pilots, seed=spec.seed)
    return [p.with_plan(plans) for p in out]
