"""The synthetic family's optima (by an independent dense grid) and the optimizer benchmark."""

import importlib.util
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from allocopt.plan.allocation import REWARDS, Allocation
from allocopt.flops import ConfigError
from objectives.synthetic import (B_REF, SIZE_MODELS, VARIANTS, SyntheticObjective, get_variant,
                                  observe, optimum, response, space_of)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "optimizers.py"
TARGETS = ("native_reward", "pass_at_1", "judge")

# The module docstring's table of known optima at B_REF: (reward, G, model, rho* per target, score)
DOCUMENTED = {
    "paper": ("prm", 8, None, (0.51, 0.45, 0.37), 0.65),
    "model-size": ("prm", 8, "Qwen/Qwen2.5-3B", (0.4476, 0.3876, 0.3076), 0.69996),
    "flat": ("prm", 8, None, (0.51, 0.45, 0.37), 0.43),
    "narrow": ("prm", 8, None, (0.51, 0.45, 0.37), 0.65),
    "rank-flip": ("dense", 8, None, (0.78, 0.72, 0.64), 0.67),
    "rho-by-g": ("prm", 8, None, (0.51, 0.45, 0.37), 0.65),
    "noisy": ("prm", 8, None, (0.51, 0.45, 0.37), 0.65),
}
RHO_STEP = 1e-4


def dense_search(variant, target, budget=B_REF):
    """Best and worst of the noise-free response over the variant's space on a 1e-4 ρ grid."""
    s = space_of(variant)
    lo, hi = s.rho
    rhos = [lo + i * RHO_STEP for i in range(round((hi - lo) / RHO_STEP) + 1)]
    best, worst = (-math.inf,), math.inf
    for m in s.models or (None,):
        for w in s.rewards:
            for g in s.group_sizes:
                vals = [response(r, g, w, target, budget, variant=variant, model=m) for r in rhos]
                k = max(range(len(vals)), key=vals.__getitem__)
                if vals[k] > best[0]:
                    best = (vals[k], rhos[k], g, w, m)
                worst = min(worst, min(vals))
    return best, worst


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_optima_are_where_the_docstring_says(variant):
    reward, g, model, rhos, score = DOCUMENTED[variant]
    for target, rho in zip(TARGETS, rhos):
        (value, r, gg, w, m), worst = dense_search(variant, target)
        assert (w, gg, m) == (reward, g, model), (variant, target)
        assert abs(r - rho) < 1e-3 and abs(value - score) < 1e-4, (variant, target, r, value)
        o = optimum(target, variant=variant)  # the module's closed form agrees with the grid
        assert abs(o.value - value) < 1e-6 and abs(o.allocation.rho - r) <= RHO_STEP
        assert (o.allocation.reward, o.allocation.group_size, o.allocation.model) == (w, gg, m)
        assert abs(o.worst - worst) < 1e-6 and o.range > 0


def test_default_variant_is_unchanged():
    assert SyntheticObjective().variant == "paper"
    assert response(0.72, 8, "sparse") == pytest.approx(0.30 + 0.25 + 0.04)
    assert response(0.45, 8, "prm", variant="flat") == pytest.approx(0.36 + 0.03 + 0.04)


@pytest.mark.slow  # an end-to-end run of several seconds (CI runs -m slow)
def test_budget_drift_and_model_size_shift():
    # +0.03 in rho* per decade of budget, every variant
    for v in VARIANTS:
        (_, r19, *_), _ = dense_search(v, "pass_at_1", 1e19)
        (_, r20, *_), _ = dense_search(v, "pass_at_1", 1e20)
        assert abs((r20 - r19) - 0.03) < 2e-3, v
    # model-size: larger models favour more search (lower rho*), larger budgets larger models
    rs = [optimum("pass_at_1", space=replace(space_of("model-size"), models=(m,)), variant="model-size")
          for m in SIZE_MODELS]
    assert rs[0].allocation.rho > rs[1].allocation.rho > rs[2].allocation.rho
    (_, _, _, _, m21), _ = dense_search("model-size", "pass_at_1", 1e21)
    assert m21 == "Qwen/Qwen2.5-7B"


def test_noise_is_seeded():
    a = observe(0.5, 8, "prm", seed=3)
    assert a == observe(0.5, 8, "prm", seed=3) != observe(0.5, 8, "prm", seed=4)
    draws = [observe(0.5, 8, "prm", seed=s)["pass_at_1"] - response(0.5, 8, "prm") for s in range(400)]
    sd = math.sqrt(sum(d * d for d in draws) / len(draws))
    assert 0.008 < sd < 0.012


