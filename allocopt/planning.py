"""The plan a budget buys at an allocation: the batch, the iterations and a cut last one.

Standard library only. :func:`make_plan` turns a FLOP budget, an
:class:`~allocopt.allocation.Allocation` and a :class:`~allocopt.allocation.Workload` into the
:class:`~allocopt.allocation.TrialPlan` the driver runs (the iteration costs come from
:mod:`allocopt.allocation`; read there how ρ is realized). Importable from
:mod:`allocopt.allocation` too.

How the budget is used up. Whole iterations leave up to one iteration's cost unspent, which is
most of a budget that buys few (issue 17: a ρ = 0.9 trial of the tiny world bought 3 and left
23 % unspent). Two things fill it, in the plan and in the driver alike:

* the last iteration may train fewer rows, down to :data:`LAST_ROWS_SHARE` of its scheduled
  rows (:func:`min_last_rows`), the most that fit (:func:`allocopt.meter.largest_fitting`;
  :attr:`TrialPlan.last_iteration_rows`); the driver cuts an iteration after the first the same
  way once its exact cost is known (:meth:`allocopt.meter.FlopMeter.largest_fitting`);
* when that still leaves more than :data:`MAX_UNUSED_SHARE` of the budget unspent (or the ρ
  unrealized), :func:`make_plan` tries smaller batches, down to the set-up's
  ``min_batch_share`` of the workload's prompts per iteration, and keeps the one whose plan
  realizes ρ and uses the most (:attr:`TrialPlan.prompts_per_iteration`; the driver runs the
  plan's batch, :func:`batch_workload` prices it).
"""

from __future__ import annotations

import math
from dataclasses import replace

from allocopt.allocation import (MODEL_BASED, RHO_TOLERANCE, Allocation, InfeasiblePlan, TrialPlan, Workload,
                                 _policy, check_budget, expected_flops, iteration_flops, max_iterations,
                                 rows_for_rho, rows_schedule)
from allocopt.meter import largest_fitting

LAST_ROWS_SHARE = 0.5
"""Least share of its scheduled rows the last iteration of a plan (or of a run, in the driver)
may train when all of them do not fit the budget (:func:`min_last_rows`): a cut deeper than
this would move the run's ρ too far from the plan's (at ρ = 0.9, a run of 4 iterations whose
last trains half its rows realizes 0.89)."""

MAX_UNUSED_SHARE = 0.03
"""A plan at the workload's batch that leaves more than this share of its budget unspent (or
does not realize its ρ) is compared with plans at smaller batches (:func:`make_plan`)."""

REBATCH_CANDIDATES = 6
"""Smaller batches :func:`make_plan` prices exactly, the ones whose whole iterations are
estimated (cost proportional to the batch) to use the most; each costs one plan."""


def min_last_rows(rows: int) -> int:
    """Fewest rows an iteration scheduled to train ``rows`` may train when it is cut to fit
    the budget: ``ceil(LAST_ROWS_SHARE × rows)``."""
    return math.ceil(LAST_ROWS_SHARE * rows - 1e-9)


def batch_workload(workload: Workload, rollouts_per_iteration: int) -> Workload:
    """``workload`` at another batch: what a plan that runs ``rollouts_per_iteration``
    completions per iteration (:attr:`TrialPlan.rollouts_per_iteration`) is priced on."""
    if rollouts_per_iteration == workload.rollouts_per_iteration:
        return workload
    return replace(workload, setup=replace(workload.setup, rollouts_per_iteration=rollouts_per_iteration))


def plan_workload(workload: Workload, plan: "TrialPlan") -> Workload:
    """The workload ``plan`` was priced on: ``workload`` at the plan's batch."""
    return batch_workload(workload, plan.rollouts_per_iteration)


