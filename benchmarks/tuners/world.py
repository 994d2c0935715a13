"""The worlds a tuner is replayed on: measured grid tables, and the synthetic test functions.

A world says what may be searched and what a trial returns; :mod:`benchmarks.tuners.truth`
says what is true. Both kinds offer the same few things to the harness: ``space`` (the search
variables, an :class:`allocopt.spec.SearchSpace`), ``fractions`` (the pilot budgets, as
fractions of the full budget, that a multi-fidelity method may run), ``candidates`` (every
cell at the full budget: what the common rule chooses among), ``grid_points`` (the IsoFLOP
grid in its run order) and ``encode`` (an allocation as a feature row in ``[0, 1]``).

**A measured table** (:func:`read_world`) is the CSV that ``benchmarks/tiny_grid.py`` writes,
one row a trial (columns ``reward, group_size, rho, fidelity, budget_flops, seed, status``, the
three targets and the FLOP columns; rows read by :func:`objectives.tiny_table.read_table`),
with an optional ``model`` column. Several tables may be given: their rows are pooled.

* **model**: the ``model`` column; a table without it is one model named by its folder with a
  trailing ``_grid`` dropped (``benchmarks/tiny_grid/trials.csv``: ``tiny``). With more than
  one model the model is a search variable (``space.models``).
* **name**: one table's world is named by its folder (:func:`world_name`; the small policy's
  table at 1e11 FLOPs, ``tiny_grid_small_1e11``, is ``small_1e11``), pooled tables' by their
  models (``medium+small+tiny``).
* **full budget**: per model, the budget of its rows whose fidelity is ``full`` (the largest
  budget when none is named so); every row's budget becomes a fraction of it (4 decimals).
  Two tables that give one model different full budgets are refused.
* **space**: the largest product of models × reward systems × G whose every cell is measured
  at every ρ level at the full budget (a level whose trials were all infeasible counts as
  measured); cells outside it are left out and ``notes`` says so. ρ ranges over the
  measured levels.
* **pilot fractions**: the fractions below 1 measured (or infeasible) at every cell and level
  of the space; other fractions are left out with a note.
* **seeds**: every full-budget candidate needs two or more measured seeds (one is held out as
  the truth in the held-out variant); the seeds measured at every candidate can be held out.

Any other shape is refused with :class:`allocopt.errors.ConfigError`, one line naming the
table and what is missing. A trial between two measured ρ levels is read as the linear
interpolation of one seed's two rows (as :mod:`objectives.tiny_table` does); a level measured
only infeasible answers infeasible, and between an infeasible and a measured level the nearer
decides.

**A synthetic variant** (:class:`SyntheticWorld`, :mod:`objectives.synthetic`) is a closed-form
test function at the full budget ``B_REF``: pilots at 10 % and 25 % of it, candidates on a ρ
grid of step 0.02, and no measured seeds (its noise is Gaussian).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

from allocopt.errors import ConfigError
from allocopt.plan.allocation import Allocation
from allocopt.spec import SearchSpace

FULL = 1.0
FRACTION_DIGITS = 4
RHO_MATCH = 1e-6
GRID_RHO_LEVELS = 8
"""ρ levels of the IsoFLOP grid on a synthetic world (a table's grid is its measured levels)."""
SYNTHETIC_FRACTIONS = (0.1, 0.25)
SYNTHETIC_RHO_STEP = 0.02

Key = tuple[str, str, int, float]
"""``(model, reward, G, fraction)``: one cell of a table at one budget."""


def model_name(path: str | Path) -> str:
    """The model a table without a ``model`` column measured: its folder, ``_grid`` dropped."""
    name = Path(path).resolve().parent.name
    return name[:-len("_grid")] if name.endswith("_grid") and len(name) > 5 else (name or "tiny")


def _encode(a: Allocation, space: SearchSpace, models: Sequence[str]) -> list[float]:
    """``[ρ, log2 G, one-hot reward, one-hot model]`` scaled to [0, 1] (a one-hot block only
    when the space has more than one value)."""
    lo, hi = space.rho
    gs = [math.log2(g) for g in space.group_sizes]
    row = [(a.rho - lo) / (hi - lo) if hi > lo else 0.0,
           (math.log2(a.group_size) - min(gs)) / (max(gs) - min(gs)) if max(gs) > min(gs) else 0.0]
    if len(space.rewards) > 1:
        row += [float(a.reward == w) for w in space.rewards]
    if len(models) > 1:
        row += [float((a.model or models[0]) == m) for m in models]
    return row


@dataclass(frozen=True)
class TableWorld:
    """A measured grid (module docstring); built by :func:`read_world`."""

    name: str
    models: tuple[str, ...]
    space: SearchSpace
    rho_levels: tuple[float, ...]
    fractions: tuple[float, ...]
    """Pilot budgets a method may run, as fractions of the full budget (ascending, each < 1)."""
    budgets: dict[str, float]
    """Full budget (FLOPs) per model."""
    cells: dict[Key, dict[float, dict[int, dict[str, float]]]] = field(repr=False)
    """``(model, reward, G, fraction) -> ρ level -> seed -> targets``."""
    infeasible: dict[Key, frozenset[float]] = field(repr=False)
    """The ρ levels of a cell whose every measured trial was infeasible."""
    notes: tuple[str, ...] = ()
    kind: str = "table"

    def model_of(self, a: Allocation) -> str:
        return a.model or self.models[0]

    def key(self, a: Allocation, fraction: float) -> Key:
        return (self.model_of(a), a.reward, a.group_size, round(fraction, FRACTION_DIGITS))

    def neighbours(self, a: Allocation, fraction: float) -> list[tuple[float, float]] | None:
        """``[(level, weight), ...]`` that ``a`` is read from at ``fraction``; ``None`` where it
        is infeasible (module docstring). Raises :class:`ConfigError` outside the table."""
        key = self.key(a, fraction)
        if key not in self.cells:
            raise ConfigError(f"allocation {a} at fraction {fraction:g}: not in the table")
        lv, bad = self.rho_levels, self.infeasible.get(key, frozenset())
        rho = float(a.rho)
        if not lv[0] - RHO_MATCH <= rho <= lv[-1] + RHO_MATCH:
            raise ConfigError(f"rho={rho:.4g}: outside the measured levels [{lv[0]}, {lv[-1]}]")
        exact = [x for x in lv if abs(x - rho) <= RHO_MATCH]
        if exact:
            pts = [(exact[0], 1.0)]
        else:
            lo, hi = max(x for x in lv if x < rho), min(x for x in lv if x > rho)
            pts = [(lo, (hi - rho) / (hi - lo)), (hi, (rho - lo) / (hi - lo))]
        if any(x in bad for x, _ in pts):
            near = min(pts, key=lambda p: (abs(p[0] - rho), -p[1]))[0]
            return None if near in bad else [(near, 1.0)]
        return pts

    def seeds(self, a: Allocation, fraction: float, level: float) -> dict[int, dict[str, float]]:
        return self.cells[self.key(a, fraction)][level]

    def mean(self, a: Allocation, target: str, fraction: float = FULL) -> float | None:
        """Seed-mean of ``target`` at ``a`` (interpolated in ρ); ``None`` where infeasible."""
        pts = self.neighbours(a, fraction)
        if pts is None:
            return None
        return sum(w * sum(r[target] for r in self.seeds(a, fraction, x).values()) / len(self.seeds(a, fraction, x))
                   for x, w in pts)

    @cached_property
    def candidates(self) -> tuple[Allocation, ...]:
        """Every feasible cell of the space at the full budget, at each measured ρ level."""
        return tuple(a for a in self.grid_points() if self.neighbours(a, FULL) is not None)

    @cached_property
    def heldout_seeds(self) -> tuple[int, ...]:
        """Seeds measured at every candidate at the full budget (each can be held out)."""
        sets = [set(self.seeds(a, FULL, a.rho)) for a in self.candidates]
        return tuple(sorted(set.intersection(*sets))) if sets else ()

    def grid_points(self) -> list[Allocation]:
        """The IsoFLOP grid in run order: model, reward system, G, then ρ (innermost)."""
        s = self.space
        return [Allocation(r, g, w, m) for m in (s.models or (None,)) for w in s.rewards
                for g in s.group_sizes for r in self.rho_levels]

    def encode(self, a: Allocation) -> list[float]:
        return _encode(a, self.space, self.models)

    @property
    def full_budget_flops(self) -> float:
        return self.budgets[self.models[0]]


# ------------------------------------------------------------------------------ reading
def _pool_rows(paths: Sequence[str | Path]) -> tuple[list, dict[str, float]]:
    """``([(model, row, fraction)], {model: full budget})`` over every table; infeasible rows
    carry ``row=None`` in a dict form (reward, G, ρ, budget)."""
    from objectives.tiny_table import BUDGET_TOLERANCE, read_table

    pooled, budgets = [], {}
    for path in paths:
        rows, other = read_table(path)
        default = model_name(path)
        infeasible = [r for r in other if r.get("status") == "infeasible"]
        by_model: dict[str, list] = {}
        for r in rows:
            by_model.setdefault(r.model or default, []).append(("complete", r.reward, r.group_size, r.rho,
                                                                  r.fidelity, r.budget_flops, r.seed, r.targets))
        for r in infeasible:
            try:
                item = ("infeasible", r["reward"], int(r["group_size"]), round(float(r["rho"]), 4), r["fidelity"],
                        float(r["budget_flops"]), None, None)
            except (KeyError, ValueError):
                raise ConfigError(f"table={str(path)!r}: an infeasible row has a bad reward, group_size, rho "
                                  "or budget_flops") from None
            by_model.setdefault((r.get("model") or "").strip() or default, []).append(item)
        for m, items in by_model.items():
            full = [it[5] for it in items if it[4] == "full"] or [max(it[5] for it in items)]
            b = max(full)
            if min(full) < b * (1 - BUDGET_TOLERANCE):
                raise ConfigError(f"table={str(path)!r}: model {m!r} has full-budget rows at {min(full):.4g} "
                                  f"and {b:.4g} FLOPs; one full budget per model")
            if m in budgets and abs(budgets[m] - b) > BUDGET_TOLERANCE * b:
                raise ConfigError(f"table={str(path)!r}: model {m!r} has full budget {b:.4g} FLOPs here and "
                                  f"{budgets[m]:.4g} in an earlier table")
            budgets.setdefault(m, b)
            pooled += [(m, it, round(it[5] / budgets[m], FRACTION_DIGITS)) for it in items]
    return pooled, budgets


def _largest_product(done: set[tuple[str, str, int]]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]]:
    """The largest ``models × rewards × G`` inside ``done`` (ties: more G, then more models)."""
    models = sorted({m for m, _, _ in done})
    gs = sorted({g for _, _, g in done})
    rewards_order = list(dict.fromkeys(w for _, w, _ in sorted(done, key=lambda k: _REWARD_RANK.get(k[1], 99))))
    best = None
    for mm in range(1, 2 ** len(models)):
        ms = tuple(m for i, m in enumerate(models) if mm >> i & 1)
        for gm in range(1, 2 ** len(gs)):
            sub = tuple(g for i, g in enumerate(gs) if gm >> i & 1)
            ws = tuple(w for w in rewards_order if all((m, w, g) in done for m in ms for g in sub))
            key = (len(ms) * len(ws) * len(sub), len(sub), len(ms))
            if ws and (best is None or key > best[0]):
                best = (key, ms, ws, sub)
    if best is None:
        return (), (), ()
    return best[1], best[2], best[3]


