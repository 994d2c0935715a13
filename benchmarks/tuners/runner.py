"""The runner: replications as jobs, paired across methods, in worker processes, resumable.

**Replication** ``s`` of a world and truth fixes what every method faces: the target
(``rotate``: ``TARGETS[s mod 3]``), the held-out seed (:func:`benchmarks.tuners.truth.heldout_seed`),
the stream of observation noise (:func:`benchmarks.tuners.truth.draw_key`) and the methods'
own seeds (``s``). One **job** is one method on one replication: it runs the method in a
:class:`~benchmarks.tuners.session.Session` to its cap (the last level, or ``caps[method]``)
and scores it at every level (:func:`benchmarks.tuners.scoring.score`), one record a level.

Jobs run in ``workers`` spawned processes (each ``os.nice(nice)``, torch on one thread), seed
by seed, so that what has finished is whole replications. Each job's records are appended to
``partial.csv`` as it ends; a rerun with the same folder skips the jobs already there. A
method that raises is recorded with its error (NaN regrets) and the benchmark goes on.
"""

from __future__ import annotations

import csv
import math
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from benchmarks.tuners import methods as registry
from benchmarks.tuners.truth import truth_for, truths_of

TARGETS: tuple[str, ...] = ("native_reward", "pass_at_1", "judge")
LEVELS: tuple[float, ...] = (4.0, 8.0, 12.0, 16.0, 24.0, 40.0)
TABLE = "tiny-table"
"""The variant name of a measured table (``--tiny-table PATH ...``)."""
CSV_KEYS: tuple[str, ...] = (
    "world", "truth", "seed", "target", "heldout_seed", "method", "level", "regret_pct", "regret_pct_common",
    "regret_pct_oracle", "compute_used", "num_full", "num_pilots", "rho", "group_size", "reward", "model",
    "seconds", "common_fits", "note", "error")
NUMERIC = ("level", "regret_pct", "regret_pct_common", "regret_pct_oracle", "compute_used", "seconds")


@dataclass(frozen=True)
class Config:
    """What one benchmark run covers."""

    seeds: int = 50
    variants: tuple[str, ...] = (TABLE,)
    """``tiny-table`` (the tables below) and/or synthetic variants (:data:`objectives.synthetic.VARIANTS`)."""
    tables: tuple[str, ...] = ()
    """Measured tables pooled into the ``tiny-table`` world (default: the tiny world's grid)."""
    targets: str = "rotate"
    truths: tuple[str, ...] = ("seedmean", "heldout")
    """Truths to run where the world has them (a synthetic world has ``seedmean`` only)."""
    methods: tuple[str, ...] = registry.METHODS
    levels: tuple[float, ...] = LEVELS
    caps: dict[str, float] = field(default_factory=dict)
    """Most compute per method (default: the last level)."""
    workers: int = 2
    nice: int = 10

    def cap(self, method: str) -> float:
        return min(self.caps.get(method, math.inf), max(self.levels))


@dataclass(frozen=True)
class Job:
    variant: str
    tables: tuple[str, ...]
    truth: str
    seed: int
    target: str
    method: str
    cap: float
    levels: tuple[float, ...]

    @property
    def key(self) -> tuple[str, str, int, str, str]:
        return (self.variant, self.truth, self.seed, self.target, self.method)


_WORLDS: dict[tuple, Any] = {}


def world_of(variant: str, tables: Sequence[str] = ()) -> Any:
    """The world of a variant, built once per process (:mod:`benchmarks.tuners.world`)."""
    from benchmarks.tuners.world import SyntheticWorld, read_world

    k = (variant, tuple(tables))
    if k not in _WORLDS:
        if variant == TABLE:
            from objectives.tiny_table import DEFAULT_TABLE

            _WORLDS[k] = read_world(list(tables) or [DEFAULT_TABLE])
        else:
            _WORLDS[k] = SyntheticWorld(variant)
    return _WORLDS[k]


def world_label(variant: str, tables: Sequence[str] = ()) -> str:
    return world_of(variant, tables).name


def targets_of(cfg: Config, seed: int) -> list[str]:
    if cfg.targets == "rotate":
        return [TARGETS[seed % len(TARGETS)]]
    if cfg.targets == "all":
        return list(TARGETS)
    return [cfg.targets]


def jobs(cfg: Config) -> list[Job]:
    """Every job of ``cfg``, seed by seed (then truth, world, target, method)."""
    out = []
    for s in range(cfg.seeds):
        for truth in cfg.truths:
            for v in cfg.variants:
                if truth not in truths_of(world_of(v, cfg.tables)):
                    continue
                for t in targets_of(cfg, s):
                    out += [Job(v, cfg.tables, truth, s, t, m, cfg.cap(m), cfg.levels) for m in cfg.methods]
    return out


