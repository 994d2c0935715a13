"""Planner: plans never exceed the budget, realize rho, and say what is infeasible."""

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocopt.plan.allocation import (
    LAST_ROWS_SHARE,
    MAX_UNUSED_SHARE,
    REWARDS,
    RHO_TOLERANCE,
    Allocation,
    InfeasiblePlan,
    Workload,
    batch_workload,
    expected_flops,
    iteration_flops,
    make_plan,
    min_budget,
    min_last_rows,
    min_prompts,
    plan_workload,
    rows_for_rho,
    rows_schedule,
)
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.setup import TrainingSetup

MODELS = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-7B"]
ENGINES = ["trl-vllm", "trl-gpu", "trl-cpu"]


@st.composite
def cases(draw):
    alloc = Allocation(rho=draw(st.floats(0.02, 0.98)), group_size=draw(st.integers(2, 32)),
                       reward=draw(st.sampled_from(REWARDS)))
    w = Workload(ModelShape.preset(draw(st.sampled_from(MODELS))), TrainingSetup(
        rollouts_per_iteration=draw(st.integers(16, 256)),
        prompt_tokens=draw(st.floats(8, 600)), completion_tokens=draw(st.floats(8, 2000)),
        beta=draw(st.sampled_from([0.0, 0.04])), engine=draw(st.sampled_from(ENGINES)),
        min_batch_share=draw(st.sampled_from([0.5, 1.0, 0.25]))))
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
    # a batch the workload allows, priced as the plan says
    G = alloc.group_size
    assert min_prompts(w, G) <= p.prompts_per_iteration <= max(1, w.setup.largest_rollouts_per_iteration // G)
    assert p.rollouts_per_iteration == p.prompts_per_iteration * G
    pw = plan_workload(w, p)
    k = p.rows_trained_per_iteration
    assert p.expected == expected_flops(pw, alloc, k, p.iterations, p.last_iteration_rows)
    cost = lambda rows: iteration_flops(pw, alloc, rows).executed.total_flops  # noqa: E731
    if p.last_iteration_rows is None:
        # the next iteration would not fit, not even cut to the fewest rows allowed
        assert total + cost(min_last_rows(rows_schedule(k, p.iterations))) > budget
    else:
        # the last iteration is cut to the most rows that fit, no fewer than allowed
        r, scheduled = p.last_iteration_rows, rows_schedule(k, p.iterations - 1)
        assert p.iterations >= 2 and min_last_rows(scheduled) <= r < scheduled
        assert total - cost(r) + cost(r + 1) > budget
    # a smaller batch only when the workload's leaves budget unspent or misses rho
    if p.rollouts_per_iteration < max(1, w.setup.rollouts_per_iteration // G) * G:
        try:
            full = make_plan(budget, alloc, w.with_setup(min_batch_share=1.0))
        except InfeasiblePlan:
            full = None
        assert full is None or not full.realizable \
            or full.budget_utilization < 1 - MAX_UNUSED_SHARE \
            or abs(full.realized_rho - alloc.rho) > RHO_TOLERANCE / 2
        assert full is None or p.realizable >= full.realizable
        if full is not None and p.realizable == full.realizable \
                and full.budget_utilization < 1 - MAX_UNUSED_SHARE:
            assert p.budget_utilization >= full.budget_utilization
    # rho recomputed from the breakdown's parts
    e = p.per_iteration.executed
    assert p.realized_rho == pytest.approx(e.learning_flops / (e.search_flops + e.learning_flops + e.reward_flops))
    lo = iteration_flops(pw, alloc, 0).executed.rho  # no row trained
    if p.realizable:
        assert abs(p.realized_rho - alloc.rho) <= RHO_TOLERANCE
    else:  # below what training on no row at all costs (a reference pass, say), above what
        # the most passes the planner allows (64) reach, or too few iterations to realize a
        # fractional rows-trained schedule (1 iteration trains floor(k))
        hi = iteration_flops(pw, alloc, 64 * p.rollouts_per_iteration).executed.rho
        assert alloc.rho < lo + RHO_TOLERANCE or alloc.rho > hi - RHO_TOLERANCE or p.iterations < 200
    # the schedule trains floor(I*k) rows in the first I iterations
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
    (dict(reward=""), "reward"), (dict(reward=3), "reward"),
])
def test_bad_allocation(kw, field):
    base = dict(rho=0.5, group_size=8, reward="sparse")
    with pytest.raises(ConfigError, match=field):
        Allocation(**{**base, **kw})


def test_a_reward_system_the_workload_cannot_price_is_refused_when_planned():
    w = Workload(policy=ModelShape.preset("qwen2.5-0.5b"))
    with pytest.raises(ConfigError, match=r"reward='foo': no price .*\[rewards\]"):
        make_plan(1e18, Allocation(0.5, 8, "foo"), w)


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


# ------------------------------------------------------------- budget use: cut and batch
LINEAR = Workload(ModelShape.preset("Qwen/Qwen2.5-0.5B"), TrainingSetup(
    engine="trl-vllm", rollouts_per_iteration=64, prompt_tokens=100, completion_tokens=300))
"""No padding, no old-policy or reference pass below two passes: an iteration's cost is
search S + rows × t (t: one row's forward + backward), and S and t scale with the prompts."""


