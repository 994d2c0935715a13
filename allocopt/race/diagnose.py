"""RACE regime diagnosis: the regime per reward system from its pilots' observations.

Per reward system (× model), from the pilots (:func:`diagnose`): a *local quadratic* in ρ with
additive G offsets, fitted by least squares weighted with a Gaussian kernel (``bandwidth``)
around the current optimum and iterated, so the curve is read where it matters and far points
do not drag the vertex; the ρ that maximizes it (the vertex, or the better end of the range when
there is none); uncertainty from the fit's approximate posterior (see below); slopes of the
target at both ends of the range (local linear fits there); the reward share of compute at the
optimum, from the trials' executed breakdowns (``reward_flops / total_flops``, linear in ρ); and
a regime label per posterior draw (:func:`regime_of`). The reported regime is the commonest
label; its probability is its share of the draws. The draws (``bootstrap`` of them) come from the
local fit's approximate posterior (:func:`_posterior_optima`: a multivariate t on the coefficients
whose noise variance is read from a global quartic's residuals, so the quadratic's misfit away from
the optimum is not taken for noise); the 90 % interval is checked for calibration over seeds of a
known function in tests/test_race.py (the wild bootstrap it replaces printed ±0.00 on 4-6 noisy
pilots), and always holds the point estimate (:func:`credible_interval`). With too few pilots
near the optimum for the fit (fewer than one degree of freedom on Kish's effective sample size,
e.g. 6 pilots over 3 G), ρ* is reported unknown: NaN, the whole ρ range as interval, regime
``unknown`` at probability 0. See :mod:`allocopt.race`. This local quadratic is the project's one ρ* estimator: the
report applies it too (:mod:`allocopt.query.report_data` says why).

numpy is imported inside functions.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from allocopt.plan.allocation import Allocation
from allocopt.race.data import Observation
from allocopt.race.design import RaceSettings, cells
from allocopt.spec import SearchSpace

def regime_of(rho: float, reward_share: float, settings: RaceSettings) -> str:
    """The regime label of an optimum at ``rho`` with ``reward_share`` of compute on reward."""
    if reward_share > settings.reward_heavy_share:
        return "reward-heavy"
    if rho < settings.search_heavy_below:
        return "search-heavy"
    if rho > settings.update_heavy_above:
        return "update-heavy"
    return "balanced"


@dataclass
class RegimeDiagnosis:
    """The regime of one reward system (× model) from its pilots."""

    reward: str
    model: str | None
    num_trials: int
    rho: float
    """ρ* that maximizes the local fit (point estimate from all pilots); NaN when unknown (too
    few pilots to fit, see :attr:`note`)."""
    rho_sd: float
    """Posterior standard deviation of ρ* (draws of :func:`_posterior_optima`)."""
    rho_interval: tuple[float, float]
    """A 90 % credible interval of the ρ* draws that holds :attr:`rho` (:func:`credible_interval`:
    the 5 % and 95 % quantiles unless ``rho`` lies outside them; calibration checked in
    tests/test_race.py: it holds the true ρ* in 85-95 % of seeds of a known function). The whole
    ρ range when ρ* is unknown (too few pilots)."""
    group_size: int
    """G with the best fitted offset (the recommended G)."""
    value: float
    """Fitted target at (ρ*, G)."""
    slope_low: float
    """d target / d ρ at the low end of the ρ range (local linear fit), target units per unit ρ."""
    slope_high: float
    """d target / d ρ at the high end of the ρ range."""
    reward_share: float
    """Reward FLOPs / total FLOPs at ρ* (from the trials' breakdowns)."""
    regime: str
    """Commonest label over the posterior draws of ρ* (``unknown``: too few pilots)."""
    probability: float
    """Share of the draws with that label."""
    label_shares: dict[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def recommendation(self) -> Allocation:
        """The allocation the pilots recommend for this reward system."""
        return Allocation(round(self.rho, 4), self.group_size, self.reward, self.model)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rho_interval"] = list(self.rho_interval)
        return d


def _design(rho, gidx, n_g, center, degree):
    import numpy as np

    x = rho - center
    cols = [np.ones_like(x)] + [x ** p for p in range(1, degree + 1)]
    cols += [(gidx == j).astype(float) for j in range(1, n_g)]
    return np.stack(cols, 1)


def _wls(rho, gidx, y, n_g, center, w, degree):
    import numpy as np

    X = _design(rho, gidx, n_g, center, degree)
    sw = np.sqrt(w)
    b, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    return b


def _argmax(b, center, lo, hi) -> float:
    """ρ maximizing ``b0 + b1 (ρ - c) + b2 (ρ - c)²`` on [lo, hi]."""
    if b[2] < 0:
        return min(max(center - b[1] / (2 * b[2]), lo), hi)
    f = lambda r: b[1] * (r - center) + b[2] * (r - center) ** 2  # noqa: E731
    return lo if f(lo) >= f(hi) else hi


def _local_optimum(rho, gidx, y, n_g, lo, hi, h, iterations: int = 4):
    """ρ* of the kernel-weighted quadratic, iterated from the unweighted fit; returns
    ``(rho_star, coefficients centred at rho_star)``."""
    import numpy as np

    c = 0.5 * (lo + hi)
    b = _wls(rho, gidx, y, n_g, c, np.ones_like(y), 2)
    c = _argmax(b, c, lo, hi)
    for _ in range(iterations):
        w = np.exp(-0.5 * ((rho - c) / h) ** 2)
        b = _wls(rho, gidx, y, n_g, c, w, 2)
        new = _argmax(b, c, lo, hi)
        if abs(new - c) < 1e-4:
            c = new
            break
        c = new
    w = np.exp(-0.5 * ((rho - c) / h) ** 2)
    return c, _wls(rho, gidx, y, n_g, c, w, 2)


def _posterior_optima(rho, gidx, y, n_g, star, b, lo, hi, h, num: int, rng):
    """``num`` draws of ρ* from the approximate posterior of the local quadratic at ``star``.

    The coefficients are drawn from a multivariate t around the kernel-weighted least-squares
    fit ``b``: scale = the sandwich covariance ``σ² (XᵀWX)⁻¹ XᵀW²X (XᵀWX)⁻¹`` with σ² the
    weighted residual variance on ``ν = n_eff − p`` degrees of freedom (``n_eff = (Σw)²/Σw²``,
    Kish's effective sample size; ``p`` the fit's parameters), ν degrees of freedom; each draw's
    ρ* is its vertex (or the better end). Unlike resampling the residuals (whose size shrinks to 0
    when few pilots nearly fit the quadratic exactly), σ² is inflated by ``n_eff / ν``. With
    ``ν < 1`` (:func:`_too_few`) nothing is known and the caller must not call this.
    """
    import numpy as np

    X = _design(rho, gidx, n_g, star, 2)
    w = np.exp(-0.5 * ((rho - star) / h) ** 2)
    p = X.shape[1]
    n_eff = w.sum() ** 2 / (w ** 2).sum()
    dof = n_eff - p
    if dof < 1:
        raise ValueError(f"effective number of pilots {n_eff:.2f} leaves {dof:.2f} < 1 degree of freedom "
                         f"for the {p} coefficients")
    # noise variance from the residuals of a global quartic (+ G offsets): the quadratic's own
    # residuals also hold its misfit away from the optimum and overstate the noise ~4x
    Xq = _design(rho, gidx, n_g, star, 4)
    if len(y) - Xq.shape[1] >= 2:
        bq, *_ = np.linalg.lstsq(Xq, y, rcond=None)
        s2 = float(((y - Xq @ bq) ** 2).sum()) / (len(y) - Xq.shape[1])
        dof = len(y) - Xq.shape[1]
    else:
        resid = y - X @ b
        s2 = float((w * resid ** 2).sum() / w.sum()) * n_eff / dof
    A = np.linalg.pinv((X * w[:, None]).T @ X)
    cov = s2 * A @ ((X * (w ** 2)[:, None]).T @ X) @ A
    vals, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
    root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    z = rng.standard_normal((num, p)) * np.sqrt(dof / rng.chisquare(dof, (num, 1)))  # t on ν dof
    return np.array([_argmax(b + root @ zi, star, lo, hi) for zi in z])


def _too_few(rho, n_g, star, h) -> tuple[bool, float, int]:
    """``(too_few, n_eff, p)``: whether the kernel-weighted quadratic at ``star`` (``p`` = 3 + G
    offsets coefficients) has fewer than one degree of freedom left on its Kish effective sample
    size ``n_eff = (Σw)²/Σw²`` — then its vertex is an interpolation, not an estimate."""
    import numpy as np

    w = np.exp(-0.5 * ((rho - star) / h) ** 2)
    # every weight underflows to 0 when a narrow kernel sits far from all pilots: none is near
    n_eff = float(w.sum() ** 2 / (w ** 2).sum()) if (w ** 2).sum() > 0 else 0.0
    p = 3 + n_g - 1
    return n_eff - p < 1, n_eff, p


def credible_interval(samples, point: float, level: float = 0.9) -> tuple[float, float]:
    """A ``level`` credible interval of the draws ``samples`` that holds ``point``.

    The central interval (quantiles ``(1 - level)/2`` and ``(1 + level)/2``) when it holds
    ``point``; otherwise the interval of the same posterior mass with ``point`` at its end: when
    ``point`` lies below the central interval (its share of draws below ``F < (1 - level)/2``),
    ``[point, q(F + level)]``; above it, ``[q(F - level), point]``. A vertex clamped at an end
    of the ρ range (F = 0 or 1) gets the one-sided ``level`` interval from that end. Units of
    ``samples``; ``point`` must be finite.
    """
    import numpy as np

    x = np.sort(np.asarray(samples, dtype=float))
    a = 0.5 * (1 - level)
    lo, hi = float(np.quantile(x, a)), float(np.quantile(x, 1 - a))
    if lo <= point <= hi:
        return lo, hi
    below = float(np.mean(x < point)) if point < lo else float(np.mean(x <= point))
    if point < lo:
        return point, float(np.quantile(x, min(below + level, 1.0)))
    return float(np.quantile(x, max(below - level, 0.0))), point


def _slope_at(rho, gidx, y, n_g, at, h) -> float:
    import numpy as np

    w = np.exp(-0.5 * ((rho - at) / h) ** 2)
    return float(_wls(rho, gidx, y, n_g, at, w, 1)[1])


def share_fit(obs: Sequence[Observation]) -> Callable[[Any], Any]:
    """Reward share of compute as a linear function of ρ, fitted on the trials' breakdowns."""
    import numpy as np

    pts = [(o.allocation.rho, o.reward_share) for o in obs if not math.isnan(o.reward_share)]
    if not pts:
        return lambda r: np.zeros_like(np.asarray(r, dtype=float))
    x, s = np.array(pts).T
    if len(set(x.round(6))) < 2:
        return lambda r: np.full_like(np.asarray(r, dtype=float), float(s.mean()))
    a, b = np.polyfit(x, s, 1)
    return lambda r: np.clip(b + a * np.asarray(r, dtype=float), 0.0, 1.0)


def diagnose_group(obs: Sequence[Observation], rho_range: tuple[float, float],
                   settings: RaceSettings = RaceSettings(), seed: int = 0,
                   share_obs: Sequence[Observation] | None = None) -> RegimeDiagnosis:
    """Diagnose one reward system (× model) from its pilots ``obs`` (module docstring).

    ``share_obs`` (default ``obs``): trials whose breakdowns give the reward share of compute.
    """
    import numpy as np

    a0 = obs[0].allocation if obs else None
    reward, model = (a0.reward, a0.model) if a0 else ("?", None)
    lo, hi = rho_range
    rho = np.array([o.allocation.rho for o in obs], dtype=float)
    if len(set(rho.round(4))) < 3:
        return RegimeDiagnosis(reward, model, len(obs), math.nan, math.nan, (math.nan, math.nan),
                               a0.group_size if a0 else 0, math.nan, math.nan, math.nan, math.nan,
                               "unknown", 0.0, {}, note=f"{len(set(rho.round(4)))} distinct rho "
                               "value(s) completed; the fit needs 3")
    gs = sorted({o.allocation.group_size for o in obs})
    gidx = np.array([gs.index(o.allocation.group_size) for o in obs])
    y = np.array([o.value for o in obs], dtype=float)
    h = settings.bandwidth
    share = share_fit(share_obs if share_obs is not None else obs)
    star, b = _local_optimum(rho, gidx, y, len(gs), lo, hi, h)
    few, n_eff, p = _too_few(rho, len(gs), star, h)
    if few:
        # the quadratic (3 coefficients + one offset per further G) interpolates these pilots:
        # its vertex is no estimate, and uniform draws would put the point outside its interval
        return RegimeDiagnosis(reward, model, len(obs), math.nan, math.nan, (float(lo), float(hi)),
                               gs[0], math.nan, math.nan, math.nan, math.nan, "unknown", 0.0, {},
                               note=f"too few pilots: rho* unknown ({len(obs)} pilots, {n_eff:.1f} "
                               f"effective near the optimum; a fit over {len(gs)} G needs {p + 1})")
    offsets = [0.0] + [float(v) for v in b[3:]]
    best_g = int(np.argmax(offsets))
    value = float(b[0] + offsets[best_g])
    samples = _posterior_optima(rho, gidx, y, len(gs), star, b, lo, hi, h, settings.bootstrap,
                                np.random.default_rng(seed))
    n = len(obs)
    samples = np.array(samples)
    labels = Counter(regime_of(r, float(s), settings) for r, s in zip(samples, share(samples)))
    regime, count = max(labels.items(), key=lambda kv: (kv[1], kv[0] == regime_of(star, float(share(star)), settings)))
    return RegimeDiagnosis(
        reward=reward, model=model, num_trials=n, rho=float(star), rho_sd=float(samples.std()),
        rho_interval=credible_interval(samples, float(star), 0.9),
        group_size=gs[best_g], value=value,
        slope_low=_slope_at(rho, gidx, y, len(gs), lo, h),
        slope_high=_slope_at(rho, gidx, y, len(gs), hi, h),
        reward_share=float(share(star)), regime=regime, probability=count / len(samples),
        label_shares={k: v / len(samples) for k, v in sorted(labels.items())})


def diagnose(obs: Iterable[Observation], space: SearchSpace, settings: RaceSettings = RaceSettings(),
             seed: int = 0) -> list[RegimeDiagnosis]:
    """One :class:`RegimeDiagnosis` per reward system (× model) of ``space`` from the pilot
    observations ``obs`` (pass only pilots of one budget: an IsoFLOP design)."""
    obs = list(obs)
    out = []
    for c, (r, m) in enumerate(cells(space)):
        mine = [o for o in obs if o.allocation.reward == r and o.allocation.model == m]
        if not mine:
            out.append(RegimeDiagnosis(r, m, 0, math.nan, math.nan, (math.nan, math.nan),
                                       space.group_sizes[0], math.nan, math.nan, math.nan, math.nan,
                                       "unknown", 0.0, {}, note="no complete pilot"))
            continue
        out.append(diagnose_group(mine, space.rho, settings, seed=seed * 1009 + c))
    return out

