"""``tiny-table``: the tiny world's *measured* trials, replayed. It trains nothing.

Every answer is a real GRPO trial of the ``tiny`` objective that ``benchmarks/tiny_grid.py``
ran and appended to its table (``benchmarks/tiny_grid/trials.csv``: one row a trial, at a grid
of reward system × G × ρ level × fidelity × seed). A trial of this objective looks up the grid
cell of its allocation and returns one measured seed's targets and FLOP breakdown, so a tuner
can be replayed against the real tiny world in milliseconds per trial. It is not a model of
new training: an allocation between the measured points gets an interpolation of measurements,
and an allocation outside the table is refused.

Lookup of a trial with allocation (ρ, G, reward) and budget ``B``:

* **fidelity**: the measured budget equal to ``B`` (within 2 %; the grid has the full budget
  3e11 FLOPs and pilot budgets at 25 % and 10 % of it); another budget is refused;
* **reward, G**: exact; another is refused;
* **ρ**: ``interpolate=True`` (default): linear interpolation between the two neighbouring
  measured ρ levels ``ρ_lo ≤ ρ ≤ ρ_hi`` of the same seed,
  ``y = (1 - w) · y(ρ_lo) + w · y(ρ_hi)``, ``w = (ρ - ρ_lo) / (ρ_hi - ρ_lo)``, for every target
  and every FLOP item (rounded to the nearest int); at a measured level (within 1e-6) the row itself,
  exactly. ``interpolate=False``: the nearest level (the lower one on a tie). ρ outside the
  measured levels is refused;
* **infeasible levels**: a level whose measured trials were all infeasible (the budget could not
  buy their first iteration: the PRM rewards at ρ 0.9, G 2 on a pilot budget) answers a trial
  at it with :class:`allocopt.errors.InfeasiblePlan`, as the real trial did (a study records it
  infeasible, at no cost); between an infeasible and a measured level the nearer one decides
  (infeasible, or that level's row alone: no interpolation toward a run that never ran);
* **seed**: one of the measured seeds of the cell (seeds present at both neighbours when
  interpolating), drawn by a generator seeded by ``(seed, reward, G, ρ, fidelity)``: the same
  trial gives the same answer, other seeds draw other measured seeds (with one measured seed,
  every draw is that seed: the replay then has no noise).

Refusals raise :class:`allocopt.errors.ConfigError` with one line naming the field, its value
and what the table holds. The table's own optimum (:meth:`TinyTableObjective.optimum`) is the
best seed-mean over its measured cells (interpolation is linear, so no point between levels
beats both ends); regret is measured against it.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from allocopt.errors import ConfigError, InfeasiblePlan
from allocopt.flops import ComputeBreakdown, FlopAccount
from allocopt.objective import TrialResult
from allocopt.plan.allocation import Allocation, TrialPlan, Workload
from allocopt.spec import SearchSpace
from objectives import COMMON_TARGETS

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "tiny_grid" / "trials.csv"
"""The grid runner's table (``benchmarks/tiny_grid.py``)."""
BUDGET_TOLERANCE = 0.02
"""A trial's budget matches a measured budget within this relative difference."""
RHO_MATCH = 1e-6
PHASE_COLUMNS = (("search", "search_flops"), ("learning", "learning_flops"), ("reward", "reward_flops"))


@dataclass(frozen=True)
class Row:
    """One measured, complete trial of the table."""

    reward: str
    group_size: int
    rho: float
    """The ρ level asked (the grid's level, 4 decimals)."""
    fidelity: str
    budget_flops: float
    seed: int
    targets: dict[str, float]
    """``native_reward``, ``pass_at_1``, ``judge`` (shares in [0, 1])."""
    flops: dict[str, int]
    """Executed FLOPs by phase: ``search``, ``learning``, ``reward``."""
    model: str = ""
    """The table's optional ``model`` column (empty when it has none)."""

    @property
    def reward_share(self) -> float:
        t = sum(self.flops.values())
        return self.flops["reward"] / t if t else math.nan


MAX_GROUP_SIZES = 12
"""Distinct G a table may hold (the search space is the best product of reward systems and a
subset of them: 2**12 subsets at most)."""


