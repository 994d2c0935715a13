"""The one translator from Optuna trials to the tuner's plain data (allocopt.study.observe):
which trials are observations and runs, at which allocation, value, budget fraction, reward
share and evaluation variance; every expected value written out by hand."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from allocopt.plan.allocation import Allocation
from allocopt.race import Budgets, Run
from allocopt.spec import SearchSpace
from allocopt.study import observe

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
DISTS = {"rho": FloatDistribution(0.2, 0.9), "group_size": CategoricalDistribution([4, 8]),
         "reward": CategoricalDistribution(["sparse", "prm"]),
         "fidelity": CategoricalDistribution(["pilot", "full"])}
NAN = math.nan


def _trial(rho, g, reward, fidelity, optuna_state=TrialState.COMPLETE, value=None, **attrs):
    return create_trial(params={"rho": rho, "group_size": g, "reward": reward, "fidelity": fidelity},
                        distributions=DISTS, state=optuna_state, value=value,
                        user_attrs={"fidelity": fidelity, **attrs})


def _study(direction="maximize"):
    """Trials 0-6 and a queued one (7): a pilot; an infeasible plan; a failure; an interrupted
    run; a running trial; a run told at the rho it spent (no budget attribute: its fidelity's);
    a run without recorded targets; a trial waiting in the queue."""
    st = optuna.create_study(direction=direction)
    ok = {"state": "COMPLETE"}
    st.add_trial(_trial(0.3, 4, "prm", "pilot", value=0.3, budget_flops=1e18, targets={"pass_at_1": 0.3},
                        metrics={"reward_flops": 2.0, "total_flops": 8.0, "pass_at_1_variance": 0.0021}, **ok))
    st.add_trial(_trial(0.5, 8, "sparse", "full", value=0.0, budget_flops=1e19, state="INFEASIBLE"))
    st.add_trial(_trial(0.6, 8, "sparse", "full", optuna_state=TrialState.FAIL, budget_flops=1e19, error="boom"))
    st.add_trial(_trial(0.7, 8, "sparse", "full", optuna_state=TrialState.FAIL, budget_flops=1e19, error="interrupted"))
    st.add_trial(_trial(0.8, 4, "prm", "full", optuna_state=TrialState.RUNNING, budget_flops=1e19))
    st.add_trial(_trial(0.55, 8, "prm", "full", value=0.4, source="tell", targets={"pass_at_1": 0.4},
                        metrics={"rho": 0.7, "reward_flops": 0.0, "total_flops": 5.0, "pass_at_1_variance": -1.0},
                        **ok))
    st.add_trial(_trial(0.45, 4, "sparse", "full", value=0.2, budget_flops=1e19, **ok))
    st.enqueue_trial({"rho": 0.25, "group_size": 4, "reward": "sparse", "fidelity": "full"})
    return st


def test_observations_of_the_objective():
    st = _study()
    got = observe.observations(st.get_trials(deepcopy=False), SPACE, Budgets(1e19, 0.1), objective_key="pass_at_1")
    # the infeasible plan (1), the failures (2, 3), the running and the queued trial are none;
    # the told run sits at the rho it spent (0.7, asked 0.55), at its fidelity's budget
    assert [(o.allocation, o.budget_flops, o.fidelity) for o in got] == [
        (Allocation(0.3, 4, "prm"), 1e18, "pilot"), (Allocation(0.7, 8, "prm"), 1e19, "full"),
        (Allocation(0.45, 4, "sparse"), 1e19, "full")]
    _same(got, [(0, 0.3, 0.1, 0.25, 0.0021), (5, 0.4, 1.0, 0.0, NAN), (6, 0.2, 1.0, NAN, NAN)])


def _same(got, want):
    """NaN != NaN: compare field by field, NaN matching NaN."""
    rows = [(o.number, o.value, o.budget_fraction, o.reward_share, o.variance) for o in got]
    assert len(rows) == len(want)
    for r, w in zip(rows, want):
        assert all(math.isnan(a) if isinstance(b, float) and math.isnan(b) else a == b for a, b in zip(r, w)), (r, w)


def test_observations_of_a_target_and_a_minimized_objective():
    st = _study()
    by_target = observe.observations(st.get_trials(deepcopy=False), SPACE, Budgets(1e19, 0.1), key="pass_at_1")
    assert [o.number for o in by_target] == [0, 5]  # trial 6 recorded no targets
    assert by_target[0].variance == 0.0021 and math.isnan(by_target[1].variance)  # a negative one is no variance
    low = _study("minimize")
    assert [o.value for o in observe.observations(low.get_trials(deepcopy=False), SPACE, Budgets(1e19, 0.1),
                                                  sign=-1.0)] == [-0.3, -0.4, -0.2]


def test_budget_fractions_per_allocation_and_unpriced():
    """A time budget prices each allocation's full budget: 1e18 + 1e19 x rho here, so the pilot
    at rho 0.3 (1e18 FLOPs) is at 1e18 / 4e18 = 0.25 of its own; without the workload to price
    it, a run sits at its fidelity's fraction."""
    st = _study()
    trials = st.get_trials(deepcopy=False)
    priced = observe.observations(trials, SPACE, Budgets(lambda a: 1e18 + 1e19 * a.rho, 0.1))
    # the told run's budget: its fidelity's share of the asked allocation's (rho 0.55: 6.5e18)
    assert [(o.budget_flops, o.budget_fraction) for o in priced] == [
        (1e18, 0.25), (pytest.approx(6.5e18), pytest.approx(1.0)), (1e19, pytest.approx(1e19 / 5.5e18))]
    unpriced = observe.observations(trials, SPACE, Budgets(None, 0.1))
    assert [o.budget_fraction for o in unpriced] == [0.1, 1.0, 1.0]


def test_runs_are_every_trial_that_ran_runs_or_waits():
    st = _study()
    runs = observe.runs(st.get_trials(deepcopy=False), SPACE)
    assert runs == [Run(Allocation(0.3, 4, "prm"), "pilot"), Run(Allocation(0.5, 8, "sparse"), "full"),
                    Run(Allocation(0.6, 8, "sparse"), "full"), Run(Allocation(0.8, 4, "prm"), "full", pending=True),
                    Run(Allocation(0.55, 8, "prm"), "full"), Run(Allocation(0.45, 4, "sparse"), "full"),
                    Run(Allocation(0.25, 4, "sparse"), "full", pending=True)]  # interrupted (3): none
    assert len(observe.runs(st.get_trials(deepcopy=False), SPACE, skip=4)) == 6