def test_an_iterations_cost_is_proportional_to_its_prompts_by_hand():
    """The premise of the hand-computed plans below: with 16 rows trained per 16 prompts x
    G = 4, search and learning at 13 prompts are 13/16 of those at 16 (the prompts' prefill is
    shared within a group, each completion decodes alone); one row trained costs the same."""
    a = Allocation(0.1, 4, "sparse")
    big, small = iteration_flops(LINEAR, a, 16).executed, \
        iteration_flops(batch_workload(LINEAR, 52), a, 13).executed
    assert small.search_flops * 16 == big.search_flops * 13
    assert small.learning_flops * 16 == big.learning_flops * 13
    t = iteration_flops(LINEAR, a, 17).executed.learning_flops - big.learning_flops
    assert t * 16 == big.learning_flops  # learning = rows x one row's cost
    assert iteration_flops(LINEAR, a, 1).executed.learning_flops == t


def test_the_batch_whose_whole_iterations_fill_the_budget_by_hand():
    """rho 0.1, G 4, 16 prompts (min_batch_share 0.5: down to 8). The budget is exactly 3
    iterations at 13 prompts, 39 prompt-units with an iteration at p prompts costing p units.
    By hand, whole iterations use: 16 -> 2 (32/39 = 82%), 15 -> 2 (77%), 14 -> 2 (72%),
    13 -> 3 (100%), 12 -> 3 (92%), 11 -> 3 (85%), 10 -> 3 (77%), 9 -> 4 (92%), 8 -> 4 (82%); a
    last iteration cut to half its rows still costs 0.95 of a whole one (search is 0.9 of it),
    more than any of them leaves (16: 7/16 = 0.44, ..., 10: 0.9, 8: 0.875). So 13 prompts."""
    a = Allocation(0.1, 4, "sparse")
    w13 = batch_workload(LINEAR, 52)
    budget = expected_flops(w13, a, rows_for_rho(w13, a), 3).executed.total_flops
    plan = make_plan(budget, a, LINEAR)
    assert (plan.prompts_per_iteration, plan.rollouts_per_iteration, plan.iterations) == (13, 52, 3)
    assert plan.last_iteration_rows is None and plan.budget_utilization == 1.0
    assert plan.realizable and plan.expected == expected_flops(w13, a, plan.rows_trained_per_iteration, 3)
    # the workload's own batch: 2 iterations, 32 of 39 units (to within the rows schedules'
    # rounding: 3 iterations train floor(3k) rows, not 3k)
    full = make_plan(budget, a, LINEAR.with_setup(min_batch_share=1.0))
    assert (full.prompts_per_iteration, full.iterations, full.last_iteration_rows) == (16, 2, None)
    assert full.budget_utilization == pytest.approx(32 / 39, rel=5e-3)
    # min_batch_share 0.85 allows 14..16 prompts: 14 and 15 use less than 16 (72%, 77%)
    at_85 = make_plan(budget, a, LINEAR.with_setup(min_batch_share=0.85))
    assert at_85.setup.min_batch_share == 0.85  # the plan carries the set-up it priced
    assert dataclasses.replace(at_85, setup=None) == dataclasses.replace(full, setup=None)


def test_the_last_iteration_is_cut_to_the_rows_that_fit_by_hand():
    """rho 0.6 at the workload's batch (min_batch_share 1): 2 whole iterations, then a budget
    that leaves room for the third's search and r rows: it trains r rows when r is at least
    half its schedule, and is left out below that."""
    w = LINEAR.with_setup(min_batch_share=1.0)
    a = Allocation(0.6, 4, "sparse")
    k = rows_for_rho(w, a)
    scheduled = rows_schedule(k, 2)
    two = expected_flops(w, a, k, 2).executed.total_flops
    cost = lambda r: iteration_flops(w, a, r).executed.total_flops  # noqa: E731
    least = min_last_rows(scheduled)
    assert least == math.ceil(LAST_ROWS_SHARE * scheduled) and 0 < least < scheduled - 2
    for r in (least, least + 1, scheduled - 1):
        for extra in (0, cost(r + 1) - cost(r) - 1):  # room for r rows, not for r + 1
            plan = make_plan(two + cost(r) + extra, a, w)
            assert (plan.iterations, plan.last_iteration_rows) == (3, r)
            assert plan.expected.executed.total_flops == two + cost(r)
    # one FLOP short of the fewest rows: two whole iterations only
    plan = make_plan(two + cost(least) - 1, a, w)
    assert (plan.iterations, plan.last_iteration_rows) == (2, None)
    # the cut lowers rho by hand: learning (2k + r) t over search 3 S + learning
    cut = make_plan(two + cost(least), a, w)
    S = cost(0)
    t = cost(1) - cost(0)
    rows = math.floor(2 * k + 1e-9) + least
    assert cut.realized_rho == pytest.approx(rows * t / (3 * S + rows * t), rel=1e-12)


def test_a_budget_below_the_full_batch_buys_a_smaller_one():
    """Below one iteration at the workload's batch but above one at the smallest batch allowed:
    a plan at a smaller batch; min_budget is the smallest batch's first iteration."""
    a = Allocation(0.5, 4, "sparse")
    need = min_budget(a, LINEAR)
    half = batch_workload(LINEAR, 32)
    assert need == iteration_flops(half, a, rows_schedule(rows_for_rho(half, a), 0)).executed.total_flops
    one_full = min_budget(a, LINEAR.with_setup(min_batch_share=1.0))
    assert need < one_full
    plan = make_plan((need + one_full) // 2, a, LINEAR)
    assert 8 <= plan.prompts_per_iteration < 16 and plan.iterations == 1
    with pytest.raises(InfeasiblePlan, match="32 rollouts, the smallest batch allowed"):
        make_plan(need - 1, a, LINEAR)


@pytest.mark.parametrize("share", [0, -0.5, 1.5, "half", True, math.nan])
def test_bad_min_batch_share(share):
    with pytest.raises(ConfigError, match="min_batch_share"):
        LINEAR.with_setup(min_batch_share=share)
