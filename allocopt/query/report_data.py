"""What the report shows, gathered: the study's terms, RACE's regimes, the one answer, and ρ*
per reward system and target.

The project's ρ* estimator
==========================
One estimator gives, from a set of trials at one budget, the update fraction ρ* that maximizes
a target: RACE's kernel-weighted local quadratic in ρ with additive G offsets
(:func:`allocopt.race.diagnose_group`), with the 90 % credible interval of its approximate
posterior. It is the project's because it is built for what a study has: a handful of noisy
trials at one budget (an IsoFLOP set); it is read around the optimum, so far trials do not drag
the vertex; its interval is checked for calibration over seeds of a known function
(tests/test_race.py); and it needs numpy only. The report applies it

* to the data RACE diagnoses (the pilots at the pilot budget, over the space's ρ range): the
  regime table, identical to what ``allocopt race`` prints (:func:`study_context`);
* to the complete full-budget trials of each reward system and target, over the ρ range those
  trials cover (:func:`rho_estimate`), so the estimate never lies beyond the data; one at an end
  of that range is flagged ``at_edge`` ("at the edge of the data: the optimum may lie beyond").

The GP surrogate (:mod:`allocopt.surrogate`) is not a second ρ* estimator: it models pilots
and full runs together to propose runs and to give the study's one answer
(:class:`allocopt.race.Recommendation`, stored on the study by ``allocopt race`` / ``study``).
Where that answer exists, its ρ is the report's ρ for the recommended reward system and the
study's target (``source = "recommendation"``). The report's former kernel smoother is gone.

numpy, Optuna and (only to compute a missing recommendation) torch are imported inside functions.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from allocopt.query.pareto import _finite, best, field_key, measured_targets, number, spent_rho, value

LEVEL = 0.9
"""Level of the credible intervals shown."""
EDGE_TOL = 0.005
"""An estimate within this of an end of its data's ρ range is "at the edge" (ρ units)."""
PHASES = ("search_flops", "learning_flops", "reward_flops")
REWARD_ORDER = ("sparse", "structured", "dense", "proxy_prm", "prm")


@dataclass(frozen=True)
class RhoEstimate:
    """ρ* of one reward system and target, by the project's estimator (module docstring)."""

    reward: str
    target: str
    """Target key (``pass_at_1``)."""
    rho: float
    interval: tuple[float, float]
    """90 % credible interval of ρ* (NaN for the recommendation, whose interval is on the target)."""
    value: float
    """Fitted target at ρ* (the recommendation: posterior mean at the full budget)."""
    source: str
    """``full-budget trials``, ``pilots`` or ``recommendation``."""
    num_trials: int
    data_range: tuple[float, float]
    """Lowest and highest ρ of the trials behind the estimate (NaN when none)."""
    at_edge: bool
    """ρ* at an end of ``data_range`` (the maximum may lie beyond the data)."""
    beyond: bool = False
    """ρ* outside ``data_range``: a recommendation (within ``rho_trust`` of a full run), or RACE's
    pilot diagnosis (fitted over the space's ρ range)."""
    value_interval: tuple[float, float] | None = None
    """The recommendation's credible interval of the target."""

    def edge_note(self) -> str:
        """``""``, or the words saying where ρ* sits against its data."""
        lo, hi = self.data_range
        if self.beyond:
            return f"outside the ρ range of its trials ({lo:.2f}-{hi:.2f})"
        if self.at_edge:
            return f"at the edge of the data (ρ {lo:.2f}-{hi:.2f}): the optimum may lie beyond"
        return ""


@dataclass
class StudyContext:
    """The study's own terms and RACE's results, read from its Optuna storage."""

    name: str
    targets: tuple[str, ...]
    """The study's target keys (its stored spec, else its metric names)."""
    budget_flops: float | None
    """The full budget of one trial (FLOPs)."""
    pilot_fraction: float | None
    seed: int = 0
    settings: Any = None
    """The :class:`allocopt.race.RaceSettings` the study ran with (defaults when not stored)."""
    diagnoses: list[Any] = field(default_factory=list)
    """RACE's :class:`allocopt.race.RegimeDiagnosis` per reward system (× model), from the
    pilots at the pilot budget, for the study's (first) target."""
    pilot_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Per reward system, the lowest and highest ρ of those pilots (RACE fits over the space's
    ρ range, which a Latin-hypercube pilot set need not reach)."""
    recommendation: dict[str, Any] | None = None
    """The one answer (:func:`allocopt.answer.recommendation_dict`)."""
    recommendation_source: str = ""
    """``stored by the study`` or ``computed by the report``."""
    directions: dict[str, str] = field(default_factory=dict)
    """Each known target key's direction (``maximize``/``minimize``, the study's vocabulary);
    a key not here is maximized."""

    def direction(self, key: str) -> str:
        return self.directions.get(key, "maximize")


def rewards_of(rows: Sequence[Any]) -> list[str]:
    """The reward systems of the rows, in the project's order."""
    seen = {str(value(r, "reward")) for r in rows if value(r, "reward") is not None}
    return [w for w in REWARD_ORDER if w in seen] + sorted(seen - set(REWARD_ORDER))


