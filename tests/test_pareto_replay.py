"""The two-target replay (benchmarks/pareto_replay.py): its hypervolume by hand and against
BoTorch's, its front, a replication's draws and scores, and its refusals."""

from __future__ import annotations

import random

import pytest

from benchmarks import pareto_replay as pr
from benchmarks.tuners.world import read_world
from objectives.tiny_table import DEFAULT_TABLE


def test_hypervolume_by_hand():
    # two steps: (0.8, 0.2) and (0.3, 0.9) over (0, 0): 0.8·0.2 + 0.3·(0.9 - 0.2)
    assert pr.hypervolume([(0.8, 0.2), (0.3, 0.9)]) == pytest.approx(0.16 + 0.21)
    assert pr.hypervolume([(0.8, 0.2), (0.3, 0.9), (0.2, 0.1)]) == pytest.approx(0.37)  # dominated: adds nothing
    assert pr.hypervolume([]) == 0.0 and pr.hypervolume([(0.5, 0.0)]) == 0.0  # on the reference: no area
    assert pr.hypervolume([(1.0, 1.0)], ref=(0.5, 0.25)) == pytest.approx(0.375)


def test_hypervolume_agrees_with_botorch():
    import torch
    from botorch.utils.multi_objective.hypervolume import Hypervolume

    rng = random.Random(1)
    for _ in range(20):
        pts = [(rng.random(), rng.random()) for _ in range(rng.randint(1, 12))]
        hv = Hypervolume(torch.zeros(2, dtype=torch.float64))
        from botorch.utils.multi_objective.pareto import is_non_dominated

        y = torch.tensor(pts, dtype=torch.float64)
        assert pr.hypervolume(pts) == pytest.approx(hv.compute(y[is_non_dominated(y)]), abs=1e-12)


def test_front_keeps_the_points_nothing_dominates():
    pts = [(0.8, 0.2), (0.3, 0.9), (0.2, 0.1), (0.8, 0.2), (0.5, 0.5)]
    assert pr.front(pts) == [0, 1, 3, 4]  # (0.2, 0.1) is dominated; the two equal points both stay


def test_a_replication_draws_both_targets_of_one_seed_and_scores_them():
    world = read_world([DEFAULT_TABLE])
    rp = pr.Replay(world, ("pass_at_1", "judge"), 0)
    a = world.candidates[5]
    y = rp.observe(a)
    seeds = world.seeds(a, 1.0, a.rho)
    assert any(y == (row["pass_at_1"], row["judge"]) for row in seeds.values())  # one seed's pair
    assert rp.regret(1)[1] == pytest.approx(100 * (1 - pr.hypervolume([rp.scaled(a)]) / rp.best))
    best = [world.candidates[i] for i in pr.front([rp.scaled(c) for c in world.candidates])]
    rp.runs = [(c, rp.scaled(c)) for c in best]  # the true front, observed without noise
    assert rp.regret(len(best)) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_bad_flags_are_refused_in_one_line(capsys):
    assert pr.main(["--methods", "kg,smac"]) == 2
    assert capsys.readouterr().err.strip() == "error: --methods='smac': allowed: kg, kg-no-design, gp, tpe, random"
    assert pr.main(["--runs", "2"]) == 2
    assert "runs=2: must be >= 4" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["kg", "tpe"])
def test_a_method_spends_the_runs_and_is_scored_at_each_level(method):
    world = read_world([DEFAULT_TABLE])
    rows = pr.replicate(world, 1, method, (4, 6))
    assert [r["level"] for r in rows] == [4, 6] and rows[0]["pair"] == "pass_at_1+native_reward"
    assert all(0 <= r["hv_regret_oracle"] <= r["hv_regret_front"] + 1e-9 <= 100 for r in rows)
    assert rows[1]["hv_regret_oracle"] <= rows[0]["hv_regret_oracle"]  # more runs never lose area


def test_a_rerun_with_more_runs_redoes_the_short_replications(tmp_path, capsys):
    """A folder of 4-run replications rerun with ``--runs 5``: they are run again (not skipped
    as done), and the tables take every replication that has every level."""
    args = ["--methods", "kg,tpe", "--seeds", "1", "--nice", "0", "--out", str(tmp_path)]
    assert pr.main([*args, "--runs", "4"]) == 0
    assert pr.main([*args, "--runs", "5"]) == 0
    out = capsys.readouterr().out
    assert "2 replications to run (0 done)" in out and "(1 paired replications)" in out
    assert "| kg against | 4 | 5 |" in (tmp_path / "tables.md").read_text()