def _reward_rank() -> dict[str, int]:
    from allocopt.plan.allocation import REWARDS

    return {w: i for i, w in enumerate(REWARDS)}


_REWARD_RANK = _reward_rank()


def read_world(paths: Sequence[str | Path], name: str | None = None) -> TableWorld:
    """The replay world of one or more measured tables (module docstring). Raises
    :class:`ConfigError` (one line) for a table the replay cannot use."""
    if not paths:
        raise ConfigError("tiny-table: no table given")
    where = ", ".join(str(p) for p in paths)
    pooled, budgets = _pool_rows(paths)
    cells: dict[Key, dict[float, dict[int, dict[str, float]]]] = {}
    bad: dict[Key, set[float]] = {}
    for m, (status, w, g, rho, _, _, seed, targets), f in pooled:
        if status == "complete":
            cells.setdefault((m, w, g, f), {}).setdefault(rho, {})[seed] = targets
        else:
            bad.setdefault((m, w, g, f), set()).add(rho)
    mixed = _demote_mixed(cells, bad)
    for k, levels in bad.items():  # a level with a complete trial is measured
        levels -= set(cells.get(k, {}))
        cells.setdefault(k, {})
    full_levels = sorted({rho for (_, _, _, f), c in cells.items() if f == FULL for rho in c}
                         | {rho for (_, _, _, f), b in bad.items() if f == FULL for rho in b})
    if not full_levels:
        raise ConfigError(f"table={where!r}: no complete trial at the full budget")

    def measured(k: Key) -> bool:
        return all(rho in cells.get(k, {}) or rho in bad.get(k, ()) for rho in full_levels)

    done = {(m, w, g) for (m, w, g, f) in cells if f == FULL and measured((m, w, g, f))}
    models, rewards, gs = _largest_product(done)
    if not models:
        raise ConfigError(f"table={where!r}: no (model, reward, G) measured at all {len(full_levels)} rho "
                          "levels at the full budget")
    space = SearchSpace(rho=(full_levels[0], full_levels[-1]), group_sizes=gs, rewards=rewards,
                        models=models if len(models) > 1 else ())
    prod = [(m, w, g) for m in models for w in rewards for g in gs]
    notes = [f"replayed infeasible (complete in one seed only, infeasible in another): {', '.join(mixed)}"] \
        if mixed else []
    left = sorted(done - set(prod))
    if left:
        notes.append(f"left out (not a full product with the rest): {', '.join(f'{m}/{w}/G={g}' for m, w, g in left)}")
    fractions = sorted({f for (_, _, _, f) in cells if f < FULL})
    kept = tuple(f for f in fractions if all(measured((m, w, g, f)) for m, w, g in prod))
    if set(fractions) - set(kept):
        notes.append("pilot fractions left out (not measured at every cell and level): "
                     + ", ".join(f"{f:g}" for f in fractions if f not in kept))
    world = TableWorld(name or world_name(paths, models), models, space, tuple(full_levels), kept,
                       {m: budgets[m] for m in models}, cells, {k: frozenset(v) for k, v in bad.items()},
                       tuple(notes))
    _check_seeds(world, where)
    return world