def fidelity(row: Any) -> str:
    return getattr(row, "fidelity", "full")


def budget_of(row: Any) -> float:
    b = getattr(row, "plan", {}).get("budget_flops")
    return float(b) if _finite(b) and float(b) > 0 else math.nan


# ============================================================================ the estimator
def observations_of(rows: Sequence[Any], key: str, full_budget: float | None = None) -> list[Any]:
    """Complete rows with a finite ``key`` and ρ as RACE observations (asked ρ; value = target)."""
    from allocopt.plan.allocation import Allocation
    from allocopt.race import Observation

    out = []
    for r in rows:
        rho, y = spent_rho(r), number(r, key)
        if r.state != "COMPLETE" or not (math.isfinite(rho) and math.isfinite(y)):
            continue
        g = number(r, "group_size")
        try:
            a = Allocation(rho, int(g) if math.isfinite(g) else 2, str(value(r, "reward")), value(r, "model"))
        except ValueError:
            continue
        b = budget_of(r)
        total = number(r, "total_flops")
        share = number(r, "reward_flops") / total if total > 0 else math.nan
        out.append(Observation(r.number, a, y, b, b / full_budget if full_budget and math.isfinite(b) else 1.0,
                               fidelity(r), share))
    return out


def _one_budget(rows: Sequence[Any]) -> list[Any]:
    """The rows at the budget most of them ran at (ties: the largest): an IsoFLOP set."""
    counts = Counter(budget_of(r) for r in rows if math.isfinite(budget_of(r)))
    if len(counts) <= 1:
        return list(rows)
    b = max(counts, key=lambda k: (counts[k], k))
    return [r for r in rows if budget_of(r) == b]


def rho_estimate(rows: Sequence[Any], reward: str, target: str, *, settings: Any = None, seed: int = 0,
                 recommendation: Mapping[str, Any] | None = None) -> RhoEstimate | None:
    """ρ* of ``reward`` for ``target`` (module docstring): the recommendation's ρ when it is for
    this reward system and target, else RACE's local quadratic (:func:`allocopt.race.diagnose_group`)
    over the complete full-budget trials of one budget, over the ρ range they span; with fewer
    than 3 distinct ρ there (or too few near the optimum for the fit), over the pilots of one
    budget; else ``None``.
    """
    from allocopt.race import RaceSettings, diagnose_group

    key = field_key(target)
    mine = [r for r in rows if str(value(r, "reward")) == reward and r.state == "COMPLETE"
            and math.isfinite(number(r, key)) and math.isfinite(spent_rho(r))]
    full = _one_budget([r for r in mine if fidelity(r) == "full"])
    span = (min((spent_rho(r) for r in full), default=math.nan),
            max((spent_rho(r) for r in full), default=math.nan))
    rec = recommendation
    if rec and field_key(str(rec.get("target", ""))) == key and (rec.get("allocation") or {}).get("reward") == reward:
        rho = float(rec["allocation"]["rho"])
        lo, hi = rec.get("lower"), rec.get("upper")
        beyond = math.isfinite(span[0]) and not (span[0] - 1e-9 <= rho <= span[1] + 1e-9)
        return RhoEstimate(reward, key, rho, (math.nan, math.nan), float(rec.get("mean", math.nan)),
                           "recommendation", len(full), span,
                           at_edge=math.isfinite(span[0]) and not beyond and min(rho - span[0], span[1] - rho) <= EDGE_TOL,
                           beyond=beyond, value_interval=(float(lo), float(hi)) if _finite(lo) and _finite(hi) else None)
    for source, use in (("full-budget trials", full),
                        ("pilots", _one_budget([r for r in mine if fidelity(r) == "pilot"]))):
        rhos = [spent_rho(r) for r in use]
        if len({round(x, 4) for x in rhos}) < 3:
            continue
        obs = observations_of(use, key)
        lo, hi = min(rhos), max(rhos)
        d = diagnose_group(obs, (lo, hi), settings or RaceSettings(), seed=seed)
        if not math.isfinite(d.rho):
            continue  # too few trials near the optimum to fit (d.note)
        return RhoEstimate(reward, key, d.rho, d.rho_interval, d.value, source, len(obs), (lo, hi),
                           at_edge=min(d.rho - lo, hi - d.rho) <= EDGE_TOL)
    return None


