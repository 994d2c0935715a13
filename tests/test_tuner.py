"""The tuner's pure core (allocopt/tuner): the knowledge gradient, the averaged GP, the decisions.

Every value is checked against an independent computation: closed forms, Monte Carlo with a
fixed seed, scipy's multivariate normal, the textbook GP formulas with explicit inverses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from allocopt.plan.allocation import Allocation
from allocopt.tuner.decide import Observed, Run, Tuner, TunerSpace
from allocopt.tuner.kg import kg_per_cost, knowledge_gradient
from allocopt.tuner.model import Data, HyperGrid, Points, kernel, posterior


# ------------------------------------------------------------------ knowledge gradient
def test_kg_of_two_symmetric_cells_is_the_mean_absolute_normal():
    # E[max(Z, -Z)] = E|Z| = sqrt(2/pi); E[max(Z, 0)] = 1/sqrt(2 pi)
    kg = knowledge_gradient(np.zeros(2), np.array([[1.0, -1.0], [1.0, 0.0]]))
    assert kg[0] == pytest.approx(math.sqrt(2 / math.pi), rel=0.01)
    assert kg[1] == pytest.approx(1 / math.sqrt(2 * math.pi), rel=0.01)


def test_kg_matches_monte_carlo_on_random_beliefs():
    rng = np.random.default_rng(7)
    mu = rng.normal(size=6) * 0.3
    b = rng.normal(size=(4, 6))
    z = rng.standard_normal(400_000)
    mc = [(mu[:, None] + row[:, None] * z[None, :]).max(0).mean() - mu.max() for row in b]
    assert knowledge_gradient(mu, b) == pytest.approx(np.asarray(mc), rel=0.02, abs=2e-3)


def test_kg_is_zero_when_a_run_cannot_change_the_order():
    assert knowledge_gradient(np.array([1.0, 0.0]), np.array([[0.3, 0.3]]))[0] == pytest.approx(0.0, abs=1e-6)  # float32 lines


def test_kg_over_a_pool_is_the_rise_of_the_best_mean_among_the_cells_the_answer_may_be():
    """Cells 0 and 1 run (means 0, 0.5), cell 2 not run (mean 5). A run that moves cell 0 by Z: over
    the pool the gain is E[max(Z, 0.5)] - 0.5 = φ(0.5) - 0.5 (1 - Φ(0.5)) (the normal's partial
    expectation, by hand), while over every cell it is nil (cell 2 stays best). A run at cell 2,
    which then may be the answer, gains 5 - 0.5 whatever it shows when it does not move."""
    from scipy.stats import norm

    mu = np.array([0.0, 0.5, 5.0])
    now = np.array([True, True, False])
    b = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    own = np.array([0, 2, -1])  # the third: a pilot at cell 0, which adds no cell
    kg = knowledge_gradient(mu, b, (now, own))
    by_hand = norm.pdf(0.5) - 0.5 * norm.sf(0.5)
    assert kg[0] == pytest.approx(by_hand, rel=0.02)
    assert kg[1] == pytest.approx(4.5, rel=1e-6)
    assert kg[2] == pytest.approx(kg[0])
    assert knowledge_gradient(mu, b)[0] == pytest.approx(0.0, abs=1e-6)


def test_the_tuner_values_runs_by_the_answer_it_gives_when_asked():
    """``kg_pool="answer"``: with one cell run, a replicate there or a run elsewhere is valued by
    the rise of the best mean among the cells run and its own; the one-run gain it reports equals
    the pooled KG read off the public posterior; ``all`` is the default; other values refused."""
    space = TunerSpace((0.2, 0.9), (4,), ("dense", "sparse"), rho_levels=4)
    obs = [Observed(Allocation(space.levels[1], 4, "dense"), 1.0, 0.5, 2.5e-4)]
    tuner = Tuner(space, kg_pool="answer")
    assert Tuner(space).kg_pool == "all"
    targets = tuner.targets(obs)
    post = tuner._posterior(obs, targets, [(a, 1.0) for a in targets], ())
    now = np.asarray([a == obs[0].allocation for a in targets])
    gain = np.zeros(len(targets))
    for w, cc, vc, nc in zip(post.weights, post.cand_cov, post.cand_var, post.cand_noise):
        gain += w * knowledge_gradient(post.mean, cc / np.sqrt(vc + nc)[:, None], (now, np.arange(len(targets))))
    ans = tuner.answer(obs)
    assert ans.allocation == obs[0].allocation
    assert ans.gain_of_one_more_run == pytest.approx(max(gain.max(), 0.0), rel=1e-3)
    assert ans.best_next == targets[int(np.argmax(gain))]
    with pytest.raises(ValueError, match="kg_pool='best': allowed: all, answer"):
        Tuner(space, kg_pool="best")


def test_kg_star_takes_the_best_number_of_repeats_per_cost():
    mu, cov = np.zeros(2), np.array([[1.0, -1.0]])
    var, noise = np.array([1.0]), np.array([8.0])
    score, kg1 = kg_per_cost(mu, cov, var, noise, np.array([0.1]), repeats=(1, 4))
    one = knowledge_gradient(mu, cov / math.sqrt(1 + 8))[0]
    four = knowledge_gradient(mu, cov / math.sqrt(1 + 2))[0]
    assert kg1[0] == pytest.approx(one)
    assert score[0] == pytest.approx(max(one / 0.1, four / 0.4))


# ------------------------------------------------------------------ the averaged GP
def _points(rho, reward=None, group=None, fid=None):
    n = len(rho)
    z = np.zeros(n, dtype=int)
    return Points(z, np.asarray(reward if reward is not None else z), np.asarray(group if group is not None else z),
                  np.asarray(rho, dtype=float), np.asarray(fid if fid is not None else z))


ONE = HyperGrid(signal=(4.0,), lengthscale=(0.3,), reward_corr=(0.5,), group_corr=(0.9,), model_corr=(0.7,),
                pilot_gap=(1.0,), train_noise=(1.0,), rho_bowl=0.0)


def test_posterior_is_the_textbook_gp_at_one_hyperparameter_setting():
    x = _points([0.1, 0.4, 0.4, 0.9], reward=[0, 0, 1, 1], fid=[0, 1, 0, 0])
    y = np.array([0.42, 0.40, 0.47, 0.45])
    ev = np.full(4, 2.5e-4)
    t = _points([0.0, 0.5, 1.0], reward=[0, 1, 1])
    post = posterior(Data(x, y, ev), t, ONE)
    (h,) = post.hypers
    scale = 2.5e-4
    K = kernel(x, x, h, scale) + np.diag(ev * (1 + h[-1]))
    Kinv = np.linalg.inv(K)
    Ktx = kernel(t, x, h, scale)
    mean = y.mean() + Ktx @ Kinv @ (y - y.mean())
    cov = kernel(t, t, h, scale) - Ktx @ Kinv @ Ktx.T
    assert post.means[0] == pytest.approx(mean, rel=1e-7)
    assert post.covs[0] == pytest.approx(cov, rel=1e-6, abs=1e-12)


def test_a_cell_offset_adds_a_term_for_the_same_cell_only_and_lets_replicates_outweigh_neighbours():
    """``cell_offset`` a adds ``s² a [same reward, group and ρ]`` (at any budget fraction) to the
    kernel, written out by hand; with it, the posterior mean of a cell run twice moves towards
    its own runs' mean and away from its neighbour's, against the same data without it."""
    from dataclasses import replace

    grid = replace(ONE, cell_offset=(2.0,))
    x = _points([0.5, 0.5, 0.5, 0.55], reward=[0, 0, 1, 0], fid=[0, 1, 0, 0])
    (h,) = posterior(Data(x, np.array([0.5, 0.4, 0.45, 0.3]), np.full(4, 2.5e-4)), x, grid).hypers
    assert h[8] == 2.0
    s2 = h[0] * 2.5e-4
    rho = np.exp(-0.5 * (x.rho[:, None] - x.rho[None, :]) ** 2 / 0.3 ** 2)
    same_r = x.reward[:, None] == x.reward[None, :]
    pilots = (x.fidelity[:, None] > 0) & (x.fidelity[None, :] > 0)
    same_pilot = pilots & (x.fidelity[:, None] == x.fidelity[None, :])
    same_cell = same_r & (x.rho[:, None] == x.rho[None, :])
    by_hand = s2 * (rho * (0.5 + 0.5 * same_r) * (1 + 1.0 * pilots) + 4.0 + 4.0 * same_pilot + 2.0 * same_cell)
    assert kernel(x, x, h, 2.5e-4) == pytest.approx(by_hand, rel=1e-12)

    runs = _points([0.5, 0.5, 0.55])
    y = np.array([0.50, 0.52, 0.40])
    ev = np.full(3, 2.5e-4)
    cell = _points([0.5])
    without = posterior(Data(runs, y, ev), cell, replace(ONE, train_noise=(0.0,))).mean[0]
    with_it = posterior(Data(runs, y, ev), cell, replace(ONE, train_noise=(0.0,), cell_offset=(2.0,))).mean[0]
    assert without < with_it < 0.51


def test_offsets_per_reward_system_and_group_size_add_a_term_constant_in_rho():
    """``reward_offset`` a and ``group_offset`` b add ``s² (a [r = r'] + b [g = g'])`` to the
    kernel, written out by hand; the posterior is the textbook GP with that kernel (and its
    candidate variance the kernel's diagonal); a run of reward system 0 at ρ 0 then moves that
    system's mean at ρ 1, which the ρ kernel alone (ℓ 0.3: e^-5.6) barely links, more than the
    other system's."""
    from dataclasses import replace

    grid = replace(ONE, reward_offset=(1.5,), group_offset=(0.5,))
    x = _points([0.0, 0.6, 0.2], reward=[0, 1, 1], group=[0, 0, 1])
    y = np.array([0.52, 0.40, 0.41])
    ev = np.full(3, 2.5e-4)
    t = _points([1.0, 1.0], reward=[0, 1], group=[0, 1])
    (h,) = posterior(Data(x, y, ev), t, grid).hypers
    s2 = h[0] * 2.5e-4
    assert h[6:8] == (1.5, 0.5)

    def by_hand(a, b):
        rho = np.exp(-0.5 * (a.rho[:, None] - b.rho[None, :]) ** 2 / 0.3 ** 2)
        same_r, same_g = a.reward[:, None] == b.reward[None, :], a.group[:, None] == b.group[None, :]
        product = rho * (0.5 + 0.5 * same_r) * (0.9 + 0.1 * same_g)
        return s2 * (product + 4.0 + 1.5 * same_r + 0.5 * same_g)

    assert kernel(x, t, h, 2.5e-4) == pytest.approx(by_hand(x, t), rel=1e-12)
    post = posterior(Data(x, y, ev), t, grid, cands=t)
    K = by_hand(x, x) + np.diag(ev * (1 + h[-1]))
    mean = y.mean() + by_hand(t, x) @ np.linalg.solve(K, y - y.mean())
    assert post.means[0] == pytest.approx(mean, rel=1e-7)
    assert post.cand_var[0] == pytest.approx(np.diag(by_hand(t, t) - by_hand(t, x) @ np.linalg.solve(K, by_hand(x, t))),
                                             rel=1e-6)
    plain = posterior(Data(x, y, ev), t, ONE)
    assert post.means[0][0] - post.means[0][1] > plain.means[0][0] - plain.means[0][1] + 0.01
    with pytest.raises(ValueError, match=r"reward_offset=\(-1.0,\): must be positive"):
        HyperGrid(reward_offset=(-1.0,))


def test_the_prior_mean_is_a_bowl_in_rho_and_the_data_are_fit_around_it():
    from dataclasses import replace

    grid = replace(ONE, rho_bowl=2.0)
    t = _points([0.0, 0.5, 1.0])
    prior = posterior(Data(_points([]), np.zeros(0), np.zeros(0)), t, grid)
    s = math.sqrt(4.0 * 1.0)  # no known noise scale without runs: the unit is 1
    assert prior.means[0] == pytest.approx([-2.0 * s, 0.0, -2.0 * s])
    x = _points([0.25, 0.75])
    y = np.array([0.40, 0.44])
    post = posterior(Data(x, y, np.full(2, 2.5e-4)), t, grid)
    (h,) = post.hypers
    scale = 2.5e-4
    bowl = -2.0 * math.sqrt(4.0 * scale) * 4 * (np.array([0.25, 0.75]) - 0.5) ** 2
    r = y - bowl
    K = kernel(x, x, h, scale) + np.diag(np.full(2, 2.5e-4 * 2))
    mean = r.mean() - 2.0 * math.sqrt(4.0 * scale) * 4 * (np.array([0.0, 0.5, 1.0]) - 0.5) ** 2 \
        + kernel(t, x, h, scale) @ np.linalg.inv(K) @ (r - r.mean())
    assert post.means[0] == pytest.approx(mean, rel=1e-7)


def test_the_bowls_centre_is_a_hyperparameter_the_runs_weigh():
    """With the bowl's centre at 0.2 or 0.8 of the range, runs that rise towards ρ's low end give
    the low centre more weight than its prior half, each combination's mean is its own bowl (the
    prior means at one centre computed by hand), and a centre outside [0, 1] is refused."""
    from dataclasses import replace

    grid = replace(ONE, rho_bowl=2.0, rho_center=(0.2, 0.8))
    t = _points([0.0, 0.2, 0.8, 1.0])
    prior = posterior(Data(_points([]), np.zeros(0), np.zeros(0)), t, grid, max_combos=99)
    s = math.sqrt(4.0 * 1.0)
    by_centre = {h[9]: m for h, m in zip(prior.hypers, prior.means)}
    assert by_centre[0.2] == pytest.approx(-2.0 * s * 4 * (np.array([0.0, 0.2, 0.8, 1.0]) - 0.2) ** 2)
    assert by_centre[0.8] == pytest.approx(-2.0 * s * 4 * (np.array([0.0, 0.2, 0.8, 1.0]) - 0.8) ** 2)
    x = _points([0.1, 0.3, 0.5, 0.7, 0.9])
    y = np.array([0.50, 0.47, 0.42, 0.35, 0.25])
    post = posterior(Data(x, y, np.full(5, 2.5e-4)), t, grid, keep=1.0, max_combos=99)
    low = sum(w for w, h in zip(post.weights, post.hypers) if h[9] == 0.2)
    assert low > 0.9
    with pytest.raises(ValueError, match=r"rho_center=\(1.5,\): must be a non-empty list of numbers from 0 to 1"):
        HyperGrid(rho_center=(1.5,))


def test_mixture_weights_are_the_marginal_likelihoods():
    grid = HyperGrid(signal=(1.0, 16.0), lengthscale=(0.3,), reward_corr=(0.5,), group_corr=(0.9,),
                     model_corr=(0.7,), pilot_gap=(1.0,), train_noise=(0.5, 1.5), rho_bowl=0.0)
    x = _points([0.1, 0.3, 0.5, 0.7, 0.9], reward=[0, 1, 0, 1, 0])
    y = np.array([0.40, 0.46, 0.47, 0.50, 0.41])
    ev = np.full(5, 2.5e-4)
    post = posterior(Data(x, y, ev), x, grid, keep=1.0, max_combos=99)
    logpdf = {h: multivariate_normal(np.zeros(5), kernel(x, x, h, 2.5e-4) + np.diag(ev * (1 + h[-1]))).logpdf(y - y.mean())
              for h in grid.combos(False, False)}
    ref = np.exp(np.array([logpdf[h] for h in post.hypers]) - max(logpdf.values()))
    assert post.weights == pytest.approx(ref / np.exp(np.array(list(logpdf.values())) - max(logpdf.values())).sum(), rel=1e-6)


def test_a_pending_run_shrinks_the_covariance_and_leaves_the_mean():
    x = _points([0.2, 0.8])
    data = Data(x, np.array([0.4, 0.5]), np.full(2, 2.5e-4))
    t = _points([0.2, 0.5, 0.8])
    free = posterior(data, t, ONE)
    busy = posterior(data, t, ONE, pending=_points([0.5]))
    assert busy.means[0] == pytest.approx(free.means[0])
    assert busy.covs[0][1, 1] < 0.7 * free.covs[0][1, 1]


def test_a_pilot_informs_the_full_budget_less_than_a_full_run():
    t = _points([0.5])
    ev = np.full(1, 2.5e-4)
    pilot = posterior(Data(_points([0.5], fid=[1]), np.array([0.5]), ev), t, ONE)
    full = posterior(Data(_points([0.5]), np.array([0.5]), ev), t, ONE)
    assert full.covs[0][0, 0] < pilot.covs[0][0, 0]


def test_bad_grids_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"reward_corr=\(1\.5,\): correlations must be in \[0, 1\]"):
        HyperGrid(reward_corr=(1.5,))
    with pytest.raises(ValueError, match="lengthscale"):
        HyperGrid(lengthscale=(0.0,))


