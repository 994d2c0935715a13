"""Benchmark the tuner: allocopt against the IsoFLOP grid, Optuna, Ax, SMAC3 and BoTorch.

    python benchmarks/optimizers.py [--variants tiny-table,...] [--tiny-table PATH [PATH ...]]
        [--seeds N] [--truths seedmean,heldout] [--methods M,...] [--levels 4,8,...] [--caps M=N,...]
        [--targets rotate|all|T] [--workers N] [--nice N] [--out DIR] [--figure PNG]
        [--no-timings | --timings-only] [--from-csv CSV[,CSV]] [--quick]

Replays each method on a world (:mod:`benchmarks.tuners.world`: a measured grid table,
``tiny-table``, by default the tiny world's 840 real GRPO trials; or a synthetic variant of
:mod:`objectives.synthetic`), ``--seeds`` replications per truth (seed-mean and a held-out
seed, :mod:`benchmarks.tuners.truth`), paired across methods, and scores every method at the
compute levels (full-run equivalents, pilots included) three ways: its own recommendation,
one common rule for all, and the oracle (:mod:`benchmarks.tuners.scoring`).

Writes into ``--out``: ``results.csv`` (one row per world, truth, method, replication and
level: ``regret_pct``, ``regret_pct_common``, ``regret_pct_oracle``, ``compute_used``, ...),
``partial.csv`` (the same rows, appended as each job ends: a rerun into the folder runs only
what is missing), ``tables.md`` (:mod:`benchmarks.tuners.report`), ``summary.json`` and the
figure (``--figure``, default ``DIR/regret.png``; one per world). ``--from-csv`` redraws the
tables and the figure from earlier ``results.csv`` files without running anything.

The package ``benchmarks.tuners`` holds everything but this command line. Peers Ax and SMAC3
need the ``bench`` extra (``pip install -e ".[bench]"``); without it they are recorded as
failed with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocopt.errors import ConfigError  # noqa: E402
from benchmarks.tuners import methods as registry  # noqa: E402
from benchmarks.tuners.runner import (TABLE, TARGETS, Config, read_csv, run_benchmark, world_of,  # noqa: E402
                                      write_csv)
from benchmarks.tuners.truth import TRUTHS  # noqa: E402
from objectives.synthetic import VARIANTS  # noqa: E402

ALL_VARIANTS: tuple[str, ...] = (TABLE, *VARIANTS)
QUICK = dict(seeds=2, truths=("seedmean", "heldout"), methods=("grid", "random", "tpe", "gp", "allocopt"),
             levels=(4.0, 8.0, 12.0))
"""``--quick``: a smoke run of the whole pipeline (2 replications, levels to 12), not a measurement."""
TIMING_TRIALS = (50, 200)


class BadFlag(Exception):
    """One line for the user (exit code 2)."""


def _items(flag: str, value: str, allowed: Sequence[str]) -> tuple[str, ...]:
    items = tuple(x.strip() for x in value.split(",") if x.strip())
    if not items or any(x not in allowed for x in items):
        raise BadFlag(f"--{flag}={value!r}: allowed: {', '.join(allowed)}")
    return items


def _numbers(flag: str, value: str) -> tuple[float, ...]:
    try:
        xs = tuple(sorted({float(x) for x in value.split(",") if x.strip()}))
    except ValueError:
        xs = ()
    if not xs or not all(x > 0 and math.isfinite(x) for x in xs):
        raise BadFlag(f"--{flag}={value!r}: a comma-separated list of compute levels > 0 (full runs)")
    return xs


def _caps(value: str) -> dict[str, float]:
    caps = {}
    for item in value.split(","):
        m, _, n = item.partition("=")
        try:
            v = float(n)
        except ValueError:
            v = math.nan
        if m.strip() not in registry.METHODS or not v > 0:
            raise BadFlag(f"--caps={value!r}: each item METHOD=N with N > 0, METHOD one of "
                          f"{', '.join(registry.METHODS)}")
        caps[m.strip()] = v
    return caps


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = ap.add_argument
    add("--quick", action="store_true", help="smoke run: 2 replications, grid/random/TPE/GP/allocopt, levels to 12")
    add("--seeds", type=int, help="replications per world and truth (default 50)")
    add("--out", default="benchmarks/results", help="folder for results.csv, partial.csv, tables.md, summary.json")
    add("--figure", help="the figure's path (default OUT/regret.png; with several worlds, one per world beside it)")
    add("--targets", help="rotate (default), all, or one target (pass@1, native_reward, judge)")
    add("--variants", help=f"comma-separated, from {', '.join(ALL_VARIANTS)} (default {TABLE}: a measured table)")
    add("--tiny-table", nargs="+", metavar="PATH", help="measured table(s) the tiny-table world pools (the grid "
        "runner's CSV, optional model column; default benchmarks/tiny_grid/trials.csv)")
    add("--tiny-study", help="study file whose RACE terms (pilots, pilot_fraction, [race]) allocopt replays on a "
        "table (default studies/tiny.toml)")
    add("--truths", help=f"comma-separated, from {', '.join(TRUTHS)} (default both; synthetic worlds: seedmean)")
    add("--methods", help=f"comma-separated, from {', '.join(registry.METHODS)} (default all)")
    add("--levels", help="compute levels in full runs, comma-separated (default 4,8,12,16,24,40)")
    add("--caps", help="most compute per method, e.g. botorch=16 (default: the last level)")
    add("--allocopt-compute", type=float, help="compute allocopt may spend (its cap; default the last level)")
    add("--workers", type=int, help="worker processes (default min(2, cores))")
    add("--nice", type=int, default=10, help="niceness added in each worker (default 10)")
    add("--no-timings", action="store_true", help="skip the per-proposal timings")
    add("--timings-only", action="store_true", help="only the per-proposal timings (of --methods)")
    add("--from-csv", help="tables and figure from earlier results.csv file(s), comma-separated; runs nothing")
    return ap


def config_of(a: argparse.Namespace) -> Config:
    """The run's :class:`Config` from the flags. Raises :class:`BadFlag`."""
    kw: dict[str, Any] = {"workers": a.workers or min(2, os.cpu_count() or 1), "nice": a.nice}
    if a.quick:
        kw.update(QUICK)
    if a.seeds is not None:
        if a.seeds < 1:
            raise BadFlag(f"--seeds={a.seeds}: must be >= 1")
        kw["seeds"] = a.seeds
    if a.workers is not None and a.workers < 1:
        raise BadFlag(f"--workers={a.workers}: must be >= 1")
    if a.targets:
        t = a.targets.replace("@", "_at_").replace(":", "_")
        if t not in ("rotate", "all", *TARGETS):
            raise BadFlag(f"--targets={a.targets!r}: allowed: rotate, all, native_reward, pass@1, judge")
        kw["targets"] = t
    if a.variants:
        kw["variants"] = _items("variants", a.variants, ALL_VARIANTS)
    if a.truths:
        kw["truths"] = _items("truths", a.truths, TRUTHS)
    if a.methods:
        kw["methods"] = _items("methods", a.methods, registry.METHODS)
    if a.levels:
        kw["levels"] = _numbers("levels", a.levels)
    caps = _caps(a.caps) if a.caps else {}
    if a.allocopt_compute is not None:
        if not a.allocopt_compute > 0:
            raise BadFlag(f"--allocopt-compute={a.allocopt_compute}: must be > 0")
        caps["allocopt"] = a.allocopt_compute
    kw["caps"] = caps
    if a.tiny_table:
        for p in a.tiny_table:
            if not Path(p).is_file():
                raise BadFlag(f"--tiny-table={p!r}: no such file; run benchmarks/tiny_grid.py to measure one")
        kw["tables"] = tuple(str(Path(p).resolve()) for p in a.tiny_table)
    if a.tiny_study:
        from allocopt.spec import StudySpec

        try:
            StudySpec.from_toml(a.tiny_study)
        except ConfigError as e:
            raise BadFlag(f"--tiny-study={a.tiny_study!r}: {e}") from None
        os.environ["ALLOCOPT_TINY_STUDY"] = str(Path(a.tiny_study).resolve())
    cfg = replace(Config(), **kw)
    for v in cfg.variants:  # a table the replay cannot use is refused now, in one line
        try:
            world_of(v, cfg.tables)
        except ConfigError as e:
            raise BadFlag(str(e)) from None
    return cfg


