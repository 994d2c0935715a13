"""benchmarks/stage_a.py: its ρ* estimator and bootstrap on data with a known answer."""

from __future__ import annotations

import numpy as np

from benchmarks.stage_a import Trial, by_budget, fit, pilot_correlation, resample, shift_sign


def _trials(peak: float, offsets=(0.0, 0.05), seeds=2, noise=0.0, rng=None, model="tiny", budget=3e11) -> list[Trial]:
    out = []
    for g, off in zip((2, 4), offsets):
        for rho in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            for s in range(seeds):
                y = 0.5 + off - (rho - peak) ** 2 + (rng.normal(0, noise) if rng is not None else 0.0)
                out.append(Trial(model, "sparse", g, rho, budget, s, {k: y for k in ("pass_at_1", "native_reward", "judge")}, 0.0, 10))
    return out


def test_the_local_quadratic_finds_a_known_peak_and_the_best_g():
    star, top, g = fit(_trials(0.63), "pass_at_1", 0.2, 0.9)
    assert abs(star - 0.63) <= 0.01 and g == 4 and abs(top - 0.55) < 1e-3


def test_a_cliff_at_one_end_does_not_drag_the_peak():
    """A global quadratic's vertex moves toward a cliff at ρ = 0.9; the local fit stays."""
    ts = [t if t.rho < 0.9 else Trial(t.model, t.reward, t.group_size, t.rho, t.budget, t.seed,
                                      {"pass_at_1": t.targets["pass_at_1"] - 0.3}, 0.0, 10)
          for t in _trials(0.5)]
    assert abs(fit(ts, "pass_at_1", 0.2, 0.9)[0] - 0.5) <= 0.03


def test_the_bootstrap_resamples_within_cells():
    rng = np.random.default_rng(0)
    ts = _trials(0.5, noise=0.01, rng=rng)
    again = resample(ts, np.random.default_rng(1))
    assert len(again) == len(ts)
    cells = lambda xs: sorted((t.rho, t.group_size) for t in xs)  # noqa: E731
    assert cells(again) == cells(ts)


def test_rho_star_against_the_budget_is_fitted_per_size_and_budget():
    """Peaks placed by hand: ``small`` rises 0.4 -> 0.6 -> 0.7, ``medium`` falls then rises."""
    ts = (_trials(0.4, model="small", budget=3e10, seeds=1) + _trials(0.6, model="small", budget=7.5e10, seeds=1)
          + _trials(0.7, model="small") + _trials(0.7, model="medium", budget=3e10, seeds=1)
          + _trials(0.5, model="medium", budget=7.5e10, seeds=1) + _trials(0.6, model="medium"))
    out = by_budget(ts, np.random.default_rng(0), boot=3)
    small = [out[("small", b, "sparse", "pass_at_1")] for b in (3e10, 7.5e10, 3e11)]
    medium = [out[("medium", b, "sparse", "pass_at_1")]["rho"] for b in (3e10, 7.5e10, 3e11)]
    assert [round(e["rho"], 2) for e in small] == [0.4, 0.6, 0.7]
    assert [e["seeds"] for e in small] == [1, 1, 2]
    assert shift_sign([e["rho"] for e in small]) == "rises"
    assert shift_sign(medium) == "mixed" and shift_sign([0.7, 0.5, 0.3]) == "falls"
    # an estimate already made (the per-size table's, at the full budget) is taken as it is
    given = {("small", 3e11, "sparse", "pass_at_1"): dict(rho=0.66, ci=(0.6, 0.7), seeds=2)}
    again = by_budget(ts, np.random.default_rng(0), boot=3, known=given)
    assert again[("small", 3e11, "sparse", "pass_at_1")] is given[("small", 3e11, "sparse", "pass_at_1")]
    assert round(again[("small", 3e10, "sparse", "pass_at_1")]["rho"], 2) == 0.4


def test_a_pilots_correlation_with_the_full_budget_is_computed_per_size_and_budget():
    """Pilots equal to the full budget's value (r = 1) for one size, its mirror image (r = -1)
    for the other, by construction."""
    full = _trials(0.5, seeds=2) + _trials(0.5, seeds=2, model="small")
    same = [Trial(t.model, t.reward, t.group_size, t.rho, 3e10, 0, dict(t.targets), 0.0, 10)
            for t in full if t.model == "tiny" and t.seed == 0]
    mirror = [Trial(t.model, t.reward, t.group_size, t.rho, 3e10, 0, {k: 1 - v for k, v in t.targets.items()}, 0.0, 10)
              for t in full if t.model == "small" and t.seed == 0]
    out = pilot_correlation(full + same + mirror)
    assert set(out) == {(m, 3e10, t) for m in ("tiny", "small") for t in ("pass_at_1", "native_reward", "judge")}
    assert abs(out[("tiny", 3e10, "pass_at_1")]["r"] - 1) < 1e-9 and out[("tiny", 3e10, "judge")]["cells"] == 16
    assert abs(out[("small", 3e10, "native_reward")]["r"] + 1) < 1e-9