# ------------------------------------------------------------------ decisions
SPACE = TunerSpace((0.2, 0.9), (2, 4), ("sparse", "dense"), rho_levels=8)


def _truth(a: Allocation) -> float:
    # a smooth world: dense better by 0.04, a peak at rho 0.6, G 4 better by 0.01
    return 0.45 + 0.04 * (a.reward == "dense") + 0.01 * (a.group_size == 4) - 0.4 * (a.rho - 0.6) ** 2


def test_the_tuner_finds_a_clear_optimum_of_a_smooth_world():
    tuner = Tuner(SPACE)
    obs: list[Observed] = []
    for _ in range(10):
        run = tuner.next_run(obs)
        assert run.fraction == 1.0 and run.score >= 0
        obs.append(Observed(run.allocation, 1.0, _truth(run.allocation), 2.5e-4))
    ans = tuner.answer(obs)
    best = max(SPACE.cells(), key=_truth)
    assert _truth(best) - _truth(ans.allocation) <= 0.0025  # within a tenth of the noise sd
    assert ans.gain_of_one_more_run >= 0


def test_the_gain_of_one_more_run_falls_as_runs_come_in():
    tuner = Tuner(SPACE)
    cells = SPACE.cells()
    few = [Observed(a, 1.0, _truth(a), 2.5e-4) for a in cells[::8]]
    many = [Observed(a, 1.0, _truth(a), 2.5e-4) for a in cells for _ in range(3)]
    assert tuner.answer(many).gain_of_one_more_run < tuner.answer(few).gain_of_one_more_run