def write_outputs(records: list[dict[str, Any]], out: Path, figure: Path | None, extra: dict[str, Any]) -> None:
    """``tables.md``, ``summary.json`` and the figure(s) of ``records`` in ``out``."""
    from benchmarks.tuners.figure import plot
    from benchmarks.tuners.report import bar_verdict, markdown

    text = markdown(records)
    (out / "tables.md").write_text(text + "\n")
    print(text)
    print(bar_verdict(records))
    worlds = list(dict.fromkeys(r["world"] for r in records))
    figure = figure or out / "regret.png"
    for w in worlds:
        path = figure if len(worlds) == 1 else figure.with_name(f"{figure.stem}_{w}{figure.suffix}")
        plot(records, w, path)
        print(f"wrote {path}")
    (out / "summary.json").write_text(json.dumps({**extra, "bar": bar_verdict(records)}, indent=1, default=str))
    print(f"wrote {out / 'tables.md'}, {out / 'summary.json'}")


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        cfg = config_of(a)
    except BadFlag as e:
        print(str(e), file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    figure = Path(a.figure) if a.figure else None
    if a.from_csv:
        records = [r for p in a.from_csv.split(",") for r in read_csv(p)]
        write_outputs(records, out, figure, {"from": a.from_csv})
        return 0
    if a.timings_only or not a.no_timings:
        from benchmarks.tuners.timings import format_timings, run_timings

        t0 = time.perf_counter()
        t = run_timings([world_of(v, cfg.tables) for v in cfg.variants], TIMING_TRIALS, 3, cfg.methods)
        print(format_timings(t, 3) + f"\n(timings took {time.perf_counter() - t0:.0f} s)")
        (out / "timings.json").write_text(json.dumps(t, indent=1))
        if a.timings_only:
            return 0
    t0 = time.perf_counter()
    print(f"tuner benchmark: {', '.join(cfg.variants)}; truths {', '.join(cfg.truths)}; {cfg.seeds} replications; "
          f"methods {', '.join(cfg.methods)}; levels {', '.join(f'{c:g}' for c in cfg.levels)}; "
          f"{cfg.workers} worker(s), nice {cfg.nice}", flush=True)
    records = run_benchmark(cfg, partial=out / "partial.csv")
    write_csv(out / "results.csv", records)
    print(f"wrote {out / 'results.csv'} ({len(records)} rows); benchmark {time.perf_counter() - t0:.0f} s")
    write_outputs(records, out, figure, {"config": {**asdict(cfg)}, "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    sys.exit(main())
