"""RACE: IsoFLOP pilot grids, regime diagnosis, and multi-fidelity validation runs.

A RACE study spends a small share of the compute on **pilots** — trials at
``pilot_fraction × budget_flops``, all at that one budget (an IsoFLOP design) — to diagnose,
per reward system (and per model), where the budget should go, then on a few **validation**
runs at the full budget proposed by a multi-fidelity surrogate (:mod:`allocopt.surrogate`).
Pilots and validations are ordinary Optuna trials of one study, tagged with the user attribute
``fidelity`` (``pilot`` or ``full``) and ``budget_flops``; every one goes through
:func:`allocopt.allocation.make_plan`, so none can exceed its budget.

1. **Pilot grid** (:func:`pilot_grid`): ``rho_levels`` evenly spaced ρ × every G × every
   reward system (× model). When that grid has more than ``max_pilots`` points, each reward
   system (× model) gets ``max_pilots // cells`` points of a seeded Latin hypercube over ρ,
   with G dealt out evenly and shuffled. Each point runs ``repeats`` times (different seeds).
2. **Regime diagnosis** (:func:`diagnose`), per reward system (× model), from the pilots:
   a *local quadratic* in ρ with additive G offsets, fitted by least squares weighted with a
   Gaussian kernel (``bandwidth``) around the current optimum and iterated, so the curve is
   read where it matters and far points do not drag the vertex; the ρ that maximizes it (the
   vertex, or the better end of the range when there is none); uncertainty by a wild
   bootstrap (``bootstrap`` resamples: the fit plus its residuals with random signs, refitted
   the same way; the design stays fixed, so every resample keeps the pilots' ρ levels); slopes of the target at both
   ends of the range (local linear fits there); the reward share of compute at the optimum,
   from the trials' executed breakdowns (``reward_flops / total_flops``, linear in ρ); and a
   regime label per bootstrap sample (:func:`regime_of`): ``reward-heavy`` when the reward
   share at the optimum exceeds ``reward_heavy_share`` (takes precedence), ``search-heavy``
   when ρ* < ``search_heavy_below``, ``update-heavy`` when ρ* > ``update_heavy_above``,
   ``balanced`` otherwise. The reported regime is the commonest label; its probability is its
   share of the bootstrap samples.
3. **Validation** (:func:`propose`, :func:`validate`, :func:`recommend`): the surrogate
   (:mod:`allocopt.surrogate`) is fitted on pilots and full runs together (the budget fraction is
   its fidelity; it learns how far the optimal ρ drifts with the budget, so the pilots' bias is
   corrected once a few full runs exist) and proposes full runs by Thompson sampling of the
   full-budget maximizer, ``batch_size`` per round (or extra pilots, when their variance
   reduction per FLOP is worth it, within ``extra_pilot_budget``: none by default);
   infeasible plans and repeats of existing trials (same G, reward, model and fidelity, ρ within
   ``rho_match``) are never proposed. Before each round and at the end RACE **recommends** an
   allocation: the maximizer of the posterior mean at the full budget near its full runs. After
   the runs, per reward system: the full-budget regime (from the surrogate's posterior at
   fidelity 1, with the same labelling), whether it matches the pilot regime, and the regret at
   full budget of the allocation the pilots recommended (surrogate mean at the best allocation
   of that reward system minus at the recommended one).

numpy, Optuna and (through the surrogate) torch are imported inside functions.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from allocopt.allocation import Allocation, InfeasiblePlan, TrialPlan, Workload, make_plan
from allocopt.flops import ConfigError
from allocopt.spec import SearchSpace, StudySpec, target_key
from allocopt.study import DEFAULT_STORAGE, TrialRow, allocation_of, distributions, open_study, run_one_trial

REGIMES: tuple[str, ...] = ("search-heavy", "update-heavy", "reward-heavy", "balanced")
"""Regime labels (``unknown`` is reported when a reward system has too few pilots)."""
FIDELITIES: tuple[str, ...] = ("pilot", "full")


@dataclass(frozen=True)
class RaceSettings:
    """Settings of a RACE study (pilot grid, diagnosis thresholds, proposals).

    Loggable with ``dataclasses.asdict``; every value is checked when built.
    """

    rho_levels: int = 6
    """ρ levels of the full pilot grid (evenly spaced over the space's ρ range), >= 3."""
    max_pilots: int | None = None
    """Most distinct pilot points (before repeats); a larger grid is replaced by a seeded Latin
    hypercube over ρ per reward system (× model), ``max_pilots // cells`` points each, which must
    be at least ``len(group_sizes) + 3`` (the local fit's parameters plus one). ``None``: sized to
    the space, ``max(60, (len(group_sizes) + 3) × cells)`` (:meth:`pilot_cap`)."""
    repeats: int = 1
    """Runs of each pilot point (different seeds); raise it when the target is noisy."""
    search_heavy_below: float = 0.4
    """``search-heavy`` when the optimal ρ is below this."""
    update_heavy_above: float = 0.6
    """``update-heavy`` when the optimal ρ is above this."""
    reward_heavy_share: float = 0.3
    """``reward-heavy`` when reward FLOPs / total FLOPs at the optimum exceed this (takes
    precedence over the ρ thresholds)."""
    bandwidth: float = 0.2
    """Width (in ρ) of the Gaussian kernel that weights pilots around the optimum in the local
    quadratic fit."""
    bootstrap: int = 200
    """Wild-bootstrap resamples for the uncertainty of ρ* and the regime probability."""
    batch_size: int = 2
    """Proposals per round (``q``): runs one round can hand to parallel workers."""
    extra_pilot_budget: float = 0.0
    """Compute, in full-budget runs, that proposals may spend on extra pilots in all (default
    none: on the synthetic benchmark, extra pilots delayed the full runs that resolve the
    pilots' budget drift and did not lower the final regret)."""
    rho_match: float = 1e-3
    """A proposal within this of an existing trial's ρ (same G, reward, model, fidelity) is a
    repeat and is not proposed."""
    rho_grid: int = 71
    """ρ values of the discrete candidate set for proposals and the full-budget argmax."""
    thompson_samples: int = 64
    """Joint posterior samples per proposal round (Thompson sampling; :func:`propose`)."""
    rho_trust: float = 0.1
    """The recommendation (:func:`recommend`) is a cell (reward system × model) with a
    full-budget run and a ρ within this of one of them (ρ units)."""
    posterior_samples: int = 256
    """Posterior samples for the full-budget regime probability."""
    seed: int | None = None
    """Seed of the pilot design, bootstrap and surrogate; ``None``: the study's seed."""

    def __post_init__(self) -> None:
        ints = {"rho_levels": 3, "max_pilots": 3, "repeats": 1, "bootstrap": 10, "batch_size": 1,
                "rho_grid": 5, "posterior_samples": 16, "thompson_samples": 1}
        for name, least in ints.items():
            v = getattr(self, name)
            if name == "max_pilots" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ConfigError(f"{name}={v!r}: must be an integer >= {least}")
        for name in ("search_heavy_below", "update_heavy_above", "reward_heavy_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ConfigError(f"{name}={v!r}: must be a number strictly between 0 and 1")
        if self.search_heavy_below > self.update_heavy_above:
            raise ConfigError(f"search_heavy_below={self.search_heavy_below!r} > update_heavy_above="
                              f"{self.update_heavy_above!r}: the search-heavy threshold must not "
                              "exceed the update-heavy one")
        for name, v in (("bandwidth", self.bandwidth), ("rho_match", self.rho_match),
                        ("rho_trust", self.rho_trust)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name}={v!r}: must be a positive number")
        if not (isinstance(self.extra_pilot_budget, (int, float)) and self.extra_pilot_budget >= 0):
            raise ConfigError(f"extra_pilot_budget={self.extra_pilot_budget!r}: must be a number >= 0 "
                              "(full-budget runs' worth of compute)")

    def pilot_cap(self, space: SearchSpace) -> int:
        """Most distinct pilot points for ``space``: ``max_pilots``, or when that is ``None``
        ``max(60, (len(group_sizes) + 3) × cells)`` (every reward system × model gets enough
        pilots for its local fit)."""
        if self.max_pilots is not None:
            return self.max_pilots
        return max(60, (len(space.group_sizes) + 3) * len(_cells(space)))


def check_pilot_fraction(pilot_fraction: Any) -> float:
    """``pilot_fraction`` as a float in (0, 1). Raises :class:`ConfigError`."""
    try:
        f = float(pilot_fraction)
    except (TypeError, ValueError):
        f = math.nan
    if not 0 < f < 1:
        raise ConfigError(f"pilot_fraction={pilot_fraction!r}: must be a number strictly between 0 "
                          "and 1 (pilots run at pilot_fraction x budget_flops)")
    return f


def regime_of(rho: float, reward_share: float, settings: RaceSettings) -> str:
    """The regime label of an optimum at ``rho`` with ``reward_share`` of compute on reward."""
    if reward_share > settings.reward_heavy_share:
        return "reward-heavy"
    if rho < settings.search_heavy_below:
        return "search-heavy"
    if rho > settings.update_heavy_above:
        return "update-heavy"
    return "balanced"


# ================================================================== (a) the pilot grid
@dataclass(frozen=True)
class PilotPoint:
    """One pilot run of the grid: an allocation and its repeat index."""

    allocation: Allocation
    repeat: int = 0

    @property
    def key(self) -> str:
        """Content key stored as the trial's ``race_pilot`` user attribute (resume finds it)."""
        a = self.allocation
        return f"{a.reward}|{a.model or '-'}|G{a.group_size}|rho{a.rho:.4f}|r{self.repeat}"


def _cells(space: SearchSpace) -> list[tuple[str, str | None]]:
    return [(r, m) for m in (space.models or (None,)) for r in space.rewards]


def pilot_grid(space: SearchSpace, settings: RaceSettings = RaceSettings(), seed: int = 0) -> list[PilotPoint]:
    """The IsoFLOP pilot design over ``space`` (module docstring, step 1).

    Returns:
        pilot points, ``repeats`` per distinct allocation, ordered by repeat, then model,
        reward system, G and ρ. Deterministic for a given seed.

    Raises:
        ConfigError: a ρ range of one value, or a ``max_pilots`` given below
            ``len(group_sizes) + 3`` per reward system (× model).
    """
    lo, hi = space.rho
    if not lo < hi:
        raise ConfigError(f"space.rho={list(space.rho)!r}: RACE needs a range of rho (low < high)")
    cells = _cells(space)
    gs = space.group_sizes
    points: list[Allocation] = []
    cap = settings.pilot_cap(space)
    if settings.rho_levels * len(gs) * len(cells) <= cap:
        levels = [round(lo + (hi - lo) * i / (settings.rho_levels - 1), 4) for i in range(settings.rho_levels)]
        points = [Allocation(rho, g, r, m) for r, m in cells for g in gs for rho in levels]
    else:
        n = cap // len(cells)
        need = len(gs) + 3  # quadratic (3) + one offset per further G + one to spare
        if n < need:
            raise ConfigError(f"max_pilots={cap}: too few for {len(cells)} reward "
                              f"system(s) x model(s) with {len(gs)} group size(s); needs at least "
                              f"{need * len(cells)} ({need} each: 3 for the quadratic in rho, one per "
                              "further G, one to spare)")
        for c, (r, m) in enumerate(cells):
            rng = random.Random(f"race-pilots|{seed}|{c}")
            strata = list(range(n))
            rng.shuffle(strata)
            rhos = [round(lo + (hi - lo) * (s + rng.random()) / n, 4) for s in strata]
            deal = [gs[i % len(gs)] for i in range(n)]
            rng.shuffle(deal)
            points += [Allocation(rho, g, r, m) for rho, g in sorted(zip(rhos, deal), key=lambda t: (t[1], t[0]))]
    return [PilotPoint(a, k) for k in range(settings.repeats) for a in points]


# ================================================================ observations of a study
@dataclass(frozen=True)
class Observation:
    """One complete trial as RACE reads it."""

    number: int
    allocation: Allocation
    value: float
    """The target of the race (a share in [0, 1])."""
    budget_flops: float
    budget_fraction: float
    """``budget_flops / spec.budget_flops``."""
    fidelity: str
    """``pilot`` or ``full`` (the trial's user attribute; trials without one are ``full``)."""
    reward_share: float
    """Executed reward FLOPs / total FLOPs of the trial (NaN when not recorded)."""


def observations(study: Any, spec: StudySpec, target: str | None = None) -> list[Observation]:
    """Every complete (feasible, run) trial of ``study`` with a value for ``target``
    (default ``spec.target``)."""
    from optuna.trial import TrialState

    key = target_key(target or spec.target)
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ua = t.user_attrs
        if ua.get("state", "COMPLETE") != "COMPLETE" or key not in ua.get("targets", {}):
            continue
        m = ua.get("metrics", {})
        total = m.get("total_flops") or 0
        budget = float(ua.get("budget_flops", spec.budget_flops))
        out.append(Observation(
            number=t.number, allocation=allocation_of(spec, t.params), value=float(ua["targets"][key]),
            budget_flops=budget, budget_fraction=budget / spec.budget_flops,
            fidelity=ua.get("fidelity", "full"),
            reward_share=(m.get("reward_flops", 0) / total) if total else math.nan))
    return out


# ================================================================== (b) regime diagnosis
@dataclass
class RegimeDiagnosis:
    """The regime of one reward system (× model) from its pilots."""

    reward: str
    model: str | None
    num_trials: int
    rho: float
    """ρ* that maximizes the local fit (point estimate from all pilots)."""
    rho_sd: float
    """Bootstrap standard deviation of ρ*."""
    rho_interval: tuple[float, float]
    """5 % and 95 % bootstrap quantiles of ρ*."""
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
    """Commonest label over the bootstrap samples (``unknown``: too few pilots)."""
    probability: float
    """Share of bootstrap samples with that label."""
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


def _slope_at(rho, gidx, y, n_g, at, h) -> float:
    import numpy as np

    w = np.exp(-0.5 * ((rho - at) / h) ** 2)
    return float(_wls(rho, gidx, y, n_g, at, w, 1)[1])


def _share_fit(obs: Sequence[Observation]) -> Callable[[Any], Any]:
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
    """Diagnose one reward system (× model) from its pilots ``obs`` (module docstring, step 2).

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
    share = _share_fit(share_obs if share_obs is not None else obs)
    star, b = _local_optimum(rho, gidx, y, len(gs), lo, hi, h)
    offsets = [0.0] + [float(v) for v in b[3:]]
    best_g = int(np.argmax(offsets))
    value = float(b[0] + offsets[best_g])
    fitted = _design(rho, gidx, len(gs), star, 2) @ b
    resid = y - fitted
    rng = np.random.default_rng(seed)
    samples = []
    n = len(obs)
    for _ in range(settings.bootstrap):  # wild bootstrap: Rademacher signs on the residuals
        y_star = fitted + resid * rng.choice((-1.0, 1.0), n)
        samples.append(_local_optimum(rho, gidx, y_star, len(gs), lo, hi, h)[0])
    samples = np.array(samples)
    labels = Counter(regime_of(r, float(s), settings) for r, s in zip(samples, share(samples)))
    regime, count = max(labels.items(), key=lambda kv: (kv[1], kv[0] == regime_of(star, float(share(star)), settings)))
    return RegimeDiagnosis(
        reward=reward, model=model, num_trials=n, rho=float(star), rho_sd=float(samples.std()),
        rho_interval=(float(np.quantile(samples, 0.05)), float(np.quantile(samples, 0.95))),
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
    for c, (r, m) in enumerate(_cells(space)):
        mine = [o for o in obs if o.allocation.reward == r and o.allocation.model == m]
        if not mine:
            out.append(RegimeDiagnosis(r, m, 0, math.nan, math.nan, (math.nan, math.nan),
                                       space.group_sizes[0], math.nan, math.nan, math.nan, math.nan,
                                       "unknown", 0.0, {}, note="no complete pilot"))
            continue
        out.append(diagnose_group(mine, space.rho, settings, seed=seed * 1009 + c))
    return out


# ============================================================== (c) surrogate, proposals
def _encoding(space: SearchSpace):
    from allocopt.surrogate import Encoding

    return Encoding(space.rho, space.group_sizes, space.rewards, tuple(space.models) or (None,))


def fit_surrogate(obs: Sequence[Observation], space: SearchSpace, seed: int = 0, init: Any = None):
    """The :class:`allocopt.surrogate.MultiFidelitySurrogate` over all observations (pilots and
    full runs; the budget fraction is the fidelity); ``init``: an earlier fit's ``raw``
    hyperparameters to start from as well. Raises ``ValueError`` with < 2 observations."""
    import torch

    from allocopt.surrogate import MultiFidelitySurrogate

    enc = _encoding(space)
    X = enc.tensor([enc.row(o.allocation.rho, o.allocation.group_size, o.allocation.reward,
                            o.allocation.model, o.budget_fraction) for o in obs])
    Y = torch.tensor([[o.value] for o in obs], dtype=torch.double)
    return MultiFidelitySurrogate(enc, X, Y, seed=seed, init=init)


def _rho_grid(space: SearchSpace, settings: RaceSettings) -> list[float]:
    lo, hi = space.rho
    return sorted({round(lo + (hi - lo) * i / (settings.rho_grid - 1), 4) for i in range(settings.rho_grid)})


def _full_candidates(space: SearchSpace, settings: RaceSettings) -> list[Allocation]:
    return [Allocation(r, g, w, m) for m in (space.models or (None,)) for w in space.rewards
            for g in space.group_sizes for r in _rho_grid(space, settings)]


def recommend(surrogate: Any, obs: Sequence[Observation], space: SearchSpace,
              settings: RaceSettings = RaceSettings()) -> tuple[Allocation, float, float]:
    """The allocation to run at the full budget: the argmax of the surrogate's posterior mean at
    fidelity 1 over the candidate grid (``rho_grid`` ρ × G × reward × model), restricted, once
    there are full-budget runs, to cells (reward system × model) with one and to ρ within
    ``rho_trust`` of one (the mean is not trusted far from full-budget data). G is not
    restricted: its effect is shared by every cell and learned from pilots too.

    Returns:
        ``(allocation, posterior mean, posterior sd)`` at the full budget (target units).
    """
    enc = surrogate.encoding
    full = [o.allocation for o in obs if o.fidelity == "full" or o.budget_fraction >= 1 - 1e-9]
    cands = _full_candidates(space, settings)
    if full:
        near = [a for a in cands if any(b.reward == a.reward and b.model == a.model
                                        and abs(b.rho - a.rho) <= settings.rho_trust + 1e-9 for b in full)]
        cands = near or cands
    mean, sd = surrogate.predict(enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0)
                                             for a in cands]))
    i = int(mean.argmax())
    return cands[i], float(mean[i]), float(sd[i])


_PLAN_KEYS = ("budget_flops", "model", "reward_model", "prompts_per_iteration", "rollouts_per_iteration",
              "rows_trained_per_iteration", "update_passes", "num_iterations_trl", "iterations",
              "realized_rho", "budget_utilization", "expected_search_flops", "expected_learning_flops",
              "expected_reward_flops", "expected_total_flops")


@dataclass(frozen=True)
class Proposal:
    """A proposed run: allocation, fidelity, and the plan its budget buys."""

    allocation: Allocation
    fidelity: str
    """``full`` (a validation run) or ``pilot`` (an extra pilot)."""
    budget_flops: float
    plan: TrialPlan
    acquisition: float
    """Share of the round's posterior samples in which this allocation (for an extra pilot: the
    full-budget allocation it informs) is the full-budget maximizer (Thompson sampling)."""
    cost: float
    """Compute in full-budget runs (``budget_flops / spec.budget_flops``)."""
    predicted_mean: float
    """Surrogate mean of the target at the full budget, at this allocation (for an extra pilot:
    at the full-budget allocation it informs)."""
    predicted_sd: float

    def trl(self) -> dict[str, Any]:
        """TRL ``GRPOConfig`` values of the plan (as the allocopt driver sets them)."""
        p = self.plan
        return {"num_generations": p.group_size, "num_iterations": p.num_iterations_trl,
                "generation_batch_size": p.rollouts_per_iteration,
                "rows_trained_per_iteration": p.rows_trained_per_iteration,
                "update_passes": p.update_passes, "iterations": p.iterations,
                "learning_rate_scale": 1.0 / p.num_iterations_trl}

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        return {"fidelity": self.fidelity, "budget_flops": self.budget_flops, "cost_full_runs": self.cost,
                "allocation": {"rho": a.rho, "group_size": a.group_size, "reward": a.reward,
                               "model": a.model or self.plan.policy},
                "predicted_full_budget": {"mean": self.predicted_mean, "sd": self.predicted_sd},
                "acquisition": self.acquisition, "trl": self.trl(),
                "plan": {k: v for k, v in self.plan.to_dict().items() if k in _PLAN_KEYS}}


def _same(a: Allocation, fa: str, b: Allocation, fb: str, tol: float) -> bool:
    return (fa == fb and a.group_size == b.group_size and a.reward == b.reward
            and a.model == b.model and abs(a.rho - b.rho) <= tol)


def existing_runs(study: Any, spec: StudySpec) -> list[tuple[Allocation, str]]:
    """``(allocation, fidelity)`` of every trial that ran, runs or waits (a failure by interrupt
    does not count: it may be re-run)."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        if t.state == TrialState.FAIL and str(ua.get("error", "")).startswith("interrupted"):
            continue
        if t.state == TrialState.WAITING:
            params = t.system_attrs.get("fixed_params", {})
        else:
            params = t.params
        try:
            out.append((allocation_of(spec, params), ua.get("fidelity", "full")))
        except ConfigError:
            continue
    return out


class _Plans:
    """make_plan with a cache (make_plan costs ~0.1 s per call)."""

    def __init__(self, workload: Workload):
        self.workload, self.cache = workload, {}

    def __call__(self, budget: float, a: Allocation) -> TrialPlan | None:
        k = (budget, a)
        if k not in self.cache:
            try:
                p = make_plan(budget, a, self.workload)
                self.cache[k] = p if p.realizable else None
            except (InfeasiblePlan, ConfigError):
                self.cache[k] = None
        return self.cache[k]


def propose(obs: Sequence[Observation], spec: StudySpec, workload: Workload, *,
            existing: Sequence[tuple[Allocation, str]] = (), q: int = 1, pilot_fraction: float = 0.1,
            allow_pilots: bool = True, settings: RaceSettings = RaceSettings(), surrogate: Any = None,
            plans: Callable[[float, Allocation], TrialPlan | None] | None = None) -> list[Proposal]:
    """Up to ``q`` runs to do next, by Thompson sampling of the full-budget maximizer.

    1. Candidates: the full-budget grid (``rho_grid`` ρ values × G × reward × model), pruned to
       those whose upper bound (mean + 2.5 sd) reaches the best lower bound (mean - 2.5 sd),
       at most 400 of them.
    2. ``thompson_samples`` joint posterior samples over them (each with its own budget drift δ,
       drawn from the surrogate's mixture); sample ``j``'s maximizer is pick ``j`` (a candidate
       already picked, a repeat or an infeasible plan passes to that sample's next best). When
       the samples run out first, the other candidates follow by upper bound (200 at most).
    3. Extra pilots (``allow_pilots``): a pick may be run as a pilot instead, at the same G and
       cell and at the ρ where the pilots' optimum sits (ρ - δ × decades below the full budget),
       when that pilot's reduction of the posterior variance of the pick's full-budget value per
       unit of compute beats the full run's (``v² / (v + σn²)`` for the full run, with ``v``
       the mixture variance, which includes the unknown drift only full runs resolve;
       ``c² / (v_z + σn²) / pilot_fraction`` for the pilot, ``c`` its covariance with the pick).

    Every proposal has a feasible, realizable plan within its budget (:func:`make_plan`), and none
    repeats an ``existing`` run or another proposal of the batch (same G, reward, model, fidelity,
    ρ within ``settings.rho_match``).

    Args:
        obs: observations the surrogate is fitted on (ignored when ``surrogate`` is given).
        existing: runs already done or queued (:func:`existing_runs`).
        allow_pilots: offer pilot-fidelity runs too.
        surrogate: a fitted surrogate (:func:`fit_surrogate`).
    """
    import torch

    seed = spec.seed if settings.seed is None else settings.seed
    sur = surrogate if surrogate is not None else fit_surrogate(obs, spec.space, seed=seed)
    enc = sur.encoding
    plans = plans or _Plans(workload)
    space = spec.space
    cands = _full_candidates(space, settings)
    X = enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0) for a in cands])
    mean, sd = sur.predict(X)
    keep = torch.nonzero(mean + 2.5 * sd >= float((mean - 2.5 * sd).max()))[:, 0]
    keep = keep[torch.argsort((mean + 2.5 * sd)[keep], descending=True)[:400]]
    draws = sur.sample(X[keep].unsqueeze(0), settings.thompson_samples)[:, 0, :]  # S x k
    wins = torch.bincount(draws.argmax(-1), minlength=len(keep)).double() / draws.shape[0]
    taken = list(existing)
    out: list[Proposal] = []
    decades = math.log10(1.0 / pilot_fraction)
    drift = sur.drift[0]
    noise2 = sur.noise_sd ** 2
    lo, hi = space.rho

    def try_run(a: Allocation, fidelity: str, frac: float) -> TrialPlan | None:
        if any(_same(a, fidelity, b, fb, settings.rho_match) for b, fb in taken):
            return None
        plan = plans(frac * spec.budget_flops, a)
        if plan is None or plan.expected.executed.total_flops > frac * spec.budget_flops:
            return None
        taken.append((a, fidelity))
        return plan

    def offer(i: int, p_best: float) -> bool:
        """Propose candidate ``i`` (as a pilot when that is worth more); ``False`` when it is a
        repeat or has no feasible plan."""
        a = cands[i]
        if allow_pilots:
            z = replace(a, rho=round(min(max(a.rho - drift * decades, lo), hi), 4))
            zrow = enc.tensor([enc.row(z.rho, z.group_size, z.reward, z.model, pilot_fraction)])
            cov, var_z = sur.covariance_with(X[i:i + 1], zrow)
            v = float(sd[i]) ** 2
            gain_full = v * v / (v + noise2)
            gain_pilot = float(cov[0]) ** 2 / (float(var_z[0]) + noise2) / pilot_fraction
            plan = try_run(z, "pilot", pilot_fraction) if gain_pilot > gain_full else None
            if plan is not None:
                out.append(Proposal(z, "pilot", pilot_fraction * spec.budget_flops, plan, p_best,
                                    pilot_fraction, float(mean[i]), float(sd[i])))
                return True
        plan = try_run(a, "full", 1.0)
        if plan is None:
            return False
        out.append(Proposal(a, "full", spec.budget_flops, plan, p_best, 1.0, float(mean[i]), float(sd[i])))
        return True

    tried: set[int] = set()  # offered (accepted or refused): never offered again
    for j in range(draws.shape[0]):
        if len(out) >= q:
            break
        for k in torch.argsort(draws[j], descending=True).tolist():
            i = int(keep[k])
            if i not in tried:
                tried.add(i)
                if offer(i, float(wins[k])):
                    break
    if len(out) < q:  # the likely maximizers are all repeats or infeasible: the rest by upper bound
        for i in torch.argsort(mean + 2.5 * sd, descending=True).tolist():
            if len(out) >= q or len(tried) >= len(keep) + 200:
                break
            if i not in tried:
                tried.add(i)
                offer(i, 0.0)
    return out