def estimates(rows: Sequence[Any], targets: Sequence[str], ctx: StudyContext | None = None) -> dict[tuple[str, str], RhoEstimate]:
    """:func:`rho_estimate` per (reward system, target key) that has one; none for a minimized
    target (a cost: the ρ that maximizes it is no answer)."""
    out = {}
    for reward in rewards_of(rows):
        for t in targets:
            key = field_key(t)
            if ctx is not None and ctx.direction(key) == "minimize":
                continue
            e = rho_estimate(rows, reward, key, settings=ctx.settings if ctx else None, seed=ctx.seed if ctx else 0,
                             recommendation=ctx.recommendation if ctx else None)
            if (e is None or e.source == "pilots") and ctx and ctx.targets and key == ctx.targets[0]:
                e = _from_regime_table(ctx, reward) or e  # the pilots' rho*: the regime table's, not a second fit
            if e is not None:
                out[(reward, key)] = e
    return out


def _from_regime_table(ctx: StudyContext, reward: str) -> RhoEstimate | None:
    """RACE's diagnosis of ``reward`` (one model) as a :class:`RhoEstimate`, its data the pilots."""
    mine = [d for d in ctx.diagnoses if d.reward == reward]
    if len(mine) != 1 or not math.isfinite(mine[0].rho) or reward not in ctx.pilot_ranges:
        return None
    d, (lo, hi) = mine[0], ctx.pilot_ranges[reward]
    return RhoEstimate(reward, ctx.targets[0], d.rho, d.rho_interval, d.value, "pilots", d.num_trials, (lo, hi),
                       at_edge=min(d.rho - lo, hi - d.rho) <= EDGE_TOL, beyond=not lo - 1e-9 <= d.rho <= hi + 1e-9)


def best_table(rows: Sequence[Any], targets: Sequence[str],
               rho_stars: Mapping[tuple[str, str], RhoEstimate] | None = None,
               ctx: StudyContext | None = None) -> list[dict[str, Any]]:
    """Per reward system and target: complete full / pilot trial counts, the best complete
    full-budget trial in the target's direction (``ctx``'s; else maximize) (number, ρ, G,
    value, executed search / learning / reward shares) and ``rho_star`` (a
    :class:`RhoEstimate` or ``None``)."""
    out = []
    for reward in rewards_of(rows):
        mine = [r for r in rows if str(value(r, "reward")) == reward and r.state == "COMPLETE"]
        full = [r for r in mine if fidelity(r) == "full"]
        for t in targets:
            key = field_key(t)
            b = best(full, key, ctx.direction(key) if ctx else "maximize")
            row: dict[str, Any] = {"reward": reward, "target": key, "full_trials": len(full),
                                   "pilot_trials": len(mine) - len(full), "best": None,
                                   "rho_star": (rho_stars or {}).get((reward, key))}
            if b is not None:
                total = number(b, "total_flops")
                row["best"] = {"number": b.number, "study": getattr(b, "study", ""), "rho": spent_rho(b),
                               "group_size": value(b, "group_size"), "value": number(b, key),
                               **{p.replace("_flops", "_share"): (number(b, p) / total if total > 0 else math.nan)
                                  for p in PHASES}}
            out.append(row)
    return out