def run_job(job: Job) -> list[dict[str, Any]]:
    """One method on one replication: a record per level (module docstring)."""
    from benchmarks.tuners.scoring import CommonRule, score
    from benchmarks.tuners.session import Session

    world = world_of(job.variant, job.tables)
    truth = truth_for(world, job.target, job.truth, job.seed, len(TARGETS))
    method = registry.get(job.method)
    session = Session(world, truth, job.seed, job.cap, job.levels)
    t0 = time.perf_counter()
    error = method.missing()
    if error is None:
        try:
            method.run(session)
        except Exception as e:  # noqa: BLE001 - a failing method is recorded; the benchmark goes on
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    seconds = time.perf_counter() - t0
    common = CommonRule(world)
    base = {"world": world.name, "truth": job.truth, "seed": job.seed, "target": job.target,
            "heldout_seed": "" if truth.heldout is None else truth.heldout, "method": job.method,
            "seconds": round(seconds, 3), "note": session.note, "error": error or ""}
    rows = score(session, method.rule, truth, common) if error is None else \
        [{"level": c, **{k: math.nan for k in NUMERIC[1:5]}, "num_full": "", "num_pilots": "", "rho": math.nan,
          "group_size": "", "reward": "", "model": ""} for c in job.levels]
    job_s = time.perf_counter() - t0  # method and scoring: what the estimate of time left needs
    return [{**base, **r, "common_fits": common.fits, "_job_seconds": job_s} for r in rows]


def _init_worker(nice: int) -> None:
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def run_benchmark(cfg: Config, *, partial: Path | None = None, log=sys.stderr) -> list[dict[str, Any]]:
    """Every job of ``cfg``; records as :func:`run_job` makes them (module docstring)."""
    todo = jobs(cfg)
    names = {v: world_label(v, cfg.tables) for v in cfg.variants}
    records: list[dict[str, Any]] = []
    if partial is not None and partial.exists():
        def key(r: dict[str, Any]) -> tuple:
            return (r["world"], r["truth"], r["seed"], r["target"], r["method"])

        want = {(names[j.variant], j.truth, j.seed, j.target, j.method) for j in todo}
        done_rows = [r for r in read_csv(partial) if key(r) in want]
        done = {key(r) for r in done_rows}
        records += done_rows
        todo = [j for j in todo if (names[j.variant], j.truth, j.seed, j.target, j.method) not in done]
        print(f"  {len(done)} job(s) read back from {partial}; {len(todo)} to run", file=log, flush=True)
    for rec in _results(cfg, todo, log):
        records += rec
        if partial is not None:
            append_csv(partial, rec)
    return records


def _results(cfg: Config, todo: list[Job], log) -> Iterable[list[dict[str, Any]]]:
    """Each job's records as it ends, with progress and an estimate of the time left."""
    if not todo:
        return
    t0 = time.perf_counter()
    took: dict[str, list[float]] = {}
    left = Counter(j.method for j in todo)
    pool = None
    if cfg.workers <= 1:
        _init_worker(cfg.nice)
        results: Iterable = map(run_job, todo)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(cfg.workers, initializer=_init_worker, initargs=(cfg.nice,),
                                            maxtasksperchild=20)
        results = pool.imap_unordered(run_job, todo)
    try:
        for k, rec in enumerate(results, 1):
            r = rec[0]
            left[r["method"]] -= 1
            took.setdefault(r["method"], []).append(float(r.get("_job_seconds", r["seconds"])))
            eta = sum(_estimate(took, m) * n for m, n in left.items()) / max(1, cfg.workers)
            print(f"  [{k}/{len(todo)}] {r['method']} {r['world']} {r['truth']} seed {r['seed']}: "
                  f"{float(r['seconds']):.0f} s{' ERROR ' + r['error'] if r['error'] else ''}; "
                  f"{time.perf_counter() - t0:.0f} s so far, about {eta / 60:.0f} min left", file=log, flush=True)
            yield rec
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def _estimate(took: dict[str, list[float]], method: str) -> float:
    xs = took.get(method)
    return sum(xs) / len(xs) if xs else registry.get(method).weight


# ------------------------------------------------------------------------------ CSV
def append_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    from benchmarks.tuners.records import append_rows

    append_rows(path, CSV_KEYS, rows)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    key = lambda r: (r["world"], r["truth"], int(r["seed"]), r["target"], r["method"], float(r["level"]))  # noqa: E731
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_KEYS, extrasaction="ignore")
        w.writeheader()
        w.writerows(sorted(rows, key=key))


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``results.csv`` or ``partial.csv`` (numbers parsed back)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r["seed"] = int(r["seed"])
            for k in NUMERIC:
                r[k] = float(r[k]) if r.get(k) not in (None, "") else math.nan
            out.append(r)
    return out
