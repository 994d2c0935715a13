"""Statistics of regrets over replications, from ``scipy.stats`` and numpy.

* :func:`describe`: median with the interquartile range (numpy's linear percentiles), and the
  mean with a 95 % bootstrap interval (``scipy.stats.bootstrap``, BCa, 2,000 resamples,
  generator seeded 0; the percentile method where BCa is undefined, e.g. all values equal).
* :func:`paired`: a method against a peer over the replications both answered: the win rate
  (share of replications with strictly lower regret, ties counted half) and the two-sided
  Wilcoxon signed-rank p value (``scipy.stats.wilcoxon``, ``zero_method="wilcox"``: tied
  pairs are dropped; 1.0 when every pair is tied). A replication where only one of the two has
  an answer counts as a win for the one that has (in the win rate only).
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def _finite(xs: Sequence[float]) -> list[float]:
    return [float(x) for x in xs if x is not None and not math.isnan(float(x))]


def describe(xs: Sequence[float]) -> dict[str, float]:
    """``n, median, q1, q3, mean, mean_lo, mean_hi`` of the finite values of ``xs`` (NaN when none)."""
    import numpy as np

    v = _finite(xs)
    nan = math.nan
    if not v:
        return {"n": 0, "median": nan, "q1": nan, "q3": nan, "mean": nan, "mean_lo": nan, "mean_hi": nan}
    a = np.asarray(v)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    lo, hi = _mean_interval(a)
    return {"n": len(v), "median": float(med), "q1": float(q1), "q3": float(q3), "mean": float(a.mean()),
            "mean_lo": lo, "mean_hi": hi}


def _mean_interval(a) -> tuple[float, float]:
    import numpy as np
    from scipy import stats

    if len(a) < 2 or float(np.ptp(a)) == 0.0:
        return float(a.mean()), float(a.mean())
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = stats.bootstrap((a,), np.mean, confidence_level=CONFIDENCE, n_resamples=BOOTSTRAP_RESAMPLES,
                                method=method, rng=np.random.default_rng(0))
        lo, hi = float(r.confidence_interval.low), float(r.confidence_interval.high)
        if not (math.isnan(lo) or math.isnan(hi)):
            return lo, hi
    return math.nan, math.nan


def paired(mine: Sequence[float], theirs: Sequence[float]) -> dict[str, float]:
    """``n, win_rate, p`` of ``mine`` against ``theirs`` (same replications, same order)."""
    from scipy import stats

    if len(mine) != len(theirs):
        raise ValueError(f"paired: {len(mine)} against {len(theirs)} values; pairs need the same replications")
    wins, n, a, b = 0.0, 0, [], []
    for x, y in zip(mine, theirs):
        x_ok, y_ok = x is not None and not math.isnan(x), y is not None and not math.isnan(y)
        if not (x_ok or y_ok):
            continue
        n += 1
        if x_ok and y_ok:
            wins += 1.0 if x < y else 0.5 if x == y else 0.0
            a.append(float(x))
            b.append(float(y))
        else:
            wins += 1.0 if x_ok else 0.0
    if not n:
        return {"n": 0, "win_rate": math.nan, "p": math.nan}
    if not a or all(x == y for x, y in zip(a, b)):
        p = 1.0
    else:
        p = float(stats.wilcoxon(a, b, zero_method="wilcox", alternative="two-sided").pvalue)
    return {"n": n, "win_rate": wins / n, "p": p}