def _plan_at(budget: float, allocation: Allocation, workload: Workload) -> TrialPlan:
    """The plan at ``workload``'s batch: the most whole iterations that fit, then a last one
    cut to the most rows that fit, when at least :func:`min_last_rows` of its schedule do."""
    G = allocation.group_size
    prompts = max(1, workload.rollouts_per_iteration // G)
    N = prompts * G
    k = rows_for_rho(workload, allocation)
    iterations = max_iterations(budget, workload, allocation, k)
    if iterations < 1:
        need = iteration_flops(workload, allocation, rows_schedule(k, 0)).executed.total_flops
        raise InfeasiblePlan(
            f"budget_flops={budget:.3g}: too small for one GRPO iteration at rho={allocation.rho}, "
            f"group_size={G}, reward={allocation.reward} ({N} rollouts); the smallest feasible "
            f"plan needs {need:.3g} FLOPs", min_budget_flops=need)
    expected = expected_flops(workload, allocation, k, iterations)
    rows = rows_schedule(k, iterations)  # the next iteration's rows: they do not fit
    last = None
    if rows > min_last_rows(rows):
        last = largest_fitting(
            lambda r: iteration_flops(workload, allocation, r).executed.total_flops,
            min_last_rows(rows), rows - 1, budget - expected.executed.total_flops)
    if last is not None:
        expected = expected + iteration_flops(workload, allocation, last)
        iterations += 1
    realized = expected.executed.rho
    rm = workload.reward_models.get(allocation.reward) if allocation.reward in MODEL_BASED else None
    return TrialPlan(
        allocation=allocation, budget_flops=budget, policy=_policy(workload, allocation).name,
        reward_model=rm.name if rm else None, group_size=G, prompts_per_iteration=prompts,
        rollouts_per_iteration=N, rows_trained_per_iteration=k, update_passes=k / N,
        num_iterations_trl=max(1, math.ceil(k / N - 1e-9)), iterations=iterations,
        per_iteration=expected * (1 / iterations), expected=expected, realized_rho=realized,
        realizable=abs(realized - allocation.rho) <= RHO_TOLERANCE, last_iteration_rows=last,
        setup_fingerprint=workload.fingerprint(allocation),
        setup=workload.setup if allocation.model is None else replace(workload.setup, model=allocation.model))


def min_prompts(workload: Workload, group_size: int) -> int:
    """Fewest prompts per iteration a plan at ``group_size`` may run:
    ``ceil(min_batch_share × prompts)`` of the workload's ``rollouts_per_iteration // G``."""
    prompts = max(1, workload.rollouts_per_iteration // group_size)
    return max(1, math.ceil(workload.min_batch_share * prompts - 1e-9))


def _merit(use: float, rho_error: float, realizable: bool = True) -> tuple:
    """How :func:`make_plan` ranks plans (larger is better): realizable first; then those
    spending at least ``1 - MAX_UNUSED_SHARE`` of the budget, by how near ρ they come (a cut
    last iteration lowers ρ: with the budget spent, ρ is set by the number of iterations);
    the others by their use."""
    full = use >= 1 - MAX_UNUSED_SHARE
    return (realizable, full, -rho_error if full else use)


def batch_candidates(budget_flops: float, allocation: Allocation, workload: Workload) -> list[int]:
    """Prompts per iteration below the workload's that :func:`make_plan` prices: the
    :data:`REBATCH_CANDIDATES` of ``min_prompts .. prompts - 1`` estimated best by
    :func:`_merit`, the best first (the larger batch among equals).

    The estimate takes an iteration's cost proportional to its prompts (the first iteration's
    at the workload's batch, per prompt) with the share ρ of it learning: the whole iterations
    that fit, plus the rest of the budget when a last iteration cut to :data:`LAST_ROWS_SHARE`
    of its rows would fit in it (its search and reward, the share 1 - ρ of a whole iteration,
    then lower the realized ρ)."""
    G = allocation.group_size
    p0 = max(1, workload.rollouts_per_iteration // G)
    k = rows_for_rho(workload, allocation)
    per_prompt = iteration_flops(workload, allocation, rows_schedule(k, 0)).executed.total_flops / p0
    rho = allocation.rho

    def estimate(p: int) -> tuple:
        cost = per_prompt * p
        n = math.floor(budget_flops / cost)
        left = budget_flops - n * cost
        if n == 0:
            return (False, False, 0.0)
        if left < (1 - LAST_ROWS_SHARE * rho) * cost:  # no cut iteration fits
            return _merit(n * cost / budget_flops, 0.0)
        return _merit(1.0, abs(1 - (n + 1) * (1 - rho) * cost / budget_flops - rho))

    est = {p: estimate(p) for p in range(min_prompts(workload, G), p0)}
    return sorted((p for p in est if est[p][0]), key=lambda p: (est[p], p), reverse=True)[:REBATCH_CANDIDATES]


def make_plan(budget_flops: float, allocation: Allocation, workload: Workload) -> TrialPlan:
    """The training plan ``budget_flops`` buys at ``allocation``.

    At the workload's batch: the most whole iterations that fit, and a last one cut to the
    most rows that fit (at least :func:`min_last_rows` of its schedule). When that plan leaves
    more than :data:`MAX_UNUSED_SHARE` of the budget unspent, misses ρ by more than half of
    :data:`RHO_TOLERANCE`, or does not exist (the budget is below one iteration), the plans at
    the smaller batches of :func:`batch_candidates` are priced too, and the best by
    :func:`_merit` is returned (realizable; then, among those that spend the budget, the one
    nearest ρ, else the one that spends the most; the larger batch among equals). The driver
    runs the plan's batch and cuts its last iteration by the same rule.

    Returns:
        a :class:`TrialPlan` whose expected executed total is at most ``budget_flops``.

    Raises:
        ConfigError: a bad budget or allocation (message names the field).
        InfeasiblePlan: the budget is below one iteration at the smallest batch allowed
            (:func:`min_prompts`); ``min_budget_flops`` says how much the smallest feasible
            plan of this allocation needs (:func:`min_budget`).
    """
    budget = check_budget(budget_flops)

    def merit(plan: TrialPlan) -> tuple:
        return _merit(plan.budget_utilization, abs(plan.realized_rho - allocation.rho), plan.realizable)

    try:
        best: TrialPlan | None = _plan_at(budget, allocation, workload)
    except InfeasiblePlan as e:
        best, refusal = None, e
    if best is not None and merit(best) >= _merit(1 - MAX_UNUSED_SHARE, RHO_TOLERANCE / 2):
        return best  # spends the budget and realizes rho closely: the workload's batch
    candidates = batch_candidates(budget, allocation, workload)
    least = min_prompts(workload, allocation.group_size)
    if best is None and least < max(1, workload.rollouts_per_iteration // allocation.group_size) \
            and least not in candidates:
        candidates.append(least)  # the cheapest iteration, when the estimates say none fits
    for prompts in candidates:
        try:
            plan = _plan_at(budget, allocation, batch_workload(workload, prompts * allocation.group_size))
        except InfeasiblePlan:
            continue
        if best is None or merit(plan) > merit(best):
            best = plan
    if best is None:
        G = allocation.group_size
        need = min_budget(allocation, workload)
        raise InfeasiblePlan(
            f"budget_flops={budget:.3g}: too small for one GRPO iteration at rho={allocation.rho}, "
            f"group_size={G}, reward={allocation.reward} ({min_prompts(workload, G) * G} rollouts, "
            f"the smallest batch allowed); the smallest feasible plan needs {need:.3g} FLOPs",
            min_budget_flops=need) from refusal
    return best


def min_budget(allocation: Allocation, workload: Workload) -> int:
    """Executed FLOPs of the first iteration at ``allocation`` and the smallest batch a plan
    may run (:func:`min_prompts`): the smallest feasible budget."""
    w = batch_workload(workload, min_prompts(workload, allocation.group_size) * allocation.group_size)
    k = rows_for_rho(w, allocation)
    return iteration_flops(w, allocation, rows_schedule(k, 0)).executed.total_flops


__all__ = ["LAST_ROWS_SHARE", "MAX_UNUSED_SHARE", "REBATCH_CANDIDATES", "batch_candidates", "batch_workload",
           "make_plan", "min_budget", "min_last_rows", "min_prompts", "plan_workload"]
