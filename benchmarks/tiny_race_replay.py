"""The tiny study's RACE, replayed on the measured grid: its pilot regimes against the table's.

    python benchmarks/tiny_race_replay.py [--study studies/tiny.toml ...] [--seeds 5]
                                          [--table benchmarks/tiny_grid/trials.csv] [--draws 500]

Each study file (default ``studies/tiny.toml``; give several to compare designs) runs as
``allocopt study --spec FILE`` runs it, through :func:`allocopt.study.race.run_race` with its
``pilots``, ``pilot_fraction``, ``[race]`` table and ``trials`` full runs, but on the
``tiny-table`` objective (:mod:`objectives.tiny_table`): every trial is a measured tiny-world
trial of ``benchmarks/tiny_grid.py``'s table, so one whole study takes seconds and trains
nothing. Seeds ``0 .. --seeds - 1`` replace the file's seed (other pilot hypercubes, other
measured seeds drawn).

Per study file, over the seeds (and the reward systems, for the regime columns):

* **pilot regime = the table's**: the share of reward systems whose pilot regime (RACE's
  diagnosis of the study's pilots, the table printed after the pilots) equals the table's own
  full-budget regime for the study's target (:func:`tiny_truth.report`, ρ* of the seed-means of
  every measured seed), over the reward systems whose table regime is *clear* (>= 80 % of the
  bootstrap draws); ``unknown`` pilot regimes count as misses and are also given apart;
* **study's same-regime rate**: what the study itself prints (pilot against the surrogate's
  full-budget regime, :func:`allocopt.race.same_regime_rate`; reward systems left unknown are
  in neither);
* **regret**: the table's optimum (best seed-mean) minus the seed-mean at RACE's recommended
  allocation, in target units and in % of the table's range.

Nothing is simulated: every value is a measured trial (interpolated in ρ between measured
levels, as the objective documents).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from allocopt.spec import target_key  # noqa: E402
from objectives.tiny_table import DEFAULT_TABLE  # noqa: E402

CLEAR = 0.8


def table_regimes(table: Path, target: str, draws: int) -> dict[str, tuple[str, float, bool]]:
    """``reward -> (regime, rho*, clear)`` of the table's full-budget rows for ``target``."""
    import tiny_truth
    from objectives.tiny_table import read_table

    rows, other = read_table(table)
    rep = tiny_truth.report(rows, other, draws=draws, seed=0)
    return {w: (e.regime, e.rho, e.clear) for (w, f, t), e in rep["estimates"].items() if f == "full" and t == target}


def replay(study: Path, seed: int, table: Path) -> dict[str, Any]:
    """One study of ``study`` at ``seed`` on the table: pilot diagnoses, validation, recommendation."""
    import torch

    from allocopt.race import same_regime_rate
    from allocopt.race.design import settings_for
    from allocopt.spec import StudySpec
    from allocopt.quiet import quiet
    from allocopt.study.race import run_race
    from objectives.tiny_table import TinyTableObjective

    torch.set_num_threads(1)
    spec = StudySpec.from_toml(study)
    spec = replace(spec, seed=seed, objective="tiny-table", name=f"replay-{study.stem}-{seed}")
    obj = TinyTableObjective(table=str(table))
    t0 = time.perf_counter()
    with quiet(False):
        res = run_race(spec, objective=obj, workload=obj.workload(), storage=None, pilot_fraction=spec.pilot_fraction,
                       validations=spec.trials, settings=settings_for(spec))
    return {"seconds": time.perf_counter() - t0, "pilots": {d.reward: d.regime for d in res.diagnoses},
            "same_regime_rate": same_regime_rate(res.validation), "recommended": res.recommended,
            "spec": spec, "objective": obj}


def _allocation(a: Any) -> str:
    """``rho=0.58 G=4 dense`` (``none`` when the study recommended nothing)."""
    return "none" if a is None else f"rho={a.rho:.2f} G={a.group_size} {a.reward}"