def test_infeasible_runs_are_never_proposed_nor_answered():
    banned = {("dense", 4)}
    tuner = Tuner(SPACE, feasible=lambda a, f: (a.reward, a.group_size) not in banned)
    obs = []
    for _ in range(4):
        run = tuner.next_run(obs)
        assert (run.allocation.reward, run.allocation.group_size) not in banned
        obs.append(Observed(run.allocation, 1.0, _truth(run.allocation), 2.5e-4))
    assert (tuner.answer(obs).allocation.reward, tuner.answer(obs).allocation.group_size) not in banned


def test_a_pilot_is_proposed_only_when_it_fits_the_compute_left():
    space = TunerSpace((0.2, 0.9), (2, 4), ("sparse", "dense"), pilot_fractions=(0.1,), rho_levels=8)
    run = Tuner(space).next_run([], compute_left=0.5)
    assert run.fraction == 0.1
    with pytest.raises(ValueError, match="no feasible run fits the budget left"):
        Tuner(space).next_run([], compute_left=0.05)


def test_bad_spaces_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"rho=\(0\.9, 0\.2\)"):
        TunerSpace((0.9, 0.2), (2,), ("sparse",))
    with pytest.raises(ValueError, match="pilot_fractions"):
        TunerSpace((0.2, 0.9), (2,), ("sparse",), pilot_fractions=(1.5,))
    assert isinstance(Run(Allocation(0.5, 2, "sparse"), 1.0), Run)