def _demote_mixed(cells: dict, bad: dict) -> list[str]:
    """A full-budget level whose first iteration fits the budget in one seed and not in another
    (the seed draws the first prompts, so a level at the edge of the budget can be both) with
    fewer than two complete seeds is replayed infeasible: a run there fails as often as not,
    and one seed cannot be held out. Removes those levels from ``cells`` (``bad`` has them
    already); their names."""
    out = []
    for k, levels in bad.items():
        if k[3] != FULL:  # a pilot is no candidate: one seed of it is a measurement like any
            continue
        for rho in sorted(levels & set(cells.get(k, {}))):
            if len(cells[k][rho]) < 2:
                del cells[k][rho]
                out.append(f"{k[0]}/{k[1]}/G={k[2]}/rho={rho}")
    return out


def world_name(paths: Sequence[str | Path], models: Sequence[str]) -> str:
    """One table's world is named by its folder, ``tiny_grid`` dropped (``tiny_grid``: ``tiny``,
    ``tiny_grid_small``: ``small``, ``tiny_grid_small_1e11``: ``small_1e11``), so that two
    tables of one model at two budgets are two worlds; pooled tables by their models."""
    if len(paths) != 1:
        return "+".join(models)
    folder = Path(paths[0]).resolve().parent.name
    label = folder[len("tiny_grid_"):] if folder.startswith("tiny_grid_") else model_name(paths[0])
    return label or "+".join(models)


