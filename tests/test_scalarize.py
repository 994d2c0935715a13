"""Several targets through the knowledge-gradient tuner (allocopt/tuner/scalarize.py and a
two-target ``tuner = "kg"`` study): the scalarization by hand, its Pareto property, the weights,
the join of the targets' observations, and the study's sampler."""

from __future__ import annotations

import math
import random

import numpy as np
import optuna
import pytest

from allocopt.plan.allocation import Allocation
from allocopt.race.data import Observation
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.study.open import make_sampler
from allocopt.study.sampler import RaceSampler
from allocopt.tuner.scalarize import AUGMENT, chebyshev, scalarized, weights
from allocopt.tuner.study import KGTuner
from objectives.synthetic import SyntheticObjective

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))


def test_chebyshev_by_hand():
    v = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    # equal weights: the balanced point is best; the two extremes tie
    # gaps [1, 0], [0, 1], [.5, .5] -> -(max w·gap) - 0.05 · sum w·gap
    s = chebyshev(v, np.array([0.5, 0.5]))
    assert s == pytest.approx([-0.5 - AUGMENT * 0.5, -0.5 - AUGMENT * 0.5, -0.25 - AUGMENT * 0.5])
    # nearly all weight on the first target: the point best in it wins
    s = chebyshev(v, np.array([0.9, 0.1]))
    assert s == pytest.approx([-0.9 - AUGMENT * 0.9, -0.1 - AUGMENT * 0.1, -0.45 - AUGMENT * 0.5])
    assert int(np.argmax(s)) == 1
    # each column is scaled over its own values: units do not matter
    assert chebyshev(v * [10.0, 0.01] + [3.0, -1.0], np.array([0.9, 0.1])) == pytest.approx(s)


def test_a_dominated_point_never_scores_above_the_one_dominating_it():
    rng = random.Random(0)
    for _ in range(200):
        v = np.array([[rng.random(), rng.random()] for _ in range(6)])
        better = v[0] + [rng.random() * 0.1, rng.random() * 0.1]  # dominates row 0
        s = chebyshev(np.vstack([v, better]), weights(2, rng.randrange(100), rng.randrange(100)))
        assert s[-1] >= s[0]


def test_weights_lie_on_the_simplex_and_differ_per_proposal():
    w = weights(3, 7, 11)
    assert w.shape == (3,) and (w >= 0).all() and math.isclose(w.sum(), 1.0)
    assert np.array_equal(w, weights(3, 7, 11))
    assert not np.array_equal(w, weights(3, 7, 12)) and not np.array_equal(w, weights(3, 8, 11))
    with pytest.raises(ValueError, match="at least one target"):
        weights(0, 0, 0)


def _o(n, a, v):
    return Observation(n, a, v, 1e19, 1.0, "full", variance=1e-4)


def test_scalarized_joins_the_targets_by_run_and_turns_a_minimized_one():
    a, b, c = Allocation(0.3, 4, "sparse"), Allocation(0.6, 8, "prm"), Allocation(0.8, 4, "prm")
    acc = [_o(0, a, 0.4), _o(1, b, 0.6), _o(2, c, 0.5)]
    cost = [_o(0, a, 10.0), _o(2, c, 30.0)]  # run 1 has no cost recorded: left out
    w = np.array([0.5, 0.5])
    out = scalarized([acc, cost], (1.0, -1.0), w)
    assert [o.number for o in out] == [0, 2] and all(math.isnan(o.variance) for o in out)
    # run 0: accuracy 0.4 (worst of the two), cost 10 (best): gaps [1, 0]; run 2: gaps [0, 1]
    assert [o.value for o in out] == pytest.approx([-0.5 - AUGMENT * 0.5] * 2)
    assert out[0].allocation == a and out[1].budget_flops == 1e19
    with pytest.raises(ValueError, match="must match"):
        scalarized([acc], (1.0, -1.0), w)


def two_targets(**kw):
    base = dict(name="mo", objective="synthetic", budget_flops=1e19, target=("pass@1", "judge"), trials=6,
                space=SPACE, seed=3)
    return StudySpec(**{**base, **kw})


