"""Plans for huge budgets answer at once and match the old walk-down and a brute-force sum;
sizes that would take unbounded memory are refused with one line."""

import math
import time

import pytest

from allocopt.plan.allocation import (
    Allocation,
    Workload,
    expected_flops,
    iteration_flops,
    make_plan,
    max_iterations,
    rows_for_rho,
    rows_schedule,
)
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.setup import MAX_ROLLOUTS_PER_ITERATION, TrainingSetup

# target_steps off: these tests are about whole iterations at one batch, whatever the budget
W = Workload(policy=ModelShape.preset("Qwen/Qwen2.5-0.5B"), setup=TrainingSetup(target_steps=None))
ALLOCS = [Allocation(rho=0.3, group_size=4, reward="sparse"),
          Allocation(rho=0.55, group_size=8, reward="prm"),  # k > N: a second pass + old log-probs
          Allocation(rho=0.8, group_size=16, reward="dense")]


def walk_down(budget, alloc, w):
    """The planner before bisection: start one above the mean-cost estimate, walk down."""
    k = rows_for_rho(w, alloc)
    mean = expected_flops(w, alloc, k, 64).executed.total_flops / 64
    n = int(budget // mean) + 1
    while n > 0 and expected_flops(w, alloc, k, n).executed.total_flops > budget:
        n -= 1
    return n


def brute_force(budget, alloc, w):
    """Add iterations one at a time at their scheduled row counts until the next one would
    pass the budget (no telescoping sum, no bisection)."""
    k = rows_for_rho(w, alloc)
    spent, n = 0, 0
    while True:
        cost = iteration_flops(w, alloc, rows_schedule(k, n)).executed.total_flops
        if spent + cost > budget:
            return n
        spent, n = spent + cost, n + 1


@pytest.mark.parametrize("alloc", ALLOCS, ids=lambda a: f"{a.reward}-G{a.group_size}")
def test_iterations_match_walk_down_and_brute_force_on_a_grid(alloc):
    first = iteration_flops(W, alloc, rows_schedule(rows_for_rho(W, alloc), 0)).executed.total_flops
    full_batch = W.with_setup(min_batch_share=1.0)  # no smaller batch: whole iterations at W's
    k = rows_for_rho(W, alloc)
    for mult in (1, 1.5, 2, 3.7, 10, 33.3, 100.01, 257, 999.9):
        budget = first * mult
        got = max_iterations(budget, W, alloc, k)
        assert got == walk_down(budget, alloc, W) == brute_force(budget, alloc, W), mult
        plan = make_plan(budget, alloc, full_batch)  # its whole iterations, then maybe a cut one
        assert plan.iterations - (plan.last_iteration_rows is not None) == got


@pytest.mark.parametrize("budget", [1e22, 1e25, 1e30, 1e100, 1e300])
def test_huge_budget_answers_at_once_and_is_the_largest_that_fits(budget):
    alloc = ALLOCS[1]
    t = time.perf_counter()
    p = make_plan(budget, alloc, W)
    assert time.perf_counter() - t < 5
    k = p.rows_trained_per_iteration
    assert p.rollouts_per_iteration == W.setup.rollouts_per_iteration  # the budget is spent: no smaller batch
    whole = p.iterations - (p.last_iteration_rows is not None)
    assert expected_flops(W, alloc, k, whole).executed.total_flops <= budget
    assert expected_flops(W, alloc, k, whole + 1).executed.total_flops > budget
    assert p.expected.executed.total_flops <= budget
    # the mean cost per iteration, times the iterations, is the budget to within one iteration
    mean = p.per_iteration.executed.total_flops
    assert math.isclose(p.iterations * mean, budget, rel_tol=2 / p.iterations + 1e-9)


@pytest.mark.parametrize("g", [MAX_ROLLOUTS_PER_ITERATION + 1, 10**9])
def test_group_size_above_the_bound_is_refused(g):
    with pytest.raises(ConfigError, match=rf"group_size={g}: must be at most {MAX_ROLLOUTS_PER_ITERATION}"):
        Allocation(rho=0.5, group_size=g, reward="sparse")


@pytest.mark.parametrize("n", [1, MAX_ROLLOUTS_PER_ITERATION + 1, 2.5, True])
def test_rollouts_outside_the_bounds_are_refused(n):
    with pytest.raises(ConfigError, match=r"rollouts_per_iteration=.*: must be an integer from 2 to"):
        W.with_setup(rollouts_per_iteration=n)
