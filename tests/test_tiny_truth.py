"""benchmarks/tiny_truth.py: ρ* rule, regimes, the three answers and the noise, on constructed
tables whose answers are known by construction."""

from __future__ import annotations

import math

import pytest

from objectives.tiny_table import read_table
from tiny_grid_table import LEVELS, benchmark_module, grid_runner, write_table

tt = benchmark_module("tiny_truth")

D = 0.004  # seed offsets -D, 0, +D: seed sd exactly D


def _rows(peaks: dict[str, float], fidelity="full", seeds=(0, 1, 2), share=0.0):
    out = []
    for w, peak in peaks.items():
        for g in (2, 4):
            for x in LEVELS:
                for s in seeds:
                    # a tent of height 0.1 at the peak level, 0.03 per level away from it; G=4 +0.02
                    y = 0.5 + max(0.0, 0.1 - 0.3 * abs(x - peak)) + (0.02 if g == 4 else 0) + D * (s - 1)
                    out.append(dict(reward=w, group_size=g, rho=x, seed=s, fidelity=fidelity, native_reward=y,
                                    pass_at_1=y, judge=y, search=1000, learning=1000,
                                    reward_f=int(2000 * share / (1 - share))))
    return out


def test_smooth_by_hand():
    assert tt.smooth([0.0, 1.0, 0.0]).tolist() == pytest.approx([1 / 3, 0.5, 1 / 3])
    assert tt.smooth([[3.0, 0.0]])[0].tolist() == pytest.approx([2.0, 1.0])


def test_rho_star_regimes_and_answers(tmp_path):
    rows = _rows({"sparse": 0.7, "prm": 0.3}) + _rows({"sparse": 0.7, "prm": 0.5}, fidelity="pilot", seeds=(0, 2))
    good, other = read_table(write_table(tmp_path / "t.csv", rows))
    rep = tt.report(good, other, draws=200, seed=0)
    est = rep["estimates"]
    for t in ("native_reward", "pass_at_1", "judge"):
        s, p = est[("sparse", "full", t)], est[("prm", "full", t)]
        assert (s.rho, s.group_size, p.rho, p.group_size) == (0.7, 4, 0.3, 4)
        assert s.regime == "update-heavy" and p.regime == "search-heavy"  # 0.7 > 0.6, 0.3 < 0.4, share 0
        assert s.interval == (0.7, 0.7) and s.noise == "seeds"  # a 0.1 peak against sd 0.004: never moves
    q1 = {a["target"]: a for a in rep["q1"]}
    assert q1["pass_at_1"]["answer"] == pytest.approx(0.3 - 0.7) and q1["pass_at_1"]["p_lower"] == 1.0
    assert not any(a["disagree"] for a in rep["q2"])  # all targets equal
    q3 = rep["q3"]  # sparse pilots peak where the full runs do; prm pilots at 0.5 (balanced)
    assert sum(a["match"] for a in q3) == 3 and len(q3) == 6
    assert {a["pilot"] for a in q3 if a["reward"] == "prm"} == {"balanced"}
    noise = {(n["fidelity"], n["target"]): n for n in rep["noise"]}
    assert noise[("full", "pass_at_1")]["pooled_sd"] == pytest.approx(D)
    assert noise[("pilot", "pass_at_1")]["pooled_sd"] == pytest.approx(2 ** 0.5 * D)  # seeds 0, 2: ±D


def test_reward_heavy_and_partial_table(tmp_path):
    rows = _rows({"prm": 0.5}, seeds=(1,), share=0.4)
    rows = [r for r in rows if not (r["group_size"] == 2 and r["rho"] == 0.9)]  # G = 2 incomplete
    good, other = read_table(write_table(tmp_path / "t.csv", rows))
    rep = tt.report(good, other, draws=100)
    e = rep["estimates"][("prm", "full", "pass_at_1")]
    assert e.regime == "reward-heavy" and e.reward_share == pytest.approx(0.4, abs=1e-3)
    assert e.g_used == (4,) and e.min_seeds == 1 and e.noise.startswith("binomial sd only")
    text = "\n".join(rep["lines"])
    assert "not answerable yet (model-based measured: prm; rule-based: none)" in text
    assert "Q3" in text and "pilot trials in the table: 0" in text


