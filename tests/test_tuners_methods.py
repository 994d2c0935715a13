"""Each method of the tuner benchmark runs in a session on a small measured table: a smoke test
each (Ax and SMAC3 skipped, with the reason, when the ``bench`` extra is missing), and the
multi-fidelity peers' own arithmetic checked by hand."""

from __future__ import annotations

import math

import pytest

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.methods import METHODS, get
from benchmarks.tuners.runner import Job, run_job
from benchmarks.tuners.session import Session
from benchmarks.tuners.truth import truth_for
from benchmarks.tuners.world import read_world
from test_tuners import cells, write

NO_BENCH = 'the bench extra is missing (pip install -e ".[bench]")'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """sparse and dense, G 2 and 4, ρ 0.2 / 0.5 / 0.8, 3 seeds at 1e12 FLOPs, 2 at 25 %;
    the best cell is dense, G 4, ρ 0.5."""
    d = tmp_path_factory.mktemp("peers")

    def val(w):
        return lambda i, g, s: 0.3 + 0.1 * (i == 1) + 0.05 * (g == 4) + 0.05 * (w == "dense") + 0.002 * s

    rows = []
    for w in ("sparse", "dense"):
        for fid, budget, seeds in (("full", 1e12, (0, 1, 2)), ("pilot", 2.5e11, (0, 1))):
            rows += [dict(r, reward=w) for r in cells(fidelity=fid, budget=budget, seeds=seeds, value=val(w))]
    return read_world([write(d / "peers" / "t.csv", rows)])


def session(world, cap: float, seed: int = 0) -> Session:
    return Session(world, truth_for(world, "pass_at_1", "seedmean", seed), seed, cap, (1.0, 2.0, cap))


def check_answers(s: Session) -> None:
    assert s.done and s.answers
    for _, a in s.answers:
        assert a.reward in s.world.space.rewards and a.group_size in s.world.space.group_sizes
        assert s.world.space.rho[0] <= a.rho <= s.world.space.rho[1]


def test_every_method_is_registered_with_a_label_and_rule():
    for m in METHODS:
        meth = get(m)
        assert meth.name == m and meth.label and meth.rule in ("best_observed", "own")


@pytest.mark.parametrize("name", ["grid", "random", "tpe", "gp", "botorch"])
def test_optuna_samplers_and_the_grid_run_full_budget_trials(world, name):
    s = session(world, 5.0)
    get(name).run(s)
    assert s.spent == 5.0 and all(e.fraction == 1.0 for e in s.events) and len(s.full_runs()) == 5
    if name == "grid":  # the replication's first reward system, G 2 at 0.2 / 0.5 / 0.8, then G 4
        first = s.listed(world.space.rewards, "reward")[0]
        assert [e.allocation for e in s.events[:4]] == [Allocation(x, g, first) for g, x in
                                                        ((2, 0.2), (2, 0.5), (2, 0.8), (4, 0.2))]


def test_the_order_of_reward_systems_is_drawn_per_replication_and_shared_by_its_methods(world):
    rewards = world.space.rewards
    orders = [session(world, 1.0, seed).listed(rewards, "reward") for seed in range(12)]
    assert all(sorted(o) == sorted(rewards) for o in orders)
    assert {o[0] for o in orders} == set(rewards)  # each reward system comes first in some replication
    assert session(world, 2.0, 3).listed(rewards, "reward") == orders[3]  # one order per replication
    firsts = set()
    for seed in range(6):
        s = session(world, 2.0, seed)
        get("grid").run(s)
        assert s.events[0].allocation.reward == orders[seed][0]
        firsts.add(s.events[0].allocation.reward)
    assert firsts == set(rewards)


def test_ax_client_runs_and_answers_by_model_prediction(world):
    pytest.importorskip("ax", reason=NO_BENCH)
    s = session(world, 3.0)
    get("ax").run(s)
    check_answers(s)
    assert s.spent == 3.0 and len(s.full_runs()) == 3
    assert s.answers[-1][1] in [a for a, _ in s.full_runs()]  # Ax's best point is an arm it ran


def test_axs_centre_point_takes_the_middle_of_the_replications_drawn_order(world):
    """Ax's first trial is its centre: for a choice, the middle of the list, ties to the later
    value (the second of two); so the drawn order, not the world's, decides its reward system."""
    pytest.importorskip("ax", reason=NO_BENCH)
    firsts = set()
    for seed in range(4):
        s = session(world, 1.0, seed)
        get("ax").run(s)
        assert s.events[0].allocation.reward == s.listed(world.space.rewards, "reward")[1]
        firsts.add(s.events[0].allocation.reward)
    assert firsts == set(world.space.rewards)