def test_the_tuner_core_loads_neither_torch_nor_optuna_nor_a_study():
    import subprocess
    import sys

    code = ("import sys, allocopt.tuner.decide; "
            "print(sorted(m for m in ('torch', 'optuna', 'mlflow', 'allocopt.study', 'allocopt.store', 'allocopt.spec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_answer_among_tried_cells_is_the_best_mean_of_those_run():
    """Two full runs either side of the bowl's middle: the posterior mean peaks between them, at a
    cell never run; ``among="tried"`` answers the better of the two run, ``all`` the peak."""
    space = TunerSpace((0.2, 0.9), (4,), ("dense",), rho_levels=8)
    lv = space.levels
    obs = [Observed(Allocation(lv[2], 4, "dense"), 1.0, 0.50, 2.5e-4),
           Observed(Allocation(lv[5], 4, "dense"), 1.0, 0.51, 2.5e-4)]
    everywhere = Tuner(space, among="all").answer(obs)
    post = Tuner(space).posterior(obs, space.cells())
    assert everywhere.allocation == space.cells()[int(np.argmax(post.mean))]
    assert lv[2] < everywhere.allocation.rho < lv[5]
    tried = Tuner(space, among="tried").answer(obs)
    means = {a.rho: m for a, m in zip(space.cells(), post.mean)}
    assert tried.allocation.rho == max((lv[2], lv[5]), key=means.get)
    assert tried.mean == pytest.approx(means[tried.allocation.rho])
    assert Tuner(space, among="tried").answer([]).allocation == Tuner(space, among="all").answer([]).allocation
    with pytest.raises(ValueError, match="among='best': allowed: all, tried"):
        Tuner(space, among="best")


def test_a_cautious_answer_maximizes_the_mean_less_its_sds():
    """``caution`` c (over every cell): the answer is the argmax of the posterior mean less c posterior sds, read
    off the public posterior, and the reported mean stays the mean; as c grows, the answer's sd
    never grows (the argmax of a family of lines in c)."""
    space = TunerSpace((0.2, 0.9), (4,), ("dense",), rho_levels=8)
    lv = space.levels
    # three runs rising to ρ's third level: the mean extrapolates the rise past them, less surely
    obs = [Observed(Allocation(lv[i], 4, "dense"), 1.0, v, 2.5e-4) for i, v in ((0, 0.40), (1, 0.45), (2, 0.50))]
    post = Tuner(space).posterior(obs, space.cells())
    sds = []
    for c in (0.0, 0.5, 1.0, 3.0, 10.0):
        ans = Tuner(space, among="all", caution=c).answer(obs)
        j = int(np.argmax(post.mean - c * np.sqrt(post.var)))
        assert ans.allocation == space.cells()[j] and ans.mean == pytest.approx(post.mean[j])
        sds.append(ans.sd)
    assert sds == sorted(sds, reverse=True) and sds[-1] < sds[0]
    assert Tuner(space, among="all", caution=0.0).answer(obs).allocation.rho > lv[2]  # beyond the runs
    assert Tuner(space, caution=3.0).answer(obs).allocation.rho <= lv[2]  # among them
    for bad in (-1, 11, "1"):
        with pytest.raises(ValueError, match="caution=.*: must be a number from 0 to 10"):
            Tuner(space, caution=bad)


def test_zooming_in_offers_midpoints_around_the_best_cell_and_answers_among_them_once_run():
    """``refine``: with the posterior mean's best cell at a grid level, the candidates gain the
    midpoints to its neighbours in ρ; a full run made off the grid becomes a cell the answer can
    be; without ``refine`` neither (the grid's 8 levels only)."""
    space = TunerSpace((0.2, 0.9), (4,), ("dense",), rho_levels=8)
    lv = space.levels  # 0.2, 0.3, ..., 0.9
    obs = [Observed(Allocation(lv[i], 4, "dense"), 1.0, v, 2.5e-4) for i, v in ((1, 0.40), (3, 0.52), (5, 0.42))]
    zoom = Tuner(space, refine=True)
    post = zoom.posterior(obs, space.cells())
    best = space.cells()[int(np.argmax(post.mean))]
    assert best.rho == lv[3]  # the peak is where the best run is
    assert zoom._zoom(obs, zoom.targets(obs)) == [Allocation(0.45, 4, "dense"), Allocation(0.55, 4, "dense")]
    assert zoom._zoom([], space.cells()) == []  # nothing to zoom on before a full run
    # a run at the midpoint, the best value so far: a cell of its own, the answer, and the next zoom is around it
    obs2 = obs + [Observed(Allocation(0.55, 4, "dense"), 1.0, 0.56, 2.5e-4)]
    assert Allocation(0.55, 4, "dense") in zoom.targets(obs2)
    assert zoom.answer(obs2).allocation == Allocation(0.55, 4, "dense")
    assert zoom._zoom(obs2, zoom.targets(obs2)) == [Allocation(0.525, 4, "dense"), Allocation(0.575, 4, "dense")]
    assert all(a.rho in lv for a in Tuner(space).targets(obs2))
    assert Tuner(space).answer(obs2).allocation.rho in lv
    # cells closer than twice the finest step (2 / 64 of the range): no midpoint between them
    near = [Observed(Allocation(r, 4, "dense"), 1.0, v, 2.5e-4) for r, v in ((0.5, 0.55), (0.51, 0.60), (0.52, 0.55))]
    mids = zoom._zoom(near, zoom.targets(near))
    assert mids and not any(0.5 < a.rho < 0.52 for a in mids)