# ============================================================================ the study
def study_context(st: Any, compute_recommendation: bool = True) -> StudyContext:
    """The study's terms (stored spec, metric names), RACE's regime diagnosis of its pilots (as
    :func:`allocopt.race.run_race` computes it: the pilots at the pilot budget, the study's
    RACE settings and seed, the space's ρ range) and its one answer: the recommendation the
    study stored, else, for a RACE study with a full-budget run (user attribute ``race``), the
    one :func:`allocopt.race.recommendation` gives now (a GP fit: seconds).
    """
    from dataclasses import fields

    from allocopt.race import RaceSettings, diagnose
    from allocopt.spec import StudySpec, target_key
    from allocopt.study.observe import study_observations

    spec = None
    try:
        spec = StudySpec(**(st.user_attrs.get("spec") or {})) if st.user_attrs.get("spec") else None
    except (TypeError, ValueError):
        spec = None
    names = [n for n in (getattr(st, "metric_names", None) or []) if n]
    targets = spec.target_keys if spec else tuple(target_key(n) for n in names if _is_target(n))
    race_attr = st.user_attrs.get("race") or {}
    known = {f.name for f in fields(RaceSettings)}
    raw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in (race_attr.get("settings") or {}).items() if k in known}
    try:
        settings = RaceSettings(**raw)
    except (TypeError, ValueError):
        settings = RaceSettings()
    seed = spec.seed if spec else 0
    frac = race_attr.get("pilot_fraction", spec.pilot_fraction if spec else None)
    ctx = StudyContext(st.study_name, tuple(targets), spec.budget_flops if spec else None,
                       float(frac) if _finite(frac) else None, seed, settings)
    if spec is not None:
        ctx.directions = {t.key: t.direction for t in spec.vocabulary.targets}
    stored = st.user_attrs.get("recommendation")
    if stored:
        ctx.recommendation, ctx.recommendation_source = dict(stored), "stored by the study"
    if spec is None:
        return ctx
    obs = study_observations(st, spec, spec.targets[0])
    f = ctx.pilot_fraction
    pilots = [o for o in obs if o.fidelity == "pilot" and f and abs(o.budget_fraction - f) <= 1e-9 * f + 1e-12]
    if pilots:
        ctx.diagnoses = diagnose(pilots, spec.space, settings, seed)
        for w in {o.allocation.reward for o in pilots}:
            rhos = [o.allocation.rho for o in pilots if o.allocation.reward == w]
            ctx.pilot_ranges[w] = (min(rhos), max(rhos))
    if (ctx.recommendation is None and compute_recommendation and race_attr and pilots
            and any(o.fidelity == "full" for o in obs) and not spec.multi_objective):
        from allocopt.answer import recommendation_dict
        from allocopt.race.recommend import final_recommendation

        rec = final_recommendation(obs, spec.space, settings, seed, level=LEVEL)
        ctx.recommendation = recommendation_dict(rec, spec.targets[0], spec.directions[0])
        ctx.recommendation_source = "computed by the report (the study stored none)"
    return ctx


def _is_target(name: str) -> bool:
    from allocopt.spec import TARGETS

    return name in TARGETS or name in {field_key(t) for t in TARGETS}


def default_pareto_pair(rows: Sequence[Any], targets: Sequence[str], ctx: StudyContext | None) -> list[str]:
    """The Pareto figure's two targets: the study's targets when it has two or more; with one,
    that target and the next of ``targets`` (else of the targets the trials measured); without
    a study (MLflow rows), the first two of ``targets``. Fewer than two: ``[]`` (no figure)."""
    keys = [field_key(t) for t in targets]
    if ctx is None or not ctx.targets:
        return keys[:2] if len(keys) >= 2 else []
    if len(ctx.targets) >= 2:
        return list(ctx.targets[:2])
    other = [k for k in [*keys, *measured_targets(rows)] if k != ctx.targets[0]]
    return [ctx.targets[0], other[0]] if other else []


def budget_line(rows: Sequence[Any], ctx: StudyContext | None) -> str:
    """The header's budget sentence: the full budget per full-budget trial, then the pilots
    apart with their budget and its fraction of the full budget (FLOPs)."""
    full_b = ctx.budget_flops if ctx and ctx.budget_flops else None
    fulls = [budget_of(r) for r in rows if fidelity(r) == "full" and math.isfinite(budget_of(r))]
    if full_b is None and fulls:
        full_b = max(fulls)
    nfull = sum(fidelity(r) == "full" for r in rows)
    parts = []
    if full_b:
        parts.append(f"full budget {full_b:.3e} FLOPs per trial ({nfull} full-budget trial{'s' * (nfull != 1)})")
    pilots = [r for r in rows if fidelity(r) == "pilot"]
    if pilots:
        pb = Counter(budget_of(r) for r in pilots if math.isfinite(budget_of(r)))
        each = ", ".join(f"{b:.3e} FLOPs" + (f" ({b / full_b:.3g} of the full budget)" if full_b else "")
                         for b in sorted(pb))
        parts.append(f"pilots: {len(pilots)} at {each or 'an unknown budget'}")
    return "; ".join(parts)


__all__ = ["EDGE_TOL", "LEVEL", "RhoEstimate", "StudyContext", "best_table", "budget_line",
           "default_pareto_pair", "estimates", "observations_of", "rewards_of", "rho_estimate",
           "study_context"]
