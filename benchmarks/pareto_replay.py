"""Two targets at once: how much of the true Pareto front each tuner finds, replayed on measured
tables.

    python benchmarks/pareto_replay.py --tables benchmarks/tiny_grid/trials.csv --seeds 30 \\
        [--methods kg,gp,tpe,random] [--runs 16] [--out benchmarks/tuner_results/pareto]

Each table is one world (its full-budget cells). A replication draws a pair of targets in turn
(pass@1 and judge, pass@1 and the native reward, judge and the native reward) and runs each
method for ``--runs`` full runs on the same draws: a run of a cell returns both targets of one
measured seed of it (picked by the replication, the cell and the repeat, as the single-target
judge draws, :meth:`benchmarks.tuners.truth.TableTruth.draw`); an infeasible cell costs nothing.
Methods: allocopt's multi-target search (``kg``: :class:`allocopt.tuner.study.KGTuner` on the
random weighting a study of several targets uses, :func:`allocopt.tuner.scalarize.scalarized`,
with the initial design such a study keeps; ``kg-no-design``: the same without it, an
ablation), and Optuna's stock multi-objective ``GPSampler`` (log EHVI), ``TPESampler`` and
``RandomSampler`` (4 random start-up runs, seeded by the replication).

Score at 4, 8, 12 and 16 runs (and ``--runs`` when larger): the **hypervolume regret**, 100 ×
(1 - HV / HV*), of the seed-mean truth of (a) the front a method reports (its runs not
dominated in what it observed: what a team reads off the study) and (b) every run it made (the
oracle), the targets scaled to [0, 1] over the world's cells, the reference point their worst
(HV* the true front's). Records are appended to ``OUT/results.csv`` per method and replication
(a rerun skips what is there); the tables (median [IQR], mean, allocopt's paired win rate with
the Wilcoxon signed-rank p) are printed and written to ``OUT/tables.md``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAIRS = (("pass_at_1", "judge"), ("pass_at_1", "native_reward"), ("judge", "native_reward"))
LEVELS = (4, 8, 12, 16)
METHODS = ("kg", "kg-no-design", "gp", "tpe", "random")
KEYS = ("world", "seed", "pair", "method", "level", "hv_regret_front", "hv_regret_oracle", "seconds")


def hypervolume(points: Sequence[tuple[float, float]], ref: tuple[float, float] = (0.0, 0.0)) -> float:
    """Area dominated by ``points`` (both coordinates larger is better) above ``ref``."""
    pts = sorted({p for p in points if p[0] > ref[0] and p[1] > ref[1]}, key=lambda p: (-p[0], -p[1]))
    area, top = 0.0, ref[1]
    for x, y in pts:
        if y > top:
            area += (x - ref[0]) * (y - top)
            top = y
    return area


def front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (larger is better in both)."""
    return [i for i, p in enumerate(points)
            if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]


class Replay:
    """One replication on one world: draws of both targets, the truth, the score."""

    def __init__(self, world: Any, pair: tuple[str, str], seed: int):
        from benchmarks.tuners.truth import TableTruth

        self.world, self.pair, self.seed = world, pair, seed
        self.truths = [TableTruth(world, t, "seedmean") for t in pair]
        vals = [[tr.value(a) for a in world.candidates] for tr in self.truths]
        self.lo = [min(v) for v in vals]
        self.span = [max(v) - min(v) or 1.0 for v in vals]
        self.best = hypervolume([self.scaled(a) for a in world.candidates])
        self.runs: list[tuple[Any, tuple[float, float]]] = []
        self._asks: dict = {}

    def scaled(self, a: Any) -> tuple[float, float]:
        return tuple((tr.value(a) - lo) / s for tr, lo, s in zip(self.truths, self.lo, self.span))

    def observe(self, a: Any) -> tuple[float, float] | None:
        """One run of ``a``: both targets of one measured seed; ``None`` where infeasible."""
        from benchmarks.tuners.truth import draw_key

        k = (a.model, a.reward, a.group_size, round(float(a.rho), 6))
        repeat = self._asks[k] = self._asks.get(k, -1) + 1
        key = "pareto|" + draw_key(self.seed, "seedmean", a, 1.0, repeat)
        y = [tr.draw(a, 1.0, key) for tr in self.truths]
        if y[0] is None:
            return None
        self.runs.append((a, (y[0], y[1])))
        return y[0], y[1]

    def regret(self, n: int) -> tuple[float, float]:
        """Hypervolume regret (%) after ``n`` runs: of the reported front, of every run."""
        runs = self.runs[:n]
        seen = [y for _, y in runs]
        reported = [self.scaled(runs[i][0]) for i in front(seen)]
        every = [self.scaled(a) for a, _ in runs]
        return (100 * (1 - hypervolume(reported) / self.best), 100 * (1 - hypervolume(every) / self.best))