def test_an_infeasible_trial_is_told_the_worst_value_so_far(world):
    """GPSampler ignores a failed trial, so on a world with an infeasible cell its deterministic
    proposal came back to that cell 1000 times; told the worst value so far (failed before any
    value) it moves on. Half the space infeasible here: 10 feasible runs in few asks."""
    import optuna

    from benchmarks.tuners.methods.optuna_samplers import ask_and_tell, make_sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", 0))
    feasible = []

    def observe(a):
        if a.rho > 0.5:
            return None
        feasible.append(a)
        return 0.3 + 0.1 * (a.group_size == 4) - abs(a.rho - 0.4)

    ask_and_tell(study, world.space, observe, lambda: len(feasible) >= 10, max_asks=200)
    assert len(feasible) == 10 and len(study.trials) < 200
    seen: list[float] = []
    for t in study.trials:
        if t.params["rho"] <= 0.5:
            seen.append(t.value)
        elif seen:
            assert t.state == optuna.trial.TrialState.COMPLETE and t.value == min(seen)
        else:
            assert t.state == optuna.trial.TrialState.FAIL
    two = optuna.create_study(directions=["maximize", "minimize"])
    for v in ([0.5, 2.0], [0.2, 1.0]):
        two.add_trial(optuna.trial.create_trial(params={}, distributions={}, values=v))
    from benchmarks.tuners.methods.optuna_samplers import _worst

    assert _worst([[0.5, 2.0], [0.2, 1.0]], two.directions) == [0.2, 2.0]


def test_ax_is_told_the_worst_target_so_far_for_an_infeasible_trial(tmp_path):
    """ρ 0.8 infeasible in every cell (a third of the space): Ax gets its 6 feasible runs, and each
    infeasible trial after the first value carries the lowest value told so far."""
    pytest.importorskip("ax", reason=NO_BENCH)
    rows = [dict(r, reward=w) for w in ("sparse", "dense") for r in cells(seeds=(0, 1))]
    for r in rows:
        if r["rho"] == 0.8:
            r["status"] = "infeasible"
    w = read_world([write(tmp_path / "half" / "t.csv", rows)])
    s = session(w, 6.0)
    told: list = []
    from ax import Client

    original = Client.complete_trial

    def spy(self, trial_index, raw_data=None, **kw):
        told.append(raw_data["y"])
        return original(self, trial_index, raw_data=raw_data, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Client, "complete_trial", spy)
        get("ax").run(s)
    assert len(s.full_runs()) == 6 and s.spent == 6.0
    expected, seen = [], []
    for e in s.events:
        if e.value is not None:
            seen.append(e.value)
            expected.append(e.value)
        elif seen:
            expected.append(min(seen))
    assert told == expected and any(e.value is None for e in s.events)


def test_smac_runs_pilots_as_its_cheap_budgets(world):
    pytest.importorskip("smac", reason=NO_BENCH)
    from benchmarks.tuners.methods.smac_mf import eta_for, nearest_fraction

    # one rung per fidelity: 1 / eta ** 2 is the smallest fraction, 1 / eta maps to 0.25
    eta = eta_for((0.1, 0.25))
    assert 1 / eta ** 2 == pytest.approx(0.1, rel=1e-5) and math.floor(math.log(10) / math.log(eta)) == 2
    assert nearest_fraction(1 / eta, (0.1, 0.25)) == 0.25 and nearest_fraction(1.0, (0.1, 0.25)) == 1.0
    s = session(world, 2.0)
    get("smac").run(s)
    check_answers(s)
    assert {e.fraction for e in s.events} <= {0.25, 1.0} and any(e.fraction == 0.25 for e in s.events)
    assert s.spent == pytest.approx(sum(e.fraction for e in s.events))


def test_botorch_mf_chooses_fidelities_and_answers_at_full_budget(world):
    from benchmarks.tuners.methods.botorch_mf import choices

    opts = choices(world)
    assert len(opts) == 2 * len(world.candidates) and {f for _, f in opts} == {0.25, 1.0}
    s = session(world, 2.75)  # 4 random start-up choices (2.5 runs at this seed), then the acquisition's
    get("botorch-mf").run(s)
    assert [e.fraction for e in s.events] == [1.0, 1.0, 0.25, 0.25, 0.25]  # the last one the acquisition's
    check_answers(s)
    assert s.answers[-1][1] in world.candidates


def test_race_replays_the_study_files_design(world, tmp_path, monkeypatch):
    """RACE (the ablation's earlier tuner) takes the study file's pilots, fraction and [race]
    table; its pilots at the full budget (said in a note) where the table has none at that
    fraction."""
    study = tmp_path / "s.toml"
    head = 'budget_flops = 1e12\ntarget = "pass@1"\npilots = 12\n'
    study.write_text(head + "pilot_fraction = 0.25\n[race]\nrho_levels = 3\n")
    monkeypatch.setenv("ALLOCOPT_RACE_STUDY", str(study))
    from benchmarks.tuners.methods.race import race_terms

    f, settings, _, note = race_terms(session(world, 5.0))
    assert (f, settings.max_pilots, settings.rho_levels, note) == (0.25, 12, 3, "")
    s = session(world, 5.0)
    get("race").run(s)
    pilots = [e for e in s.events if e.fraction == 0.25]
    assert len(pilots) == 12 and s.answers and s.answers[0][0] >= 12 * 0.25 - 1e-9  # nothing before the pilots
    check_answers(s)
    study.write_text(head + "pilot_fraction = 0.1\n")
    assert race_terms(session(world, 5.0))[0] == 1.0 and "no pilots at 0.1" in race_terms(session(world, 5.0))[3]


