"""The tiny world's ground truth, read from the measured grid (``benchmarks/tiny_grid.py``'s table).

    python benchmarks/tiny_truth.py [--table benchmarks/tiny_grid/trials.csv] [--out DIR]
                                    [--draws 2000] [--seed 0]

Works on a partial table: every answer says which cells and seeds it rests on.

**ρ\\* rule** (per reward system, target and fidelity): the G with every ρ level measured are
used; per G the seed-means over the ρ levels are smoothed with the 3-point kernel
``(1/4, 1/2, 1/4)`` (at the ends ``(2/3, 1/3)``), and ρ\\* (with G\\*) is the argmax of the
smoothed curves over (G, ρ level). So ρ\\* is one of the measured levels (spacing 0.1).

**Intervals**: a seeded bootstrap over seeds (``--draws`` draws): per draw, every cell's seeds
are resampled with replacement (the same resample for all targets: the draws are paired), the
rule is applied, and the 90 % interval is the 5 % and 95 % quantiles of the draws. A cell with
one measured seed cannot be resampled: its draw adds Gaussian noise of the pooled seed-to-seed
sd of that target and fidelity (cells with >= 2 seeds), or, where no cell has 2 seeds yet, the
evaluation's binomial sd ``sqrt(p (1 - p) / 1000)`` (1000 problems) — a lower bound, since it
leaves out training noise; the tables say which was used.

**Regime**: :func:`allocopt.race.diagnose.regime_of` at (ρ\\*, reward share of compute at the
optimum's cell) with the default :class:`allocopt.race.RaceSettings` thresholds (search-heavy
below 0.4, update-heavy above 0.6, reward-heavy above a 0.3 share); the label of the point
estimate and the share of draws that agree. A regime is *clear* when >= 80 % of draws give it.
For comparison RACE's own estimator (:func:`allocopt.race.diagnose.diagnose_group`, the local
quadratic with G offsets) is applied to the same rows.

The paper's three questions:

1. does a model-based reward (proxy_prm, prm) lower ρ\\*? mean ρ\\* of the model-based systems
   minus that of the rule-based ones (sparse, structured, dense), per target, with its interval
   and the share of draws below 0;
2. do the targets disagree? per reward system, ρ\\*(t1) − ρ\\*(t2) for each pair of targets
   (paired draws), and whether the regimes differ;
3. how often would a pilot grid at 25 % have named the full budget's regime? per reward system
   and target with both fidelities measured: the pilot table's regime against the full table's.

Noise: the seed-to-seed sd of each target at a cell (cells with >= 2 seeds; median and pooled)
against the evaluation's binomial sd at the cell's mean.

Pilot design (:func:`pilot_design`): at no more pilot compute than the tiny study's RACE design before the grid (30
pilots at 25 %: 7.5 full runs), at every pilot fraction the table measured (25 %: 6 pilots per
reward system; 10 %: 15), each candidate design (RACE's own grid, or k measured ρ levels × a set
of G; RACE's kernel width 0.2, 0.35 or 0.5) is replayed from the table's pilot rows (the
``tiny-table`` objective) and diagnosed by RACE; its same-regime rate is the share of (reward,
target, replay) whose regime equals the full table's, over the pairs whose full regime is clear.
Needs pilot rows; says so when there are none.

Output: tables on stdout; in ``--out`` (default the table's folder) ``README.md`` (generated:
coverage, tables, answers) and ``tiny_truth.png`` (each target against ρ per reward system,
seeds as points, seed-means as lines per G).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from objectives import COMMON_TARGETS  # noqa: E402
from objectives.tiny_table import DEFAULT_TABLE, Row, read_table  # noqa: E402

REWARDS = ("sparse", "structured", "dense", "proxy_prm", "prm")
MODEL_BASED = ("proxy_prm", "prm")
RULE_BASED = ("sparse", "structured", "dense")
EVAL_PROBLEMS = 1000
"""Problems of the tiny objective's evaluation (``studies/tiny.toml``: ``eval_problems``)."""
CLEAR = 0.8
GRID_G = (2, 4, 8)
GRID_LEVELS = 8
GRID_SEEDS = {"full": 3, "pilot": 2}
"""The grid ``benchmarks/tiny_grid.py`` runs by default (for the coverage table); another pilot
fidelity (``pilot10``: pilots at 10 %, ``--pilot-fractions``) has the pilots' seeds."""


def fidelities(grs: dict) -> list[str]:
    """The table's fidelities, ``full`` first, then the pilots by budget, largest first."""
    budget = {f: g.budget_flops for (w, f), g in grs.items()}
    return sorted(budget, key=lambda f: (f != "full", -budget[f]))


def smooth(y: Any) -> Any:
    """3-point smoothing ``(1/4, 1/2, 1/4)`` along the last axis, the weights renormalized over
    the levels present (so the ends are ``(2/3, 1/3)``); a NaN level (measured infeasible) stays
    NaN and lends no weight to its neighbours. ``... x L`` -> ``... x L``."""
    import numpy as np

    y = np.asarray(y, dtype=float)
    m = ~np.isnan(y)
    v = np.where(m, y, 0.0)
    num, den = 0.5 * v, 0.5 * m.astype(float)
    num[..., 1:] += 0.25 * v[..., :-1]
    den[..., 1:] += 0.25 * m[..., :-1]
    num[..., :-1] += 0.25 * v[..., 1:]
    den[..., :-1] += 0.25 * m[..., 1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m, num / np.where(den > 0, den, 1.0), np.nan)