def test_stress_variants_do_what_their_names_say():
    # rank-flip: at the pilots' budget (a tenth of B_REF) prm is best and dense third; at B_REF dense
    def best_per_reward(budget):
        s = space_of("rank-flip")
        return sorted(s.rewards, key=lambda w: -optimum("pass_at_1", budget, replace(s, rewards=(w,)),
                                                         variant="rank-flip").value)
    assert best_per_reward(B_REF / 10)[:3] == ["prm", "proxy_prm", "dense"]
    assert best_per_reward(B_REF)[0] == "dense"
    assert optimum("pass_at_1", variant="rank-flip").value - response(0.45, 8, "prm", variant="rank-flip") \
        == pytest.approx(0.05, abs=1e-9)  # dense 0.33 + 0.05 + 0.29 vs prm 0.36 - 0.03 + 0.29
    # rho-by-g: the best rho of prm moves by 0.1 per doubling of G (dense grid per G)
    for g, want in ((2, 0.25), (4, 0.35), (8, 0.45), (16, 0.55)):
        rhos = [0.2 + i * 1e-4 for i in range(7001)]
        r = max(rhos, key=lambda x: response(x, g, "prm", variant="rho-by-g"))
        assert abs(r - want) < 2e-4, (g, r)
    # noisy: twice the paper variant's sd
    draws = [observe(0.5, 8, "prm", seed=s, variant="noisy")["pass_at_1"] - response(0.5, 8, "prm")
             for s in range(400)]
    sd = math.sqrt(sum(d * d for d in draws) / len(draws))
    assert 0.017 < sd < 0.023


def test_unknown_variant_is_one_clear_error():
    with pytest.raises(ConfigError, match="variant='nope'.*paper"):
        get_variant("nope")
    with pytest.raises(ConfigError, match="variant"):
        SyntheticObjective(variant="nope")


# ------------------------------------------------------------------------------ the harness
@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_optimizers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_optimizers"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_grid_order_and_levels(bench):
    pts = bench.grid_points(space_of("paper"))
    assert len(pts) == 8 * 4 * len(REWARDS) == bench.grid_size("paper")
    assert [p.rho for p in pts[:8]] == [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    assert pts[0].reward == "sparse" and pts[-1].reward == "prm"  # one rho sweep after another
    assert bench.grid_size("model-size") == 3 * 160 and {120, 480} <= set(bench.levels_of("model-size"))


def test_at_level_and_regret(bench):
    a, b = Allocation(0.3, 2, "sparse"), Allocation(0.45, 8, "prm")
    traj = [(0.5, None), (1.0, a), (1.5, b)]
    assert bench.at_level(traj, 0.5, 10) is None and bench.at_level(traj, 1.2, 10) == a
    assert bench.at_level(traj, 100, 10) is None  # beyond the method's cap
    assert bench.at_level(traj, 100, math.inf) == b  # allocopt keeps its last recommendation
    p = bench.Problem("paper", "pass_at_1")
    assert p.regret(b) == (0.0, 0.0)
    r, pct = p.regret(a)
    assert r == pytest.approx(0.65 - response(0.3, 2, "sparse")) and pct == pytest.approx(100 * r / p.optimum.range)
    assert all(math.isnan(x) for x in p.regret(None))


def test_harness_smoke(bench):
    """Two seeds, a tiny cap, in-process: records, tables and the figure."""
    cfg = replace(bench.Config(), seeds=2, variants=("paper",), targets="pass_at_1",
                  methods=("grid", "random", "tpe", "gp"), caps={"grid": 6, "random": 6, "tpe": 6, "gp": 6},
                  workers=1)
    recs = bench.run_benchmark(cfg)
    assert {(r["method"], r["seed"]) for r in recs} == {(m, s) for m in cfg.methods for s in (0, 1)}
    for r in recs:
        if r["level"] > 6:
            assert math.isnan(r["regret"])
        else:
            assert 0 <= r["regret_pct"] <= 100 and r["compute_used"] <= r["level"]
    # the grid's first 4 runs are sparse, G=2, rho 0.2..0.5: its recommendation is one of them
    g4 = [r for r in recs if r["method"] == "grid" and r["level"] == 4]
    assert all(r["reward"] == "sparse" and r["group_size"] == 2 and r["rho"] <= 0.5 for r in g4)
    text = bench.format_tables(recs, cfg)
    assert "== paper" in text and "Optuna GPSampler" in text and "grid (IsoFLOP)" in text
    assert "not run" in bench.bar_verdict(recs, cfg)[0]


@pytest.mark.slow
def test_quick_benchmark_prints_its_table(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for label in ("grid (IsoFLOP)", "random", "Optuna TPE", "Optuna GPSampler", "BoTorchSampler", "allocopt"):
        assert label in out
    assert "== paper" in out and "Seconds per proposal" in out
    assert "Bar (allocopt)" in out or "allocopt (not available)" in out
    assert (tmp_path / "regret.png").stat().st_size > 10_000 and (tmp_path / "results.csv").exists()


def test_allocopt_trajectory_is_races_own_recommendations(bench):
    """Nothing until the pilots (60 at 0.1: 6 runs) are done; then RACE's recommendation after
    the pilots and after each round of 2 full runs, until the compute (8 runs) is spent."""
    traj, info = bench.run_allocopt(bench.Problem("paper", "pass_at_1"), 0, 8.0, 2)
    assert info["num_pilots"] == 60 and info["num_full"] == 2 and info["refits"] >= 2
    costs = [c for c, _ in traj]
    assert costs == sorted(costs) and costs[-1] == pytest.approx(6 + 2)
    assert all(a is None for c, a in traj[:59]) and traj[59][1] is not None
    assert traj[59][0] == pytest.approx(6.0)
    assert traj[60][1] == traj[59][1]  # mid-round: the round's recommendation stands
    last = traj[-1][1]
    assert info["proposal_trials"] == [60]  # one round of proposals (q = 2) after the pilots
    r, pct = bench.Problem("paper", "pass_at_1").regret(last)
    assert 0 <= pct <= 100
