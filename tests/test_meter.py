"""allocopt.plan.meter: the runtime FLOP ledger that never lets a run pass its budget (pure, no torch)."""

from __future__ import annotations

import math

import pytest

from allocopt.flops import ComputeBreakdown, FlopAccount
from allocopt.plan.meter import BudgetExhausted, FlopMeter, IterationRecord, largest_fitting


def account(search: int = 0, learning: int = 0, reward: int = 0) -> FlopAccount:
    """An iteration's account: executed FLOPs as given (search 1/4 prefill, 3/4 decode;
    learning 1/3 forward, 2/3 backward), useful FLOPs half of each item (integer math)."""
    def breakdown(div: int) -> ComputeBreakdown:
        s, l, r = search // div, learning // div, reward // div
        return ComputeBreakdown(search={"prefill": s // 4, "decode": s - s // 4},
                                learning={"forward": l // 3, "backward": l - l // 3},
                                reward={"reward_model": r})
    return FlopAccount(useful=breakdown(2), executed=breakdown(1))


# ----------------------------------------------------------------------------- admit
def test_admit_allows_exactly_up_to_the_budget():
    meter = FlopMeter(budget_flops=1000)
    meter.admit(1000)  # spent 0 + 1000 == budget: allowed
    meter.admit(0)
    assert meter.stopped_reason is None
    with pytest.raises(BudgetExhausted):
        meter.admit(1001)
    meter.charge(account(search=200, learning=300, reward=100))  # 600 executed
    assert meter.executed_flops == 600 and meter.remaining_flops == 400
    meter.admit(400)  # 600 + 400 == 1000
    with pytest.raises(BudgetExhausted) as exc:
        meter.admit(401)  # 600 + 401 > 1000
    assert meter.stopped_reason == str(exc.value)
    assert "6.000e+02 spent" in str(exc.value) and "4.010e+02" in str(exc.value) \
        and "1.000e+03" in str(exc.value)
    assert isinstance(exc.value, RuntimeError)


@pytest.mark.parametrize("budget", [1e9, 1234567.5, 7])
@pytest.mark.parametrize("spent", [0, 1, 5, 999_999])
def test_admit_raises_iff_spent_plus_bound_exceeds_budget(budget, spent):
    meter = FlopMeter(budget_flops=budget)
    if spent:
        meter.charge(account(learning=spent))
    for bound in {0, 1, int(budget) - spent - 1, int(budget) - spent, int(budget) - spent + 1,
                  math.ceil(budget) - spent, 10 ** 12}:
        if bound < 0:
            continue
        exceeds = spent + bound > budget
        if exceeds:
            with pytest.raises(BudgetExhausted):
                meter.admit(bound)
        else:
            meter.admit(bound)
    # admit never charges anything
    assert meter.executed_flops == spent


def test_admit_does_not_charge_and_the_ledger_goes_on_after_a_refusal():
    meter = FlopMeter(budget_flops=100)
    with pytest.raises(BudgetExhausted):
        meter.admit(101)
    assert meter.executed_flops == 0 and meter.records == []
    meter.admit(100)
    meter.charge(account(search=100))
    assert meter.utilization == 1.0


# ----------------------------------------------------------------------------- charge
def test_charge_adds_useful_and_executed_by_phase_and_item():
    meter = FlopMeter(budget_flops=10_000)
    first = account(search=400, learning=300, reward=100)
    second = account(search=200, learning=600, reward=0)
    r0 = meter.charge(first, rows_trained=3, reward_mean=0.25, wall_seconds=1.5)
    r1 = meter.charge(second, rows_trained=7)
    assert meter.spent == first + second
    ex, us = meter.spent.executed, meter.spent.useful
    # by hand: executed search 400 + 200, learning 300 + 600, reward 100
    assert (ex.search_flops, ex.learning_flops, ex.reward_flops) == (600, 900, 100)
    assert ex.search == {"prefill": 100 + 50, "decode": 300 + 150}
    assert ex.learning == {"forward": 100 + 200, "backward": 200 + 400}
    assert ex.reward == {"reward_model": 100}
    assert (us.search_flops, us.learning_flops, us.reward_flops) == (300, 450, 50)
    assert meter.executed_flops == 1600
    assert meter.remaining_flops == 8400
    assert meter.utilization == pytest.approx(0.16)
    assert ex.rho == pytest.approx(900 / 1600)
    assert r0 == IterationRecord(iteration=0, rows_trained=3, executed_flops=800,
                                 cumulative_flops=800, reward_mean=0.25, wall_seconds=1.5)
    assert (r1.iteration, r1.rows_trained, r1.executed_flops, r1.cumulative_flops) == (1, 7, 800, 1600)
    assert math.isnan(r1.reward_mean)
    assert meter.records == [r0, r1]


def test_charge_never_refuses_the_ledger_records_an_overrun():
    """Charging is bookkeeping: the guard is :meth:`FlopMeter.admit`, before the work."""
    meter = FlopMeter(budget_flops=100)
    meter.charge(account(learning=150))
    assert meter.executed_flops == 150 and meter.remaining_flops == -50
    assert meter.utilization == 1.5
    with pytest.raises(BudgetExhausted):
        meter.admit(0)


def test_big_numbers_stay_exact():
    meter = FlopMeter(budget_flops=1e21)
    big = account(search=3 * 10 ** 19 + 1, learning=10 ** 19 + 7, reward=12345)
    for _ in range(3):
        meter.charge(big)
    assert meter.executed_flops == 3 * (4 * 10 ** 19 + 8 + 12345)
    assert isinstance(meter.executed_flops, int)


# ----------------------------------------------------------------------------- to_dict
def test_to_dict_keys_and_values():
    meter = FlopMeter(budget_flops=2000)
    meter.charge(account(search=400, learning=300, reward=100))
    meter.add_wall("search", 1.0)
    meter.add_wall("search", 0.5)
    meter.add_wall("learning", 2.0)
    d = meter.to_dict()
    phases = ("search", "learning", "reward")
    items = ("search_decode", "search_prefill", "learning_backward", "learning_forward",
             "reward_reward_model")
    executed = {f"{p}_flops" for p in phases} | {"total_flops", "rho"} | {f"{i}_flops" for i in items}
    expected = (executed | {f"useful_{k}" for k in executed}
                | {"budget_flops", "budget_utilization", "iterations",
                   "search_wall_seconds", "learning_wall_seconds"})
    assert set(d) == expected
    assert d["total_flops"] == 800 and d["useful_total_flops"] == 400
    assert (d["search_flops"], d["learning_flops"], d["reward_flops"]) == (400, 300, 100)
    assert (d["search_prefill_flops"], d["search_decode_flops"]) == (100, 300)
    assert (d["useful_search_prefill_flops"], d["useful_search_decode_flops"]) == (50, 150)
    assert d["rho"] == pytest.approx(300 / 800) and d["useful_rho"] == pytest.approx(150 / 400)
    assert d["budget_flops"] == 2000 and d["budget_utilization"] == pytest.approx(0.4)
    assert d["iterations"] == 1
    assert d["search_wall_seconds"] == 1.5 and d["learning_wall_seconds"] == 2.0
    assert all(isinstance(v, (int, float)) for v in d.values())


def test_empty_meter():
    meter = FlopMeter(budget_flops=10)
    d = meter.to_dict()
    assert d["total_flops"] == 0 and d["iterations"] == 0 and d["budget_utilization"] == 0
    assert math.isnan(d["rho"])
    assert not any(k.endswith("_wall_seconds") for k in d)


def test_timer_adds_wall_time_to_its_phase(monkeypatch):
    clock = iter([10.0, 12.5, 20.0, 20.25])
    monkeypatch.setattr("allocopt.plan.meter.time.perf_counter", lambda: next(clock))
    meter = FlopMeter(budget_flops=1)
    with meter.timer("reward"):
        pass
    with pytest.raises(ValueError):
        with meter.timer("reward"):  # time spent in a block that raises counts too
            raise ValueError("boom")
    assert meter.wall_seconds == {"reward": 2.75}


# ------------------------------------------------------------------ two-stage admission
def test_two_stage_admission_bounds_the_reward_exactly():
    """Stage 1 admits generation + learning on their worst case; stage 2 admits the batch at
    its exact cost (reward included) once generated, replacing the bound; refused, the
    generation already executed is charged (no record) and nothing else."""
    meter = FlopMeter(budget_flops=1000)
    meter.admit(500)  # worst case of search + learning, no reward
    assert meter.admitted_flops == 500
    meter.admit_exact(560)  # exact: more than stage 1 (the reward), within the budget
    assert meter.admitted_flops == 560 and meter.executed_flops == 0
    meter.charge(account(search=100, learning=360, reward=100))  # 560 == what was admitted
    # second iteration: 440 left; stage 1 fits (400), the exact cost (450) does not
    meter.admit(400)
    generation = account(search=90)
    with pytest.raises(BudgetExhausted) as exc:
        meter.admit_exact(450, done=generation)
    assert meter.stopped_reason == str(exc.value) and meter.refused_flops == 450
    assert "5.600e+02 spent + 4.500e+02" in str(exc.value) and "1.000e+03" in str(exc.value)
    assert meter.executed_flops == 560 + 90 <= meter.budget_flops  # the generation is on the ledger
    assert meter.spent.executed.search_flops == 100 + 90 and meter.spent.useful.search_flops == 50 + 45
    assert meter.discarded_flops == 90 and len(meter.records) == 1  # trained on nothing
    assert meter.to_dict()["discarded_flops"] == 90 and meter.to_dict()["iterations"] == 1
    assert meter.admitted_flops == 400  # a refused bound is not admitted


@pytest.mark.parametrize("exact", [0, 1, 439, 440, 441])
def test_admit_exact_raises_iff_spent_plus_exact_exceeds_budget(exact):
    meter = FlopMeter(budget_flops=1000)
    meter.charge(account(learning=560))
    meter.admit(0)
    if 560 + exact > 1000:
        with pytest.raises(BudgetExhausted):
            meter.admit_exact(exact)  # no generation given: nothing charged
        assert meter.executed_flops == 560 and meter.discarded_flops == 0
    else:
        meter.admit_exact(exact)
        assert meter.admitted_flops == exact


# ------------------------------------------------------------------- largest_fitting
def test_largest_fitting_by_hand():
    """An iteration of 1000 FLOPs of search + 7 per row trained, with room 1100: 14 rows cost
    1098 (fit), 15 cost 1105 (do not). A second pass adds a 50-FLOP old-policy pass from row
    11 on: 10 rows cost 1070, 11 cost 1127, so 10. Not even ``lo`` fits: None; ``hi`` fits: hi."""
    affine = lambda r: 1000 + 7 * r  # noqa: E731
    jump = lambda r: 1000 + 7 * r + (50 if r > 10 else 0)  # noqa: E731
    assert largest_fitting(affine, 5, 40, 1100) == 14
    assert largest_fitting(jump, 5, 40, 1100) == 10
    assert largest_fitting(affine, 15, 40, 1100) is None
    assert largest_fitting(affine, 5, 14, 1100) == 14 and largest_fitting(affine, 14, 14, 1100) == 14
    assert largest_fitting(affine, 0, 0, 999) is None
    with pytest.raises(ValueError, match="lo=3 > hi=2"):
        largest_fitting(affine, 3, 2, 1e9)


@pytest.mark.parametrize("room", [999, 1000, 1003, 1500, 4000, 8000, 10**6])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_largest_fitting_agrees_with_a_scan_in_few_calls(room, step):
    """Against a linear scan, for a cost with a jump; at most ~2 log2(range) + 2 calls."""
    calls = []

    def cost(r: int) -> int:
        calls.append(r)
        return 1000 + step * r + (500 if r > 600 else 0) + (r * r) // 997

    lo, hi = 0, 1000
    fits = [r for r in range(lo, hi + 1) if cost(r) <= room]
    calls.clear()
    assert largest_fitting(cost, lo, hi, room) == (max(fits) if fits else None)
    assert len(calls) <= 2 * math.ceil(math.log2(hi - lo)) + 2


def test_meter_largest_fitting_uses_the_room_left():
    meter = FlopMeter(budget_flops=1000)
    meter.charge(account(search=300, learning=200))  # 500 spent, 500 left
    assert meter.largest_fitting(lambda r: 400 + 10 * r, 0, 64) == 10  # 500 fits, 510 does not
    assert meter.largest_fitting(lambda r: 400 + 10 * r, 11, 64) is None
    assert meter.executed_flops == 500 and meter.admitted_flops is None  # admits nothing
