"""The ``tiny-table`` objective: replays measured rows exactly, interpolates in ρ as documented,
refuses what the table does not hold."""

from __future__ import annotations

import tomllib

import pytest

from allocopt.errors import ConfigError
from allocopt.plan.allocation import Allocation, make_plan
from objectives.tiny_table import TinyTableObjective, make
from tiny_grid_table import LEVELS, ROOT, write_table


def _rows(seeds=(0, 1), gs=(2, 4)):
    out = []
    for g in gs:
        for i, x in enumerate(LEVELS):
            for s in seeds:
                # distinct, hand-readable values: pass@1 = 0.4 + 0.01 i + 0.001 s + 0.1 [G=4]
                p = 0.4 + 0.01 * i + 0.001 * s + (0.1 if g == 4 else 0.0)
                out.append(dict(reward="sparse", group_size=g, rho=x, seed=s, native_reward=p + 0.2,
                                pass_at_1=p, judge=p + 0.3, search=1000 * (8 - i) + s, learning=1000 * (i + 1),
                                reward_f=0))
    return out


@pytest.fixture
def table(tmp_path):
    return write_table(tmp_path / "trials.csv", _rows())


def test_grid_point_returns_a_measured_row_exactly(table):
    obj = TinyTableObjective(table=str(table))
    plan = make_plan(3e11, Allocation(0.5, 4, "sparse"), obj.workload())
    rows = [r for r in _rows() if r["group_size"] == 4 and r["rho"] == 0.5]
    seen = set()
    for seed in range(12):
        res = obj.run(plan, seed=seed)
        row = next(r for r in rows if abs(r["pass_at_1"] - res.targets["pass_at_1"]) < 1e-12)
        assert res.targets == {"native_reward": row["native_reward"], "pass_at_1": row["pass_at_1"],
                               "judge": row["judge"]}
        b = res.breakdown
        assert (b.search_flops, b.learning_flops, b.reward_flops) == (row["search"], row["learning"], 0)
        seen.add(row["seed"])
        assert obj.run(plan, seed=seed).targets == res.targets  # same trial, same answer
    assert seen == {0, 1}  # other seeds draw the other measured seed


def test_interpolation_in_rho_by_hand(tmp_path):
    table = write_table(tmp_path / "t.csv", _rows(seeds=(0,)))
    obj = TinyTableObjective(table=str(table))
    # rho 0.43 between levels 0.4 (i = 2) and 0.5 (i = 3), w = 0.3, G = 2, seed 0:
    # pass@1 = 0.7 * 0.42 + 0.3 * 0.43 = 0.423; search = 0.7 * 6000 + 0.3 * 5000 = 5700;
    # learning = 0.7 * 3000 + 0.3 * 4000 = 3300
    targets, flops, seed = obj.lookup(Allocation(0.43, 2, "sparse"), 3e11, seed=5)
    assert targets["pass_at_1"] == pytest.approx(0.423, abs=1e-12)
    assert targets["judge"] == pytest.approx(0.723, abs=1e-12)
    assert flops == {"search": 5700, "learning": 3300, "reward": 0}
    assert seed == 0
    assert obj.mean_value(Allocation(0.43, 2, "sparse"), "pass_at_1") == pytest.approx(0.423, abs=1e-12)
    near = TinyTableObjective(table=str(table), interpolate=False)
    assert near.lookup(Allocation(0.43, 2, "sparse"), 3e11)[0]["pass_at_1"] == pytest.approx(0.42)
    assert near.lookup(Allocation(0.47, 2, "sparse"), 3e11)[0]["pass_at_1"] == pytest.approx(0.43)