def run_optuna(name: str, rp: Replay, n: int) -> None:
    """Optuna's stock sampler ``name``, as the judge builds and asks it (the same 4 start-up runs)."""
    import optuna

    from benchmarks.tuners.methods.optuna_samplers import ask_and_tell, make_sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=make_sampler(name, rp.seed))
    ask_and_tell(study, rp.world.space, lambda a: (lambda y: None if y is None else list(y))(rp.observe(a)),
                 lambda: len(rp.runs) >= n, max_asks=50 * n)


def run_kg(rp: Replay, n: int, initial: bool | None = None) -> None:
    """allocopt's tuner as a two-target study drives it (module docstring); ``initial``: whether
    its first runs are the initial design (``None``: as a study of several targets has it;
    ``kg-no-design``, the ablation: ``False``)."""
    from allocopt.race.data import Budgets, Observation, Run
    from allocopt.tuner.scalarize import scalarized, weights
    from allocopt.tuner.study import INITIAL_DESIGN_SEVERAL_TARGETS, INITIAL_LAYOUT_SEVERAL_TARGETS, KGTuner

    w = rp.world
    refused: set = set()
    tuner = KGTuner(w.space, Budgets(w.full_budget_flops, 0.1), max_pilots=0, seed=rp.seed,
                    feasible=lambda a, f: a not in refused,
                    initial=INITIAL_DESIGN_SEVERAL_TARGETS if initial is None else initial,
                    layout=INITIAL_LAYOUT_SEVERAL_TARGETS)
    per: list[list[Observation]] = [[], []]
    runs: list[Run] = []
    asked = 0
    while len(rp.runs) < n and asked < 50 * n:
        obs = scalarized(per, (1.0, 1.0), weights(2, rp.seed, asked))
        props = tuner.propose(obs, runs, q=1)
        asked += 1
        if not props:
            break
        a = props[0].allocation
        y = rp.observe(a)
        if y is None:
            refused.add(a)
            continue
        runs.append(Run(a, "full"))
        for k in (0, 1):
            per[k].append(Observation(len(runs), a, y[k], w.full_budget_flops, 1.0, "full"))


def runner(method: str) -> Callable[[Replay, int], None]:
    if method == "kg-no-design":
        return lambda rp, n: run_kg(rp, n, initial=False)
    return run_kg if method == "kg" else (lambda rp, n: run_optuna(method, rp, n))


def replicate(world: Any, seed: int, method: str, levels: Sequence[int]) -> list[dict[str, Any]]:
    pair = PAIRS[seed % len(PAIRS)]
    rp = Replay(world, pair, seed)
    t0 = time.process_time()
    runner(method)(rp, max(levels))
    sec = time.process_time() - t0
    out = []
    for lv in levels:
        f, o = rp.regret(lv)
        out.append({"world": world.name, "seed": seed, "pair": "+".join(pair), "method": method, "level": lv,
                    "hv_regret_front": round(f, 4), "hv_regret_oracle": round(o, 4), "seconds": round(sec, 2)})
    return out