def binomial_sd(p: float, n: int = EVAL_PROBLEMS) -> float:
    """sd of a share ``p`` measured on ``n`` independent problems: ``sqrt(p (1 - p) / n)``."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


@dataclass
class Group:
    """The measured cells of one (reward system, fidelity): ``values[g][level] -> seeds x targets``."""

    reward: str
    fidelity: str
    levels: tuple[float, ...]
    complete_g: tuple[int, ...]
    """G measured at every ρ level (the ones ρ* is read from)."""
    budget_flops: float = 0.0
    values: dict[int, dict[float, Any]] = field(default_factory=dict)
    infeasible: dict[int, set] = field(default_factory=dict)
    """Levels per G whose every measured trial was infeasible (the budget could not buy one iteration)."""
    shares: dict[int, dict[float, float]] = field(default_factory=dict)
    """Mean reward share of executed FLOPs per cell."""
    trials: int = 0

    @property
    def min_seeds(self) -> int:
        return min((len(self.values[g][x]) for g in self.complete_g for x in self.levels if x in self.values[g]),
                   default=0)

    def level_means(self, g: int) -> Any:
        """Seed-means at G ``g``, ``levels x targets`` (NaN rows at infeasible levels)."""
        import numpy as np

        nan = np.full(len(COMMON_TARGETS), np.nan)
        return np.stack([self.values[g][x].mean(0) if x in self.values[g] else nan for x in self.levels])


def groups(rows: Sequence[Row], other: Sequence[dict] = ()) -> dict[tuple[str, str], Group]:
    """The table's rows by (reward, fidelity); every group shares the table's ρ levels. ``other``:
    the table's other rows; a level whose every trial was infeasible counts as measured (a G
    with every level measured or infeasible is complete; ρ* is read at its feasible levels)."""
    import numpy as np

    bad: dict[tuple[str, str], dict[int, set]] = {}
    for r in other:
        if r.get("status") == "infeasible":
            bad.setdefault((r["reward"], r["fidelity"]), {}).setdefault(int(r["group_size"]), set()).add(
                round(float(r["rho"]), 4))
    levels = tuple(sorted({r.rho for r in rows}))
    by: dict[tuple[str, str], dict[int, dict[float, list[Row]]]] = {}
    for r in rows:
        by.setdefault((r.reward, r.fidelity), {}).setdefault(r.group_size, {}).setdefault(r.rho, []).append(r)
    out = {}
    for (w, f), per_g in by.items():
        inf = {g: {x for x in bad.get((w, f), {}).get(g, set()) if x not in c} for g, c in per_g.items()}
        g_done = tuple(sorted(g for g, c in per_g.items() if all(x in c or x in inf[g] for x in levels)))
        first = next(iter(next(iter(per_g.values())).values()))[0]
        grp = Group(w, f, levels, g_done, budget_flops=first.budget_flops, infeasible=inf,
                    trials=sum(len(v) for c in per_g.values() for v in c.values()))
        for g, c in per_g.items():
            grp.values[g] = {x: np.array([[r.targets[t] for t in COMMON_TARGETS] for r in sorted(rs, key=lambda r: r.seed)])
                             for x, rs in c.items()}
            grp.shares[g] = {x: float(np.mean([r.reward_share for r in rs])) for x, rs in c.items()}
        out[(w, f)] = grp
    return out


def pooled_sd(gs: Sequence[Group]) -> tuple[Any, int]:
    """Pooled seed-to-seed sd per target over the cells with >= 2 seeds (``targets``,), and
    the number of such cells (NaN sds when none)."""
    import numpy as np

    ss, dof, n = np.zeros(len(COMMON_TARGETS)), 0, 0
    for grp in gs:
        for c in grp.values.values():
            for v in c.values():
                if len(v) >= 2:
                    ss += ((v - v.mean(0)) ** 2).sum(0)
                    dof += len(v) - 1
                    n += 1
    return (np.sqrt(ss / dof) if dof else np.full(len(COMMON_TARGETS), np.nan)), n


def rho_star(grp: Group, means: dict[int, Any]) -> tuple[Any, Any]:
    """``(rho*, G*)`` per target (arrays of length ``targets``) from seed-means
    ``means[g] -> levels x targets`` (the module's rule)."""
    import numpy as np

    gs = list(grp.complete_g)
    curves = np.stack([smooth(means[g].T) for g in gs])  # G x targets x levels
    curves = np.where(np.isnan(curves), -np.inf, curves)  # an infeasible level is never rho*
    k = curves.transpose(1, 0, 2).reshape(len(COMMON_TARGETS), -1).argmax(1)
    gi, li = np.unravel_index(k, (len(gs), len(grp.levels)))
    return np.array(grp.levels)[li], np.array(gs)[gi]


@dataclass
class Estimate:
    """ρ* of one (reward, fidelity, target) with its bootstrap draws."""

    reward: str
    fidelity: str
    target: str
    rho: float
    group_size: int
    draws: Any
    """ρ* per bootstrap draw."""
    regime: str
    regime_share: float
    """Share of draws with the point estimate's regime."""
    regime_draws: list[str]
    reward_share: float
    noise: str
    """``seeds`` (every cell resampled), or how single-seed cells were perturbed."""
    g_used: tuple[int, ...]
    min_seeds: int
    race: dict[str, Any] = field(default_factory=dict)

    @property
    def interval(self) -> tuple[float, float]:
        import numpy as np

        return float(np.quantile(self.draws, 0.05)), float(np.quantile(self.draws, 0.95))

    @property
    def clear(self) -> bool:
        return self.regime_share >= CLEAR


def estimate(grp: Group, sd: Any, draws: int, rng: Any, settings: Any) -> list[Estimate]:
    """ρ*, interval and regime of every target of one group (module docstring)."""
    import numpy as np

    from allocopt.race.diagnose import regime_of

    gs = grp.complete_g
    means = {g: grp.level_means(g) for g in gs}
    point, point_g = rho_star(grp, means)
    binom = {g: np.sqrt(np.clip(means[g] * (1 - means[g]), 0, None) / EVAL_PROBLEMS) for g in gs}
    one_seed = any(len(grp.values[g][x]) < 2 for g in gs for x in grp.levels if x in grp.values[g])
    use_pooled = not np.isnan(sd).any()
    noise = "seeds" if not one_seed else ("seeds + pooled seed sd for 1-seed cells" if use_pooled
                                          else "binomial sd only (1 seed per cell; a lower bound)")
    all_draws = np.empty((draws, len(COMMON_TARGETS)))
    all_g = np.empty((draws, len(COMMON_TARGETS)), dtype=int)
    for d in range(draws):
        m = {}
        for g in gs:
            rows = []
            for i, x in enumerate(grp.levels):
                v = grp.values[g].get(x)
                if v is None:  # infeasible level
                    rows.append(np.full(len(COMMON_TARGETS), np.nan))
                elif len(v) >= 2:
                    rows.append(v[rng.integers(0, len(v), len(v))].mean(0))
                else:
                    rows.append(v[0] + rng.standard_normal(len(COMMON_TARGETS)) * (sd if use_pooled else binom[g][i]))
            m[g] = np.stack(rows)
        all_draws[d], all_g[d] = rho_star(grp, m)
    out = []
    for k, t in enumerate(COMMON_TARGETS):
        share = grp.shares[int(point_g[k])][float(point[k])]
        lab = regime_of(float(point[k]), share, settings)
        labs = [regime_of(float(r), grp.shares[int(g)][float(r)], settings) for r, g in zip(all_draws[:, k], all_g[:, k])]
        out.append(Estimate(grp.reward, grp.fidelity, t, float(point[k]), int(point_g[k]), all_draws[:, k], lab,
                            labs.count(lab) / len(labs), labs, share, noise, gs, grp.min_seeds))
    return out


def race_estimate(grp: Group, target: str, settings: Any, seed: int) -> dict[str, Any]:
    """RACE's own ρ* estimator (:func:`allocopt.race.diagnose.diagnose_group`) on every measured
    row of the group (all G, all seeds)."""
    from allocopt.plan.allocation import Allocation
    from allocopt.race.diagnose import Observation, diagnose_group

    k = COMMON_TARGETS.index(target)
    obs = []
    for g, c in grp.values.items():
        for x, v in c.items():
            for y in v[:, k]:
                obs.append(Observation(len(obs), Allocation(x, g, grp.reward), float(y), 0.0, 1.0, grp.fidelity,
                                       grp.shares[g][x]))
    d = diagnose_group(obs, (grp.levels[0], grp.levels[-1]), settings, seed=seed)
    return {"rho": d.rho, "interval": d.rho_interval, "regime": d.regime, "probability": d.probability,
            "n": d.num_trials}


# ------------------------------------------------------------------------------ answers
def q1_model_based(est: dict, draws: int) -> list[dict[str, Any]]:
    """Per target: mean ρ* (model-based) − mean ρ* (rule-based), full budget."""
    import numpy as np

    out = []
    for t in COMMON_TARGETS:
        mb = [est[(w, "full", t)] for w in MODEL_BASED if (w, "full", t) in est]
        rb = [est[(w, "full", t)] for w in RULE_BASED if (w, "full", t) in est]
        if not mb or not rb:
            out.append({"target": t, "answer": None, "model_based": [e.reward for e in mb],
                        "rule_based": [e.reward for e in rb]})
            continue
        diff = np.mean([e.draws for e in mb], 0) - np.mean([e.draws for e in rb], 0)
        point = float(np.mean([e.rho for e in mb]) - np.mean([e.rho for e in rb]))
        out.append({"target": t, "answer": point, "interval": (float(np.quantile(diff, 0.05)), float(np.quantile(diff, 0.95))),
                    "p_lower": float(np.mean(diff < 0)), "model_based": [e.reward for e in mb],
                    "rule_based": [e.reward for e in rb]})
    return out


def q2_targets(est: dict) -> list[dict[str, Any]]:
    """Per reward system and pair of targets: ρ*(t1) − ρ*(t2) (paired draws), full budget."""
    import numpy as np

    out = []
    for w in REWARDS:
        for i, t1 in enumerate(COMMON_TARGETS):
            for t2 in COMMON_TARGETS[i + 1:]:
                a, b = est.get((w, "full", t1)), est.get((w, "full", t2))
                if a is None or b is None:
                    continue
                d = a.draws - b.draws
                lo, hi = float(np.quantile(d, 0.05)), float(np.quantile(d, 0.95))
                out.append({"reward": w, "pair": (t1, t2), "diff": a.rho - b.rho, "interval": (lo, hi),
                            "disagree": lo > 0 or hi < 0, "regimes": (a.regime, b.regime),
                            "p_regime_differs": float(np.mean([x != y for x, y in zip(a.regime_draws, b.regime_draws)]))})
    return out


def q3_pilots(est: dict) -> list[dict[str, Any]]:
    """Per pilot fidelity, reward system and target with a full curve too: the pilot grid's
    regime vs the full budget's."""
    out = []
    pilots = sorted({f for (_, f, _) in est if f != "full"}, key=lambda f: (f != "pilot", f))
    for pf in pilots:
        for w in REWARDS:
            for t in COMMON_TARGETS:
                f, p = est.get((w, "full", t)), est.get((w, pf, t))
                if f is None or p is None:
                    continue
                agree = sum(a == b for a, b in zip(p.regime_draws, f.regime_draws)) / len(f.regime_draws)
                out.append({"fidelity": pf, "reward": w, "target": t, "full": f.regime, "pilot": p.regime,
                            "match": f.regime == p.regime, "p_match": agree, "clear": f.clear,
                            "rho_full": f.rho, "rho_pilot": p.rho})
    return out


def noise_table(grs: dict) -> list[dict[str, Any]]:
    """Per fidelity and target: seed-to-seed sd at cells with >= 2 seeds vs the binomial sd."""
    import numpy as np

    out = []
    for f in fidelities(grs):
        gs = [g for (w, ff), g in grs.items() if ff == f]
        pooled, n = pooled_sd(gs)
        for k, t in enumerate(COMMON_TARGETS):
            sds, bins, allmeans = [], [], []
            for grp in gs:
                for c in grp.values.values():
                    for v in c.values():
                        allmeans.append(float(v[:, k].mean()))
                        if len(v) >= 2:
                            sds.append(float(v[:, k].std(ddof=1)))
                            bins.append(binomial_sd(float(v[:, k].mean())))
            out.append({"fidelity": f, "target": t, "cells": n, "median_sd": float(np.median(sds)) if sds else math.nan,
                        "pooled_sd": float(pooled[k]), "binomial_sd": float(np.median(bins)) if bins else
                        binomial_sd(float(np.mean(allmeans))),
                        "ratio": float(pooled[k]) / float(np.median(bins)) if bins else math.nan})
    return out


def coverage(grs: dict, other: Sequence[dict]) -> list[dict[str, Any]]:
    """Per reward system and fidelity (the default grid's two, then any other measured): trials
    measured against the default grid's count (other pilot fidelities: at the pilots' seeds)."""
    out = []
    fids = list(dict.fromkeys(["full", "pilot", *fidelities(grs)]))
    for w in REWARDS:
        for f in fids:
            grp = grs.get((w, f))
            want = len(GRID_G) * GRID_LEVELS * GRID_SEEDS.get(f, GRID_SEEDS["pilot"])
            bad = sum(1 for r in other if r["reward"] == w and r["fidelity"] == f)
            out.append({"reward": w, "fidelity": f, "trials": grp.trials if grp else 0, "of": want,
                        "not_complete": bad, "complete_g": grp.complete_g if grp else (),
                        "min_seeds": grp.min_seeds if grp else 0})
    return out


# ------------------------------------------------------------------------------ output
def fmt_rho(e: Estimate) -> str:
    lo, hi = e.interval
    return f"{e.rho:.2f} [{lo:.2f},{hi:.2f}]"


def report(rows: Sequence[Row], other: Sequence[dict], draws: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Every table and answer of the module docstring, as a dict (``lines``: the text)."""
    import numpy as np

    from allocopt.race import RaceSettings

    settings = RaceSettings()
    grs = groups(rows, other)
    rng = np.random.default_rng(seed)
    est: dict[tuple[str, str, str], Estimate] = {}
    for f in fidelities(grs):
        sd, _ = pooled_sd([g for (w, ff), g in grs.items() if ff == f])
        for w in REWARDS:
            grp = grs.get((w, f))
            if grp is None or not grp.complete_g:
                continue
            for e in estimate(grp, sd, draws, rng, settings):
                e.race = race_estimate(grp, e.target, settings, seed)
                est[(w, f, e.target)] = e
    cov = coverage(grs, other)
    q1, q2, q3 = q1_model_based(est, draws), q2_targets(est), q3_pilots(est)
    noise = noise_table(grs)
    L: list[str] = []
    total = len(rows) + len(other)
    want = sum(c["of"] for c in cov)  # the default grid's, and any other pilot fidelity measured
    L.append(f"Coverage: {total} of {want} trials of the grid ({len(rows)} complete); per reward system and fidelity:")
    L.append("| reward | fidelity | trials | of | not complete | G with all 8 ρ levels measured (complete or all infeasible) | min seeds at those |")
    L.append("|---|---|---|---|---|---|---|")
    for c in cov:
        L.append(f"| {c['reward']} | {c['fidelity']} | {c['trials']} | {c['of']} | {c['not_complete']} | "
                 f"{','.join(map(str, c['complete_g'])) or '—'} | {c['min_seeds'] or '—'} |")
    L.append("")
    L.append(f"ρ* per reward system and target (90 % bootstrap interval, {draws} draws; rule: argmax over G and "
             "ρ level of the 3-point-smoothed seed-mean curves); regime (share of draws); RACE's local quadratic "
             "on the same rows for comparison:")
    L.append("| reward | fidelity | target | ρ* [90 %] | G* | regime (share) | reward share | RACE ρ* [90 %] | RACE regime | G used | min seeds | noise in the draws |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (w, f, t), e in est.items():
        r = e.race
        rr = "unknown" if math.isnan(r["rho"]) else f"{r['rho']:.2f} [{r['interval'][0]:.2f},{r['interval'][1]:.2f}]"
        L.append(f"| {w} | {f} | {t} | {fmt_rho(e)} | {e.group_size} | {e.regime} ({e.regime_share:.2f}) | "
                 f"{e.reward_share:.3f} | {rr} | {r['regime']} ({r['probability']:.2f}) | "
                 f"{','.join(map(str, e.g_used))} | {e.min_seeds} | {e.noise} |")
    if not est:
        L.append("| (no reward system has a G measured at every ρ level yet) |||||||||||")
    L.append("")
    L.append("Q1. Does a model-based reward lower ρ*? mean ρ*(proxy_prm, prm) − mean ρ*(sparse, structured, dense), full budget:")
    for a in q1:
        if a["answer"] is None:
            L.append(f"- {a['target']}: not answerable yet (model-based measured: {', '.join(a['model_based']) or 'none'}; "
                     f"rule-based: {', '.join(a['rule_based']) or 'none'})")
        else:
            L.append(f"- {a['target']}: {a['answer']:+.2f} [{a['interval'][0]:+.2f},{a['interval'][1]:+.2f}], "
                     f"P(< 0) = {a['p_lower']:.2f} (model-based: {', '.join(a['model_based'])}; rule-based: "
                     f"{', '.join(a['rule_based'])})")
    L.append("")
    L.append("Q2. Do the targets disagree? ρ*(t1) − ρ*(t2) per reward system (paired draws), full budget:")
    if not q2:
        L.append("- not answerable yet: no reward system measured at every ρ level")
    for a in q2:
        lo, hi = a["interval"]
        L.append(f"- {a['reward']}: {a['pair'][0]} − {a['pair'][1]} = {a['diff']:+.2f} [{lo:+.2f},{hi:+.2f}]"
                 f"{' (disagree: interval excludes 0)' if a['disagree'] else ''}; regimes {a['regimes'][0]} / "
                 f"{a['regimes'][1]}, P(regimes differ) = {a['p_regime_differs']:.2f}")
    if q2:
        n_dis = sum(a["disagree"] for a in q2)
        L.append(f"- {n_dis} of {len(q2)} (reward, pair) comparisons have an interval that excludes 0")
    L.append("")
    L.append("Q3. Would a pilot grid at 25 % have named the full budget's regime? (the same for any other pilot "
             "fraction measured)")
    if not q3:
        L.append("- not answerable yet: no reward system has both a full and a pilot curve measured at every ρ level "
                 f"(pilot trials in the table: {sum(c['trials'] for c in cov if c['fidelity'] != 'full')})")
    for pf in dict.fromkeys(a["fidelity"] for a in q3):
        qs = [a for a in q3 if a["fidelity"] == pf]
        m = sum(a["match"] for a in qs)
        clear = [a for a in qs if a["clear"]]
        frac = next(g.budget_flops for (w, f), g in grs.items() if f == pf) / next(
            g.budget_flops for (w, f), g in grs.items() if f == "full")
        L.append(f"- pilots at {frac:.0%} ({pf}): same regime in {m} of {len(qs)} (reward, target) pairs "
                 f"(P(match) over draws, mean: {sum(a['p_match'] for a in qs) / len(qs):.2f}); where the full regime "
                 f"is clear (>= {CLEAR:.0%} of draws): {sum(a['match'] for a in clear)} of {len(clear)}")
        for a in qs:
            L.append(f"  - {a['reward']} {a['target']}: pilot {a['pilot']} (ρ* {a['rho_pilot']:.2f}) vs full {a['full']} "
                     f"(ρ* {a['rho_full']:.2f}{', clear' if a['clear'] else ''}); P(match over draws) = {a['p_match']:.2f}")
    L.append("")
    L.append(f"Noise: seed-to-seed sd of each target at a cell (cells with >= 2 seeds) vs the evaluation's binomial sd "
             f"sqrt(p(1-p)/{EVAL_PROBLEMS}):")
    L.append("| fidelity | target | cells with >= 2 seeds | median sd | pooled sd | binomial sd | pooled / binomial |")
    L.append("|---|---|---|---|---|---|---|")
    for n in noise:
        f = lambda x: "—" if math.isnan(x) else f"{x:.4f}"  # noqa: E731
        L.append(f"| {n['fidelity']} | {n['target']} | {n['cells']} | {f(n['median_sd'])} | {f(n['pooled_sd'])} | "
                 f"{f(n['binomial_sd'])} | {'—' if math.isnan(n['ratio']) else format(n['ratio'], '.2f')} |")
    return {"estimates": est, "coverage": cov, "q1": q1, "q2": q2, "q3": q3, "noise": noise, "lines": L,
            "groups": grs}


# ------------------------------------------------------------------------------ pilot design
STUDY_PILOTS = 30
STUDY_PILOT_FRACTION = 0.25
"""The tiny study's pilot design before the table chose one (``studies/tiny.toml`` until
2026-12-02: 30 pilots at 25 % of the budget, RACE's default grid and kernel width): 7.5 full runs
of pilot compute, the most a candidate design may spend."""


@dataclass(frozen=True)
class Design:
    """A RACE pilot design a study file can state: ``pilots`` (``max_pilots``) at
    ``pilot_fraction``, and the ``[race]`` settings ``rho_levels``, ``pilot_group_sizes`` and
    ``bandwidth``; its pilots are RACE's own grid (:func:`allocopt.race.pilot_grid`: the whole
    grid when it fits under ``pilots``, else a Latin hypercube in ρ)."""

    pilots: int
    pilot_fraction: float
    rho_levels: int = 6
    pilot_group_sizes: tuple[int, ...] | None = None
    """``None``: every G of the space."""
    bandwidth: float = 0.2
    """RACE's kernel width in ρ (:attr:`allocopt.race.RaceSettings.bandwidth`, default 0.2): with
    few pilots per reward system a wider kernel keeps enough effective pilots for the fit."""

    def settings(self, **kw: Any) -> Any:
        from allocopt.race import RaceSettings

        return RaceSettings(max_pilots=self.pilots, rho_levels=self.rho_levels,
                            pilot_group_sizes=self.pilot_group_sizes, bandwidth=self.bandwidth, **kw)

    def allocations(self, space: Any, reward: str, seed: int) -> list[Any]:
        from allocopt.race import pilot_grid

        return [p.allocation for p in pilot_grid(space, self.settings(), seed) if p.allocation.reward == reward]

    def name(self, space: Any) -> str:
        from allocopt.race import pilot_grid

        grid = pilot_grid(space, self.settings(), 0)
        n = len(grid) // len(REWARDS)
        gs = "/".join(map(str, self.pilot_group_sizes or space.group_sizes))
        full = len({p.allocation.rho for p in grid}) == self.rho_levels
        how = f"{self.rho_levels} rho levels x G={gs}" if full else f"hypercube of {n} over G={gs}"
        return f"{how} ({len(grid)} pilots at {self.pilot_fraction:.0%}), bandwidth {self.bandwidth}"

    def study_file(self) -> str:
        """The study-file lines of this design (``pilots``, ``pilot_fraction``, ``[race]``)."""
        race = [f"rho_levels = {self.rho_levels}", f"bandwidth = {self.bandwidth}"]
        if self.pilot_group_sizes:
            race.insert(1, f"pilot_group_sizes = {list(self.pilot_group_sizes)}")
        return f"pilots = {self.pilots}, pilot_fraction = {self.pilot_fraction:g}, [race] " + ", ".join(race)


BANDWIDTHS = (0.2, 0.35, 0.5)
"""Kernel widths tried (0.2: RACE's default)."""


def candidate_designs(levels: Sequence[float], gs: Sequence[int], per_reward: int, fraction: float) -> list[Design]:
    """At pilot ``fraction`` with at most ``per_reward`` pilots a reward system, per kernel width
    (:data:`BANDWIDTHS`): RACE's default grid (6 ρ levels, every G; a hypercube of
    ``per_reward`` when the grid does not fit: the first design at 25 %, width 0.2, is what
    ``studies/tiny.toml`` ran), and for every non-empty set of G, every whole grid of k ρ levels
    (3 <= k <= the table's levels) with ``k × |G| <= per_reward``."""
    from itertools import combinations

    n = per_reward * len(REWARDS)
    out = []
    subsets = [c for m in range(1, len(gs) + 1) for c in combinations(gs, m)]
    for h in BANDWIDTHS:
        if per_reward >= len(gs) + 3:
            out.append(Design(n, fraction, 6, None, h))
        for sub in subsets:
            for k in range(3, len(levels) + 1):
                if k * len(sub) > per_reward:
                    break
                pg = None if len(sub) == len(gs) else tuple(sub)
                if pg is None and k == 6 and k * len(sub) <= per_reward:
                    continue  # RACE's default grid, above
                out.append(Design(k * len(sub) * len(REWARDS), fraction, k, pg, h))
    return out


BASELINE = Design(STUDY_PILOTS, STUDY_PILOT_FRACTION)
"""The tiny study's design before (:data:`STUDY_PILOTS`)."""


def study_design(path: Path) -> Design:
    """The pilot design a study file runs (its ``pilots``, ``pilot_fraction`` and ``[race]``'s
    ``rho_levels``, ``pilot_group_sizes``, ``bandwidth``)."""
    from allocopt.race.design import settings_for
    from allocopt.spec import StudySpec

    spec = StudySpec.from_toml(path)
    st = settings_for(spec)
    return Design(st.pilot_cap(spec.space), spec.pilot_fraction, st.rho_levels, st.pilot_group_sizes, st.bandwidth)


def pilot_design(est: dict, table: Path, draws: int = 10, seed: int = 0,
                 compute: float = STUDY_PILOTS * STUDY_PILOT_FRACTION,
                 extra: Sequence[Design] = (BASELINE,)) -> dict[str, Any]:
    """Same-regime rate of each candidate design (:func:`candidate_designs`) at every pilot
    fidelity of the table, each at no more than ``compute`` full runs of pilot compute (at
    fraction ``f``: ``floor(compute / f) // 5`` pilots per reward system). Per reward system and
    target whose full-budget regime is clear, per draw, the design's pilots are replayed from the
    table's pilot rows (:class:`objectives.tiny_table.TinyTableObjective`, one measured seed
    per point, ρ interpolated) and diagnosed by RACE (:func:`allocopt.race.diagnose.diagnose_group`);
    the rate is the share of (pair, draw) whose regime equals the full table's, and
    ``rho_error`` the mean ``|ρ*(pilots) − ρ*(full)|`` over the draws RACE named a ρ* in (a
    design biased to the middle of the range matches "balanced" regimes without finding ρ*:
    this column tells them apart). ``{"note": ...}``
    alone when no pilot fidelity has rows at every ρ level for a reward system with a clear regime;
    ``notes`` lists the pilot fidelities left out and why. ``extra`` designs (the baseline, the
    study file's) are replayed too at a fraction the table measured, whatever their compute."""
    from allocopt.errors import ConfigError, InfeasiblePlan
    from allocopt.race.diagnose import Observation, diagnose_group
    from allocopt.spec import SearchSpace
    from objectives.tiny_table import TinyTableObjective

    obj = TinyTableObjective(table=str(table))
    clear_all = [e for (w, f, t), e in est.items() if f == "full" and e.clear]
    pilots = sorted((f for f in obj.budgets if f != "full"), key=lambda f: -obj.budgets[f])
    if not pilots:
        return {"note": f"no pilot rows in the table yet ({len(clear_all)} (reward, target) pairs with a clear "
                        "full-budget regime): the pilot design cannot be chosen from it"}
    rows, notes, pairs = [], [], set()
    for pf in pilots:
        frac = obj.budgets[pf] / obj.full_budget_flops
        try:
            pspace = obj.space(pf)
        except ConfigError as e:
            notes.append(f"{pf}: no reward system has pilot rows at every rho level yet ({e})")
            continue
        clear = [e for e in clear_all if e.reward in pspace.rewards]
        if not clear:
            notes.append(f"{pf}: no reward system with pilot rows at every rho level has a clear full-budget "
                         f"regime (>= {CLEAR:.0%} of draws)")
            continue
        pairs |= {(e.reward, e.target, e.regime) for e in clear}
        space = SearchSpace(rho=pspace.rho, group_sizes=pspace.group_sizes, rewards=REWARDS)
        budget = obj.budgets[pf]
        per_reward = int(compute / frac + 1e-9) // len(REWARDS)
        designs = candidate_designs(obj.rho_levels, pspace.group_sizes, per_reward, frac)
        designs += [d for d in extra if abs(d.pilot_fraction - frac) < 1e-9 and d not in designs]
        for d in designs:
            hits = unknown = n = npts = 0
            errs: list[float] = []
            for e in clear:
                for r in range(draws):
                    allocs = d.allocations(space, e.reward, seed + r)
                    npts = len(allocs)
                    obs = []
                    for i, a in enumerate(allocs):
                        try:
                            t, fl, _ = obj.lookup(a, budget, seed=1000 * r + i)
                        except (ConfigError, InfeasiblePlan):  # infeasible: a study records it, at no cost
                            continue
                        tot = sum(fl.values())
                        obs.append(Observation(i, a, t[e.target], budget, frac, "pilot",
                                               fl["reward"] / tot if tot else math.nan))
                    diag = diagnose_group(obs, pspace.rho, d.settings(bootstrap=50), seed=seed + r) if obs else None
                    lab = diag.regime if diag else "unknown"
                    if diag is not None and math.isfinite(diag.rho):
                        errs.append(abs(diag.rho - e.rho))
                    hits += lab == e.regime
                    unknown += lab == "unknown"
                    n += 1
            rows.append({"design": d.name(space), "study_file": d.study_file(), "spec": d, "fidelity": pf,
                         "fraction": frac, "pilots_per_reward": npts,
                         "compute": npts * len(REWARDS) * frac, "rate": hits / n, "unknown": unknown / n, "n": n,
                         "rho_error": sum(errs) / len(errs) if errs else math.nan,
                         "pairs": len(clear)})
    if not rows:
        return {"note": "; ".join(notes)}
    return {"rows": rows, "pairs": sorted(pairs), "draws": draws, "notes": notes}


def plot(grs: dict, path: Path) -> None:
    """Each target against ρ per reward system: seeds as points (full filled, pilots hollow),
    seed-means as lines (full solid, 25 % pilots dotted, other pilot fractions dashed), one
    colour per G."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(COMMON_TARGETS), len(REWARDS), figsize=(3.2 * len(REWARDS), 2.6 * len(COMMON_TARGETS)),
                             sharex=True, squeeze=False)
    colours = {2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
    for j, w in enumerate(REWARDS):
        for i, t in enumerate(COMMON_TARGETS):
            ax = axes[i][j]
            for f in fidelities(grs):
                style = {"full": "-", "pilot": ":"}.get(f, "--")
                grp = grs.get((w, f))
                if grp is None:
                    continue
                for g, c in sorted(grp.values.items()):
                    xs = sorted(c)
                    col = colours.get(g, "tab:gray")
                    for x in xs:
                        ys = c[x][:, i]
                        ax.scatter([x] * len(ys), ys, s=10, color=col if f == "full" else "none", edgecolors=col,
                                   linewidths=0.8)
                    ax.plot(xs, [float(np.mean(c[x][:, i])) for x in xs], style, color=col, lw=1,
                            label=f"G={g} {f}")
            if not any((w, f) in grs for f in fidelities(grs)):
                ax.text(0.5, 0.5, "no trials yet", ha="center", va="center", transform=ax.transAxes, fontsize=8,
                        color="grey")
                ax.set_yticks([])
            if i == 0:
                ax.set_title(w, fontsize=9)
            if j == 0:
                ax.set_ylabel(t, fontsize=8)
            if i == len(COMMON_TARGETS) - 1:
                ax.set_xlabel("ρ", fontsize=8)
            ax.tick_params(labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for row in axes:
        for ax in row:
            h, lab = ax.get_legend_handles_labels()
            if len(h) > len(handles):
                handles, labels = h, lab
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="upper right")
    fig.suptitle("tiny world, measured grid (points: seeds, filled full budget 3e11, hollow pilots (pilot: 25 %, pilot10: 10 %); lines: seed-means)",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.93, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, default=DEFAULT_TABLE, help="grid table (CSV of benchmarks/tiny_grid.py)")
    ap.add_argument("--out", type=Path, help="folder for README.md and tiny_truth.png (default: the table's folder)")
    ap.add_argument("--draws", type=int, default=2000, help="bootstrap draws (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    ap.add_argument("--design-draws", type=int, default=40, help="replays per pilot design and pair (default 40)")
    ap.add_argument("--study", type=Path, default=Path(__file__).resolve().parent / "tiny_grid" / "tiny_race.toml",
                    help="study file whose RACE pilot design is replayed beside the candidates (default "
                         "benchmarks/tiny_grid/tiny_race.toml)")
    a = ap.parse_args(argv)
    if a.draws < 10:
        print(f"--draws={a.draws}: must be >= 10", file=sys.stderr)
        return 2
    if a.design_draws < 1:
        print(f"--design-draws={a.design_draws}: must be >= 1", file=sys.stderr)
        return 2
    from allocopt.errors import ConfigError

    try:
        rows, other = read_table(a.table)
        current = study_design(a.study)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = a.out or a.table.parent
    out.mkdir(parents=True, exist_ok=True)
    rep = report(rows, other, a.draws, a.seed)
    pd = pilot_design(rep["estimates"], a.table, a.design_draws, a.seed, extra=(BASELINE, current))
    rep["lines"] += ["", f"Pilot design (4.): same-regime rate of pilot designs at no more pilot compute than the "
                     f"tiny study spent before ({STUDY_PILOTS} pilots at {STUDY_PILOT_FRACTION:.0%}: "
                     f"{STUDY_PILOTS * STUDY_PILOT_FRACTION:g} full runs); the study file's design: "
                     f"{current.study_file()}:"]
    if "note" in pd:
        rep["lines"].append(f"- not possible yet: {pd['note']}")
    else:
        rep["lines"].append(f"over {len(pd['pairs'])} (reward, target) pair(s) with a clear full regime x {pd['draws']} "
                            f"draws: {', '.join(f'{w}/{t}: {g}' for w, t, g in pd['pairs'])}")
        rep["lines"] += [f"- left out: {n}" for n in pd["notes"]]
        ranked = sorted(pd["rows"], key=lambda r: (-r["rate"], r["unknown"], r["compute"]))
        cap = STUDY_PILOTS * STUDY_PILOT_FRACTION + 1e-9
        best = next((r for r in ranked if r["compute"] <= cap), None)
        rep["lines"] += ["| design | pilots per reward | pilot compute (full runs) | pairs | same regime | unknown | "
                         "mean abs(ρ* pilots − ρ* full) |", "|---|---|---|---|---|---|---|"]
        for r in ranked:
            tag = [t for t, d in (("before", BASELINE), ("the study file's", current)) if r["spec"] == d]
            tag += ["best"] if r is best else []
            rep["lines"].append(f"| {r['design']}{' (' + ', '.join(tag) + ')' if tag else ''} | "
                                f"{r['pilots_per_reward']} | {r['compute']:.2f} | {r['pairs']} | "
                                f"{r['rate']:.2f} | {r['unknown']:.2f} | "
                                f"{'—' if math.isnan(r['rho_error']) else format(r['rho_error'], '.3f')} |")
        base = next((r for r in ranked if r["spec"] == BASELINE), None)
        if best is not None:
            rep["lines"].append(f"- best (highest same-regime rate, then fewest unknown, then least compute): "
                                f"{best['design']}: {best['rate']:.2f}" + (f" vs {base['rate']:.2f} before" if base else "")
                                + f"; as a study file: {best['study_file']}")
    text = "\n".join(rep["lines"])
    print(text)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = ["# The tiny world's measured grid (generated)", "",
            f"Generated by `python benchmarks/tiny_truth.py` on {stamp} from `{a.table.name}` "
            f"({len(rows) + len(other)} trials; bootstrap seed {a.seed}). Regenerate it as the grid grows: "
            "answers on a partial grid are preliminary, and each says what it rests on.", "",
            "![each target against ρ per reward system](tiny_truth.png)", ""]
    (out / "README.md").write_text("\n".join(head) + text + "\n")
    plot(rep["groups"], out / "tiny_truth.png")
    print(f"\nwrote {out / 'README.md'}, {out / 'tiny_truth.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
