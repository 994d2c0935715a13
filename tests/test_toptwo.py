"""Top-two Thompson sampling (allocopt.tuner.toptwo) and the tuner's ``top-two`` acquisition."""

import numpy as np
import pytest
from scipy.stats import norm

from allocopt.plan.allocation import Allocation
from allocopt.tuner.decide import Observed, Tuner, TunerSpace
from allocopt.tuner.toptwo import TRIES, top_two


def _picks(weights, means, covs, n=4000, **kw):
    rng = np.random.default_rng(0)
    return np.bincount([top_two(np.asarray(weights), np.asarray(means), np.asarray(covs), rng, **kw)
                        for _ in range(n)], minlength=np.asarray(means).shape[1]) / n


def test_two_live_cells_are_run_half_the_time_each():
    # cell 0 is out of the race; whichever of 1 and 2 leads, half the time the other is the
    # challenger: P(run 2) = 0.5 P(lead 2) + 0.5 P(lead 1) = 0.5 whatever P(lead 2) is
    share = _picks([1.0], [[0.0, 5.0, 5.3]], [np.eye(3)])
    assert share[0] == 0.0
    assert share[2] == pytest.approx(0.5, abs=0.03)


def test_beta_one_runs_the_leader_with_its_posterior_probability():
    # two independent cells, difference N(1, 2): P(cell 1 leads) = Phi(1 / sqrt 2) = 0.7602
    share = _picks([1.0], [[0.0, 1.0]], [np.eye(2)], beta=1.0)
    assert share[1] == pytest.approx(0.7602, abs=0.02)


def test_a_draw_picks_the_mixture_component_by_weight():
    # component 0 (weight 1/4) is sure cell 0 is best, component 1 (3/4) that cell 1 is
    tight = np.eye(2) * 1e-8
    share = _picks([0.25, 0.75], [[1.0, 0.0], [0.0, 1.0]], [tight, tight], beta=1.0)
    assert share[0] == pytest.approx(0.25, abs=0.02)


def test_a_sure_leader_is_run_when_no_challenger_turns_up():
    share = _picks([1.0], [[0.0, 100.0]], [np.eye(2) * 1e-6], n=200)
    assert share[1] == 1.0


def test_cells_not_allowed_are_never_run():
    share = _picks([1.0], [[0.0, 5.0, 5.3]], [np.eye(3)], allowed=[True, True, False])
    assert share[2] == 0.0
    # cell 0 is the challenger only when one of TRIES draws puts it above cell 1 (a difference
    # N(5, 2) below 0); else the leader is run after all
    p = norm.cdf(-5.0 / np.sqrt(2.0))
    assert share[0] == pytest.approx(0.5 * (1 - (1 - p) ** TRIES), abs=0.004)
    with pytest.raises(ValueError, match="no cell"):
        top_two(np.ones(1), np.zeros((1, 2)), np.eye(2)[None], np.random.default_rng(0), allowed=[False, False])


def _space(pilots=()):
    return TunerSpace((0.1, 0.9), (4, 8), ("sparse", "dense"), pilot_fractions=pilots, rho_levels=5)


def _observed():
    return [Observed(Allocation(0.3, 4, "sparse"), 1.0, 0.40), Observed(Allocation(0.7, 8, "dense"), 1.0, 0.55),
            Observed(Allocation(0.5, 8, "dense"), 0.1, 0.50)]


def test_the_tuner_draws_full_runs_only_and_reproducibly():
    tuner = Tuner(_space(pilots=(0.1,)), acquisition="top-two")
    runs = [tuner.next_run(_observed(), seed=(3, k)) for k in range(40)]
    assert all(r.fraction == 1.0 for r in runs)
    assert len({r.allocation for r in runs}) > 1  # draws, not one argmax
    assert [tuner.next_run(_observed(), seed=(3, k)) for k in range(40)] == runs
    # the knowledge gradient, by contrast, ignores the seed
    kg = Tuner(_space(pilots=(0.1,)))
    assert kg.next_run(_observed(), seed=1) == kg.next_run(_observed(), seed=2)


def test_an_unknown_acquisition_is_refused():
    with pytest.raises(ValueError, match="acquisition='ucb': allowed: kg, top-two"):
        Tuner(_space(), acquisition="ucb")
