"""Planner: plans never exceed the budget, realize rho, and say what is infeasible."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocopt.allocation import (
    REWARDS,
    RHO_TOLERANCE,
    Allocation,
    InfeasiblePlan,
    Workload,
    iteration_flops,
    make_plan,
    min_budget,
    rows_for_rho,
    rows_schedule,
)
from allocopt.flops import ConfigError, ModelShape
from allocopt.setup import TrainingSetup

MODELS = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"]
ENGINES = ["trl-vllm", "trl-gpu", "trl-cpu"]


@st.composite
def cases(draw):
    alloc = Allocation(rho=draw(st.floats(0.02, 0.98)), group_size=draw(st.integers(2, 32)),
                       reward=draw(st.sampled_from(REWARDS)))
    w = Workload(ModelShape.preset(draw(st.sampled_from(MODELS))), TrainingSetup(
        rollouts_per_iteration=draw(st.integers(16, 256)),
        prompt_tokens=draw(st.floats(8, 600)), completion_tokens=draw(st.floats(8, 2000)),
        beta=draw(st.sampled_from([0.0, 0.04])), engine=draw(st.sampled_from(ENGINES))))
    budget = 10 ** draw(st.floats(13, 22))
    return alloc, w, budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_plan_never_exceeds_budget_and_realizes_rho(case):
    alloc, w, budget = case
    try:
        p = make_plan(budget, alloc, w)
    except InfeasiblePlan as e:
        assert e.min_budget_flops > budget
        assert e.min_budget_flops == min_budget(alloc, w)
        return
    total = p.expected.executed.total_flops
    assert total <= budget
    # one more iteration would not fit: the plan uses the budget as far as whole iterations go
    k = p.rows_trained_per_iteration
    following = iteration_flops(w, alloc, rows_schedule(k, p.iterations)).executed.total_flops
    assert total + following > budget
    # rho recomputed from the breakdown's parts
    e = p.per_iteration.executed
    assert p.realized_rho == pytest.approx(e.learning_flops / (e.search_flops + e.learning_flops + e.reward_flops))
    lo = iteration_flops(w, alloc, 0).executed.rho  # no row trained
    if p.realizable:
        assert abs(p.realized_rho - alloc.rho) <= RHO_TOLERANCE
    else:  # below what training on no row at all costs (a reference pass, say), above what
        # the most passes the planner allows (64) reach, or too few iterations to realize a
        # fractional rows-trained schedule (1 iteration trains floor(k))
        hi = iteration_flops(w, alloc, 64 * p.rollouts_per_iteration).executed.rho
        assert alloc.rho < lo + RHO_TOLERANCE or alloc.rho > hi - RHO_TOLERANCE or p.iterations < 200
    # the schedule trains floor(I*k) rows in the first I iterations
    k = p.rows_trained_per_iteration
    assert sum(rows_schedule(k, i) for i in range(p.iterations if p.iterations < 500 else 500)) \
        == math.floor(min(p.iterations, 500) * k + 1e-9)


@settings(max_examples=30, deadline=None)
@given(rho=st.floats(0.2, 0.9), G=st.sampled_from([4, 8, 16]), reward=st.sampled_from(REWARDS))
def test_rho_realizable_in_paper_range_at_real_size(rho, G, reward):
    """Qwen2.5-1.5B, 64 rollouts of 103 + 304 tokens: every rho in [0.2, 0.9] is realizable,
    also across the jump where a second pass adds an old-policy log-prob pass (vLLM's
    importance-sampling correction off: with it on, that pass runs on every iteration and
    puts a floor under rho, tests/test_engines.py)."""
    w = Workload(ModelShape.preset("Qwen/Qwen2.5-1.5B"), TrainingSetup(importance_sampling_correction=False))
    p = make_plan(1e19, Allocation(rho, G, reward), w)
    assert p.realizable and abs(p.realized_rho - rho) <= RHO_TOLERANCE


def test_more_rows_trained_raise_rho():
    w = Workload(policy=ModelShape.preset("Qwen/Qwen2.5-1.5B"))
    a = Allocation(0.5, 8, "prm")
    rhos = [iteration_flops(w, a, k).executed.rho for k in (8, 32, 64, 65, 128, 256)]
    assert rhos == sorted(rhos) and len(set(rhos)) == len(rhos)


def test_prm_costs_more_than_rule_based():
    w = Workload(policy=ModelShape.preset("Qwen/Qwen2.5-1.5B"))
    sparse = make_plan(1e19, Allocation(0.5, 8, "sparse"), w)
    prm = make_plan(1e19, Allocation(0.5, 8, "prm"), w)
    assert sparse.expected.executed.reward_flops == 0
    assert prm.expected.executed.reward_flops > 0.3 * prm.expected.executed.total_flops
    assert prm.iterations < sparse.iterations


def test_infeasible_budget_names_minimum():
    w = Workload(policy=ModelShape.preset("Qwen/Qwen2.5-1.5B"))
    a = Allocation(0.5, 8, "sparse")
    need = min_budget(a, w)
    with pytest.raises(InfeasiblePlan, match="smallest feasible plan needs"):
        make_plan(need - 1, a, w)
    assert make_plan(need, a, w).iterations == 1


@pytest.mark.parametrize("budget", [-1, 0, math.nan, math.inf, "abc", None])
def test_bad_budget(budget):
    with pytest.raises(ConfigError, match="budget_flops"):
        make_plan(budget, Allocation(0.5, 8, "sparse"), Workload(policy=ModelShape.preset("qwen2.5-0.5b")))


@pytest.mark.parametrize("kw,field", [
    (dict(rho=0.0), "rho"), (dict(rho=1.0), "rho"), (dict(rho=math.nan), "rho"), (dict(rho=-0.2), "rho"),
    (dict(group_size=1), "group_size"), (dict(group_size=2.5), "group_size"),
    (dict(reward="foo"), "reward"),
])
def test_bad_allocation(kw, field):
    base = dict(rho=0.5, group_size=8, reward="sparse")
    with pytest.raises(ConfigError, match=field):
        Allocation(**{**base, **kw})


def test_rows_for_rho_by_hand():
    """With rule-based reward and no reference pass, rho(k) = k*T / (S + k*T) for k <= N
    (T: learning FLOPs per row trained): solve for k by hand and compare. (No old-policy
    pass: vLLM's importance-sampling correction off.)"""
    w = Workload(ModelShape.preset("Qwen/Qwen2.5-1.5B"),
                 TrainingSetup(engine="trl-vllm", importance_sampling_correction=False))
    a = Allocation(0.4, 8, "sparse")
    N = 64
    one = iteration_flops(w, a, N).executed  # mu = 1
    S = one.search_flops
    T = one.learning_flops / N
    k_exact = 0.4 * S / (0.6 * T)
    assert rows_for_rho(w, a) == pytest.approx(k_exact, rel=1e-6)


@pytest.mark.parametrize("k,expected", [(2.5, [2, 3, 2, 3]), (0.25, [0, 0, 0, 1]), (3.0, [3, 3, 3, 3]),
                                        (1 / 3, [0, 0, 1, 0, 0, 1])])
def test_rows_schedule(k, expected):
    assert [rows_schedule(k, i) for i in range(len(expected))] == expected