def _check_seeds(world: TableWorld, where: str) -> None:
    if not world.candidates:
        raise ConfigError(f"table={where!r}: every cell at the full budget was infeasible")
    for a in world.candidates:
        for x, _ in world.neighbours(a, FULL):
            n = len(world.seeds(a, FULL, x))
            if n < 2:
                raise ConfigError(f"table={where!r}: {world.model_of(a)}/{a.reward}/G={a.group_size}/rho={x} has "
                                  f"{n} seed at the full budget; the replay needs >= 2")


# ------------------------------------------------------------------------------ synthetic
@dataclass(frozen=True)
class SyntheticWorld:
    """A synthetic variant of :mod:`objectives.synthetic` at ``B_REF`` (module docstring)."""

    variant: str
    kind: str = "synthetic"

    @property
    def name(self) -> str:
        return self.variant

    @cached_property
    def space(self) -> SearchSpace:
        from objectives.synthetic import space_of

        return space_of(self.variant)

    @property
    def models(self) -> tuple[str, ...]:
        return self.space.models or (None,)  # type: ignore[return-value]

    @property
    def fractions(self) -> tuple[float, ...]:
        return SYNTHETIC_FRACTIONS

    @property
    def notes(self) -> tuple[str, ...]:
        return ()

    @property
    def full_budget_flops(self) -> float:
        from objectives.synthetic import B_REF

        return B_REF

    @cached_property
    def rho_levels(self) -> tuple[float, ...]:
        lo, hi = self.space.rho
        return tuple(round(lo + (hi - lo) * i / (GRID_RHO_LEVELS - 1), 4) for i in range(GRID_RHO_LEVELS))

    @cached_property
    def candidates(self) -> tuple[Allocation, ...]:
        lo, hi = self.space.rho
        n = round((hi - lo) / SYNTHETIC_RHO_STEP)
        rhos = [round(lo + i * SYNTHETIC_RHO_STEP, 4) for i in range(n + 1)]
        s = self.space
        return tuple(Allocation(r, g, w, m) for m in (s.models or (None,)) for w in s.rewards
                     for g in s.group_sizes for r in rhos)

    def grid_points(self) -> list[Allocation]:
        s = self.space
        return [Allocation(r, g, w, m) for m in (s.models or (None,)) for w in s.rewards
                for g in s.group_sizes for r in self.rho_levels]

    def encode(self, a: Allocation) -> list[float]:
        return _encode(a, self.space, self.space.models)

    def mean(self, a: Allocation, target: str, fraction: float = FULL) -> float:
        from objectives.synthetic import B_REF, response

        return response(a.rho, a.group_size, a.reward, target, fraction * B_REF, variant=self.variant, model=a.model)


World = TableWorld | SyntheticWorld
