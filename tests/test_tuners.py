"""The tuner benchmark's judge (``benchmarks.tuners``): the table reader, the truths, the paired
noise, the common rule, the statistics and the runner, each against numbers computed here."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from allocopt.errors import ConfigError
from allocopt.plan.allocation import Allocation
from benchmarks.tuners.runner import Config, Job, read_csv, run_benchmark, run_job, world_of
from benchmarks.tuners.scoring import CommonRule, best_observed
from benchmarks.tuners.session import Session
from benchmarks.tuners.stats import describe, paired
from benchmarks.tuners.truth import draw_key, heldout_seed, regret_pct, truth_for
from benchmarks.tuners.world import read_world
from tiny_grid_table import grid_columns

COLUMNS = (*grid_columns(), "model")


def write(path: Path, rows: list[dict]) -> Path:
    """A grid table (the grid runner's columns plus ``model``) of ``rows``: dicts with reward,
    group_size, rho, fidelity, budget_flops, seed, pass_at_1 (the other targets derived)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            row = {k: "" for k in COLUMNS}
            row.update(status="complete", search_flops=100, learning_flops=100, reward_flops=0, total_flops=200)
            row.update(r)
            if row["status"] == "complete":
                row.update(native_reward=r["pass_at_1"] + 0.1, judge=r["pass_at_1"] + 0.2)
            w.writerow(row)
    return path


def cells(levels=(0.2, 0.5, 0.8), gs=(2, 4), seeds=(0, 1, 2), budget=1e12, fidelity="full", model="",
          value=lambda i, g, s: 0.3 + 0.01 * i + 0.1 * (g == 4) + 0.001 * s):
    return [dict(reward="sparse", group_size=g, rho=x, fidelity=fidelity, budget_flops=budget, seed=s, model=model,
                 pass_at_1=value(i, g, s)) for g in gs for i, x in enumerate(levels) for s in seeds]


# ------------------------------------------------------------------------------ the reader
def test_reader_pools_models_budgets_and_pilots(tmp_path):
    a = write(tmp_path / "small_grid" / "trials.csv",  # no model column value: named by its folder
              cells() + cells(fidelity="pilot", budget=2.5e11, seeds=(0, 1)))
    b = write(tmp_path / "other" / "trials.csv", cells(model="big", budget=4e12)
              + cells(model="big", fidelity="pilot", budget=1e12, seeds=(0, 1)))
    w = read_world([a, b])
    assert w.models == ("big", "small") and w.space.models == ("big", "small")
    assert w.budgets == {"big": 4e12, "small": 1e12}  # read from each table, not assumed
    assert w.fractions == (0.25,) and w.rho_levels == (0.2, 0.5, 0.8) and w.space.group_sizes == (2, 4)
    assert len(w.candidates) == 2 * 2 * 3 and w.heldout_seeds == (0, 1, 2)
    one = read_world([a])
    assert one.models == ("small",) and one.space.models == () and one.full_budget_flops == 1e12
    assert (one.name, w.name, read_world([b]).name) == ("small", "big+small", "other")  # by folder; pooled by models
    # one model measured at two budgets: two worlds with two names, and refused pooled
    third = write(tmp_path / "tiny_grid_small_1e11" / "trials.csv", cells(model="small", budget=1e11))
    assert read_world([third]).name == "small_1e11" and read_world([third]).models == ("small",)
    with pytest.raises(ConfigError, match="full budget 1e\\+11 FLOPs here and 1e\\+12 in an earlier table"):
        read_world([a, third])
    # a G measured at only some levels is left out of the product, and said so
    # G = 8 measured at 0.2 and 0.5 only: not at every level, so not in the space
    c = write(tmp_path / "c.csv", cells() + cells(gs=(8,), levels=(0.2, 0.5)))
    wc = read_world([c])
    assert wc.space.group_sizes == (2, 4) and all(a.group_size != 8 for a in wc.candidates)
    # a pilot fraction measured at some cells only is left out, and said so
    d = write(tmp_path / "d.csv", cells() + cells(fidelity="pilot", budget=1e11, gs=(2,)))
    wd = read_world([d])
    assert wd.fractions == () and any("0.1" in n for n in wd.notes)


def test_a_full_budget_level_feasible_in_one_seed_only_is_replayed_infeasible(tmp_path):
    """The seed draws the first prompts, so a level at the edge of the budget can fit in one seed
    and not in another: with one complete seed it cannot be held out, and a run there fails as
    often as not, so the replay answers it infeasible and says so (a pilot keeps its one seed)."""
    edge = dict(reward="sparse", group_size=4, rho=0.8, fidelity="full", budget_flops=1e12, seed=1,
                status="infeasible")
    rows = [r for r in cells() if not (r["group_size"] == 4 and r["rho"] == 0.8 and r["seed"] > 0)]
    pilots = cells(fidelity="pilot", budget=2.5e11, seeds=(0, 1))
    pilots = [r for r in pilots if not (r["group_size"] == 4 and r["rho"] == 0.8 and r["seed"] == 1)]
    w = read_world([write(tmp_path / "edge" / "trials.csv",
                          rows + [edge] + pilots + [dict(edge, fidelity="pilot", budget_flops=2.5e11)])])
    assert Allocation(0.8, 4, "sparse") not in w.candidates and len(w.candidates) == 5
    assert w.notes[0] == "replayed infeasible (complete in one seed only, infeasible in another): edge/sparse/G=4/rho=0.8"
    assert w.fractions == (0.25,)  # the pilot level with one complete seed stays measured
    with pytest.raises(ConfigError, match="rho=0.8 has 1 seed at the full budget"):  # complete in one seed, no other
        read_world([write(tmp_path / "one" / "trials.csv", rows)])


def test_bad_tables_are_one_line_errors(tmp_path, capsys):
    one_seed = write(tmp_path / "one.csv", cells(seeds=(0,)))
    with pytest.raises(ConfigError, match=r"rho=0.2 has 1 seed at the full budget; the replay needs >= 2"):
        read_world([one_seed])
    bad = tmp_path / "bad.csv"
    bad.write_text("reward,rho\nsparse,0.2\n")
    with pytest.raises(ConfigError, match="missing column"):
        read_world([bad])
    two = write(tmp_path / "two.csv", cells(budget=1e12) + cells(budget=2e12))
    with pytest.raises(ConfigError, match="one full budget per model"):
        read_world([two])
    from benchmarks import optimizers

    assert optimizers.main(["--tiny-table", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing column" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ truths
def hand_table(tmp_path) -> Path:
    """One reward, G 2, levels 0.2 and 0.6, seeds 0..2 at the full budget, seeds 0, 1 at 25 %."""
    full = {(0.2, 0): 0.30, (0.2, 1): 0.34, (0.2, 2): 0.38, (0.6, 0): 0.50, (0.6, 1): 0.40, (0.6, 2): 0.45}
    rows = [dict(reward="sparse", group_size=2, rho=x, fidelity="full", budget_flops=1e12, seed=s, pass_at_1=v)
            for (x, s), v in full.items()]
    rows += [dict(reward="sparse", group_size=2, rho=x, fidelity="pilot", budget_flops=2.5e11, seed=s,
                  pass_at_1=0.1 + 0.01 * s + (x > 0.5) * 0.05) for x in (0.2, 0.6) for s in (0, 1)]
    return write(tmp_path / "hand" / "t.csv", rows)


def test_seedmean_and_heldout_truths_by_hand(tmp_path):
    w = read_world([hand_table(tmp_path)])
    mid = Allocation(0.3, 2, "sparse")  # a quarter of the way from 0.2 to 0.6
    sm = truth_for(w, "pass_at_1", "seedmean", 0)
    assert sm.value(mid) == pytest.approx(0.75 * 0.34 + 0.25 * 0.45)  # seed-means 0.34 and 0.45
    assert (sm.best, sm.worst) == (pytest.approx(0.45), pytest.approx(0.34))
    # replication 3 with 3 targets holds out seed (3 // 3) % 3 = 1
    assert heldout_seed(w, 3, 3) == 1 and heldout_seed(w, 0, 3) == 0 and heldout_seed(w, 8, 3) == 2
    ho = truth_for(w, "pass_at_1", "heldout", 3)
    assert ho.heldout == 1 and ho.value(mid) == pytest.approx(0.75 * 0.34 + 0.25 * 0.40)
    assert (ho.best, ho.worst) == (pytest.approx(0.40), pytest.approx(0.34))
    assert regret_pct(ho, Allocation(0.2, 2, "sparse")) == pytest.approx(100.0)
    # full-budget draws never return the held-out seed; pilots draw from both their seeds
    at = Allocation(0.6, 2, "sparse")
    full = {round(ho.draw(at, 1.0, draw_key(3, "heldout", at, 1.0, k)), 6) for k in range(60)}
    assert full == {0.50, 0.45}
    pilots = {round(ho.draw(at, 0.25, draw_key(3, "heldout", at, 0.25, k)), 6) for k in range(60)}
    assert pilots == {0.15, 0.16}
    # at an interpolated rho the draw is one seed's interpolation, never the held-out one's
    vals = {round(ho.draw(mid, 1.0, draw_key(3, "heldout", mid, 1.0, k)), 6) for k in range(60)}
    assert vals == {round(0.75 * 0.30 + 0.25 * 0.50, 6), round(0.75 * 0.38 + 0.25 * 0.45, 6)}


def test_paired_seeds_two_methods_see_the_same_truth_and_noise(tmp_path):
    w = read_world([hand_table(tmp_path)])
    a, b = Allocation(0.6, 2, "sparse"), Allocation(0.2, 2, "sparse")
    s1 = Session(w, truth_for(w, "pass_at_1", "heldout", 4), 4, 10.0, (1.0,))
    s2 = Session(w, truth_for(w, "pass_at_1", "heldout", 4), 4, 10.0, (1.0,))
    seq1 = [s1.observe(a), s1.observe(b), s1.observe(a), s1.observe(a, 0.25)]
    seq2 = [s2.observe(b), s2.observe(a, 0.25), s2.observe(a), s2.observe(a)]
    assert s1.truth.heldout == s2.truth.heldout == 1
    # the k-th run of a point gives the same draw to both, whatever the order of their runs
    assert seq1[0] == seq2[2] and seq1[2] == seq2[3] and seq1[1] == seq2[0] and seq1[3] == seq2[1]
    assert s1.spent == s2.spent == pytest.approx(3.25)  # a pilot at 25 % costs 0.25
    # the harness gives two methods of a replication the same target and held-out seed
    recs = [run_job(Job("tiny-table", (str(hand_table(tmp_path)),), "heldout", 4, "pass_at_1", m, 2.0, (2.0,)))
            for m in ("grid", "random")]
    assert recs[0][0]["heldout_seed"] == recs[1][0]["heldout_seed"] == 1


def test_session_costs_and_when_an_answer_is_due(tmp_path):
    w = read_world([hand_table(tmp_path)])
    s = Session(w, truth_for(w, "pass_at_1", "seedmean", 0), 0, 2.0, (1.0, 2.0))
    assert not s.answer_due(1.0)  # a full run now ends at 1: it counts at level 1
    s.observe(Allocation(0.2, 2, "sparse"), 0.25)
    assert s.spent == 0.25 and not s.answer_due(0.25) and s.answer_due(1.0)  # 0.25 + 1 passes level 1
    with pytest.raises(ValueError, match="fraction=0.1"):
        s.observe(Allocation(0.2, 2, "sparse"), 0.1)
    s.observe(Allocation(0.2, 2, "sparse"))
    s.observe(Allocation(0.6, 2, "sparse"))
    assert s.done and s.spent == 2.25 and len(s.full_runs(2.0)) == 1 and len(s.full_runs()) == 2


# ------------------------------------------------------------------------------ the common rule
def test_common_rule_picks_the_gp_posterior_mean_argmax(tmp_path):
    """Seven ρ levels, full runs at all but the middle one, on a parabola peaking there
    (0.5 - 2 (ρ - 0.5)², symmetric): a smooth posterior mean peaks at the unmeasured 0.5, a cell
    the best observed run can never name (it names 0.4, the first of the two best)."""
    levels = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    w = read_world([write(tmp_path / "sym.csv", cells(levels=levels, gs=(2,), seeds=(0, 1)))])
    full = [(Allocation(x, 2, "sparse"), 0.5 - 2 * (x - 0.5) ** 2) for x in levels if x != 0.5]
    rule = CommonRule(w)
    assert rule(full) == Allocation(0.5, 2, "sparse") and rule.fits == 1
    assert best_observed(full) == Allocation(0.4, 2, "sparse")
    assert rule(list(full)) == Allocation(0.5, 2, "sparse") and rule.fits == 1  # cached
    # one run, or runs that all observed one value: the best observed
    assert rule(full[:1]) == full[0][0] and rule([(a, 0.3) for a, _ in full]) == full[0][0]


# ------------------------------------------------------------------------------ statistics
def test_describe_matches_numpy_and_scipy():
    xs = [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, math.nan]
    d = describe(xs)
    a = np.array(xs[:-1])
    assert d["n"] == 6 and d["median"] == 3.0 and (d["q1"], d["q3"]) == tuple(np.percentile(a, [25, 75]))
    assert d["mean"] == pytest.approx(31 / 6)
    ci = sps.bootstrap((a,), np.mean, confidence_level=0.95, n_resamples=2000, method="BCa",
                       rng=np.random.default_rng(0)).confidence_interval
    assert (d["mean_lo"], d["mean_hi"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d["mean_lo"] < d["mean"] < d["mean_hi"]
    same = describe([2.0, 2.0, 2.0])
    assert (same["mean_lo"], same["mean_hi"]) == (2.0, 2.0)
    assert describe([])["n"] == 0 and math.isnan(describe([math.nan])["median"])


def test_paired_win_rate_and_wilcoxon():
    mine = [1.0, 2.0, 3.0, 0.0, 5.0, 2.0, math.nan, 1.0]
    theirs = [2.0, 2.0, 5.0, 1.0, 4.0, 6.0, 3.0, math.nan]
    p = paired(mine, theirs)
    # pairs 1-6: wins at 1, 3, 4, 6, a tie at 2, a loss at 5; 7: only theirs (loss); 8: only mine (win)
    assert p["n"] == 8 and p["win_rate"] == pytest.approx((4 + 0.5 + 1) / 8)
    want = sps.wilcoxon([1.0, 2.0, 3.0, 0.0, 5.0, 2.0], [2.0, 2.0, 5.0, 1.0, 4.0, 6.0], zero_method="wilcox").pvalue
    assert p["p"] == pytest.approx(want)
    assert paired([1.0, 2.0], [1.0, 2.0]) == {"n": 2, "win_rate": 0.5, "p": 1.0}
    with pytest.raises(ValueError, match="same replications"):
        paired([1.0], [1.0, 2.0])


# ------------------------------------------------------------------------------ the runner
def test_runner_writes_every_column_and_resumes(tmp_path):
    t = hand_table(tmp_path)
    cfg = Config(seeds=2, tables=(str(t),), methods=("grid", "random"), levels=(1.0, 2.0), workers=1, nice=0)
    part = tmp_path / "out" / "partial.csv"
    part.parent.mkdir()
    recs = run_benchmark(cfg, partial=part)
    assert len(recs) == 2 * 2 * 2 * 2  # seeds x truths x methods x levels
    assert {(r["truth"], r["seed"], r["target"]) for r in recs} == \
        {(tr, s, ("native_reward", "pass_at_1")[s]) for tr in ("seedmean", "heldout") for s in (0, 1)}
    grid2 = [r for r in recs if r["method"] == "grid" and r["level"] == 2.0]
    # the grid runs rho 0.2 then 0.6; by 2 runs its oracle is the truth's best: regret 0
    assert all(r["regret_pct_oracle"] == 0.0 and r["compute_used"] == 2.0 for r in grid2)
    again = run_benchmark(cfg, partial=part)
    assert len(again) == len(recs) and len(read_csv(part)) == len(recs)  # nothing ran twice
    assert world_of("tiny-table", (str(t),)).name == "hand"


# ------------------------------------------------------------------------------ synthetic worlds
def test_a_synthetic_world_is_scored_against_its_exact_optimum():
    from benchmarks.tuners.world import SyntheticWorld
    from objectives.synthetic import optimum, response

    w = SyntheticWorld("paper")
    assert len(w.candidates) == 36 * 4 * 5 and w.fractions == (0.1, 0.25) and len(w.grid_points()) == 8 * 4 * 5
    t = truth_for(w, "pass_at_1", "seedmean", 0)
    o = optimum("pass_at_1", variant="paper")
    assert (t.best, t.worst) == (o.value, o.worst) and regret_pct(t, o.allocation) == 0.0
    a = Allocation(0.3, 2, "sparse")
    assert regret_pct(t, a) == pytest.approx(100 * (o.value - response(0.3, 2, "sparse")) / o.range)
    k = draw_key(0, "seedmean", a, 0.1, 0)
    assert t.draw(a, 0.1, k) == t.draw(a, 0.1, k) != t.draw(a, 0.1, draw_key(0, "seedmean", a, 0.1, 1))
    with pytest.raises(ValueError, match="only seedmean"):
        truth_for(w, "pass_at_1", "heldout", 0)


@pytest.mark.slow  # the whole command line on the tiny world's table: minutes on 2 cores
def test_quick_benchmark_writes_results_tables_and_figure(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "optimizers.py"), "--quick", "--no-timings",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=1800, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_csv(tmp_path / "results.csv")
    assert {"regret_pct", "regret_pct_common", "regret_pct_oracle", "truth", "compute_used"} <= set(rows[0])
    assert {r["method"] for r in rows} == {"grid", "random", "tpe", "gp", "allocopt"}
    assert len(rows) == 2 * 2 * 5 * 3  # replications x truths x methods x levels
    text = (tmp_path / "tables.md").read_text()
    assert "common rule" in text and "held-out seed" in text and (tmp_path / "regret.png").stat().st_size > 10_000


def test_report_tables_are_the_statistics_of_the_records():
    from benchmarks.tuners.report import leaders, paired_table, stat_table

    def rec(m, seed, own, common):
        return {"world": "w", "truth": "heldout", "method": m, "seed": seed, "target": "pass_at_1", "level": 8.0,
                "regret_pct": own, "regret_pct_common": common, "regret_pct_oracle": 0.0}

    recs = [rec("allocopt", s, v, 1.0) for s, v in enumerate([1.0, 2.0, 3.0, 10.0])]
    recs += [rec("tpe", s, v, 2.0) for s, v in enumerate([2.0, 2.0, 1.0, 20.0])]
    table = stat_table(recs, "w", "heldout", "own")
    q1, q3 = np.percentile([1.0, 2.0, 3.0, 10.0], [25, 75])
    assert f"| allocopt | 4 | 2.5 [{q1:.1f}, {q3:.1f}] |" in table
    # wins at seeds 0 and 3, a tie at 1, a loss at 2: (2 + 0.5) / 4
    p = sps.wilcoxon([1.0, 3.0, 10.0], [2.0, 1.0, 20.0]).pvalue
    assert f"| Optuna TPE | 0.62 (p={p:.2g}, n=4) |" in paired_table(recs, "w", "heldout", "own")
    assert "8: allocopt (1.0)" in leaders(recs, "w", "heldout", "common")
    assert "No peer has a lower median than allocopt" in leaders(recs, "w", "heldout", "common")


def test_the_bar_names_levels_not_run_instead_of_failing_them():
    """``--levels 4,8``: the bar over 8-40 runs is judged at 8 only (12-40 not run), at none
    with ``--levels 4``, and 3 % at 16 is not run; a level run where a peer is lower is a NO
    whatever else was not run."""
    from benchmarks.tuners.report import bar_verdict

    def rec(m, level, v):
        return {"world": "w", "truth": "seedmean", "method": m, "seed": 0, "target": "pass_at_1", "level": level,
                "regret_pct": v, "regret_pct_common": v, "regret_pct_oracle": v}

    runs = [rec("allocopt", 4.0, 1.0), rec("allocopt", 8.0, 1.0), rec("tpe", 4.0, 2.0), rec("tpe", 8.0, 2.0)]
    text = bar_verdict(runs)
    assert "w / seedmean / own: lowest median at 8, 12, 16, 24, 40: YES at 8 (12, 16, 24, 40 not run); " \
           "<= 3 % at 16: not run" in text and "NO" not in text
    assert "lowest median at 8, 12, 16, 24, 40: not judged (8, 12, 16, 24, 40 not run)" in bar_verdict(runs[::2])
    text = bar_verdict(runs + [rec("allocopt", 12.0, 1.0), rec("tpe", 12.0, 0.5)])
    assert "lowest median at 8, 12, 16, 24, 40: NO (not at 12) (16, 24, 40 not run)" in text
    full = [rec(m, lv, v) for m, v in (("allocopt", 2.0), ("tpe", 4.0)) for lv in (8.0, 12.0, 16.0, 24.0, 40.0)]
    assert "lowest median at 8, 12, 16, 24, 40: YES; <= 3 % at 16: YES (2.0 %)" in bar_verdict(full)
    # allocopt's own ablation rows are other settings of it, not peers: lower, they beat nothing
    own = [rec(m, lv, 1.0) for m in ("allocopt-design", "allocopt-pilots") for lv in (8.0, 12.0, 16.0, 24.0, 40.0)]
    assert "lowest median at 8, 12, 16, 24, 40: YES;" in bar_verdict(full + own)


def test_ablation_choices_are_made_on_the_other_worlds_and_reported_on_the_one_left_out():
    from benchmarks.tuners.ablation import against_shipped, leave_one_world_out, score_on, tables

    def recs(variant, world, value, seeds=(0, 1)):
        return [{"variant": variant, "world": world, "truth": t, "seed": s, "level": lv, "regret_pct": value,
                 "regret_pct_oracle": value / 2} for t in ("seedmean", "heldout") for s in seeds
                for lv in (8.0, 12.0, 16.0, 40.0)]

    records = (recs("shipped", "A", 10.0) + recs("x", "A", 5.0) + recs("shipped", "B", 4.0) + recs("x", "B", 6.0)
               + recs("shipped", "A", 100.0, seeds=(7,)))  # a replication x did not run: left out
    assert score_on(records, "shipped", ["A"], ["shipped", "x"]) == pytest.approx(10.0)
    got = {c["held_out"]: c for c in leave_one_world_out(records, ["shipped", "x"])}
    assert got["A"]["choice"] == "shipped" and got["A"]["chosen_on"] == ["B"]
    assert got["A"]["on_held_out"] == pytest.approx(10.0) == got["A"]["shipped_on_held_out"]
    assert got["B"]["choice"] == "x" and got["B"]["on_held_out"] == pytest.approx(6.0)
    assert got["B"]["shipped_on_held_out"] == pytest.approx(4.0)
    md = tables(records, ["shipped", "x"])
    assert "| x | 5.0 (2.5) / 5.0 (2.5) / 5.0 (2.5)" in md and "| B | A | x | 5.00 | 6.00 | 4.00 |" in md
    # x alone against shipped: A left out, x - shipped on B is 6 - 4 (not chosen), on A 5 - 10
    pairs = {r["held_out"]: r for r in against_shipped(records, ["shipped", "x"])}
    assert pairs["A"]["on_others"] == pytest.approx(2.0) and pairs["A"]["on_held_out"] == pytest.approx(-5.0)
    assert pairs["B"]["on_others"] == pytest.approx(-5.0) and pairs["B"]["on_held_out"] == pytest.approx(2.0)
    assert "| x | +2.00 / -5.00 | -5.00 / +2.00 | chosen in 1 of 2; lower where left out in 0 of those |" in md


def test_the_design_ablation_replays_each_change_of_todays_tuner_and_refuses_bad_flags(tmp_path, capsys):
    """``--design``: the shipped tuner beside each change of :data:`DESIGN` on every world and
    truth, to design.csv/.md with a leave-one-world-out row per world; a variant of another mode
    is one line and exit code 2."""
    from benchmarks import tuner_ablation
    from benchmarks.tuners.ablation import DESIGN

    a = write(tmp_path / "wa" / "trials.csv", cells())
    b = write(tmp_path / "wb" / "trials.csv", cells(value=lambda i, g, s: 0.5 - 0.02 * i + 0.05 * (g == 2) + 0.001 * s))
    out = tmp_path / "abl"
    assert tuner_ablation.main(["--tables", str(a), str(b), "--design", "--variants", "categories-alike",
                                "--out", str(out), "--nice", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "categories-alike" in err and "allowed with --design" in err and "no-initial-design" in err
    assert err.startswith("error: --variants='categories-alike': "), err  # the flag as the user typed it
    assert tuner_ablation.main(["--tables", str(a), "--design", "--out", str(out), "--nice", "0"]) == 2
    assert "two or more worlds" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("reward,rho\nsparse,0.2\n")
    assert tuner_ablation.main(["--tables", str(a), str(bad), "--design", "--out", str(out), "--nice", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing column" in err and "Traceback" not in err
    assert tuner_ablation.main(["--tables", str(a), str(b), "--design", "--seeds", "1", "--out", str(out),
                                "--nice", "0"]) == 0
    with (out / "design.csv").open() as f:
        rows = list(csv.DictReader(f))
    got = {(r["variant"], r["world"], r["truth"]) for r in rows}
    assert got == {(v, w, t) for v in DESIGN for w in ("wa", "wb") for t in ("seedmean", "heldout")}
    assert len(rows) == len(got) * 6  # one record per level
    md = (out / "design.md").read_text()
    assert "| wa | wb |" in md and "| wb | wa |" in md and "| no-initial-design |" in md
    assert "* `zoom-in-rho`: " + DESIGN["zoom-in-rho"][0] in md and "(1 paired replication each" in md


def test_best_run_mean_is_the_cell_whose_full_runs_average_highest():
    from allocopt.plan.allocation import Allocation
    from allocopt.tuner.decide import Observed
    from benchmarks.tuners.ablation import best_run_mean

    a, b, c = (Allocation(r, 4, "sparse") for r in (0.3, 0.5, 0.7))
    runs = [Observed(a, 1.0, 0.5), Observed(b, 1.0, 0.45), Observed(a, 1.0, 0.3),  # a: mean 0.4
            Observed(c, 0.25, 0.9)]  # a pilot: not a full run, not the answer
    assert best_run_mean(runs) == b
    assert best_run_mean(runs + [Observed(c, 1.0, 0.41)]) == b
    assert best_run_mean(runs + [Observed(c, 1.0, 0.46)]) == c


def test_the_answer_rules_are_taken_on_the_runs_of_the_tuner_named_by_on(tmp_path, capsys):
    """``--answer-rules --on VARIANT``: every rule's answer on one replay of that variant's tuner
    (the rule ``shipped`` must reproduce the replay's own answers, which the replay checks); the
    model-free rule answers the best run mean; ``--on`` without ``--answer-rules`` or naming no
    ``--design`` variant is one line and exit code 2."""
    from benchmarks import tuner_ablation
    from benchmarks.tuners.ablation import BEST_RUN_MEAN, run_answer_rules, run_variant
    from benchmarks.tuners.runner import LEVELS, world_of

    a = write(tmp_path / "wa" / "trials.csv", cells())
    b = write(tmp_path / "wb" / "trials.csv", cells(value=lambda i, g, s: 0.5 - 0.02 * i + 0.05 * (g == 2) + 0.01 * s))
    out = tmp_path / "ar"
    for bad, says in ((["--on", "initial-wide-middle"], "--on: give it with --answer-rules"),
                      (["--answer-rules", "--on", "categories-alike"], "--on='categories-alike': allowed: shipped")):
        assert tuner_ablation.main(["--tables", str(a), str(b), *bad, "--out", str(out), "--nice", "0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert tuner_ablation.main(["--tables", str(a), str(b), "--answer-rules", "--on", "initial-wide-middle",
                                "--variants", f"shipped,cell-offset,{BEST_RUN_MEAN}", "--seeds", "1",
                                "--out", str(out), "--nice", "0"]) == 0
    with (out / "answer_rules.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["variant"], r["world"], r["truth"]) for r in rows} == \
        {(v, w, t) for v in ("shipped", "cell-offset", BEST_RUN_MEAN) for w in ("wa", "wb") for t in ("seedmean", "heldout")}
    # the rule shipped on these runs is the replay of initial-wide-middle itself, level by level
    w = world_of("tiny-table", (str(b),))
    own = {r["level"]: r["regret_pct"] for r in run_variant(w, "seedmean", 0, "initial-wide-middle", LEVELS, design=True)}
    got = {float(r["level"]): float(r["regret_pct"]) for r in rows
           if (r["variant"], r["world"], r["truth"]) == ("shipped", "wb", "seedmean")}
    assert got == pytest.approx(own, nan_ok=True)
    # taken on the tuner before (the default), the shipped rule is that tuner's replay, not this one's
    before = {r["level"]: r["regret_pct"] for r in run_answer_rules(w, "seedmean", 0, LEVELS, ["shipped"])}
    assert before == pytest.approx({r["level"]: r["regret_pct"] for r in run_variant(w, "seedmean", 0, "initial-g-in-turn", LEVELS, design=True)}, nan_ok=True)


def test_paired_lines_are_the_wilcoxon_test_of_each_change_against_the_shipped_design():
    from benchmarks.tuners.ablation import paired_lines

    def rec(v, seed, level, value):
        return {"variant": v, "world": "w", "truth": "seedmean", "seed": seed, "level": level, "regret_pct": value}

    base = {0: 4.0, 1: 6.0, 2: 5.0, 3: 9.0}
    change = {0: 2.0, 1: 7.0, 2: 5.0, 3: 1.0}  # lower, higher, tied, lower
    records = [rec("shipped", k, 8.0, v) for k, v in base.items()] + [rec("x", k, 8.0, v) for k, v in change.items()]
    records.append(rec("shipped", 9, 8.0, 50.0))  # x did not run replication 9: not a pair
    p = sps.wilcoxon([-2.0, 1.0, 0.0, -8.0]).pvalue
    md = "\n".join(paired_lines(records, ["shipped", "x"]))
    assert "| variant | 8–16 runs |" in md and f"| x | 6.00 → 3.75; 2 / 1; p = {p:.2g} |" in md
    # another world's pairs join the pooled table and stay out of the table of w alone
    other = [dict(r, world="v", regret_pct=r["regret_pct"] + 100.0) for r in records]
    assert f"| x | 6.00 → 3.75; 2 / 1; p = {p:.2g} |" in "\n".join(paired_lines(records + other, ["shipped", "x"], "w"))
    assert "paired on w alone" in "\n".join(paired_lines(records + other, ["shipped", "x"], "w"))
    assert "6.00 → 3.75" not in "\n".join(paired_lines(records + other, ["shipped", "x"]))


def test_changes_are_paired_against_the_named_base_when_it_is_not_the_shipped_design(tmp_path, capsys):
    """``base`` (``--against``): the pairs are each change less that variant, by hand below; the
    shipped design is then one change among the others; a base not among the variants is refused."""
    from benchmarks import tuner_ablation
    from benchmarks.tuners.ablation import paired_lines

    def rec(v, seed, value):
        return {"variant": v, "world": "w", "truth": "seedmean", "seed": seed, "level": 8.0, "regret_pct": value}

    vals = {"shipped": [4.0, 6.0, 5.0, 9.0], "nd": [3.0, 3.0, 8.0, 2.0], "wm": [1.0, 4.0, 8.0, 3.0]}
    records = [rec(v, k, x) for v, xs in vals.items() for k, x in enumerate(xs)]
    md = "\n".join(paired_lines(records, list(vals), base="nd"))
    p_wm = sps.wilcoxon([-2.0, 1.0, 0.0, 1.0]).pvalue  # wm less nd
    p_sh = sps.wilcoxon([1.0, 3.0, -3.0, 7.0]).pvalue  # shipped less nd
    assert "against `nd`" in md and "| nd |" not in md
    assert f"| wm | 4.00 → 4.00; 1 / 2; p = {p_wm:.2g} |" in md
    assert f"| shipped | 4.00 → 6.00; 1 / 3; p = {p_sh:.2g} |" in md
    a, b = tmp_path / "wa" / "trials.csv", tmp_path / "wb" / "trials.csv"
    for t in (a, b):
        t.parent.mkdir()
        t.write_text("x\n")
    assert tuner_ablation.main(["--tables", str(a), str(b), "--design", "--variants", "shipped,initial-wide-middle",
                                "--against", "no-initial-design", "--out", str(tmp_path / "o"), "--nice", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--against='no-initial-design'" in err and "initial-wide-middle" in err


def test_the_synthetic_mode_replays_every_change_on_the_named_worlds_and_chooses_nothing(tmp_path, capsys):
    from benchmarks import tuner_ablation

    out = tmp_path / "abl"
    assert tuner_ablation.main(["--synthetic", "flat", "--design", "--variants", "shipped,initial-g-in-turn",
                                "--seeds", "1", "--out", str(out), "--nice", "0"]) == 0
    capsys.readouterr()
    with (out / "design_synthetic.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["variant"], r["world"], r["truth"]) for r in rows} == {
        ("shipped", "flat", "seedmean"), ("initial-g-in-turn", "flat", "seedmean")}
    md = (out / "design_synthetic.md").read_text()
    assert "paired" in md and "| initial-g-in-turn |" in md and "Leave one world out" not in md
    for bad, says in ((["--synthetic", "nope"], "allowed: all, or some of"),
                      (["--synthetic", "all", "--tables", "a.csv"], "not both")):
        assert tuner_ablation.main(bad + ["--design", "--out", str(out), "--nice", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and says in err


def test_the_other_seeds_answer_is_the_best_mean_without_the_held_out_seed(tmp_path):
    """A world where every seed's best cell differs: ρ 0.2 scores 0.41 in every seed, ρ 0.6 scores
    0.50 / 0.43 / 0.30. Holding out seed 0 or 1, the other seeds' mean at 0.6 (0.365, 0.40) is
    below 0.41, so the answer is 0.2 and the held-out seed prefers 0.6; holding out seed 2 (mean
    0.465) the answer is 0.6 and seed 2 prefers 0.2: regret 100 % of the range each time."""
    from benchmarks import heldout_reference
    from benchmarks.tuners.truth import other_seeds_answer

    vals = {0.2: (0.41, 0.41, 0.41), 0.6: (0.50, 0.43, 0.30)}
    path = write(tmp_path / "flip" / "trials.csv",
                 [dict(reward="sparse", group_size=2, rho=x, fidelity="full", budget_flops=1e12, seed=s, pass_at_1=v)
                  for x, vs in vals.items() for s, v in enumerate(vs)])
    w = read_world([path])
    for h, want in ((0, 0.2), (1, 0.2), (2, 0.6)):
        rep = next(r for r in range(30) if truth_for(w, "pass_at_1", "heldout", r, 3).heldout == h)
        truth = truth_for(w, "pass_at_1", "heldout", rep, 3)
        assert other_seeds_answer(truth).rho == want
        assert regret_pct(truth, other_seeds_answer(truth)) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="needs a held-out truth"):
        other_seeds_answer(truth_for(w, "pass_at_1", "seedmean", 0, 3))
    name, regrets = heldout_reference.reference(path, 6)
    assert name == "flip" and regrets == pytest.approx([100.0] * 6)


def test_the_world_noise_table_is_one_runs_spread_against_the_cells_range(tmp_path, capsys):
    """Two cells of two seeds: ρ 0.2 scores 0.40 / 0.44, ρ 0.6 0.50 / 0.54. By hand: each cell's
    variance 0.0008, sd 0.0283 = 28.3 % of the 0.1 range; the seed-mean truth's sd is that over
    √2 (20.0 %); the second-best cell (of two) lies 100 % below; runs to tell them apart
    2 · 0.0008 / 0.1² = 0.16."""
    from benchmarks import world_noise

    vals = {0.2: (0.40, 0.44), 0.6: (0.50, 0.54)}
    path = write(tmp_path / "two" / "trials.csv",
                 [dict(reward="sparse", group_size=2, rho=x, fidelity="full", budget_flops=1e12, seed=s,
                       pass_at_1=v, native_reward=v, judge=v)
                  for x, vs in vals.items() for s, v in enumerate(vs)])
    row = world_noise.noise_row(read_world([path]), "pass_at_1")
    assert row == pytest.approx({"seeds": 2.0, "one_run": 28.284, "truth": 20.0, "gap5": 100.0, "runs": 0.16},
                                rel=1e-4)
    assert world_noise.main(["--tables", str(path)]) == 0
    assert "| two | judge | 2.0 | 28.3 | 20.0 | 100.0 | 0.2 |" in capsys.readouterr().out
    assert world_noise.main(["--tables", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "none.csv" in err and "not a file" in err


def test_the_benchmark_scripts_refuse_a_table_given_twice_or_two_tables_of_one_world(tmp_path, capsys):
    """One table twice (by another path, too) is one world, not two: each script that reads
    worlds refuses it in one line; the ablation also refuses two tables of one world's name."""
    from benchmarks import heldout_reference, tuner_ablation, world_noise

    a = write(tmp_path / "wa" / "trials.csv", cells())
    again = str(tmp_path / "wa" / ".." / "wa" / "trials.csv")
    for main, extra in ((world_noise.main, []), (heldout_reference.main, []),
                        (tuner_ablation.main, ["--out", str(tmp_path / "o"), "--nice", "0"])):
        assert main(["--tables", str(a), again, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "given twice" in err and "trials.csv" in err
    b = write(tmp_path / "other" / "wa" / "trials.csv", cells(value=lambda i, g, s: 0.5 - 0.01 * i))
    assert tuner_ablation.main(["--tables", str(a), str(b), "--out", str(tmp_path / "o"), "--nice", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "two tables are world 'wa'" in err
    assert not (tmp_path / "o" / "ablation.csv").exists()
    c = write(tmp_path / "wc" / "trials.csv", cells())
    assert tuner_ablation.main(["--tables", str(a), str(c), "--paired-on", "wb", "--out", str(tmp_path / "o"),
                                "--nice", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--paired-on='wb': not a world of this run; its worlds: wa, wc" in err
    assert not (tmp_path / "o" / "ablation.csv").exists()


def test_the_ablations_score_levels_choose_and_pair_over_the_levels_given(tmp_path):
    """``score_levels=(4, 8)``: the score is the mean at 4 and 8 runs (x: (1 + 9) / 2 = 5 on A,
    shipped (6 + 6) / 2 = 6), so x is chosen where at 8 runs alone it would not be, and the
    paired table gains the span 4–8; the command line refuses a level the replay does not record."""
    from benchmarks import tuner_ablation
    from benchmarks.tuners.ablation import leave_one_world_out, score_on, tables

    assert tuner_ablation._score_levels("4, 8,8") == ((4.0, 8.0), None)
    for bad in ("4,5", "x", ""):
        assert tuner_ablation._score_levels(bad)[1] == f"--score-levels={bad!r}: give comma-separated levels " \
            "from 4, 8, 12, 16, 24, 40"

    def recs(variant, world, by_level):
        return [{"variant": variant, "world": world, "truth": t, "seed": s, "level": lv, "regret_pct": v,
                 "regret_pct_oracle": v} for t in ("seedmean", "heldout") for s in (0, 1)
                for lv, v in by_level.items()]

    records = (recs("shipped", "A", {4.0: 6.0, 8.0: 6.0}) + recs("x", "A", {4.0: 1.0, 8.0: 9.0})
               + recs("shipped", "B", {4.0: 6.0, 8.0: 6.0}) + recs("x", "B", {4.0: 1.0, 8.0: 9.0}))
    assert score_on(records, "x", ["A"], ["shipped", "x"], levels=(4.0, 8.0)) == pytest.approx(5.0)
    assert score_on(records, "x", ["A"], ["shipped", "x"], levels=(8.0,)) == pytest.approx(9.0)
    assert {c["choice"] for c in leave_one_world_out(records, ["shipped", "x"], levels=(4.0, 8.0))} == {"x"}
    assert {c["choice"] for c in leave_one_world_out(records, ["shipped", "x"], levels=(8.0,))} == {"shipped"}
    md = tables(records, ["shipped", "x"], levels=(4.0, 8.0), score_levels=(4.0, 8.0))
    assert "mean own regret at 4, 8 runs" in md and "| 4–8 runs |" in md
    # the 4-8 span pools 16 pairs (2 worlds, 2 truths, 2 seeds, 2 levels): the 8 at 4 runs lower, at 8 higher
    assert "| x | 6.00 → 1.00; 8 / 0;" in md and "| 6.00 → 5.00; 8 / 8; p =" in md


def test_noise_learned_reports_the_tables_noise_share_by_hand_and_repeats_it_can_count(tmp_path, capsys):
    """``benchmarks/noise_learned.py``: one run's noise share of a table by hand (two cells, two
    seeds each: values 0.30/0.34 and 0.50/0.52, within-cell variances 0.0008 and 0.0002, their
    mean 0.0005, over the variance of the four values); a replay's counts are consistent, and
    with two seeds per cell every repeat under the held-out truth returns the same value."""
    from benchmarks import noise_learned
    from benchmarks.tuners.runner import world_of

    vals = {(0.2, 0): 0.30, (0.2, 1): 0.34, (0.8, 0): 0.50, (0.8, 1): 0.52}
    t = write(tmp_path / "wn" / "trials.csv", cells(levels=(0.2, 0.8), gs=(4,), seeds=(0, 1),
                                                    value=lambda i, g, s: vals[((0.2, 0.8)[i], s)]))
    w = world_of("tiny-table", (str(t),))
    by_hand = 0.0005 / statistics.variance(vals.values())
    assert noise_learned.table_noise_share(w, "pass_at_1") == pytest.approx(by_hand)
    b = write(tmp_path / "wb" / "trials.csv", cells(seeds=(0, 1)))
    r = noise_learned.replay(world_of("tiny-table", (str(b),)), "heldout", 0)
    assert r["runs"] >= 40 - 1 and 0 <= r["same"] == r["repeats"] <= r["runs"]
    assert sum(v for k, v in r.items() if k.startswith("w")) == pytest.approx(1.0)
    assert noise_learned.main(["--tables", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tables=") and err.count("\n") == 1
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n1,2\n")
    assert noise_learned.main(["--tables", str(notes)]) == 2  # a file that is not a grid table
    err = capsys.readouterr().err
    assert err.startswith("error: table=") and "missing column" in err and err.count("\n") == 1