def test_a_two_target_study_is_searched_by_the_kg_tuner(tmp_path):
    """The default tuner on two targets: the study's sampler asks the kg tuner (full runs only),
    its observations are the scalarization of the trials' two values with the weights of the
    trial being proposed, and there is no one answer (the study's is its front)."""
    s = two_targets()
    obj = SyntheticObjective()
    sampler = make_sampler(s, workload=obj.workload())
    assert isinstance(sampler, RaceSampler) and isinstance(sampler.tuner, KGTuner)
    assert sampler.tuner.max_pilots == 0
    st = run_study(s, objective=obj, workload=obj.workload(), sampler=sampler,
                   storage=f"sqlite:///{tmp_path}/mo.db")
    done = [t for t in st.trials if t.state.name == "COMPLETE"]
    assert len(done) == 6 and all(t.user_attrs["fidelity"] == "full" for t in done)
    design = sampler.tuner.initial  # one full run per reward system, then the knowledge gradient
    assert len(design) == 2 and [sampler.decisions[n].allocation for n in (0, 1)] == design
    assert all(sampler.decisions[n].proposal.acquisition > 0 for n in range(2, 6))
    values = np.array([t.values for t in done])
    obs = sampler.observations(st, number=9)
    assert [o.number for o in obs] == [t.number for t in done]
    assert [o.value for o in obs] == pytest.approx(chebyshev(values, weights(2, 3, 9)).tolist())
    assert sampler.answer(st) == (None, None)


def test_the_sampler_refuses_a_study_of_other_directions():
    s = RaceSampler(SPACE, 1e19, tuner=lambda b, f: KGTuner(SPACE, b, max_pilots=0),
                    targets=(("pass_at_1", 1.0), ("judge", 1.0)))
    study = optuna.create_study(direction="maximize", sampler=s)
    with pytest.raises(ValueError, match="2 targets"):
        s.suggest(study.ask())


def test_the_command_line_says_how_two_targets_are_searched_and_drops_pilots_with_a_note(tmp_path, monkeypatch):
    import optuna
    from typer.testing import CliRunner

    from allocopt.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["study", "--objective", "synthetic", "--target", "pass@1", "--target", "judge", "--budget", "1e19"]
    r = CliRunner().invoke(app, [*args, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "tuner kg, 2 targets: each full run chosen on a fresh random weighting" in " ".join(r.output.split())
    assert not list(tmp_path.iterdir())  # a dry run records nothing
    r = CliRunner().invoke(app, [*args, "--pilots", "5", "--trials", "3", "--no-mlflow"])
    assert r.exit_code == 0, r.output
    assert "note: 2 targets: the kg tuner runs full runs only (as --pilots 0)" in " ".join(r.stderr.split())
    st = optuna.load_study(study_name="allocopt", storage="sqlite:///allocopt.db")
    assert [t.user_attrs["fidelity"] for t in st.trials] == ["full"] * 3 and len(st.directions) == 2


def test_race_with_two_targets_says_it_runs_as_bo(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from allocopt.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["study", "--objective", "synthetic", "--target", "pass@1", "--target", "judge", "--budget", "1e19",
            "--tuner", "race"]
    r = CliRunner().invoke(app, [*args, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert ("tuner race, 2 targets: runs as --tuner bo (RACE has one target) with Optuna's hypervolume "
            "search (sampler gp); the answer is the Pareto front") in " ".join(r.output.split())
    r = CliRunner().invoke(app, [*args, "--trials", "2", "--no-mlflow"])
    assert r.exit_code == 0, r.output
    assert ("note: 2 targets: RACE has one target; the study runs as --tuner bo (Optuna's hypervolume "
            "search, sampler gp, no pilots)") in " ".join(r.stderr.split())


def test_the_live_bar_of_a_two_target_study_counts_its_front():
    """One target: the bar says the best value; two: how many runs are on the Pareto front of
    the runs so far (a minimized target turned), not the first target's best."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from allocopt.cli.live import StudyDisplay
    from allocopt.vocabulary import Vocabulary

    def row(acc, cost):
        return SimpleNamespace(value=acc, targets={"aime24": acc, "cost_usd": cost}, state="COMPLETE",
                               params={}, metrics={})

    voc = Vocabulary.declare({"aime24": {"direction": "maximize"}, "cost_usd": {"direction": "minimize"}})
    s = StudySpec(name="mo", objective="command", budget_flops=1e19, target=("aime24", "cost_usd"),
                  vocabulary=voc, objective_settings={"command": "true"})
    d = StudyDisplay(Console(file=io.StringIO()), s, num_full=4, disable=True)
    infos = [d._best_info(row(a, c)) for a, c in ((0.4, 10.0), (0.5, 20.0), (0.3, 30.0), (0.6, 5.0))]
    # (0.3, 30) is dominated by both first runs; (0.6, 5) dominates every run before it
    assert infos == ["Pareto front 1 of 1", "Pareto front 2 of 2", "Pareto front 2 of 3", "Pareto front 1 of 4"]
    one = StudyDisplay(Console(file=io.StringIO()), two_targets(target="pass@1"), num_full=2, disable=True)
    assert [one._best_info(SimpleNamespace(value=v, targets={})) for v in (0.4, 0.3)] == ["best pass@1=0.400"] * 2