def test_main_writes_readme_and_figure_and_refuses_a_missing_table(tmp_path, capsys):
    table = write_table(tmp_path / "t.csv", _rows({"sparse": 0.5}))
    assert tt.main(["--table", str(table), "--draws", "50", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "tiny_truth.png").stat().st_size > 1000
    assert "| sparse | full | pass_at_1 | 0.50 [0.50,0.50] | 4 | balanced (1.00)" in (tmp_path / "o" / "README.md").read_text()
    capsys.readouterr()
    assert tt.main(["--table", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and err.count("\n") == 1


def test_pilot_design_on_a_table_with_pilots(tmp_path):
    rows = _rows({"sparse": 0.7, "prm": 0.3}) + _rows({"sparse": 0.7, "prm": 0.3}, fidelity="pilot", seeds=(0, 2))
    table = write_table(tmp_path / "t.csv", rows)
    good, other = read_table(table)
    rep = tt.report(good, other, draws=100)
    pd = tt.pilot_design(rep["estimates"], table, draws=3)
    assert len(pd["pairs"]) == 6  # 2 reward systems x 3 targets, all clear
    first = pd["rows"][0]
    assert first["spec"] == tt.BASELINE and first["pilots_per_reward"] == 6
    assert first["design"] == "hypercube of 6 over G=2/4 (30 pilots at 25%), bandwidth 0.2"
    assert first["study_file"] == "pilots = 30, pilot_fraction = 0.25, [race] rho_levels = 6, bandwidth = 0.2"
    # the study's design: 6 pilots over 2 G leave the local fit (3 + 1 coefficients) under one
    # degree of freedom on Kish's effective size at width 0.2: RACE says unknown every time
    assert first["unknown"] == 1.0 and first["compute"] == 7.5
    assert all(r["compute"] <= 30 * 0.25 + 1e-9 for r in pd["rows"])
    best = max(pd["rows"], key=lambda r: r["rate"])
    assert best["rate"] == 1.0  # peaks of 0.1 against seed sd 0.004, pilots shaped as the full runs
    assert best["rho_error"] < 0.1  # the vertex within one level spacing of the tent peaks (0.7, 0.3)
    assert math.isnan(first["rho_error"])  # unknown every time: no rho* named
    empty = tt.pilot_design(rep["estimates"], write_table(tmp_path / "f.csv", _rows({"sparse": 0.7})))
    assert empty["note"].startswith("no pilot rows in the table yet")


def test_a_second_pilot_fraction_is_answered_and_designed_apart(tmp_path):
    # pilots at 25 % peak where the full runs do; pilots at 10 % (fidelity pilot10) peak at 0.3
    rows = (_rows({"sparse": 0.7}) + _rows({"sparse": 0.7}, fidelity="pilot", seeds=(0, 2))
            + [dict(r, budget_flops=3e10) for r in _rows({"sparse": 0.3}, fidelity="pilot10", seeds=(0, 2))])
    table = write_table(tmp_path / "t.csv", rows)
    good, other = read_table(table)
    rep = tt.report(good, other, draws=100)
    assert tt.fidelities(rep["groups"]) == ["full", "pilot", "pilot10"]
    q3 = {(a["fidelity"], a["target"]): a for a in rep["q3"]}
    assert len(q3) == 6
    assert all(q3[("pilot", t)]["match"] for t in ("native_reward", "pass_at_1", "judge"))
    assert q3[("pilot10", "pass_at_1")]["pilot"] == "search-heavy" and not q3[("pilot10", "pass_at_1")]["match"]
    text = "\n".join(rep["lines"])
    assert "- pilots at 25% (pilot): same regime in 3 of 3" in text
    assert "- pilots at 10% (pilot10): same regime in 0 of 3" in text
    pd = tt.pilot_design(rep["estimates"], table, draws=2)
    by = {r["design"]: r for r in pd["rows"]}
    # 7.5 full runs of pilot compute: 30 pilots at 25 % (6 per reward), 75 at 10 % (15 per reward);
    # under a cap of 75 RACE runs its whole grid, 6 levels x 2 G x 5 rewards = 60 pilots: 6.0 runs
    race10 = by["6 rho levels x G=2/4 (60 pilots at 10%), bandwidth 0.2"]
    assert race10["pilots_per_reward"] == 12 and race10["compute"] == pytest.approx(6.0)
    assert race10["study_file"] == "pilots = 75, pilot_fraction = 0.1, [race] rho_levels = 6, bandwidth = 0.2"
    assert by["5 rho levels x G=2/4 (50 pilots at 10%), bandwidth 0.2"]["pilots_per_reward"] == 10
    assert by["8 rho levels x G=4 (40 pilots at 10%), bandwidth 0.35"]["study_file"].endswith(
        "rho_levels = 8, pilot_group_sizes = [4], bandwidth = 0.35")
    assert not any(n.startswith("8 rho levels x G=2/4") for n in by)  # 16 pilots > 15
    assert all(r["compute"] <= 7.5 + 1e-9 for r in pd["rows"])
    assert max(r["rate"] for r in pd["rows"] if r["fidelity"] == "pilot10") == 0.0  # they peak at 0.3
    assert max(r["rate"] for r in pd["rows"] if r["fidelity"] == "pilot") == 1.0


def test_grid_runner_names_and_orders_the_pilot_fractions():
    import argparse

    g = grid_runner()
    assert (g.fidelity_name(0.25), g.fidelity_name(0.1), g.fidelity_name(0.5)) == ("pilot", "pilot10", "pilot50")
    args = argparse.Namespace(rho_range=(0.2, 0.9), rho_levels=8, budget=3e11, pilot_fractions=[0.25, 0.1],
                              pilot_group_sizes=[4], group_sizes=[2, 4, 8], rewards=["sparse", "prm"],
                              full_seeds=3, pilot_seeds=2)
    cells = g.grid(args)
    # full: 2 rewards x 3 G x 8 levels x 3 seeds; each pilot fraction: 2 x 1 G x 8 x 2 seeds
    assert len(cells) == 144 + 32 + 32
    assert {c.budget_flops for c in cells if c.fidelity == "pilot10"} == {3e10}
    assert {c.group_size for c in cells if c.fidelity != "full"} == {4}
    assert [c.fidelity for c in cells[:48]] == ["full"] * 48  # breadth first: every first seed first
    assert len({c.key() for c in cells}) == len(cells)


def test_main_names_the_best_design_against_the_one_before(tmp_path, capsys):
    rows = _rows({"sparse": 0.7, "prm": 0.3}) + _rows({"sparse": 0.7, "prm": 0.3}, fidelity="pilot", seeds=(0, 2))
    table = write_table(tmp_path / "t.csv", rows)
    study = tmp_path / "s.toml"
    study.write_text('budget_flops = 3e11\npilots = 20\npilot_fraction = 0.25\n'
                     '[space]\ngroup_sizes = [2, 4]\nrewards = ["sparse", "prm"]\n'
                     '[race]\nrho_levels = 4\npilot_group_sizes = [4]\nbandwidth = 0.5\n')
    assert tt.study_design(study) == tt.Design(20, 0.25, 4, (4,), 0.5)
    assert tt.main(["--table", str(table), "--draws", "50", "--design-draws", "2", "--study", str(study),
                    "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "| hypercube of 6 over G=2/4 (30 pilots at 25%), bandwidth 0.2 (before) | 6 | 7.50 |" in out
    assert "| 4 rho levels x G=4 (20 pilots at 25%), bandwidth 0.5 (the study file's" in out
    best = [ln for ln in out.splitlines() if ln.startswith("- best (highest same-regime rate")]
    assert len(best) == 1 and ": 1.00 vs 0.00 before; as a study file: pilots = " in best[0]


def test_an_infeasible_level_is_measured_but_never_rho_star(tmp_path):
    import numpy as np

    # by hand: [1, 0, nan, 3] -> (2*1+0)/3, (0.25+0)/0.75, nan, 3 (no weight from the NaN)
    got = tt.smooth([1.0, 0.0, np.nan, 3.0])
    assert got[:2].tolist() == pytest.approx([2 / 3, 1 / 3]) and np.isnan(got[2]) and got[3] == pytest.approx(3.0)
    rows = _rows({"prm": 0.9})  # the tent peaks at 0.9 ...
    rows = [r for r in rows if not (r["group_size"] == 4 and r["rho"] == 0.9)]  # ... which is infeasible at G 4
    rows += [dict(reward="prm", group_size=4, rho=0.9, seed=s, status="infeasible", native_reward="",
                  pass_at_1="", judge="", error="too small") for s in (0, 1, 2)]
    good, other = read_table(write_table(tmp_path / "t.csv", rows))
    rep = tt.report(good, other, draws=100)
    grp = rep["groups"][("prm", "full")]
    assert grp.complete_g == (2, 4) and grp.infeasible[4] == {0.9}
    e = rep["estimates"][("prm", "full", "pass_at_1")]
    # G 4 (+0.02) at 0.8 (0.59, smoothed with 0.7 only: (2*0.59 + 0.56)/3 = 0.58) against
    # G 2 at 0.9 (0.60 end-smoothed with 0.8: (2*0.60 + 0.57)/3 = 0.59): G 2, rho 0.9 wins
    assert (e.rho, e.group_size) == (0.9, 2)


@pytest.mark.slow  # two whole RACE studies (surrogate fits) on a constructed table: ~30 s
def test_the_race_replay_scores_pilot_regimes_against_the_tables(tmp_path, capsys):
    rr = benchmark_module("tiny_race_replay")
    # sparse peaks at 0.7 (update-heavy), prm at 0.3 (search-heavy), pilots shaped as the full runs
    rows = _rows({"sparse": 0.7, "prm": 0.3}) + _rows({"sparse": 0.7, "prm": 0.3}, fidelity="pilot", seeds=(0, 2))
    table = write_table(tmp_path / "t.csv", rows)
    head = ('budget_flops = 3e11\ntarget = "pass@1"\ntrials = 2\npilot_fraction = 0.25\n'
            '[space]\ngroup_sizes = [2, 4]\nrewards = ["sparse", "prm"]\n')
    few, whole = tmp_path / "few.toml", tmp_path / "whole.toml"
    few.write_text("pilots = 12\n" + head)  # a hypercube of 6 over 2 G a reward system: unknown
    whole.write_text("pilots = 16\n" + head + "[race]\nrho_levels = 8\npilot_group_sizes = [4]\nbandwidth = 0.35\n")
    assert rr.main(["--study", str(few), str(whole), "--seeds", "1", "--table", str(table), "--draws", "50"]) == 0
    out = capsys.readouterr().out
    assert "sparse update-heavy (rho* 0.70, clear), prm search-heavy (rho* 0.30, clear)" in out
    rows = {ln.split("|")[1].strip(): ln.split("|") for ln in out.splitlines() if ln.startswith("| ") and ".toml" in ln}
    assert rows["few.toml"][3].strip() == "0.00" and rows["few.toml"][4].strip() == "1.00"  # every pilot regime unknown
    assert rows["whole.toml"][3].strip() == "1.00" and rows["whole.toml"][4].strip() == "0.00"
    assert rr.main(["--study", str(tmp_path / "none.toml")]) == 2


def test_main_refuses_a_design_draw_count_below_one_in_one_line(tmp_path, capsys):
    table = write_table(tmp_path / "t.csv", _rows({"sparse": 0.5}))
    assert tt.main(["--table", str(table), "--design-draws", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "--design-draws=0: must be >= 1\n"


def test_a_study_file_with_a_bad_race_entry_is_one_line_in_both_benchmarks(tmp_path, capsys):
    # the [race] table is checked by RACE (below the study file's module): both benchmarks that
    # read a study file say so in one line, exit 2, before any replay
    table = write_table(tmp_path / "t.csv", _rows({"sparse": 0.5}))
    bad = tmp_path / "bad.toml"
    bad.write_text("budget_flops = 3e11\n[race]\nbandwith = 0.3\n")
    assert tt.main(["--table", str(table), "--study", str(bad)]) == 2
    assert benchmark_module("tiny_race_replay").main(["--table", str(table), "--study", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("error: race.bandwith: unknown RACE setting") for line in err), err
