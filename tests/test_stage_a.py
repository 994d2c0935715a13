"""benchmarks/stage_a.py: its ρ* estimator and bootstrap on data with a known answer."""

from __future__ import annotations

import numpy as np

from benchmarks.stage_a import Trial, fit, resample


def _trials(peak: float, offsets=(0.0, 0.05), seeds=2, noise=0.0, rng=None) -> list[Trial]:
    out = []
    for g, off in zip((2, 4), offsets):
        for rho in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            for s in range(seeds):
                y = 0.5 + off - (rho - peak) ** 2 + (rng.normal(0, noise) if rng is not None else 0.0)
                out.append(Trial("tiny", "sparse", g, rho, 3e11, s, {"pass_at_1": y}, 0.0, 10))
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