def read_table(path: str | Path = DEFAULT_TABLE) -> tuple[list[Row], list[dict[str, str]]]:
    """``(complete rows, other rows)`` of a grid table (CSV of ``benchmarks/tiny_grid.py``),
    through the reading layer (:mod:`allocopt.limits`: a regular file of at most 64 MiB, lines
    of at most 1 MiB, numbers in ASCII digits).

    Raises :class:`ConfigError` (one line) when the file is missing, not a regular file, over a
    limit, lacks a column, holds a value out of its range, a trial more than
    :data:`~allocopt.limits.MAX_REPEATS` times or more than :data:`MAX_GROUP_SIZES` distinct G."""
    from allocopt.limits import MAX_TABLE_BYTES, RepeatCounter, iter_lines

    path = Path(path)
    if not os.path.lexists(path):
        raise ConfigError(f"table={str(path)!r}: no such file; run benchmarks/tiny_grid.py to measure one")
    rows, other = [], []
    repeats = RepeatCounter()
    try:
        reader = csv.DictReader(iter_lines(path, MAX_TABLE_BYTES, "table"))
        need = {"reward", "group_size", "rho", "fidelity", "budget_flops", "seed", "status",
                *COMMON_TARGETS, *(c for _, c in PHASE_COLUMNS)}
        missing = need - set(reader.fieldnames or ())
        if missing:
            raise ConfigError(f"table={str(path)!r}: missing column(s) {', '.join(sorted(missing))}")
        for r in reader:
            if None in r or any(v is None for v in r.values()):
                raise ConfigError(f"table={str(path)!r}: line {reader.line_num}: not as many cells as columns")
            if r["status"] != "complete" or any(r[t] == "" for t in COMMON_TARGETS):
                _check_other(r, path, reader.line_num)
                other.append(r)
                continue
            row = _row(r, path, reader.line_num)
            repeats.add((row.reward, row.group_size, row.rho, row.fidelity, row.seed),
                        f"table={str(path)!r}: line {reader.line_num}", "a trial", ConfigError)
            rows.append(row)
    except csv.Error as e:
        raise ConfigError(f"table={str(path)!r}: not a CSV table of benchmarks/tiny_grid.py ({e})") from None
    groups = {r.group_size for r in rows} | {int(r["group_size"]) for r in other}
    if len(groups) > MAX_GROUP_SIZES:
        raise ConfigError(f"table={str(path)!r}: {len(groups)} distinct group sizes; allowed: at "
                          f"most {MAX_GROUP_SIZES}")
    return rows, other


