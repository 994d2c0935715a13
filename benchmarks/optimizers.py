"""Benchmark the tuner: allocopt against a grid, random search and Optuna's samplers.

    python benchmarks/optimizers.py [--quick] [--seeds N] [--out DIR] [--targets rotate|all|T]
                                    [--variants V,...] [--methods M,...] [--workers N]
                                    [--caps M=N,...] [--allocopt-compute N] [--no-timings | --timings-only]

On the synthetic family (:mod:`objectives.synthetic`, a documented test function with known
optima, not a prediction), at equal compute, every method searches the allocation (ρ, G, reward
system, and for ``model-size`` the policy model) for one target at the full budget
``B_REF = 1e19`` FLOPs. Compute is counted in **full-budget runs**: a run at fraction ``f`` of
the budget costs ``f`` (a RACE pilot at 10 % costs 0.1).

Methods (each searches the variant's space, :func:`objectives.synthetic.space_of`):

* ``grid``: the paper-style IsoFLOP grid at the full budget, 8 evenly spaced ρ levels × G ×
  reward (× model), run in a fixed order (model, then reward system in ``REWARDS`` order, then G,
  then ρ: one ρ sweep after another, as a paper runs it) and truncated at the compute level;
* ``random``: Optuna's ``RandomSampler``;
* ``tpe``, ``gp``, ``botorch``: Optuna's ``TPESampler``, ``GPSampler`` and
  ``optuna_integration.BoTorchSampler``, each after 4 random start-up trials (allocopt's
  ``StudySpec.startup_trials``; ``gp`` and ``botorch`` built by :func:`allocopt.study.open.make_sampler`,
  as ``allocopt study`` builds them);
* ``allocopt``: RACE's loop (:func:`run_allocopt`) with its default settings (pilots at 0.1 × the
  budget, ``RaceSettings()``: a pilot grid sized to the space, no extra pilots), then full-budget
  runs proposed by its multi-fidelity surrogate (:func:`allocopt.race.propose`, ``q = 2`` per
  round, ``Config.allocopt_batch``) until ``Config.allocopt_compute`` runs of compute are spent
  (80: the last level of the bar), through the real planner and the synthetic objective. Shown as "allocopt (not available)" when
  ``allocopt.study.race.run_race`` cannot be imported.

The Optuna samplers and the grid call the synthetic response directly
(:func:`objectives.synthetic.observe`: same noise, same seeding) without planning each trial:
every corner of each space is checked once to be a feasible, realizable plan at the budget, and
the response does not depend on the plan. allocopt plans every trial (the RACE code does).

Recommendation of a method at compute ``c``: for the grid and the Optuna samplers, the allocation
of its best observed (noisy) full-budget run among those it made with at most ``c`` compute. For
allocopt, RACE's own recommendation (:func:`allocopt.race.recommend`: the maximizer of its
surrogate's posterior mean at the full budget near its full runs) made from the runs it had with
at most ``c`` compute; nothing before its pilots are done. allocopt stops at
``Config.allocopt_compute``; at a larger compute its last recommendation is kept (it spent less). The other methods have no
value beyond their own cap (``—``).

Simple regret = true optimum − true (noise-free) value of the recommendation, in target units and
in % of the target's range over the space (:attr:`objectives.synthetic.Optimum.range`). Median
and interquartile range over seeds. Targets: ``rotate`` (default) gives seed ``s`` the target
``TARGETS[s mod 3]``, so each variant has all seeds and each target a third of them; ``all``
runs every target with every seed (3× the time).

Output: tables on stdout (regret per method and compute level; the bar allocopt is held to;
each sampler's own time per proposal at 50 and 200 trials, timing only ``study.ask``, and for
allocopt one surrogate fit + one proposal; wall clock and CPU seconds, with the load average), and in ``--out``: ``regret.png`` (regret vs compute,
one panel per variant), ``results.csv`` (one row per run and compute level), ``summary.json``,
and ``partial.csv`` (the same rows, appended as each run finishes; a rerun into the same folder
runs only what is not in it).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocopt.plan.allocation import Allocation, make_plan  # noqa: E402
from allocopt.spec import SearchSpace, StudySpec, target_label  # noqa: E402
from objectives.synthetic import (B_REF, SHIFT, VARIANTS, SyntheticObjective, observe,  # noqa: E402
                                  optimum, response, space_of)

BUDGET = B_REF
TABLE = "tiny-table"
"""The replay variant: the tiny world's measured grid (:mod:`objectives.tiny_table`), not a test
function. Its budget is the table's full budget (3e11 FLOPs), its space the largest product of
reward systems × G the table has measured at every ρ level, its optimum the table's own, its
noise the measured seeds; RACE runs the tiny study's design (:func:`table_race_terms`:
``studies/tiny.toml``'s pilots, pilot fraction and ``[race]`` table), its pilots at the full
budget when the table has no pilot rows at that fraction for the space (noted in the results). Table path:
``$ALLOCOPT_TINY_TABLE`` or ``--tiny-table`` (default ``benchmarks/tiny_grid/trials.csv``)."""
ALL_VARIANTS: tuple[str, ...] = (*VARIANTS, TABLE)
METHODS: tuple[str, ...] = ("grid", "random", "tpe", "gp", "botorch", "allocopt")
OPTUNA_METHODS: tuple[str, ...] = ("tpe", "gp", "botorch")
"""The Optuna samplers allocopt is held to (random search is Optuna's too, but a baseline)."""
LABELS = {"grid": "grid (IsoFLOP)", "random": "random", "tpe": "Optuna TPE", "gp": "Optuna GPSampler",
          "botorch": "BoTorchSampler", "allocopt": "allocopt (RACE)"}
TARGETS: tuple[str, ...] = tuple(SHIFT)  # native_reward, pass_at_1, judge
RHO_LEVELS = 8
STARTUP_TRIALS = 4
NOISE_SEED_STRIDE = 1000
"""Run ``i`` of seed ``s`` draws its noise with seed ``1000·s + i`` (RACE: ``spec.seed + trial``)."""
BASE_LEVELS: tuple[float, ...] = (4, 8, 12, 16, 24, 32, 40, 60, 80, 160)
"""Compute levels reported (full-budget runs); the grid's size and a quarter of it are added."""


@dataclass(frozen=True)
class Config:
    """What one benchmark run covers."""

    seeds: int = 20
    variants: tuple[str, ...] = tuple(VARIANTS)
    targets: str = "rotate"
    """``rotate``, ``all`` or one target (``pass@1``, ``pass_at_1``, ``native_reward``, ``judge``)."""
    methods: tuple[str, ...] = METHODS
    caps: dict[str, float] = field(default_factory=lambda: {
        "grid": math.inf, "random": math.inf, "tpe": 160, "gp": 80, "botorch": 16})
    """Most compute per method (``inf``: the grid's size). BoTorchSampler stops at 16: its ask
    costs seconds and grows with the trials (over 4 min for one 80-trial study at load 10 on the
    2-core machine), beyond what ten seeds of seven variants can spend."""
    allocopt_compute: float = 80.0
    """Compute (full-budget runs, pilots included) allocopt's race spends before it stops."""
    allocopt_batch: int = 2
    """Proposals per round of allocopt's race (``q``: a study with this many workers)."""
    timing_trials: tuple[int, ...] = (50, 200)
    timing_repeats: int = 3
    timing_variants: tuple[str, ...] = ("paper", "model-size")
    workers: int = 2


QUICK = Config(seeds=2, variants=("paper",), targets="pass_at_1", allocopt_compute=16.0,
               caps={"grid": math.inf, "random": math.inf, "tpe": 40, "gp": 12, "botorch": 12},
               timing_repeats=1, timing_variants=("paper",))
"""``--quick``: a smoke run of the whole pipeline (2 seeds, paper, pass@1), not a measurement."""


_TABLE_OBJ: dict[str, Any] = {}


def table_objective():
    """The ``tiny-table`` objective of ``$ALLOCOPT_TINY_TABLE`` (default table), built once per process."""
    from objectives.tiny_table import DEFAULT_TABLE, TinyTableObjective

    path = os.environ.get("ALLOCOPT_TINY_TABLE", str(DEFAULT_TABLE))
    if path not in _TABLE_OBJ:
        _TABLE_OBJ[path] = TinyTableObjective(table=path)
    return _TABLE_OBJ[path]


def budget_of(variant: str) -> float:
    """The full budget of a variant (FLOPs): ``B_REF``, or the table's for ``tiny-table``."""
    return table_objective().full_budget_flops if variant == TABLE else BUDGET


TINY_STUDY = Path(__file__).resolve().parents[1] / "studies" / "tiny.toml"
"""The study whose RACE terms the ``tiny-table`` variant replays (``$ALLOCOPT_TINY_STUDY`` or
``--tiny-study``)."""


def table_race_terms() -> tuple[float, Any, str]:
    """``(pilot fraction, RaceSettings, note)`` of RACE on ``tiny-table``: the tiny study's
    (``studies/tiny.toml``, or ``$ALLOCOPT_TINY_STUDY``: its ``pilots``, ``pilot_fraction`` and
    ``[race]`` table, :func:`allocopt.race.design.settings_for`), so the replay runs the design a
    tiny study runs. When the table has no pilot rows at that fraction for every (reward, G) of
    the benchmark space, the pilots run at the full budget (fraction 1.0) and the note says so."""
    from allocopt.errors import ConfigError
    from allocopt.race.design import settings_for

    spec = StudySpec.from_toml(os.environ.get("ALLOCOPT_TINY_STUDY", str(TINY_STUDY)))
    settings = settings_for(spec)
    obj = table_objective()
    f = spec.pilot_fraction
    try:
        fid = obj.fidelity_of(f * obj.full_budget_flops)
        ps = obj.space(fid)
    except ConfigError as e:
        return 1.0, settings, f"pilots at the full budget: the table has no pilot rows at {f:g} for this space ({e})"
    s = obj.space("full")
    if set(s.rewards) <= set(ps.rewards) and set(s.group_sizes) <= set(ps.group_sizes):
        return obj.budgets[fid] / obj.full_budget_flops, settings, ""
    return 1.0, settings, f"pilots at the full budget: the table's {fid} rows do not cover this space"


def bench_workload(variant: str):
    """The workload trials are planned for: the synthetic objective's policy with 16 rollouts per
    iteration (the response does not depend on the workload; a small batch keeps ``make_plan``,
    about 0.06 s a call at 64 rollouts, out of the timings). ``tiny-table``: the tiny world's
    own workload (the measured trials were planned with it)."""
    if variant == TABLE:
        return table_objective().workload()
    return SyntheticObjective(variant=variant).workload().with_setup(rollouts_per_iteration=16)


@dataclass(frozen=True)
class Problem:
    """One variant and target at the full budget."""

    variant: str
    target: str
    """Python key (``pass_at_1``)."""

    @property
    def space(self) -> SearchSpace:
        return table_objective().space() if self.variant == TABLE else space_of(self.variant)

    @property
    def optimum(self):
        if self.variant == TABLE:
            return table_objective().optimum(self.target)
        return optimum(self.target, BUDGET, self.space, variant=self.variant)

    def value(self, a: Allocation) -> float:
        """Noise-free value of an allocation (target units; ``tiny-table``: the seed-mean)."""
        if self.variant == TABLE:
            return table_objective().mean_value(a, self.target)
        return response(a.rho, a.group_size, a.reward, self.target, BUDGET, variant=self.variant,
                        model=a.model)

    def regret(self, a: Allocation | None) -> tuple[float, float]:
        """``(regret, regret in % of the range)``; NaN for no recommendation."""
        if a is None:
            return math.nan, math.nan
        o = self.optimum
        r = max(0.0, o.value - self.value(a))
        return r, 100.0 * r / o.range

    def spec(self, seed: int, **kw: Any) -> StudySpec:
        return StudySpec(name=f"bench-{self.variant}-{self.target}-{seed}",
                         objective=TABLE if self.variant == TABLE else "synthetic",
                         budget_flops=budget_of(self.variant), target=target_label(self.target),
                         seed=NOISE_SEED_STRIDE * seed, space=self.space, **kw)


def grid_points(space: SearchSpace, rho_levels: int = RHO_LEVELS) -> list[Allocation]:
    """The IsoFLOP grid in its run order: model, reward (as listed), G, then ρ (innermost)."""
    lo, hi = space.rho
    rhos = [round(lo + (hi - lo) * i / (rho_levels - 1), 4) for i in range(rho_levels)]
    return [Allocation(r, g, w, m) for m in (space.models or (None,)) for w in space.rewards
            for g in space.group_sizes for r in rhos]


def grid_size(variant: str) -> int:
    return len(grid_points(Problem(variant, "pass_at_1").space))


def levels_of(variant: str) -> tuple[float, ...]:
    n = grid_size(variant)
    return tuple(sorted(set(BASE_LEVELS) | {float(n), n / 4}))


def check_feasible(variant: str) -> None:
    """Every corner of the space is a feasible, realizable plan at the budget (raises if not).
    ``tiny-table``: its space is built from trials that ran."""
    if variant == TABLE:
        return
    s = space_of(variant)
    w = bench_workload(variant)
    for m in s.models or (None,):
        for r in s.rewards:
            for g in (min(s.group_sizes), max(s.group_sizes)):
                for rho in s.rho:
                    p = make_plan(BUDGET, Allocation(rho, g, r, m), w)
                    if not p.realizable:
                        raise RuntimeError(f"{variant}: {p.allocation} is not realizable at {BUDGET:g}")


Trajectory = list[tuple[float, "Allocation | None"]]
"""``(compute spent so far, recommendation after it)`` after each run."""


def _noisy(problem: Problem, a: Allocation, seed: int, i: int) -> float:
    if problem.variant == TABLE:  # one measured seed, drawn with the run's seed
        return table_objective().lookup(a, budget_of(TABLE), NOISE_SEED_STRIDE * seed + i)[0][problem.target]
    return observe(a.rho, a.group_size, a.reward, BUDGET, variant=problem.variant, model=a.model,
                   seed=NOISE_SEED_STRIDE * seed + i)[problem.target]


def run_grid(problem: Problem, seed: int, cap: float) -> Trajectory:
    best, out = None, []
    for i, a in enumerate(grid_points(problem.space)[: int(min(cap, 1e9))]):
        y = _noisy(problem, a, seed, i)
        if best is None or y > best[0]:
            best = (y, a)
        out.append((i + 1.0, best[1]))
    return out


def make_optuna_sampler(method: str, seed: int) -> Any:
    import optuna

    from allocopt.study.open import make_sampler

    if method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if method == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    return make_sampler(StudySpec(sampler=method, seed=seed, startup_trials=STARTUP_TRIALS, pilots=0))


def run_optuna(problem: Problem, method: str, seed: int, cap: float) -> tuple[Trajectory, list[float]]:
    """A study of ``cap`` full-budget runs (in-memory storage); also the seconds of each ask."""
    import optuna

    from allocopt.spec import allocation_of
    from allocopt.study.open import distributions

    spec = problem.spec(seed)
    dists = distributions(spec)
    study = optuna.create_study(direction="maximize", sampler=make_optuna_sampler(method, seed))
    best, out, ask_s = None, [], []
    for i in range(int(min(cap, grid_size(problem.variant)))):
        t0 = time.perf_counter()
        trial = study.ask(dists)
        ask_s.append(time.perf_counter() - t0)
        a = allocation_of(spec, trial.params)
        y = _noisy(problem, a, seed, i)
        study.tell(trial, y)
        if best is None or y > best[0]:
            best = (y, a)
        out.append((i + 1.0, best[1]))
    return out, ask_s


def allocopt_available() -> bool:
    try:
        from allocopt.study.race import run_race  # noqa: F401
    except Exception:
        return False
    return True


def run_allocopt(problem: Problem, seed: int, compute: float, batch: int) -> tuple[Trajectory, dict[str, Any]]:
    """One RACE on the synthetic objective, as a trajectory of recommendations: its pilot grid
    (RACE's defaults: sized to the space, at 0.1 × the budget; ``tiny-table``: the tiny study's
    design, :func:`table_race_terms`), then proposals until ``compute``
    full-budget runs are spent, ``batch`` per round (each round: :class:`allocopt.race.SurrogateCache`
    gives the surrogate of every run so far, :func:`allocopt.race.recommend` the recommendation,
    :func:`allocopt.race.propose` the next ``batch`` runs). This is the loop a study runs (one
    proposal per free worker); it is written out here so the benchmark needs no storage.

    The recommendation after a run is RACE's own from the runs made so far, charged all the
    compute spent until then; nothing before the pilots are done. Run ``i`` draws its noise
    with seed ``spec.seed + i`` (as a study's trial ``i``)."""
    from allocopt.errors import InfeasiblePlan
    from allocopt.race import (Observation, PlanCache, RaceSettings, SurrogateCache, pilot_grid, propose,
                               recommend)

    table = problem.variant == TABLE
    obj = table_objective() if table else SyntheticObjective(variant=problem.variant)
    budget = budget_of(problem.variant)
    spec = problem.spec(seed)
    f, settings, note = table_race_terms() if table else (0.1, RaceSettings(), "")
    wl = bench_workload(problem.variant)
    plans = PlanCache(wl)
    obs: list = []
    existing: list = []
    out: Trajectory = []
    cost = 0.0

    def run(a: Allocation, fidelity: str, frac: float) -> None:
        nonlocal cost
        n = len(existing)
        existing.append((a, fidelity))
        plan = plans(frac * budget, a)
        if plan is None:  # infeasible: recorded, costs nothing
            return
        try:
            y = obj.run(plan, seed=spec.seed + n).targets[problem.target]
        except InfeasiblePlan:  # tiny-table: the measured trials there were infeasible; likewise
            return
        obs.append(Observation(n, a, y, frac * budget, frac, fidelity, math.nan))
        cost += frac
        out.append((cost, out[-1][1] if out else None))

    for p in pilot_grid(spec.space, settings, spec.seed):
        run(p.allocation, "pilot", f)
    n_pilots = len(obs)
    cache = SurrogateCache(spec.space, seed=spec.seed)
    prop_s, prop_n, fit_s = [], [], []
    while True:
        t0 = time.perf_counter()
        sur = cache(obs)
        rec = recommend(sur, obs, spec.space, settings)[0]
        out[-1] = (out[-1][0], rec)
        if cost >= compute - 1e-9:
            break
        q = min(batch, math.ceil(compute - cost - 1e-9))
        props = propose(obs, spec, wl, existing=existing, q=q, pilot_fraction=f, allow_pilots=False,
                        settings=settings, surrogate=sur, plans=plans)
        prop_s.append(time.perf_counter() - t0)
        prop_n.append(len(obs))
        fit_s.append(sur.fit_seconds)
        if not props:
            break
        for pr in props:
            run(pr.allocation, pr.fidelity, pr.budget_flops / budget)
    info = {"fit_seconds": fit_s, "proposal_seconds": prop_s, "proposal_trials": prop_n,
            "num_pilots": n_pilots, "num_full": sum(1 for o in obs if o.fidelity == "full"),
            "refits": cache.fits, "compute": cost,
            "note": note}
    return out, info


def at_level(traj: Trajectory, level: float, cap: float) -> Allocation | None:
    """Recommendation with at most ``level`` compute; ``None`` beyond ``cap`` or before any."""
    if level > cap + 1e-9:
        return None
    rec = None
    for cost, a in traj:
        if cost > level + 1e-9:
            break
        rec = a
    return rec


def run_job(job: tuple[str, str, str, int, Config]) -> list[dict[str, Any]]:
    """One method on one problem and seed: a record per compute level."""
    method, variant, target, seed, cfg = job
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    p = Problem(variant, target)
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    n_grid = grid_size(variant)
    try:
        if method == "allocopt":
            traj, info = run_allocopt(p, seed, cfg.allocopt_compute, cfg.allocopt_batch)
            cap = math.inf
        else:
            cap = min(cfg.caps.get(method, math.inf), n_grid)
            if method == "grid":
                traj = run_grid(p, seed, cap)
            else:
                traj, asks = run_optuna(p, method, seed, cap)
                info = {"ask_seconds": sum(asks)}
    except Exception as e:  # a method that fails is recorded as failed; the benchmark goes on
        traj, cap, info = [], 0.0, {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    wall = time.perf_counter() - t0
    out = []
    for level in levels_of(variant):
        a = at_level(traj, level, cap)
        r, pct = p.regret(a)
        used = max((c for c, _ in traj if c <= level + 1e-9), default=0.0) if a is not None else math.nan
        out.append({"variant": variant, "target": target, "method": method, "seed": seed, "level": level,
                    "regret": r, "regret_pct": pct, "compute_used": used,
                    "rho": a.rho if a else math.nan, "group_size": a.group_size if a else "",
                    "reward": a.reward if a else "", "model": (a.model or "") if a else "",
                    "seconds": wall, **{k: json.dumps(v) if isinstance(v, list) else v for k, v in info.items()}})
    return out


def jobs(cfg: Config) -> list[tuple[str, str, str, int, Config]]:
    if cfg.targets == "rotate":
        pairs = [(v, TARGETS[s % len(TARGETS)], s) for v in cfg.variants for s in range(cfg.seeds)]
    elif cfg.targets == "all":
        pairs = [(v, t, s) for v in cfg.variants for t in TARGETS for s in range(cfg.seeds)]
    else:
        t = cfg.targets.replace("@", "_at_").replace(":", "_")
        pairs = [(v, t, s) for v in cfg.variants for s in range(cfg.seeds)]
    methods = [m for m in cfg.methods if m != "allocopt" or allocopt_available()]
    out = [(m, v, t, s, cfg) for m in methods for v, t, s in pairs]
    # longest first, so that two workers finish together
    weight = {"allocopt": 100, "botorch": 10, "gp": 5, "tpe": 1, "random": 0.1, "grid": 0}
    return sorted(out, key=lambda j: -weight[j[0]] * (4 if j[1] == "model-size" else 1))


def _job_key(r: dict[str, Any]) -> tuple[str, str, str, int]:
    return (r["method"], r["variant"], r["target"], int(r["seed"]))


def run_benchmark(cfg: Config, *, progress: bool = False, partial: Path | None = None) -> list[dict[str, Any]]:
    """Every job of ``cfg`` (in ``cfg.workers`` processes); records as :func:`run_job` makes.

    ``partial``: a CSV each finished job's records are appended to as they come (a run stopped
    early keeps what it finished; ``--from-csv`` reads it); jobs already in it are not run again,
    their records are read back."""
    for v in cfg.variants:
        check_feasible(v)
    todo = jobs(cfg)
    records: list[dict[str, Any]] = []
    if partial is not None and partial.exists():
        wanted = {j[:4] for j in todo}
        done = [r for r in read_csv(partial) if _job_key(r) in wanted]
        keys = {_job_key(r) for r in done}
        records += done
        todo = [j for j in todo if j[:4] not in keys]
        if progress:
            print(f"  {len(keys)} job(s) read back from {partial}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    if cfg.workers <= 1:
        results = map(run_job, todo)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(cfg.workers, maxtasksperchild=20)
        results = pool.imap_unordered(run_job, todo)
    for k, rec in enumerate(results, 1):
        records += rec
        if partial is not None:
            _append_csv(partial, rec)
        if progress and (k % max(1, len(todo) // 20) == 0 or k == len(todo)):
            print(f"  {k}/{len(todo)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if cfg.workers > 1:
        pool.close()
        pool.join()
    return records


# ------------------------------------------------------------------------------ summaries
def _quantiles(xs: Sequence[float]) -> tuple[float, float, float]:
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return math.nan, math.nan, math.nan
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def summarize(records: Sequence[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """``(variant, target or '*', method, level) -> {q1, median, q3, n, abs_median, compute}``."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        for t in (r["target"], "*"):
            groups.setdefault((r["variant"], t, r["method"], r["level"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        q1, med, q3 = _quantiles([r["regret_pct"] for r in rs])
        out[k] = {"q1": q1, "median": med, "q3": q3, "n": sum(not math.isnan(r["regret_pct"]) for r in rs),
                  "runs": len(rs), "abs_median": _quantiles([r["regret"] for r in rs])[1],
                  "compute": _quantiles([r["compute_used"] for r in rs])[1]}
    return out


def _cell(s: dict[str, Any] | None) -> str:
    if not s or s["n"] == 0:
        return "—"
    if s["n"] < s["runs"]:
        return f"{s['median']:.1f}({s['n']})"
    return f"{s['median']:.1f} [{s['q1']:.1f},{s['q3']:.1f}]"


def method_label(m: str) -> str:
    if m not in LABELS:
        return m
    return LABELS[m] if m != "allocopt" or allocopt_available() else "allocopt (not available)"


def format_tables(records: Sequence[dict[str, Any]], cfg: Config) -> str:
    """The regret tables: per variant (targets pooled), then per variant and target."""
    summ = summarize(records)
    methods = [m for m in cfg.methods]
    lines = []
    seeds = sorted({r["seed"] for r in records})
    lines.append(f"Simple regret in % of the target's range: median [IQR] over {len(seeds)} seed(s); "
                 "compute in full-budget runs; '—': beyond the method's cap or no recommendation yet; "
                 "'x(n)': only n runs had one.")
    for v in cfg.variants:
        levels = levels_of(v)
        o = Problem(v, "pass_at_1").optimum
        targets = sorted({r["target"] for r in records if r["variant"] == v})
        lines.append("")
        lines.append(f"== {v}: grid {grid_size(v)} runs; range {o.range:.3f} (pass@1); "
                     f"targets {', '.join(target_label(t) for t in targets)}")
        head = f"{'method':26s}" + "".join(f"{int(c):>18d}" for c in levels)
        lines.append(head)
        for m in methods:
            row = f"{method_label(m):26s}"
            for c in levels:
                row += f"{_cell(summ.get((v, '*', m, c))):>18s}"
            lines.append(row)
        if "allocopt" in methods and allocopt_available():
            s = [summ.get((v, "*", "allocopt", c)) for c in levels]
            used = max((x["compute"] for x in s if x and not math.isnan(x["compute"])), default=math.nan)
            lines.append(f"{'':26s}allocopt's median compute at the end of its race: {used:.2f} runs")
    if len({r["target"] for r in records}) > 1:
        lines.append("")
        lines.append("Per target (median regret %, n seeds) at compute 12 and 40:")
        lines.append(f"{'variant':12s}{'target':15s}" + "".join(f"{method_label(m)[:15]:>17s}" for m in methods))
        for v in cfg.variants:
            for t in TARGETS:
                if not any(r["variant"] == v and r["target"] == t for r in records):
                    continue
                row = f"{v:12s}{target_label(t):15s}"
                for m in methods:
                    a, b = summ.get((v, t, m, 12.0)), summ.get((v, t, m, 40.0))
                    f = lambda s: "—" if not s or s["n"] == 0 else f"{s['median']:.1f}"  # noqa: E731
                    row += f"{f(a) + '/' + f(b) + ' n' + str(a['runs'] if a else 0):>17s}"
                lines.append(row)
    errors = sorted({(r["method"], r["variant"], r["error"]) for r in records if r.get("error")})
    notes = sorted({(r["method"], r["variant"], r["note"]) for r in records if r.get("note")})
    for m, v, e in errors:
        n = len({r["seed"] for r in records if r["method"] == m and r["variant"] == v and r.get("error") == e})
        lines.append(f"FAILED {method_label(m)} on {v} ({n} run(s)): {e}")
    for m, v, e in notes:
        lines.append(f"note: {method_label(m)} on {v}: {e}")
    lines.append("")
    lines.append("Median regret in target units (score points) at compute 12 / 40 / the grid's size:")
    for v in cfg.variants:
        n = float(grid_size(v))
        row = f"{v:12s}"
        for m in methods:
            vals = [summ.get((v, "*", m, c)) for c in (12.0, 40.0, n)]
            row += f"  {m}: " + "/".join("—" if not s or s["n"] == 0 else f"{s['abs_median']:.4f}" for s in vals)
        lines.append(row)
    return "\n".join(lines)


BAR_COMPUTE = 40.0
"""The bar: allocopt's median regret <= 1 % of the range by this compute (full-budget runs)."""


def bar_verdict(records: Sequence[dict[str, Any]], cfg: Config) -> tuple[str, dict[str, Any]]:
    """Did allocopt meet the bar? (median regret <= 1 % of the range by ``BAR_COMPUTE`` runs of
    compute; lower median regret than every Optuna sampler at equal compute, at every level from
    allocopt's first recommendation to the last level its races reached, on every variant)."""
    if "allocopt" not in cfg.methods or not allocopt_available():
        return ("allocopt was not run: bar not evaluated" if "allocopt" not in cfg.methods
                else "allocopt (not available): bar not evaluated"), {}
    summ = summarize(records)
    lines, verdict = [f"Bar (allocopt): median regret <= 1 % of range by {BAR_COMPUTE:.0f} runs of compute; "
                      "lower median regret than every Optuna sampler at equal compute (every level from "
                      "allocopt's first recommendation to the first level its races have all ended by)"], {}
    for v in cfg.variants:
        quarter = BAR_COMPUTE
        ok_levels = [c for c in levels_of(v) if c <= quarter]
        meds = {c: summ.get((v, "*", "allocopt", c)) for c in ok_levels}
        hit = [c for c, s in meds.items() if s and s["n"] == s["runs"] and s["median"] <= 1.0]
        first = min(hit) if hit else None
        # equal compute: up to the first level at which every race has ended (beyond it allocopt
        # spends nothing more, and the others would be compared at more compute than it used)
        ends = [r["compute_used"] for r in records if r["method"] == "allocopt" and r["variant"] == v
                and r["level"] == max(levels_of(v)) and not math.isnan(r["compute_used"])]
        upto = min((c for c in levels_of(v) if ends and c >= max(ends) - 1e-9), default=math.inf)
        cmp_lines, beats_all = [], True
        for c in levels_of(v):
            a = summ.get((v, "*", "allocopt", c))
            if c > upto:
                break
            if not a or a["n"] < a["runs"]:
                continue
            for m in OPTUNA_METHODS:
                s = summ.get((v, "*", m, c))
                if not s or s["n"] < s["runs"] or m not in cfg.methods:
                    continue
                better = a["median"] < s["median"]
                beats_all &= better
                cmp_lines.append(f"{m}@{int(c)}: {a['median']:.1f} vs {s['median']:.1f} {'<' if better else '>='}")
        s_end = meds.get(max(ok_levels)) if ok_levels else None
        verdict[v] = {"regret_1pct_by_40_runs": first is not None, "first_level": first,
                      "median_at_quarter_grid": s_end["median"] if s_end else math.nan,
                      "beats_every_optuna_sampler": beats_all and bool(cmp_lines)}
        lines.append(f"  {v:11s} <=1% by {quarter:.0f} runs: {'YES at ' + str(int(first)) if first else 'NO'}"
                     f" (median {verdict[v]['median_at_quarter_grid']:.2f}% at {int(max(ok_levels))});"
                     f" beats every Optuna sampler: {'YES' if verdict[v]['beats_every_optuna_sampler'] else 'NO'}"
                     f" [{'; '.join(cmp_lines)}]")
    return "\n".join(lines), verdict


def plot(records: Sequence[dict[str, Any]], cfg: Config, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summarize(records)
    n = len(cfg.variants)
    fig, axes = plt.subplots(1, n, figsize=(max(5.0, 4.2 * n), 4.0), squeeze=False, sharey=True)
    for ax, v in zip(axes[0], cfg.variants):
        for m in cfg.methods:
            pts = [(c, summ[(v, "*", m, c)]) for c in levels_of(v) if (v, "*", m, c) in summ]
            pts = [(c, s) for c, s in pts if s["n"] == s["runs"] and s["n"] > 0]
            if not pts:
                continue
            xs = [c for c, _ in pts]
            line, = ax.plot(xs, [s["median"] for _, s in pts], marker="o", ms=3, label=method_label(m))
            ax.fill_between(xs, [s["q1"] for _, s in pts], [s["q3"] for _, s in pts], alpha=0.15,
                            color=line.get_color())
        ax.axhline(1.0, color="k", lw=0.7, ls="--")
        ax.axvline(grid_size(v) / 4, color="grey", lw=0.7, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, 100)
        ax.set_title(f"{v}")
        ax.set_xlabel("compute (full-budget runs)")
    axes[0][0].set_ylabel("simple regret, % of range (median, IQR)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.suptitle(("synthetic test functions (not predictions)" if set(cfg.variants) - {TABLE} else
                  "the tiny world's measured grid, replayed (tiny-table)") + "\n"
                 "dashed: 1 % of the range; dotted: 25 % of the grid's compute", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------- timings
def _random_allocations(space: SearchSpace, n: int, rng: random.Random) -> list[Allocation]:
    lo, hi = space.rho
    return [Allocation(round(rng.uniform(lo, hi), 4), rng.choice(space.group_sizes), rng.choice(space.rewards),
                       rng.choice(space.models) if space.models else None) for _ in range(n)]


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since ``t0`` (:func:`_clocks`)."""
    return time.perf_counter() - t0[0], time.process_time() - t0[1]


def time_proposals(variant: str, n_trials: int, repeats: int, methods: Sequence[str]) -> dict[str, float]:
    """Median seconds of one proposal with ``n_trials`` finished trials: ``study.ask`` for the
    Optuna samplers; for allocopt (``n_trials`` observations, 60 % of them pilots at 0.1 of the
    budget) the surrogate plus one proposal (``q = 1``) averaged over a refit cycle of
    :class:`allocopt.race.SurrogateCache`: one call with a hyperparameter fit and
    ``ceil(0.2 n) - 1`` calls that keep the hyperparameters (both are reported too, as
    ``allocopt (refit)`` and ``allocopt (reuse)``). Wall-clock seconds under each name, and the
    process's CPU seconds (``time.process_time``, one thread: what the load does not inflate)
    under the name with `` cpu`` appended."""
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import optuna
    from optuna.trial import create_trial

    from allocopt.spec import allocation_of
    from allocopt.study.open import distributions

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    p = Problem(variant, "pass_at_1")
    spec = p.spec(0)
    dists = distributions(spec)
    rng = random.Random(f"timing|{variant}|{n_trials}")
    allocs = _random_allocations(p.space, n_trials, rng)
    out = {}
    for m in methods:
        if m == "grid":
            continue
        if m == "allocopt":
            if not allocopt_available():
                continue
            from allocopt.race import Observation, propose

            n_pilot = int(0.6 * n_trials)
            obs = []
            for i, a in enumerate(allocs[:n_trials]):
                frac = 0.1 if i < n_pilot else 1.0
                y = observe(a.rho, a.group_size, a.reward, frac * BUDGET, variant=variant, model=a.model, seed=i)
                obs.append(Observation(i, a, y["pass_at_1"], frac * BUDGET, frac,
                                       "pilot" if frac < 1 else "full", math.nan))
            from allocopt.race import SurrogateCache

            wl = bench_workload(variant)
            existing = [(o.allocation, o.fidelity) for o in obs]
            fit_ts, reuse_ts = [], []
            for k in range(repeats + 1):  # the first, untimed, warms up imports and caches
                cache = SurrogateCache(p.space, seed=k)
                t0 = _clocks()
                sur = cache(obs)  # a hyperparameter fit (what a refit costs)
                propose(obs, spec, wl, existing=existing, q=1, surrogate=sur)
                fit_ts.append(_since(t0))
                extra = obs + [replace(obs[-1], number=len(obs), value=obs[-1].value + 0.001)]
                t0 = _clocks()
                sur = cache(extra)  # one more trial: hyperparameters kept, posterior recomputed
                propose(extra, spec, wl, existing=existing, q=1, surrogate=sur)
                reuse_ts.append(_since(t0))
            cycle = max(1, math.ceil(cache.refit_growth * n_trials))  # proposals per refit (q = 1)
            for k, suffix in ((0, ""), (1, " cpu")):
                fit_s = statistics.median(t[k] for t in fit_ts[1:])
                reuse_s = statistics.median(t[k] for t in reuse_ts[1:])
                out["allocopt (refit)" + suffix], out["allocopt (reuse)" + suffix] = fit_s, reuse_s
                out[m + suffix] = (fit_s + (cycle - 1) * reuse_s) / cycle
            continue
        study = optuna.create_study(direction="maximize", sampler=make_optuna_sampler(m, 0))
        study.add_trials([create_trial(params={k: {"rho": a.rho, "group_size": a.group_size, "reward": a.reward,
                                                   "model": a.model}[k] for k in dists},
                                       distributions=dists, value=p.value(a) + rng.gauss(0, 0.01))
                          for a in allocs[:n_trials]])
        ts = []
        for _ in range(repeats + 1):  # the first, untimed, warms up imports and caches
            t0 = _clocks()
            trial = study.ask(dists)
            ts.append(_since(t0))
            study.tell(trial, p.value(allocation_of(spec, trial.params)))
        out[m] = statistics.median(t[0] for t in ts[1:])
        out[m + " cpu"] = statistics.median(t[1] for t in ts[1:])
    return out


def run_timings(cfg: Config) -> dict[str, dict[int, dict[str, float]]]:
    """:func:`time_proposals` per timing variant and trial count; each row also carries ``load``,
    the machine's 1-minute load average (``os.getloadavg``) averaged over its start and end
    (the timings are wall clock: on a shared machine they scale with the load)."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for v in cfg.timing_variants:
        out[v] = {}
        for n in cfg.timing_trials:
            load0 = os.getloadavg()[0]
            row = time_proposals(v, n, cfg.timing_repeats, cfg.methods)
            row["load"] = (load0 + os.getloadavg()[0]) / 2
            out[v][n] = row
    return out


def format_timings(t: dict[str, dict[int, dict[str, float]]], cfg: Config) -> str:
    lines = ["Seconds per proposal (sampler only: study.ask; allocopt: surrogate + one proposal, averaged "
             "over a refit cycle of 20 % growth; its refit and reuse calls alone in the last two columns), "
             f"median of {cfg.timing_repeats}; wall clock, then the process's CPU time (one thread), "
             "with the machine's 1-minute load average:"]
    methods = [m for m in cfg.methods if m != "grid"]
    if "allocopt" in methods:
        methods += ["allocopt (refit)", "allocopt (reuse)"]
    lines.append(f"{'space':12s}{'trials':>7s}{'clock':>6s}" + "".join(f"{method_label(m)[:16]:>18s}" for m in methods)
                 + f"{'load (1 min)':>14s}")
    for v, by_n in t.items():
        for n, row in by_n.items():
            for suffix, name in (("", "wall"), (" cpu", "cpu")):
                lines.append(f"{v:12s}{n:7d}{name:>6s}"
                             + "".join(f"{row[m + suffix]:18.3f}" if m + suffix in row else f"{'—':>18s}"
                                       for m in methods)
                             + (f"{row['load']:14.1f}" if "load" in row else f"{'—':>14s}"))
    return "\n".join(lines)


CSV_KEYS: tuple[str, ...] = ("variant", "target", "method", "seed", "level", "regret", "regret_pct",
                             "compute_used", "rho", "group_size", "reward", "model", "seconds", "ask_seconds",
                             "fit_seconds", "proposal_seconds", "proposal_trials", "num_pilots", "num_full",
                             "refits", "compute", "note", "error")


def _append_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_KEYS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Records of an earlier run's ``results.csv`` (numbers parsed back)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ("seed",):
                r[k] = int(r[k])
            for k in ("level", "regret", "regret_pct", "compute_used", "seconds"):
                r[k] = float(r[k]) if r.get(k) not in (None, "") else math.nan
            out.append(r)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, paper, pass@1 (< 3 min)")
    ap.add_argument("--seeds", type=int, help="seeds (default 20; --quick 2)")
    ap.add_argument("--out", default="benchmarks/results", help="folder for regret.png, results.csv, summary.json")
    ap.add_argument("--targets", help="rotate (default), all, or one target (pass@1, native_reward, judge)")
    ap.add_argument("--variants", help=f"comma-separated, from {', '.join(ALL_VARIANTS)} ({TABLE}: replays "
                    "the measured tiny-world grid)")
    ap.add_argument("--tiny-table", help="grid table the tiny-table variant replays (default "
                    "benchmarks/tiny_grid/trials.csv)")
    ap.add_argument("--tiny-study", help="study file whose RACE terms (pilots, pilot_fraction, [race]) the "
                    "tiny-table variant replays (default studies/tiny.toml)")
    ap.add_argument("--methods", help=f"comma-separated, from {', '.join(METHODS)}")
    ap.add_argument("--workers", type=int, help="processes (default: min(2, cores))")
    ap.add_argument("--caps", help="most compute per method, e.g. gp=40,botorch=16 (default tpe=160, gp=80, botorch=16)")
    ap.add_argument("--allocopt-compute", type=float, help="compute (full-budget runs) allocopt's races spend (default 80)")
    ap.add_argument("--no-timings", action="store_true", help="skip the per-proposal timings")
    ap.add_argument("--timings-only", action="store_true", help="only the per-proposal timings (of --methods)")
    ap.add_argument("--from-csv", help="print the tables and redraw the figure from earlier results.csv "
                    "file(s), comma-separated (e.g. allocopt and the other methods run apart)")
    a = ap.parse_args(argv)
    cfg = QUICK if a.quick else Config()
    kw: dict[str, Any] = {"workers": a.workers or min(2, os.cpu_count() or 1)}
    if a.seeds is not None:
        if a.seeds < 1:
            print(f"--seeds={a.seeds}: must be >= 1", file=sys.stderr)
            return 2
        kw["seeds"] = a.seeds
    if a.targets:
        t = a.targets.replace("@", "_at_").replace(":", "_")
        if t not in ("rotate", "all", *TARGETS):
            print(f"--targets={a.targets!r}: allowed: rotate, all, native_reward, pass@1, judge", file=sys.stderr)
            return 2
        kw["targets"] = t
    if a.tiny_table:
        if not Path(a.tiny_table).is_file():
            print(f"--tiny-table={a.tiny_table!r}: no such file; run benchmarks/tiny_grid.py to measure one",
                  file=sys.stderr)
            return 2
        os.environ["ALLOCOPT_TINY_TABLE"] = str(Path(a.tiny_table).resolve())
    if a.tiny_study:
        from allocopt.errors import ConfigError

        try:
            StudySpec.from_toml(a.tiny_study)
        except ConfigError as e:
            print(f"--tiny-study={a.tiny_study!r}: {e}", file=sys.stderr)
            return 2
        os.environ["ALLOCOPT_TINY_STUDY"] = str(Path(a.tiny_study).resolve())
    for name, allowed in (("variants", ALL_VARIANTS), ("methods", METHODS)):
        val = getattr(a, name)
        if val:
            items = tuple(x.strip() for x in val.split(",") if x.strip())
            bad = [x for x in items if x not in allowed]
            if bad or not items:
                print(f"--{name}={val!r}: allowed: {', '.join(allowed)}", file=sys.stderr)
                return 2
            kw[name] = items
    if a.caps:
        caps = dict(cfg.caps)
        for item in a.caps.split(","):
            m, _, n = item.partition("=")
            try:
                v = float(n)
            except ValueError:
                v = math.nan
            if m.strip() not in caps or not v > 0:
                print(f"--caps={a.caps!r}: each item METHOD=N with N > 0, METHOD one of {', '.join(caps)}",
                      file=sys.stderr)
                return 2
            caps[m.strip()] = v
        kw["caps"] = caps
    if a.allocopt_compute is not None:
        if not a.allocopt_compute > 0:
            print(f"--allocopt-compute={a.allocopt_compute}: must be > 0", file=sys.stderr)
            return 2
        kw["allocopt_compute"] = a.allocopt_compute
    cfg = replace(cfg, **kw)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.from_csv:
        records = [r for path in a.from_csv.split(",") for r in read_csv(path)]
        cfg = replace(cfg, variants=tuple(v for v in ALL_VARIANTS if any(r["variant"] == v for r in records)),
                      methods=tuple(m for m in METHODS if any(r["method"] == m for r in records)))
        print(format_tables(records, cfg))
        print()
        print(bar_verdict(records, cfg)[0])
        plot(records, cfg, out / "regret.png")
        print(f"\nwrote {out / 'regret.png'}")
        return 0
    if a.timings_only:
        timings = run_timings(cfg)
        print(format_timings(timings, cfg))
        (out / "timings.json").write_text(json.dumps(timings, indent=1))
        return 0
    t0 = time.perf_counter()
    print(f"allocopt benchmark ({'quick' if a.quick else 'full'}): variants "
          f"{', '.join(cfg.variants)}; targets {cfg.targets}; {cfg.seeds} seeds; {cfg.workers} worker(s)",
          flush=True)
    if not allocopt_available():
        print("allocopt.study.race.run_race is not importable: allocopt is shown as 'allocopt (not available)'")
    records = run_benchmark(cfg, progress=True, partial=out / "partial.csv")
    bench_s = time.perf_counter() - t0
    print()
    print(format_tables(records, cfg))
    print()
    verdict_text, verdict = bar_verdict(records, cfg)
    print(verdict_text)
    race = [r for r in records if r["method"] == "allocopt" and r["level"] == levels_of(r["variant"])[0]]
    if race:
        fits = [x for r in race for x in json.loads(r["fit_seconds"])]
        props = [x for r in race for x in json.loads(r["proposal_seconds"])]
        print(f"allocopt inside its races: median {statistics.median(fits):.2f} s per surrogate call, "
              f"{statistics.median(props):.2f} s per proposal round (surrogate + recommend + propose, "
              f"q <= {cfg.allocopt_batch}); median race "
              f"{statistics.median(r['seconds'] for r in race):.1f} s")
    timings = {}
    if not a.no_timings:
        t1 = time.perf_counter()
        timings = run_timings(cfg)
        print()
        print(format_timings(timings, cfg))
        print(f"(timings took {time.perf_counter() - t1:.0f} s)")
    with open(out / "results.csv", "w", newline="") as f:
        keys = sorted({k for r in records for k in r})
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(records)
    summ = summarize(records)
    (out / "summary.json").write_text(json.dumps({
        "config": {**asdict(cfg), "caps": {k: (None if math.isinf(v) else v) for k, v in cfg.caps.items()}},
        "summary": [{"variant": k[0], "target": k[1], "method": k[2], "level": k[3], **v} for k, v in summ.items()],
        "verdict": verdict, "timings": timings, "seconds": time.perf_counter() - t0}, indent=1, default=str))
    plot(records, cfg, out / "regret.png")
    print(f"\nwrote {out / 'regret.png'}, {out / 'results.csv'}, {out / 'summary.json'}; "
          f"benchmark {bench_s:.0f} s, total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