@pytest.mark.parametrize("alloc, budget, words", [
    (Allocation(0.95, 2, "sparse"), 3e11, "rho=0.95: outside the measured levels [0.2, 0.9]"),
    (Allocation(0.5, 16, "sparse"), 3e11, "allocation=(sparse, G=16): not in the table"),
    (Allocation(0.5, 2, "prm"), 3e11, "allocation=(prm, G=2): not in the table"),
    (Allocation(0.5, 2, "sparse"), 1e11, "budget_flops=1e+11: the table measured 3e+11 (full) only"),
])
def test_refuses_outside_the_table_in_one_line(table, alloc, budget, words):
    obj = TinyTableObjective(table=str(table))
    with pytest.raises(ConfigError) as e:
        obj.lookup(alloc, budget)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_optimum_space_and_missing_levels(tmp_path):
    rows = _rows() + [r | {"group_size": 8} for r in _rows(gs=(2,)) if r["rho"] < 0.6]
    obj = TinyTableObjective(table=str(write_table(tmp_path / "t.csv", rows)))
    s = obj.space()
    assert (s.rewards, s.group_sizes, s.rho) == (("sparse",), (2, 4), (0.2, 0.9))  # G=8 is partial
    o = obj.optimum("pass_at_1")
    # best seed-mean: G = 4, rho 0.9 (i = 7): 0.4 + 0.07 + 0.0005 + 0.1; worst G = 2, rho 0.2: 0.4005
    assert o.allocation == Allocation(0.9, 4, "sparse")
    assert o.value == pytest.approx(0.5705) and o.worst == pytest.approx(0.4005) and o.seeds == 2
    with pytest.raises(ConfigError, match="level 0.6 of this"):
        obj.lookup(Allocation(0.55, 8, "sparse"), 3e11)


def test_registered_and_built_by_make(table):
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["allocopt.objectives"]
    assert eps["tiny-table"] == "objectives.tiny_table:make"
    assert make(table=str(table)).name == "tiny-table"
    with pytest.raises(ValueError, match="setting 'noise'"):
        make(table=str(table), noise=0.1)
    with pytest.raises(ConfigError, match="no such file"):
        make(table=str(table) + ".missing")


def test_a_level_measured_infeasible_answers_infeasible_and_the_nearer_level_decides(tmp_path):
    from allocopt.errors import InfeasiblePlan

    msg = ("budget_flops=3.000e+11: the first iteration's exact cost once generated (3.2e+11 FLOPs) does not fit; "
           "the smallest budget that runs one iteration is 3.2e+11")
    rows = [r for r in _rows() if not (r["group_size"] == 2 and r["rho"] == 0.9)]
    rows += [dict(reward="sparse", group_size=2, rho=0.9, seed=s, status="infeasible", error=msg,
                  native_reward="", pass_at_1="", judge="") for s in (0, 1)]
    obj = TinyTableObjective(table=str(write_table(tmp_path / "t.csv", rows)))
    assert obj.complete_cells() == {("sparse", 2): 2, ("sparse", 4): 2}  # the infeasible level counts as measured
    for rho in (0.9, 0.86):  # at the level, and nearer to it than to 0.8
        with pytest.raises(InfeasiblePlan, match="rho 0.9 of this reward system and G were infeasible") as e:
            obj.lookup(Allocation(rho, 2, "sparse"), 3e11)
        assert e.value.min_budget_flops == 320_000_000_000
    t, fl, seed = obj.lookup(Allocation(0.84, 2, "sparse"), 3e11, seed=0)  # nearer 0.8: its row, not interpolated
    assert t["pass_at_1"] == pytest.approx(0.4 + 0.01 * 6 + 0.001 * seed) and fl["search"] == 2000 + seed
    with pytest.raises(InfeasiblePlan):
        obj.run(make_plan(3e11, Allocation(0.9, 2, "sparse"), obj.workload()), seed=0)
    # the optimum is over feasible levels: G 4, rho 0.9 (0.57); the worst G 2, rho 0.2 (0.40)
    o = obj.optimum("pass_at_1")
    assert (o.allocation.group_size, o.allocation.rho) == (4, 0.9) and o.worst == pytest.approx(0.4005)