def _number(r: dict[str, str], field_name: str, path: Path, line: int, *, whole: bool = False,
            least: float = -math.inf, most: float = math.inf, empty: float | None = None) -> Any:
    """The cell ``field_name`` of a row as a number in ``[least, most]`` (ASCII digits; whole
    when ``whole``; an empty cell is ``empty`` when given); :class:`ConfigError` naming the
    line and field otherwise."""
    from allocopt.limits import read_number

    text = r.get(field_name) or ""
    if text == "" and empty is not None:
        return empty
    where = f"table={str(path)!r}: line {line}: {field_name}"
    v = read_number(text, where)
    if v is None or not (math.isfinite(v) and least <= v <= most) or (whole and not float(v).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{where}={text[:40]!r}: must be {kind} from {least:g} to {most:g}")
    return int(v) if whole else float(v)


def _check_other(r: dict[str, str], path: Path, line: int) -> None:
    """The cells an incomplete row is read by (G, ρ, budget) are numbers in range."""
    _number(r, "group_size", path, line, whole=True, least=1, most=65536)
    _number(r, "rho", path, line, least=0, most=1)
    _number(r, "budget_flops", path, line, least=0, most=1e30)


def _row(r: dict[str, str], path: Path, line: int) -> Row:
    """One complete row of the table; :class:`ConfigError` naming the line and field when a value
    is not a number in its range (an empty FLOP column is 0)."""
    flops = {p: int(_number(r, c, path, line, least=0, most=1e30, empty=0)) for p, c in PHASE_COLUMNS}
    return Row(r["reward"][:64], _number(r, "group_size", path, line, whole=True, least=1, most=65536),
               round(_number(r, "rho", path, line, least=0, most=1), 4), r["fidelity"][:64],
               _number(r, "budget_flops", path, line, least=0, most=1e30),
               _number(r, "seed", path, line, whole=True, least=0, most=2**32),
               {t: _number(r, t, path, line, least=-1e30, most=1e30) for t in COMMON_TARGETS}, flops,
               (r.get("model") or "").strip()[:64])


def _least_budget(row: dict[str, str]) -> int:
    """The least budget (FLOPs) an infeasible row's message names ("... is 7.736e+10", "...
    needs 3.84e+10 FLOPs"), else just over the row's budget."""
    import re

    m = re.search(r"(?:smallest budget that runs one iteration is|needs) ([0-9.e+]+)", row.get("error") or "")
    try:
        return int(float(m.group(1).rstrip("."))) if m else int(float(row["budget_flops"])) + 1
    except ValueError:
        return int(float(row["budget_flops"])) + 1


@dataclass(frozen=True)
class TableOptimum:
    """The table's own optimum of one target at one fidelity (seed-means of measured cells)."""

    allocation: Allocation
    value: float
    """Best seed-mean (target units)."""
    worst: float
    """Worst seed-mean over the same cells."""
    seeds: int
    """Measured seeds of the best cell."""

    @property
    def range(self) -> float:
        """``value - worst`` (regrets are quoted in % of it)."""
        return self.value - self.worst


@dataclass
class TinyTableObjective:
    """Replays the measured tiny-world trials of a grid table (module docstring); trains nothing."""

    table: str = str(DEFAULT_TABLE)
    """Path of the grid table (CSV of ``benchmarks/tiny_grid.py``)."""
    interpolate: bool = True
    """Linear interpolation in ρ between the neighbouring measured levels (else the nearest level)."""
    full_budget_flops: float = 3e11
    """The table's full budget (FLOPs); fidelities are named by budget / this."""
    name: str = "tiny-table"
    _cells: dict = field(default_factory=dict, init=False, repr=False)
    _infeasible: dict = field(default_factory=dict, init=False, repr=False)
    """``(reward, G, fidelity) -> {rho: least budget that buys one iteration}`` of the levels
    whose every measured trial was infeasible."""

    def __post_init__(self) -> None:
        if not isinstance(self.interpolate, bool):
            raise ValueError(f"interpolate={self.interpolate!r}: must be true or false")
        if not (isinstance(self.full_budget_flops, (int, float)) and self.full_budget_flops > 0):
            raise ValueError(f"full_budget_flops={self.full_budget_flops!r}: must be FLOPs > 0")
        rows, other = read_table(self.table)
        for r in rows:
            self._cells.setdefault((r.reward, r.group_size, r.fidelity), {}).setdefault(r.rho, {})[r.seed] = r
        for r in other:
            if r.get("status") != "infeasible":
                continue
            key, rho = (r["reward"], int(r["group_size"]), r["fidelity"]), round(float(r["rho"]), 4)
            if self._cells.get(key, {}).get(rho):
                continue  # another seed ran: the level is measured
            self._cells.setdefault(key, {})
            self._infeasible.setdefault(key, {})[rho] = _least_budget(r)
        if not self._cells:
            raise ConfigError(f"table={self.table!r}: no complete trial yet")

    # ------------------------------------------------------------------ the table's shape
    @cached_property
    def budgets(self) -> dict[str, float]:
        """Measured budget (FLOPs) per fidelity name."""
        out: dict[str, float] = {}
        for cell in self._cells.values():
            for by_seed in cell.values():
                for r in by_seed.values():
                    out.setdefault(r.fidelity, r.budget_flops)
        return out

    @cached_property
    def rho_levels(self) -> tuple[float, ...]:
        return tuple(sorted({rho for cell in self._cells.values() for rho in cell}
                            | {rho for bad in self._infeasible.values() for rho in bad}))

    def fidelity_of(self, budget_flops: float) -> str:
        """The fidelity measured at ``budget_flops`` (within 2 %); :class:`ConfigError` if none."""
        for f, b in self.budgets.items():
            if abs(budget_flops - b) <= BUDGET_TOLERANCE * b:
                return f
        have = ", ".join(f"{b:.3g} ({f})" for f, b in sorted(self.budgets.items()))
        raise ConfigError(f"budget_flops={budget_flops:.4g}: the table measured {have} only")

    def complete_cells(self, fidelity: str = "full") -> dict[tuple[str, int], int]:
        """``(reward, G) -> fewest seeds over the feasible ρ levels`` for pairs measured at every
        ρ level (a level measured infeasible counts as measured)."""
        out = {}
        for (w, g, f), cell in self._cells.items():
            bad = self._infeasible.get((w, g, f), {})
            if f == fidelity and all(rho in cell or rho in bad for rho in self.rho_levels):
                out[(w, g)] = min((len(cell[rho]) for rho in self.rho_levels if rho in cell), default=0)
        return {k: v for k, v in out.items() if v}

    def space(self, fidelity: str = "full") -> SearchSpace:
        """The largest product space (reward systems × G × the measured ρ range) whose every cell
        is measured at every ρ level at ``fidelity``; :class:`ConfigError` when there is none."""
        done = set(self.complete_cells(fidelity))
        gs = sorted({g for _, g in done})
        best: tuple[int, int, tuple, tuple] | None = None
        for mask in range(1, 2 ** len(gs)):
            sub = tuple(g for i, g in enumerate(gs) if mask >> i & 1)
            rewards = tuple(w for w in dict.fromkeys(w for w, _ in sorted(done)) if all((w, g) in done for g in sub))
            key = (len(rewards) * len(sub), len(sub), rewards, sub)
            if rewards and (best is None or key[:2] > best[:2]):
                best = key
        if best is None:
            raise ConfigError(f"table={self.table!r}: no (reward, G) measured at all {len(self.rho_levels)} "
                              f"rho levels at fidelity {fidelity!r} yet")
        return SearchSpace(rho=(self.rho_levels[0], self.rho_levels[-1]), group_sizes=best[3], rewards=best[2])

    # ------------------------------------------------------------------ lookup
    def _cell(self, a: Allocation, fidelity: str) -> dict[float, dict[int, Row]]:
        cell = self._cells.get((a.reward, a.group_size, fidelity))
        if cell is None:
            have = sorted({(w, g) for w, g, f in self._cells if f == fidelity})
            raise ConfigError(f"allocation=({a.reward}, G={a.group_size}): not in the table at fidelity "
                              f"{fidelity}; it holds {', '.join(f'{w}/G={g}' for w, g in have) or 'nothing'}")
        return cell

    def _neighbours(self, rho: float, cell: dict, bad: dict | None = None) -> list[tuple[float, float]]:
        """``[(level, weight), ...]`` of the measured levels ``rho`` is read from; ``bad``: the
        cell's infeasible levels (module docstring: the nearer level decides; raises
        :class:`InfeasiblePlan` when it is infeasible)."""
        lv = self.rho_levels
        if not lv[0] - RHO_MATCH <= rho <= lv[-1] + RHO_MATCH:
            raise ConfigError(f"rho={rho:.4g}: outside the measured levels [{lv[0]}, {lv[-1]}]")
        exact = [x for x in lv if abs(x - rho) <= RHO_MATCH]
        if exact:
            pts = [(exact[0], 1.0)]
        elif not self.interpolate:
            pts = [(min(lv, key=lambda x: (abs(x - rho), x)), 1.0)]
        else:
            lo = max(x for x in lv if x < rho)
            hi = min(x for x in lv if x > rho)
            w = (rho - lo) / (hi - lo)
            pts = [(lo, 1.0 - w), (hi, w)]
        bad = bad or {}
        if any(x in bad for x, _ in pts):
            near = min(pts, key=lambda p: (abs(p[0] - rho), -p[1]))[0]
            if near in bad:
                raise InfeasiblePlan(f"rho={rho:.4g}: the measured trials at rho {near} of this reward system and "
                                     "G were infeasible at this budget (it cannot buy their first iteration)",
                                     min_budget_flops=bad[near])
            pts = [(near, 1.0)]
        for x, _ in pts:
            if not cell.get(x):
                raise ConfigError(f"rho={rho:.4g}: level {x} of this (reward, G, fidelity) is not measured yet")
        return pts

    def lookup(self, a: Allocation, budget_flops: float, seed: int = 0) -> tuple[dict[str, float], dict[str, int], int]:
        """``(targets, executed FLOPs by phase, measured seed used)`` of a trial (module docstring)."""
        fidelity = self.fidelity_of(budget_flops)
        cell = self._cell(a, fidelity)
        pts = self._neighbours(float(a.rho), cell, self._infeasible.get((a.reward, a.group_size, fidelity)))
        common = set.intersection(*(set(cell[x]) for x, _ in pts))
        rng = random.Random(f"{seed}|{a.reward}|{a.group_size}|{float(a.rho):.6f}|{fidelity}")
        if common:
            s = rng.choice(sorted(common))
            rows = [(cell[x][s], w) for x, w in pts]
        else:  # no seed at both neighbours: one drawn per neighbour
            s = -1
            rows = [(cell[x][rng.choice(sorted(cell[x]))], w) for x, w in pts]
        if len(rows) == 1:
            r = rows[0][0]
            return dict(r.targets), dict(r.flops), r.seed
        targets = {t: sum(w * r.targets[t] for r, w in rows) for t in COMMON_TARGETS}
        flops = {p: int(round(sum(w * r.flops[p] for r, w in rows))) for p, _ in PHASE_COLUMNS}
        return targets, flops, s

    def mean_value(self, a: Allocation, target: str, budget_flops: float | None = None) -> float:
        """Seed-mean of ``target`` at ``a`` (interpolated as a trial is): the noise-free value
        regret is measured with. Raises :class:`InfeasiblePlan` where a trial would."""
        fidelity = self.fidelity_of(budget_flops or self.full_budget_flops)
        cell = self._cell(a, fidelity)
        pts = self._neighbours(float(a.rho), cell, self._infeasible.get((a.reward, a.group_size, fidelity)))
        return sum(w * sum(r.targets[target] for r in cell[x].values()) / len(cell[x]) for x, w in pts)

    def optimum(self, target: str = "pass_at_1", budget_flops: float | None = None,
                space: SearchSpace | None = None) -> TableOptimum:
        """Best and worst seed-mean of ``target`` over the measured levels of ``space``
        (default :meth:`space`) at ``budget_flops`` (default the full budget)."""
        budget = budget_flops or self.full_budget_flops
        space = space or self.space(self.fidelity_of(budget))
        fid = self.fidelity_of(budget)
        vals = [(self.mean_value(Allocation(x, g, w), target, budget), -x, Allocation(x, g, w))
                for w in space.rewards for g in space.group_sizes for x in self.rho_levels
                if space.rho[0] - RHO_MATCH <= x <= space.rho[1] + RHO_MATCH
                and x not in self._infeasible.get((w, g, fid), {})]
        best = max(vals, key=lambda v: (v[0], v[1]))
        cell = self._cell(best[2], self.fidelity_of(budget))
        return TableOptimum(best[2], best[0], min(v[0] for v in vals), len(cell[best[2].rho]))

    # ------------------------------------------------------------------ objective contract
    @cached_property
    def _workload(self) -> Workload:
        from objectives.tiny import make as make_tiny

        return make_tiny().workload()

    def workload(self) -> Workload:
        """The tiny world's workload (plans are made exactly as for the measured trials)."""
        return self._workload

    def check_available(self) -> None:
        """Always available: a table lookup."""

    def run(self, plan: TrialPlan, *, seed: int = 0, progress: Any = None) -> TrialResult:
        """A measured trial of ``plan``'s allocation and budget (module docstring). Raises
        :class:`ConfigError` (one line) for an allocation or budget outside the table,
        :class:`InfeasiblePlan` where the measured trials were infeasible."""
        targets, flops, _ = self.lookup(plan.allocation, plan.budget_flops, seed)
        bd = ComputeBreakdown(search={"measured": flops["search"]}, learning={"measured": flops["learning"]},
                              reward={"measured": flops["reward"]} if flops["reward"] else {})
        return TrialResult(targets=targets, spent=FlopAccount(bd, bd), budget_flops=plan.budget_flops,
                           curves=[], wall_seconds={})


def make(**settings: Any) -> TinyTableObjective:
    """The ``tiny-table`` objective (entry point ``allocopt.objectives``): replays the measured
    trials of ``table``. Raises ``ValueError`` (one line) for an unknown or ill-typed setting."""
    from allocopt.objective import check_settings

    check_settings(TinyTableObjective, settings, "tiny-table")
    return TinyTableObjective(**settings)


make.targets = COMMON_TARGETS  # type: ignore[attr-defined]
make.rewards = ("sparse", "structured", "dense", "proxy_prm", "prm")  # type: ignore[attr-defined]  # a table measures these
