"""The paper's Stage A on the tiny world's measured grids: policy size and allocation together.

Reads the grid runner's tables (``benchmarks/tiny_grid/trials.csv``: the ``tiny`` policy;
``benchmarks/tiny_grid_small/trials.csv``: ``small``; any other table with a ``model`` column)
and answers, with seeded bootstrap intervals over the seeds of each cell:

* per size, reward system and target: ρ* (the maximizer in ρ of a local quadratic fitted to
  every full-budget trial of that size and reward system, one offset per G, at the best G) and its
  regime (:func:`allocopt.race.diagnose.regime_of`, the reward share read off the trials);
* per reward system and target: the best size at the same FLOPs and its advantage over the
  next size (the fitted maxima's difference);
* whether the larger policy's ρ* is lower or higher (the paper: a larger policy buys fewer
  updates per FLOP);
* the iterations and tokens each size buys at each ρ (the plans of ``allocopt plan``:
  :func:`allocopt.plan.allocation.make_plan` on the tiny objective's workload);
* ρ* against the budget per size: each table's pilots at 10 % and 25 % are runs at 3e10 and
  7.5e10 FLOPs; and whether the shift has one sign;
* how much a pilot says of the full budget: the correlation across cells of a pilot's value
  with the full budget's seed-mean, per size, pilot budget and target.

Usage::

    python benchmarks/stage_a.py                      # tables to stdout and benchmarks/stage_a/
    python benchmarks/stage_a.py --figure docs/img/stage_a.png

Seeds per cell are few (2 or 3): the bootstrap resamples them with replacement within each
(ρ, G) cell, so an interval says how much the answer moves with the seeds measured, not with
seeds never run. Standard library, numpy and matplotlib (for the figure).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TABLES = tuple(ROOT / "benchmarks" / d / "trials.csv" for d in ("tiny_grid", "tiny_grid_small", "tiny_grid_medium"))
TARGETS = ("pass_at_1", "native_reward", "judge")
REWARDS = ("sparse", "structured", "dense", "proxy_prm", "prm")
FULL = 3e11
LEVEL = 0.9
BOOT = 200
BANDWIDTH = 0.2


@dataclass(frozen=True)
class Trial:
    model: str
    reward: str
    group_size: int
    rho: float
    budget: float
    seed: int
    targets: dict
    reward_share: float
    iterations: int


def read(paths) -> list[Trial]:
    """Complete trials of the tables (a table without a ``model`` column is ``tiny``)."""
    out = []
    for p in paths:
        for r in csv.DictReader(open(p, newline="")):
            if r["status"] != "complete":
                continue
            total = float(r["total_flops"]) or 1.0
            out.append(Trial(r.get("model") or "tiny", r["reward"], int(r["group_size"]), float(r["rho"]),
                             float(r["budget_flops"]), int(r["seed"]), {t: float(r[t]) for t in TARGETS},
                             float(r["reward_flops"]) / total, int(r["iterations"])))
    return out


def fit(trials: list[Trial], target: str, lo: float, hi: float) -> tuple[float, float, int]:
    """``(ρ*, fitted maximum, best G)`` by a local quadratic in ρ (the estimator RACE's regime
    table uses): at each ρ0 of a grid over ``[lo, hi]``, weighted least squares of
    ``y = a_G + b·(ρ - ρ0) + c·(ρ - ρ0)²`` with Gaussian weights of width :data:`BANDWIDTH`
    around ρ0, its value at ρ0 for the G with the largest mean; ρ* the grid's maximizer. A
    global quadratic would let a cliff at one end (the PRM at ρ = 0.9) drag the vertex."""
    gs = sorted({t.group_size for t in trials})
    g_best = max(gs, key=lambda g: np.mean([t.targets[target] for t in trials if t.group_size == g]))
    k = gs.index(g_best)
    rho = np.array([t.rho for t in trials])
    onehot = np.array([[float(t.group_size == g) for g in gs] for t in trials])
    y = np.array([t.targets[target] for t in trials])
    grid = np.linspace(lo, hi, 71)
    curve = np.empty(len(grid))
    for i, x0 in enumerate(grid):
        d = rho - x0
        sw = np.sqrt(np.exp(-0.5 * (d / BANDWIDTH) ** 2))
        X = np.column_stack([onehot, d, d ** 2]) * sw[:, None]
        coef, *_ = np.linalg.lstsq(X, y * sw, rcond=None)
        curve[i] = coef[k]
    i = int(np.argmax(curve))
    return float(grid[i]), float(curve[i]), g_best


def resample(trials: list[Trial], rng: np.random.Generator) -> list[Trial]:
    """The seeds of each (ρ, G) cell drawn with replacement."""
    cells = defaultdict(list)
    for t in trials:
        cells[(t.rho, t.group_size)].append(t)
    out = []
    for k in sorted(cells):
        ts = cells[k]
        out += [ts[j] for j in rng.integers(0, len(ts), len(ts))]
    return out


def interval(xs) -> tuple[float, float]:
    q = (1 - LEVEL) / 2
    return float(np.quantile(xs, q)), float(np.quantile(xs, 1 - q))


def regime(trials: list[Trial], rho: float) -> str:
    """:func:`allocopt.race.diagnose.regime_of` at ρ*, the reward share of the trials nearest it."""
    from allocopt.race import RaceSettings
    from allocopt.race.diagnose import regime_of

    near = min({t.rho for t in trials}, key=lambda r: abs(r - rho))
    share = float(np.mean([t.reward_share for t in trials if t.rho == near]))
    return regime_of(rho, share, RaceSettings())


def stage_a(trials: list[Trial], seed: int = 0) -> dict:
    """Every answer of the module docstring as plain data."""
    rng = np.random.default_rng(seed)
    models = sorted({t.model for t in trials}, key=lambda m: ("tiny", "small", "medium").index(m)
                    if m in ("tiny", "small", "medium") else 9)
    full = [t for t in trials if t.budget == FULL]
    lo, hi = min(t.rho for t in full), max(t.rho for t in full)
    per, best = {}, {}
    for target in TARGETS:
        for w in REWARDS:
            maxima = {}
            for m in models:
                mine = [t for t in full if t.model == m and t.reward == w]
                if not mine:
                    continue
                star, top, g = fit(mine, target, lo, hi)
                boots = [fit(resample(mine, rng), target, lo, hi) for _ in range(BOOT)]
                per[(m, w, target)] = dict(rho=star, ci=interval([b[0] for b in boots]), value=top, G=g,
                                           regime=regime(mine, star), seeds=len({t.seed for t in mine}),
                                           boots=[b[1] for b in boots], rhos=[b[0] for b in boots])
                maxima[m] = per[(m, w, target)]
            if len(maxima) >= 2:
                order = sorted(maxima, key=lambda m: -maxima[m]["value"])
                a, b = maxima[order[0]], maxima[order[1]]
                diff = np.array(a["boots"]) - np.array(b["boots"])
                best[(w, target)] = dict(best=order[0], next=order[1], advantage=a["value"] - b["value"],
                                         ci=interval(diff), p_best=float(np.mean(diff > 0)),
                                         shift=per[(models[-1], w, target)]["rho"] - per[(models[0], w, target)]["rho"],
                                         shift_ci=interval(np.array(per[(models[-1], w, target)]["rhos"])
                                                           - np.array(per[(models[0], w, target)]["rhos"])))
    # the full budget's ρ* is the one estimate above, not a second draw
    budgets = by_budget(trials, rng, known={(m, FULL, w, t): dict(rho=e["rho"], ci=e["ci"], seeds=e["seeds"])
                                            for (m, w, t), e in per.items()})
    return dict(models=models, per=per, best=best, budgets=budgets, plans=plans(models),
                pilots=pilot_correlation(trials))


def by_budget(trials: list[Trial], rng: np.random.Generator, boot: int = BOOT, known: dict | None = None) -> dict:
    """ρ* per size, reward system and target at each budget the size's table holds; ``known``:
    estimates already made, keyed ``(size, budget, reward, target)``, taken as they are."""
    out = {}
    for m in sorted({t.model for t in trials}):
        mine_m = [t for t in trials if t.model == m]
        for budget in sorted({t.budget for t in mine_m}):
            at = [t for t in mine_m if t.budget == budget]
            lo, hi = min(t.rho for t in at), max(t.rho for t in at)
            for target in TARGETS:
                for w in REWARDS:
                    mine = [t for t in at if t.reward == w]
                    if (m, budget, w, target) in (known or {}):
                        out[(m, budget, w, target)] = known[(m, budget, w, target)]
                        continue
                    if len({t.rho for t in mine}) < 3:
                        continue
                    star = fit(mine, target, lo, hi)[0]
                    boots = [fit(resample(mine, rng), target, lo, hi)[0] for _ in range(boot)]
                    out[(m, budget, w, target)] = dict(rho=star, ci=interval(boots),
                                                       seeds=len({t.seed for t in mine}))
    return out


def pilot_correlation(trials: list[Trial]) -> dict:
    """Per size, pilot budget and target: Pearson's r across the (reward, G, ρ) cells between a
    pilot's value (mean over its seeds) and the full budget's seed-mean, and the cells counted;
    how much a pilot says of the full-budget response the tuner is after."""
    out = {}
    for m in sorted({t.model for t in trials}):
        cells: dict = defaultdict(lambda: defaultdict(list))
        for t in trials:
            if t.model == m:
                cells[(t.reward, t.group_size, t.rho)][t.budget].append(t)
        for budget in sorted({t.budget for t in trials if t.model == m and t.budget < FULL}):
            both = [c for c in cells.values() if c.get(budget) and c.get(FULL)]
            if len(both) < 3:
                continue
            for target in TARGETS:
                xs = [np.mean([t.targets[target] for t in c[budget]]) for c in both]
                ys = [np.mean([t.targets[target] for t in c[FULL]]) for c in both]
                out[(m, budget, target)] = dict(r=float(np.corrcoef(xs, ys)[0, 1]), cells=len(both))
    return out


def shift_sign(rhos: Sequence[float]) -> str:
    """``rises`` / ``falls`` when every step between consecutive budgets has that sign, else ``mixed``."""
    steps = np.sign(np.diff(rhos))
    return "rises" if all(s > 0 for s in steps) else "falls" if all(s < 0 for s in steps) else "mixed"


def plans(models) -> dict:
    """Iterations and tokens (prompt + completion, every rollout) each size buys at each ρ, G = 4,
    the ``sparse`` reward, at the full budget: the plans ``allocopt plan`` prints."""
    from allocopt.plan.allocation import Allocation, make_plan
    from objectives.tiny import make as make_tiny

    workload = make_tiny().workload()
    out = {}
    for m in models:
        for rho in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            p = make_plan(FULL, Allocation(rho, 4, "sparse", model=m), workload)
            tokens = p.iterations * p.rollouts_per_iteration * (workload.setup.prompt_tokens + workload.setup.completion_tokens)
            out[(m, rho)] = dict(iterations=p.iterations, rollouts=p.iterations * p.rollouts_per_iteration,
                                 tokens=tokens, passes=p.update_passes)
    return out


def tables(res: dict) -> str:
    """The answers as markdown."""
    models, per, best = res["models"], res["per"], res["best"]
    lines = ["## ρ* per size and reward system (full budget 3e11; 90 % bootstrap interval over seeds)", "",
             "| target | reward | " + " | ".join(f"{m}: ρ* [90 %] G regime" for m in models) + " |",
             "|---|---|" + "---|" * len(models)]
    for target in TARGETS:
        for w in REWARDS:
            cells = []
            for m in models:
                e = per.get((m, w, target))
                cells.append("–" if e is None else f"{e['rho']:.2f} [{e['ci'][0]:.2f}–{e['ci'][1]:.2f}] G{e['G']} {e['regime']}")
            lines.append(f"| {target} | {w} | " + " | ".join(cells) + " |")
    lines += ["", "## Best size per reward system at the same FLOPs (fitted maxima; advantage over the next size)", "",
              "| target | reward | best | next | advantage [90 %] | P(best > next) | ρ*(largest) − ρ*(smallest) [90 %] |",
              "|---|---|---|---|---|---|---|"]
    for (w, target), b in sorted(best.items(), key=lambda kv: (TARGETS.index(kv[0][1]), REWARDS.index(kv[0][0]))):
        lines.append(f"| {target} | {w} | {b['best']} | {b['next']} | {b['advantage']:+.3f} "
                     f"[{b['ci'][0]:+.3f}, {b['ci'][1]:+.3f}] | {b['p_best']:.0%} | {b['shift']:+.2f} "
                     f"[{b['shift_ci'][0]:+.2f}, {b['shift_ci'][1]:+.2f}] |")
    lines += ["", "## What each size buys at the full budget (G = 4, sparse; the plans `allocopt plan` prints)", "",
              "| ρ | " + " | ".join(f"{m}: iterations / rollouts / tokens" for m in models) + " |",
              "|---|" + "---|" * len(models)]
    for rho in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        cells = [f"{res['plans'][(m, rho)]['iterations']} / {res['plans'][(m, rho)]['rollouts']} / "
                 f"{res['plans'][(m, rho)]['tokens']:.3g}" for m in models]
        lines.append(f"| {rho:.1f} | " + " | ".join(cells) + " |")
    budgets = sorted({k[1] for k in res["budgets"]})
    lines += ["", "## ρ* against the budget (pilots are runs at 10 % and 25 % of 3e11; no interval where a pilot cell has one seed)", "",
              "| size | target | reward | " + " | ".join(f"{b:.1e}" for b in budgets) + " | sign of the shift |",
              "|---|---|---|" + "---|" * (len(budgets) + 1)]
    signs: dict = defaultdict(lambda: defaultdict(int))
    for m in models:
        for target in TARGETS:
            for w in REWARDS:
                es = [res["budgets"].get((m, b, w, target)) for b in budgets]
                if any(e is None for e in es):
                    continue
                sign = shift_sign([e["rho"] for e in es])
                signs[m][sign] += 1
                lines.append(f"| {m} | {target} | {w} | " + " | ".join(_rho_cell(e) for e in es) + f" | {sign} |")
    lines += ["", "Signs of the shift per size: " + "; ".join(
        f"{m}: " + ", ".join(f"{k} {v}" for k, v in sorted(signs[m].items())) for m in models if signs[m]) + "."]
    pil = res.get("pilots", {})
    if pil:
        lines += ["", "## What a pilot says of the full budget (Pearson's r across cells: a pilot's value against the full budget's seed-mean)", "",
                  "| size | pilot budget | " + " | ".join(t for t in TARGETS) + " | cells |", "|---|---|" + "---|" * (len(TARGETS) + 1)]
        for m, b in sorted({(k[0], k[1]) for k in pil}, key=lambda mb: (models.index(mb[0]) if mb[0] in models else 9, mb[1])):
            lines.append(f"| {m} | {b:.1e} | " + " | ".join(f"{pil[(m, b, t)]['r']:.2f}" for t in TARGETS)
                         + f" | {pil[(m, b, TARGETS[0])]['cells']} |")
    return "\n".join(lines) + "\n"


def _rho_cell(e: dict) -> str:
    return f"{e['rho']:.2f}" if e["seeds"] < 2 else f"{e['rho']:.2f} [{e['ci'][0]:.2f}–{e['ci'][1]:.2f}]"


def figure(trials: list[Trial], res: dict, path: Path, target: str = "pass_at_1") -> None:
    """Target against ρ per size (colour) and reward system (panel), seeds as points, the fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = [t for t in trials if t.budget == FULL]
    fig, axes = plt.subplots(1, len(REWARDS), figsize=(3.2 * len(REWARDS), 3.2), sharey=True)
    colors = {"tiny": "tab:blue", "small": "tab:orange", "medium": "tab:green"}
    for ax, w in zip(axes, REWARDS):
        for m in res["models"]:
            mine = [t for t in full if t.model == m and t.reward == w]
            if not mine:
                continue
            e = res["per"][(m, w, target)]
            at = [t for t in mine if t.group_size == e["G"]]
            ax.scatter([t.rho for t in at], [t.targets[target] for t in at], s=10, alpha=0.5, color=colors.get(m))
            ax.axvline(e["rho"], color=colors.get(m), lw=1, ls="--")
            ax.axvspan(*e["ci"], color=colors.get(m), alpha=0.08)
            ax.plot([], [], color=colors.get(m), label=f"{m} (G{e['G']}): ρ*={e['rho']:.2f}")
        ax.set_title(w)
        ax.set_xlabel("ρ")
        ax.legend(fontsize=7)
    axes[0].set_ylabel(target.replace("_at_", "@"))
    fig.suptitle("Stage A on the tiny world: target against ρ per policy size (points: seeds at the fit's G; "
                 "dashed: ρ*, band: its 90 % interval)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="+", type=Path, default=list(TABLES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "stage_a")
    ap.add_argument("--figure", type=Path, default=None, help="default OUT/stage_a.png")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    trials = read(a.tables)
    res = stage_a(trials, a.seed)
    text = tables(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tables.md").write_text(text)
    figure(trials, res, a.figure or a.out / "stage_a.png")
    print(text)


if __name__ == "__main__":
    main()