@dataclass
class ValidationRow:
    """Pilot regime against the full-budget regime for one reward system (× model)."""

    reward: str
    model: str | None
    pilot_regime: str
    pilot_rho: float
    full_regime: str
    full_probability: float
    """Share of posterior samples (at the full budget) with ``full_regime``."""
    full_rho: float
    """Argmax over ρ of the surrogate mean at the full budget (at its best G)."""
    same_regime: bool
    regret: float
    """Surrogate mean at the full budget: best allocation of this reward system minus the
    pilot-recommended one (>= 0; target units)."""
    num_full: int
    """Full-budget runs of this reward system (× model) the surrogate saw."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate(diagnoses: Sequence[RegimeDiagnosis], obs: Sequence[Observation], spec: StudySpec,
             settings: RaceSettings = RaceSettings(), surrogate: Any = None) -> list[ValidationRow]:
    """Pilot regimes against full-budget regimes (module docstring, step 3), from the surrogate
    fitted on ``obs`` (pilots and full runs)."""
    import numpy as np

    seed = spec.seed if settings.seed is None else settings.seed
    sur = surrogate if surrogate is not None else fit_surrogate(obs, spec.space, seed=seed)
    enc = sur.encoding
    lo, hi = spec.space.rho
    grid = np.array(sorted({round(lo + (hi - lo) * i / (settings.rho_grid - 1), 4)
                            for i in range(settings.rho_grid)}))
    out = []
    for d in diagnoses:
        rows_g = {g: [enc.row(float(r), g, d.reward, d.model, 1.0) for r in grid] for g in spec.space.group_sizes}
        means = {g: sur.predict(enc.tensor(rows_g[g]))[0].numpy() for g in rows_g}
        best_g = max(means, key=lambda g: means[g].max())
        full_rho = float(grid[int(means[best_g].argmax())])
        samples = sur.sample(enc.tensor(rows_g[best_g]).unsqueeze(0), settings.posterior_samples)[:, 0, :]
        rho_s = grid[samples.argmax(-1).numpy()]
        mine = [o for o in obs if o.allocation.reward == d.reward and o.allocation.model == d.model]
        share = _share_fit(mine)
        labels = Counter(regime_of(float(r), float(s), settings) for r, s in zip(rho_s, share(rho_s)))
        full_regime, count = labels.most_common(1)[0]
        if math.isnan(d.rho):
            regret = math.nan
        else:
            rec = enc.tensor([enc.row(d.rho, d.group_size, d.reward, d.model, 1.0)])
            regret = max(0.0, float(means[best_g].max()) - float(sur.predict(rec)[0][0]))
        out.append(ValidationRow(
            reward=d.reward, model=d.model, pilot_regime=d.regime, pilot_rho=d.rho,
            full_regime=full_regime, full_probability=count / len(rho_s), full_rho=full_rho,
            same_regime=d.regime == full_regime, regret=regret,
            num_full=sum(o.fidelity == "full" for o in mine)))
    return out


def same_regime_rate(rows: Sequence[ValidationRow], validated_only: bool = True) -> float:
    """Share of reward systems whose pilot regime matches the full-budget one; with
    ``validated_only``, over those with at least one full-budget run (NaN when none)."""
    use = [r for r in rows if r.num_full > 0 or not validated_only]
    return sum(r.same_regime for r in use) / len(use) if use else math.nan


# ====================================================================== the whole race
@dataclass
class RaceResult:
    """What :func:`run_race` did and found."""

    study: Any
    pilot_budget_flops: float
    pilots: list[TrialRow]
    """Pilot trials run by this call (a resumed race skips pilots already done)."""
    diagnoses: list[RegimeDiagnosis]
    proposals: list[Proposal]
    """Proposals run by this call (with ``propose_only``: proposed, none run)."""
    validations: list[TrialRow]
    """Runs of proposals done by this call (full runs and extra pilots)."""
    validation: list[ValidationRow]
    """Pilot against full-budget regimes (empty until the study has a full-budget run)."""
    timings: dict[str, list[float]] = field(default_factory=dict)
    """``fit_seconds`` per surrogate fit, ``proposal_seconds`` per proposal round."""
    recommendation: Allocation | None = None
    """The allocation RACE recommends for the full budget at the end (:func:`recommend` on every
    run of the study; with ``validations = 0`` the pilots' best diagnosis)."""
    recommendations: list[tuple[int, Allocation]] = field(default_factory=list)
    """``(last trial number seen, recommendation)`` after the pilots and after each round of
    this call: what RACE would have answered had it stopped there."""

    @property
    def same_regime_rate(self) -> float:
        return same_regime_rate(self.validation)

    def to_dict(self) -> dict[str, Any]:
        return {"pilot_budget_flops": self.pilot_budget_flops,
                "diagnoses": [d.to_dict() for d in self.diagnoses],
                "proposals": [p.to_dict() for p in self.proposals],
                "validation": [v.to_dict() for v in self.validation],
                "same_regime_rate": self.same_regime_rate, "timings": self.timings,
                "recommendation": None if self.recommendation is None else asdict(self.recommendation)}


def _params(spec: StudySpec, a: Allocation) -> dict[str, Any]:
    d = distributions(spec)
    full = {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model}
    return {k: v for k, v in full.items() if k in d}


def _run_enqueued(study, spec, params, user_attrs, dists, **kw) -> TrialRow:
    study.enqueue_trial(params, user_attrs=user_attrs)
    trial = study.ask(dists)
    row, _ = run_one_trial(study, trial, spec, **kw)
    return row


def run_race(
    spec: StudySpec,
    *,
    objective: Any,
    workload: Workload,
    storage: str | None = DEFAULT_STORAGE,
    tracker: Any = None,
    pilot_fraction: float = 0.1,
    validations: int = 4,
    propose_only: bool = False,
    settings: RaceSettings = RaceSettings(),
    on_phase: Callable[[str, Any], None] | None = None,
    on_trial_start: Callable[[int, Allocation, TrialPlan | None], None] | None = None,
    on_trial_end: Callable[[TrialRow, Any], None] | None = None,
    progress: Callable[..., None] | None = None,
) -> RaceResult:
    """Pilots, regime diagnosis, validation proposals (and runs) in one Optuna study.

    Args:
        spec: the study; ``spec.budget_flops`` is the full budget, ``spec.space`` the grid.
        objective, workload: as for :func:`allocopt.study.run_study`.
        storage: Optuna storage URL (``None``: in memory). Running again resumes: pilots and
            validations already in the study are not run again.
        tracker: an :class:`allocopt.tracking.StudyTracker` (fidelity tags ``pilot``/``full``).
        pilot_fraction: pilots run at ``pilot_fraction × spec.budget_flops``, in (0, 1).
        validations: full-budget runs the study should have from RACE proposals (0: pilots only).
        propose_only: propose ``validations`` runs (pilots allowed within the extra-pilot
            budget), run none.
        settings: :class:`RaceSettings`.
        on_phase: called as ``(phase, payload)`` with ``("pilots", [PilotPoint to run])``,
            ``("diagnoses", [RegimeDiagnosis])``, ``("proposals", [Proposal])`` each round,
            ``("validation", [ValidationRow])``.
        on_trial_start, on_trial_end, progress: per-trial callbacks (as :func:`run_study`).

    Raises:
        ConfigError: bad ``pilot_fraction``, ``validations`` or space.
        StudyError: the storage cannot be opened, or the objective lacks the target.
    """
    from optuna.trial import TrialState

    f = check_pilot_fraction(pilot_fraction)
    if isinstance(validations, bool) or not isinstance(validations, int) or validations < 0:
        raise ConfigError(f"validations={validations!r}: must be an integer >= 0")
    seed = spec.seed if settings.seed is None else settings.seed
    design = pilot_grid(spec.space, settings, seed)
    pilot_budget = f * spec.budget_flops
    study = open_study(replace(spec, sampler="random"), storage)  # RACE fixes every parameter itself
    study.set_user_attr("spec", spec.to_dict())
    study.set_user_attr("race", {"pilot_fraction": f, "settings": asdict(settings)})
    dists = distributions(spec)
    emit = on_phase or (lambda phase, payload: None)
    kw = dict(objective=objective, workload=workload, tracker=tracker, on_trial_start=on_trial_start,
              on_trial_end=on_trial_end, progress=progress)

    # (a) pilots
    done = set()
    for t in study.get_trials(deepcopy=False):
        k = t.user_attrs.get("race_pilot")
        interrupted = t.state == TrialState.FAIL and str(t.user_attrs.get("error", "")).startswith("interrupted")
        if k and t.state in (TrialState.COMPLETE, TrialState.FAIL) and not interrupted:
            done.add(k)
    todo = [p for p in design if p.key not in done]
    emit("pilots", todo)
    pilot_rows = []
    for p in todo:
        pilot_rows.append(_run_enqueued(
            study, spec, _params(spec, p.allocation),
            {"fidelity": "pilot", "budget_flops": pilot_budget, "race_pilot": p.key}, dists, **kw))

    # (b) diagnosis
    obs = observations(study, spec)
    pilots = [o for o in obs if o.fidelity == "pilot" and abs(o.budget_fraction - f) <= 1e-9 * f + 1e-12]
    diagnoses = diagnose(pilots, spec.space, settings, seed)
    emit("diagnoses", diagnoses)
    result = RaceResult(study, pilot_budget, pilot_rows, diagnoses, [], [], [],
                        {"fit_seconds": [], "proposal_seconds": []})
    fitted = [d for d in diagnoses if not math.isnan(d.value)]
    if fitted:
        result.recommendation = max(fitted, key=lambda d: d.value).recommendation
    if validations == 0:
        return result

    def recommend_now(sur: Any, obs: list[Observation]) -> None:
        result.recommendation = recommend(sur, obs, spec.space, settings)[0]
        result.recommendations.append((max(o.number for o in obs), result.recommendation))

    # (c) proposals and validation runs
    plans = _Plans(workload)

    def status():
        ts = study.get_trials(deepcopy=False)
        n_full = sum(1 for t in ts if t.user_attrs.get("race_validation") and t.user_attrs.get("fidelity") == "full"
                     and t.state in (TrialState.COMPLETE, TrialState.FAIL))
        n_extra = sum(1 for t in ts if t.user_attrs.get("race_validation") and t.user_attrs.get("fidelity") == "pilot"
                      and t.state in (TrialState.COMPLETE, TrialState.FAIL))
        return n_full, n_extra * f

    sur, raw = None, None
    for _round in range(validations + math.ceil(settings.extra_pilot_budget / f) + 2):
        n_full, extra_spent = status()
        if n_full >= validations and not propose_only:
            break
        obs = observations(study, spec)
        if len(obs) < 2:
            break
        t0 = time.perf_counter()
        sur = fit_surrogate(obs, spec.space, seed=seed + len(obs), init=raw)
        raw = sur.raw
        result.timings["fit_seconds"].append(sur.fit_seconds)
        recommend_now(sur, obs)
        q = validations if propose_only else settings.batch_size
        allow = extra_spent + f <= settings.extra_pilot_budget + 1e-12
        batch = propose(obs, spec, workload, existing=existing_runs(study, spec), q=q, pilot_fraction=f,
                        allow_pilots=allow, settings=settings, surrogate=sur, plans=plans)
        result.timings["proposal_seconds"].append(time.perf_counter() - t0 - sur.fit_seconds)
        if propose_only:
            result.proposals += batch
            emit("proposals", batch)
            break
        emit("proposals", batch)
        for p in batch:
            n_full, extra_spent = status()
            if p.fidelity == "full" and n_full >= validations:
                continue
            if p.fidelity == "pilot" and extra_spent + f > settings.extra_pilot_budget + 1e-12:
                continue
            if any(_same(p.allocation, p.fidelity, a, fa, settings.rho_match)
                   for a, fa in existing_runs(study, spec)):
                continue  # another worker ran it meanwhile
            result.proposals.append(p)
            result.validations.append(_run_enqueued(
                study, spec, _params(spec, p.allocation),
                {"fidelity": p.fidelity, "budget_flops": p.budget_flops, "race_validation": True},
                dists, **kw))
        if not batch:
            break
        sur = None

    obs = observations(study, spec)
    if any(o.fidelity == "full" for o in obs) and len(obs) >= 2:
        if sur is None:
            sur = fit_surrogate(obs, spec.space, seed=seed + len(obs), init=raw)
            result.timings["fit_seconds"].append(sur.fit_seconds)
            recommend_now(sur, obs)
        result.validation = validate(diagnoses, obs, spec, settings, surrogate=sur)
        emit("validation", result.validation)
    return result


__all__ = ["FIDELITIES", "Observation", "PilotPoint", "Proposal", "REGIMES", "RaceResult",
           "RaceSettings", "RegimeDiagnosis", "ValidationRow", "check_pilot_fraction", "diagnose",
           "diagnose_group", "existing_runs", "fit_surrogate", "observations", "pilot_grid",
           "propose", "recommend", "regime_of", "run_race", "same_regime_rate", "validate"]