def summary(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> str:
    """Markdown tables per world: median [IQR] and mean of both regrets; kg's paired win rate
    and Wilcoxon p against each peer (front rule) on the replications every method ran (the
    judge's statistics, :mod:`benchmarks.tuners.stats`)."""
    from benchmarks.tuners.stats import describe, paired

    out = []
    for w in dict.fromkeys(r["world"] for r in rows):
        rw = [r for r in rows if r["world"] == w]
        val = {(r["method"], int(r["level"]), rule, int(r["seed"])): float(r[rule])
               for r in rw for rule in ("hv_regret_front", "hv_regret_oracle")}
        levels = sorted({int(r["level"]) for r in rw})
        seeds = sorted(set.intersection(*({int(r["seed"]) for r in rw if r["method"] == m and int(r["level"]) == lv}
                                          for m in methods for lv in levels)))  # every method at every level
        head = ["| method | " + " | ".join(map(str, levels)) + " |", "|---|" + "---|" * len(levels)]
        out += [f"### {w}: hypervolume regret, % ({len(seeds)} paired replications)", ""]
        for rule, label in (("hv_regret_front", "the reported front (runs not dominated in what was observed)"),
                            ("hv_regret_oracle", "every run made (oracle)")):
            out += [f"**Median [IQR], mean — {label}**", "", *head]
            for m in methods:
                ds = [describe([val[(m, lv, rule, s)] for s in seeds]) for lv in levels]
                out.append(f"| {m} | " + " | ".join(f"{d['median']:.1f} [{d['q1']:.1f}, {d['q3']:.1f}], "
                                                     f"mean {d['mean']:.1f}" for d in ds) + " |")
            out.append("")
        if "kg" in methods:
            out += ["**kg's paired win rate (ties half) and Wilcoxon p — reported front**", "",
                    "| kg against | " + " | ".join(map(str, levels)) + " |", "|---|" + "---|" * len(levels)]
            for m in (m for m in methods if m != "kg"):
                ps = [paired([val[("kg", lv, "hv_regret_front", s)] for s in seeds],
                             [val[(m, lv, "hv_regret_front", s)] for s in seeds]) for lv in levels]
                out.append(f"| {m} | " + " | ".join(f"{p['win_rate']:.2f} (p={p['p']:.2g})" for p in ps) + " |")
            out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, default=[ROOT / "benchmarks/tiny_grid/trials.csv"],
                    help="one measured table (the grid runner's trials.csv) per world (default: the tiny world's)")
    ap.add_argument("--seeds", type=int, default=30, help="paired replications per world (default 30)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--runs", type=int, default=16, help="full runs per replication (default 16)")
    ap.add_argument("--nice", type=int, default=10, help="niceness of the run (default 10)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/tuner_results/pareto",
                    help="folder of results.csv (appended to; a rerun skips what is there) and tables.md")
    a = ap.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = next((m for m in methods if m not in METHODS), None)
    error = (f"--methods={bad!r}: allowed: {', '.join(METHODS)}" if bad or not methods else
             next((f"--tables={str(t)!r}: not a file" for t in a.tables if not t.is_file()), None) or
             (f"--seeds={a.seeds}: must be >= 1" if a.seeds < 1 else None) or
             (f"--runs={a.runs}: must be >= 4" if a.runs < 4 else None))
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if a.nice:
        os.nice(a.nice)
    import torch

    torch.set_num_threads(1)
    from benchmarks.tuners.records import append_rows, read_rows
    from benchmarks.tuners.world import read_world

    levels = tuple(sorted({lv for lv in LEVELS if lv <= a.runs} | {a.runs}))
    worlds = [read_world([t]) for t in a.tables]
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "results.csv"
    have: dict[tuple, set[int]] = {}
    for r in read_rows(path):
        have.setdefault((r["world"], int(r["seed"]), r["method"]), set()).add(int(r["level"]))
    done = {k for k, lv in have.items() if set(levels) <= lv}  # a replication of fewer runs is run again
    todo = [(w, s, m) for s in range(a.seeds) for w in worlds for m in methods if (w.name, s, m) not in done]
    print(f"{len(todo)} replications to run ({len(done)} done), {len(worlds)} world(s)", flush=True)
    t0 = time.perf_counter()
    for k, (w, s, m) in enumerate(todo, 1):
        rows = replicate(w, s, m, levels)
        append_rows(path, KEYS, rows)
        el = time.perf_counter() - t0
        print(f"[{k}/{len(todo)}] {w.name} seed {s} {m}: hypervolume regret {rows[-1]['hv_regret_front']:.1f} % at "
              f"{levels[-1]} runs ({el / k * (len(todo) - k) / 60:.0f} min left)", flush=True)
    table = summary([r for r in read_rows(path) if int(r["level"]) in levels], methods)
    (a.out / "tables.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