def test_race_gets_its_pilot_design_once_per_policy_size_of_a_pooled_world(tmp_path, monkeypatch):
    """On a world pooling two policy sizes RACE's pilots are the study file's once per size (12
    pilots for 2 rewards x 2 G of one size: 24 for two sizes), so its design per reward system
    and size is the one-size world's; it runs them all before its first full run."""
    def val(w):
        return lambda i, g, s: 0.3 + 0.1 * (i == 1) + 0.05 * (g == 4) + 0.05 * (w == "dense") + 0.002 * s

    rows = []
    for m in ("a", "b"):
        for w in ("sparse", "dense"):
            for fid, budget, seeds in (("full", 1e12, (0, 1, 2)), ("pilot", 2.5e11, (0, 1))):
                rows += [dict(r, reward=w, model=m) for r in cells(fidelity=fid, budget=budget, seeds=seeds,
                                                                   value=val(w))]
    pooled = read_world([write(tmp_path / "pooled" / "t.csv", rows)])
    assert pooled.space.models == ("a", "b")
    study = tmp_path / "s.toml"
    study.write_text('budget_flops = 1e12\ntarget = "pass@1"\npilots = 12\npilot_fraction = 0.25\n'
                     "[race]\nrho_levels = 3\n")
    monkeypatch.setenv("ALLOCOPT_RACE_STUDY", str(study))
    from benchmarks.tuners.methods.race import race_terms

    assert race_terms(session(pooled, 8.0))[1].max_pilots == 24
    s = session(pooled, 8.0)
    get("race").run(s)
    assert len([e for e in s.events if e.fraction == 0.25]) == 24 and s.answers[0][0] >= 6.0 - 1e-9
    check_answers(s)


def test_allocopt_runs_the_studys_tuner_with_the_study_files_pilot_terms(world, tmp_path, monkeypatch):
    """allocopt is the study's KGTuner: at most the study file's ``pilots`` pilots, at its
    ``pilot_fraction``; none (said in a note) where the table has no pilots at that fraction;
    an answer at every scored level once a full run is made."""
    study = tmp_path / "s.toml"
    monkeypatch.setenv("ALLOCOPT_TINY_STUDY", str(study))
    from benchmarks.tuners.methods.allocopt import study_terms

    study.write_text('budget_flops = 1e12\ntuner = "kg"\npilots = 2\npilot_fraction = 0.25\n')
    assert study_terms(world) == (0.25, 2, "")
    s = session(world, 5.0)
    get("allocopt").run(s)
    assert sum(e.fraction == 0.25 for e in s.events) <= 2 and {e.fraction for e in s.events} <= {0.25, 1.0}
    check_answers(s)
    study.write_text('budget_flops = 1e12\ntuner = "kg"\npilot_fraction = 0.1\n')
    assert study_terms(world) == (0.1, 0, "no pilots: the world has none at 0.1")
    s = session(world, 3.0)
    get("allocopt").run(s)
    assert all(e.fraction == 1.0 for e in s.events) and "no pilots" in s.note


def test_a_failing_method_is_recorded_and_the_rest_go_on(world, monkeypatch):
    import benchmarks.tuners.methods.grid as grid

    def boom(s):
        raise RuntimeError("no luck\nsecond line")

    monkeypatch.setattr(grid, "METHOD", grid.METHOD.__class__("grid", "grid", "best_observed", boom))
    monkeypatch.setattr("benchmarks.tuners.runner.world_of", lambda v, t=(): world)
    rec = run_job(Job("tiny-table", (), "seedmean", 0, "pass_at_1", "grid", 2.0, (1.0, 2.0)))
    assert [r["error"] for r in rec] == ["RuntimeError: no luck"] * 2
    assert all(math.isnan(r["regret_pct"]) for r in rec)


def test_the_default_study_files_allocopt_runs_no_pilots_and_its_ablation_and_race_do(world, monkeypatch):
    """Without overrides: `allocopt` replays studies/tiny.toml (kg, pilots = 0: the choice made
    on the measured worlds), `allocopt-pilots` the same tuner with up to 70 pilots, and `race`
    RACE's design in benchmarks/tiny_grid/tiny_race.toml (70 pilots at 10 %)."""
    monkeypatch.delenv("ALLOCOPT_TINY_STUDY", raising=False)
    monkeypatch.delenv("ALLOCOPT_RACE_STUDY", raising=False)
    from allocopt.spec import StudySpec
    from benchmarks.tuners.methods import race_study, tiny_study
    from benchmarks.tuners.methods.allocopt import PILOTS_ABLATION, study_terms

    shipped, race = StudySpec.from_toml(tiny_study()), StudySpec.from_toml(race_study())
    assert (shipped.tuner, shipped.pilots) == ("kg", 0) and (race.tuner, race.pilots) == ("race", 70)
    assert study_terms(world)[1] == 0 and PILOTS_ABLATION == race.pilots
    assert get("allocopt-pilots").label == "allocopt with pilots (ablation)"