@pytest.mark.slow  # a whole RACE study (surrogate fits) on a constructed table: ~15 s
def test_a_race_study_replays_the_table_end_to_end(tmp_path):
    """``allocopt study`` with objective tiny-table: pilots at the table's 25 % rows, full runs
    at its full rows; every trial's targets and FLOPs are the table's (interpolated in rho)."""
    import subprocess
    import sys

    import optuna

    rows = _rows() + [dict(r, fidelity="pilot") for r in _rows()]
    table = write_table(tmp_path / "t.csv", rows)
    study = tmp_path / "s.toml"
    study.write_text('name = "tt"\nobjective = "tiny-table"\nbudget_flops = 3e11\ntarget = "pass@1"\ntrials = 2\n'
                     'tuner = "race"\npilots = 12\npilot_fraction = 0.25\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [2, 4]\n'
                     f'rewards = ["sparse"]\n[race]\nbandwidth = 0.35\n[objective_settings]\ntable = "{table}"\n')
    url = f"sqlite:///{tmp_path}/s.db"
    p = subprocess.run([sys.executable, "-m", "allocopt.cli", "study", "--spec", str(study), "--no-mlflow",
                        "--storage", url], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Pilot regime against the full-budget regime" in p.stdout
    obj = TinyTableObjective(table=str(table))
    trials = [t for t in optuna.load_study(study_name="tt", storage=url).trials if t.state.name == "COMPLETE"]
    fid = [t.user_attrs["fidelity"] for t in trials]
    assert fid.count("pilot") == 12 and fid.count("full") == 2  # 6 rho levels x 2 G, then 2 full runs
    for t in trials:
        a = Allocation(t.params["rho"], t.params.get("group_size", 2), "sparse")
        budget = 7.5e10 if t.user_attrs["fidelity"] == "pilot" else 3e11
        want = obj.mean_value(a, "pass_at_1", budget)  # two seeds 0.001 apart: the drawn one is within 0.0005
        assert t.value == pytest.approx(want, abs=0.0005 + 1e-9), (t.number, t.params)


def test_a_table_that_is_not_text_or_has_a_bad_number_is_one_line(tmp_path):
    from objectives.tiny_table import read_table

    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"bin.csv.*line 1: not UTF-8 text"):
        read_table(binary)
    rows = _rows(seeds=(0,), gs=(2,))
    rows[3]["group_size"] = "two"
    with pytest.raises(ConfigError, match=r"line 5: group_size='two': must be a whole number from 1 to 65536"):
        read_table(write_table(tmp_path / "t.csv", rows))
    rows[3]["group_size"] = "٢"  # a digit Python's int() reads, in another script
    with pytest.raises(ConfigError, match=r"line 5: group_size='٢': not a number as allowed: ASCII digits"):
        read_table(write_table(tmp_path / "t.csv", rows))
    rows = _rows(seeds=(0,), gs=(2,))
    rows[0]["judge"] = "high"
    with pytest.raises(ConfigError, match=r"line 2: judge='high': must be a number"):
        read_table(write_table(tmp_path / "u.csv", rows))


def test_a_replayed_trial_prints_no_iterations_or_walls_it_does_not_have(tmp_path):
    # the trial command's report of a tiny-table trial: the measured row's targets and FLOPs,
    # and no "0 iterations", empty wall times or 0 evaluation FLOPs (the table keeps none)
    from typer.testing import CliRunner

    from allocopt.cli import app

    table = write_table(tmp_path / "trials.csv", _rows(seeds=(0,)))
    r = CliRunner().invoke(app, ["trial", "--objective", "tiny-table", "--set", f"table={table}",
                                 "--budget", "3e11", "--rho", "0.5", "--group-size", "4",
                                 "--reward", "sparse"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "0.5300" in r.output  # pass@1 at rho 0.5 (level 3), G 4, seed 0: 0.4 + 0.03 + 0.1
    assert "iterations" not in r.output and "wall time" not in r.output and "evaluation" not in r.output
    assert "of budget" in r.output