def summarize(study: Path, runs: Sequence[dict], truth: dict, target: str) -> dict[str, Any]:
    """The columns of the module docstring for one study file's runs."""
    key = target_key(target)
    clear = {w: r for w, (r, _, c) in truth.items() if c}
    hits = unknown = n = 0
    regrets, pcts, rates = [], [], []
    for run in runs:
        for w, regime in clear.items():
            got = run["pilots"].get(w, "unknown")
            hits += got == regime
            unknown += got == "unknown"
            n += 1
        if not math.isnan(run["same_regime_rate"]):
            rates.append(run["same_regime_rate"])
        obj, a = run["objective"], run["recommended"]
        if a is not None:
            opt = obj.optimum(key)
            r = max(0.0, opt.value - obj.mean_value(a, key))
            regrets.append(r)
            pcts.append(100 * r / opt.range)
    return {"study": study.name, "seeds": len(runs), "clear": clear, "match": hits / n if n else math.nan,
            "unknown": unknown / n if n else math.nan, "study_rate": statistics.mean(rates) if rates else math.nan,
            "rated": len(rates), "regret": statistics.median(regrets) if regrets else math.nan,
            "regret_pct": statistics.median(pcts) if pcts else math.nan,
            "seconds": statistics.median(r["seconds"] for r in runs)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", type=Path, nargs="+", default=[ROOT / "studies" / "tiny.toml"],
                    help="study file(s) whose design is replayed (default studies/tiny.toml)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per study file (default 5)")
    ap.add_argument("--table", type=Path, default=DEFAULT_TABLE, help="grid table (default benchmarks/tiny_grid/trials.csv)")
    ap.add_argument("--draws", type=int, default=500, help="bootstrap draws of the table's regimes (default 500)")
    a = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")  # Optuna's ExperimentalWarning on metric names, per study
    from allocopt.errors import ConfigError
    from allocopt.race.design import settings_for
    from allocopt.spec import StudySpec

    if a.seeds < 1 or a.draws < 10:
        print(f"--seeds={a.seeds}, --draws={a.draws}: need --seeds >= 1 and --draws >= 10", file=sys.stderr)
        return 2
    try:
        specs = [StudySpec.from_toml(p) for p in a.study]
        for s in specs:
            settings_for(s)  # a bad [race] entry: one line now, not a traceback in the first replay
        if not a.table.is_file():
            raise ConfigError(f"table={str(a.table)!r}: no such file; run benchmarks/tiny_grid.py to measure one")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    targets = {s.target for s in specs}
    if len(targets) != 1 or not isinstance(next(iter(targets)), str):
        print("error: --study: the files must share one target", file=sys.stderr)
        return 2
    target = specs[0].target
    truth = table_regimes(a.table, target_key(target), a.draws)
    print(f"table regimes ({target}, full budget): "
          + ", ".join(f"{w} {r} (rho* {x:.2f}{', clear' if c else ''})" for w, (r, x, c) in truth.items()), flush=True)
    out = []
    for p in a.study:
        runs = []
        for s in range(a.seeds):
            runs.append(replay(p, s, a.table))
            print(f"  {p.name} seed {s}: pilots " + ", ".join(f"{w} {g}" for w, g in runs[-1]["pilots"].items())
                  + f"; recommended {_allocation(runs[-1]['recommended'])}; {runs[-1]['seconds']:.0f} s", flush=True)
        out.append(summarize(p, runs, truth, target))
    print()
    print(f"| study file | seeds | pilot regime = the table's (clear: {len(out[0]['clear'])} reward systems) | "
          "pilot regime unknown | study's same-regime rate (seeds with one) | median regret of the "
          "recommendation (% of range) | median s per study |")
    print("|---|---|---|---|---|---|---|")
    for o in out:
        print(f"| {o['study']} | {o['seeds']} | {o['match']:.2f} | {o['unknown']:.2f} | "
              f"{o['study_rate']:.2f} ({o['rated']}) | {o['regret']:.4f} ({o['regret_pct']:.1f} %) | {o['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
