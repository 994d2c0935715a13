"""RACE pilot design: settings, the IsoFLOP pilot grid, the pilot fraction.

The grid (:func:`pilot_grid`): ``rho_levels`` evenly spaced ρ × every G (or the
``pilot_group_sizes`` among them) × every reward system (× model). When that grid has more than ``max_pilots`` points, each reward system (× model) gets
``max_pilots // cells`` points of a seeded Latin hypercube over ρ, with G dealt out evenly and
shuffled. Each point runs ``repeats`` times (different seeds). All pilots run at one budget,
``pilot_fraction × budget_flops`` (an IsoFLOP design). See :mod:`allocopt.race`.

Standard library only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from allocopt.plan.allocation import FIDELITIES, Allocation  # noqa: F401  (FIDELITIES re-exported)
from allocopt.flops import ConfigError
from allocopt.spec import SearchSpace

REGIMES: tuple[str, ...] = ("search-heavy", "update-heavy", "reward-heavy", "balanced")
"""Regime labels (``unknown`` is reported when a reward system has too few pilots)."""



def _check_range(name: str, v: Any, meta: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` unless ``v`` is in the range ``meta`` gives (:func:`_setting`)."""
    if v is None and meta["optional"]:
        return
    low, high = meta["range"]
    if meta["kind"] is int:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ConfigError(f"{name}={v!r}: must be an integer >= {low} and <= {high}"
                              + (", or left unset" if meta["optional"] else ""))
        return
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    if meta["open"]:
        if not (ok and low < v < high):
            raise ConfigError(f"{name}={v!r}: must be a number strictly between {low:g} and {high:g}")
    elif not (ok and low <= v <= high):
        raise ConfigError(f"{name}={v!r}: must be a number from {low:g} to {high:g}")


SECTIONS: tuple[str, ...] = ("pilots", "diagnosis", "proposals", "answer")
"""The sections of :class:`RaceSettings`, in the order RACE uses them."""


def _setting(default: Any, section: str, low: float | None = None, high: float | None = None, *,
             kind: type = int, open_ends: bool = False, optional: bool = False) -> Any:
    """A :class:`RaceSettings` field: its section and the range :meth:`RaceSettings.__post_init__`
    checks (``kind`` int or float; ``open_ends``: both ends excluded; ``optional``: ``None``
    allowed)."""
    return field(default=default, metadata={"section": section, "range": (low, high), "kind": kind,
                                            "open": open_ends, "optional": optional})


@dataclass(frozen=True)
class RaceSettings:
    """Settings of a RACE study, in four sections (:data:`SECTIONS`): the pilot grid
    (``pilots``), the regime diagnosis (``diagnosis``), the proposals (``proposals``) and the
    recommendation (``answer``); :meth:`section` lists a section's values.

    Every number has a range (in its field's metadata), checked when built: a value outside it
    raises :class:`ConfigError` with one line naming the field, the value and the range. The
    ranges keep every step bounded in time and memory (the largest posterior sample is
    ``posterior_samples × rho_grid`` doubles, 32 MB at both maxima). Loggable with
    ``dataclasses.asdict``; the keys are a study file's ``[race]`` keys (:func:`check_race_table`).
    """

    # ---------------------------------------------------------------- pilots
    rho_levels: int = _setting(6, "pilots", 3, 1000)
    """ρ levels of the full pilot grid (evenly spaced over the space's ρ range), 3 to 1000."""
    max_pilots: int | None = _setting(None, "pilots", 3, 100_000, optional=True)
    """Most distinct pilot points (before repeats); a larger grid is replaced by a seeded Latin
    hypercube over ρ per reward system (× model), ``max_pilots // cells`` points each, which must
    be at least ``len(group_sizes) + 3`` (the local fit's parameters plus one). ``None``: sized to
    the space, ``max(60, (len(group_sizes) + 3) × cells)`` (:meth:`pilot_cap`). Set by the
    study's ``pilots``."""
    repeats: int = _setting(1, "pilots", 1, 100)
    """Runs of each pilot point (different seeds); raise it when the target is noisy."""
    pilot_group_sizes: tuple[int, ...] | None = field(default=None, metadata={"section": "pilots"})
    """G of the pilot grid (each one of the space's); ``None``: every G of the space. Fewer G
    leave more pilots per G for the local fit at the same pilot count (its parameters are 3 plus
    one per further G); the full runs still range over every G of the space."""
    fit_pilots: bool = field(default=True, metadata={"section": "pilots"})
    """Given a workload, move each pilot whose plan at the pilot budget is not usable (not
    realizable, or spending under 85 % of it) to the nearest usable ρ within half a stratum
    (:func:`allocopt.race.pilot_plans.fit_pilots`)."""

    # ---------------------------------------------------------------- diagnosis
    search_heavy_below: float = _setting(0.4, "diagnosis", 0, 1, kind=float, open_ends=True)
    """``search-heavy`` when the optimal ρ is below this."""
    update_heavy_above: float = _setting(0.6, "diagnosis", 0, 1, kind=float, open_ends=True)
    """``update-heavy`` when the optimal ρ is above this."""
    reward_heavy_share: float = _setting(0.3, "diagnosis", 0, 1, kind=float, open_ends=True)
    """``reward-heavy`` when reward FLOPs / total FLOPs at the optimum exceed this (takes
    precedence over the ρ thresholds)."""
    bandwidth: float = _setting(0.2, "diagnosis", 0.01, 10, kind=float)
    """Width (in ρ, 0.01 to 10) of the Gaussian kernel that weights pilots around the optimum in
    the local quadratic fit (a narrow one leaves too few pilots near the optimum: ρ* unknown)."""
    bootstrap: int = _setting(200, "diagnosis", 10, 20_000)
    """Posterior draws of the local fit for the uncertainty of ρ* and the regime probability
    (:func:`allocopt.race.diagnose._posterior_optima`), 10 to 20000."""

    # ---------------------------------------------------------------- proposals
    extra_pilot_budget: float = _setting(0.0, "proposals", 0, 1000, kind=float)
    """Compute, in full-budget runs, that proposals may spend on extra pilots in all (default
    none: on the synthetic benchmark, extra pilots delayed the full runs that resolve the
    pilots' budget drift and did not lower the final regret)."""
    rho_match: float = _setting(1e-3, "proposals", 1e-6, 0.5, kind=float)
    """A proposal within this of an existing trial's ρ (same G, reward, model, fidelity) is a
    repeat and is not proposed."""
    rho_grid: int = _setting(71, "proposals", 5, 1001)
    """ρ values of the discrete candidate set for proposals and the full-budget argmax."""
    thompson_samples: int = _setting(64, "proposals", 1, 4096)
    """Joint posterior samples per proposal round (Thompson sampling; :func:`propose`)."""
    explore_cells_after: int | None = _setting(2, "proposals", 0, 10_000, optional=True)
    """Once the study has this many full-budget runs, every cell (reward system × model) without
    a full run gets one (at its best posterior mean, the best cells first, one per cell and
    batch) before the
    proposals range over the whole space again: the pilots' ranking of the cells is not trusted
    until a full run of each has tested it (the surrogate's per-cell pilot bias is unknown
    until then). ``None``: never forced. The default 2 lets the first two full runs go where
    Thompson sampling sends them (on the benchmark: the pilots' favourite cell, at two ρ that
    tell the budget drift apart) before the other cells are tested: with 0, the first full run
    of each cell sat at the pilots' optimum, off a sharp peak's full-budget optimum, and on
    ``narrow`` the median regret at 8 runs of compute was 21.6 % (10 seeds; 7.8 % with 2; on
    ``rank-flip`` 13.9 % and 13.7 % at 8 runs, 1.9 % and 0.2 % at 10; on ``narrow`` at 16
    runs 1.5 % and 2.9 %)."""
    replicates: int = _setting(0, "proposals", 0, 100)
    """Extra seeds of the leading full run :func:`allocopt.race.propose` may ask for when the
    leaders are within one evaluation's noise (0: never; the benchmark runs without)."""

    # ---------------------------------------------------------------- answer
    rho_trust: float = _setting(0.1, "answer", 1e-3, 1, kind=float)
    """The recommendation (:func:`recommend`) is a cell (reward system × model) with a
    full-budget run and a ρ within this of one of them (ρ units)."""
    posterior_samples: int = _setting(256, "answer", 16, 4096)
    """Posterior samples for the credible interval, the probability per cell of holding the
    best allocation and the full-budget regime probability."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if "range" in f.metadata:
                _check_range(f.name, getattr(self, f.name), f.metadata)
        pg = self.pilot_group_sizes
        if pg is not None:
            if isinstance(pg, list):
                pg = tuple(pg)
                object.__setattr__(self, "pilot_group_sizes", pg)
            if (not isinstance(pg, tuple) or not pg or len(set(pg)) < len(pg)
                    or any(isinstance(g, bool) or not isinstance(g, int) or g < 2 for g in pg)):
                raise ConfigError(f"pilot_group_sizes={pg!r}: must be distinct integers >= 2 (G of the "
                                  "space), or None for every G")
        if not isinstance(self.fit_pilots, bool):
            raise ConfigError(f"fit_pilots={self.fit_pilots!r}: must be true or false")
        if self.search_heavy_below > self.update_heavy_above:
            raise ConfigError(f"search_heavy_below={self.search_heavy_below!r} > update_heavy_above="
                              f"{self.update_heavy_above!r}: the search-heavy threshold must not "
                              "exceed the update-heavy one")

    def section(self, name: str) -> dict[str, Any]:
        """The values of section ``name`` (one of :data:`SECTIONS`), by field name."""
        if name not in SECTIONS:
            raise ConfigError(f"section={name!r}: allowed: {', '.join(SECTIONS)}")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("section") == name}

    def pilot_cap(self, space: SearchSpace) -> int:
        """Most distinct pilot points for ``space``: ``max_pilots``, or when that is ``None``
        ``max(60, (len(group_sizes) + 3) × cells)`` (every reward system × model gets enough
        pilots for its local fit)."""
        if self.max_pilots is not None:
            return self.max_pilots
        return max(60, (len(self.pilot_gs(space)) + 3) * len(cells(space)))

    def pilot_gs(self, space: SearchSpace) -> tuple[int, ...]:
        """G of the pilot grid over ``space``: :attr:`pilot_group_sizes`, or every G of it.
        Raises :class:`ConfigError` for a G the space does not have."""
        if self.pilot_group_sizes is None:
            return tuple(space.group_sizes)
        bad = [g for g in self.pilot_group_sizes if g not in space.group_sizes]
        if bad:
            raise ConfigError(f"pilot_group_sizes={list(self.pilot_group_sizes)}: G {bad[0]} is not in the "
                              f"space's group_sizes {list(space.group_sizes)}")
        return tuple(self.pilot_group_sizes)


NOT_IN_RACE_TABLE = {"max_pilots": "pilots", "seed": "seed"}
"""Keys a study file's ``[race]`` table may not set, and the study key that does."""
REMOVED = {"batch_size": "every trial gets its own proposal, and parallel workers are conditioned "
                         "on each other's pending trials; remove it"}
"""Former RACE settings, and what to do instead: a ``[race]`` table that sets one is refused."""


def check_race_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """A study file's ``[race]`` table, checked: every key a field of :class:`RaceSettings` but
    those of :data:`NOT_IN_RACE_TABLE` and :data:`REMOVED`, every value as RaceSettings checks
    it (lists become tuples). Raises :class:`ConfigError` with one line naming the key."""
    known = {f.name for f in fields(RaceSettings)} - set(NOT_IN_RACE_TABLE)
    for k in table:
        if k in NOT_IN_RACE_TABLE:
            raise ConfigError(f"race.{k}: set by the study's {NOT_IN_RACE_TABLE[k]!r}, not in [race]")
        if k in REMOVED:
            raise ConfigError(f"race.{k}: no longer a RACE setting: {REMOVED[k]}")
        if k not in known:
            raise ConfigError(f"race.{k}: unknown RACE setting; allowed: {', '.join(sorted(known))}")
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}
    try:
        RaceSettings(**out)
    except ConfigError as e:
        raise ConfigError(f"race.{e}") from None
    return out


def race_settings(table: Mapping[str, Any], max_pilots: int | None = None, **flags: Any) -> RaceSettings:
    """The :class:`RaceSettings` of a ``[race]`` table (:func:`check_race_table`), ``max_pilots``
    (a study's ``pilots``), then every flag given (``None`` left out) over them. Raises
    :class:`ConfigError` for a bad ``[race]`` key or value, or a bad flag value."""
    given = {"max_pilots": max_pilots, **{k: v for k, v in flags.items() if v is not None}}
    return RaceSettings(**{**check_race_table(table), **given})


def settings_for(spec: Any, **flags: Any) -> RaceSettings:
    """:func:`race_settings` of a study's terms: its ``race`` table and ``pilots`` (the two
    values read; a :class:`allocopt.spec.StudySpec`, not imported here), then ``flags`` (a
    ``max_pilots`` flag over ``pilots``)."""
    given = {k: v for k, v in flags.items() if v is not None}
    return race_settings(spec.race, given.pop("max_pilots", spec.pilots), **given)


def check_pilot_fraction(pilot_fraction: Any) -> float:
    """``pilot_fraction`` as a float in (0, 1). Raises :class:`ConfigError`."""
    try:
        f = float(pilot_fraction)
    except (TypeError, ValueError):
        f = math.nan
    if not 0 < f < 1:
        raise ConfigError(f"pilot_fraction={pilot_fraction!r}: must be a number strictly between 0 "
                          "and 1 (pilots run at pilot_fraction x budget_flops)")
    return f


@dataclass(frozen=True)
class PilotPoint:
    """One pilot run of the grid: an allocation and its repeat index."""

    allocation: Allocation
    repeat: int = 0

    @property
    def key(self) -> str:
        """Content key stored as the trial's ``race_pilot`` user attribute (resume finds it)."""
        a = self.allocation
        return f"{a.reward}|{a.model or '-'}|G{a.group_size}|rho{a.rho:.4f}|r{self.repeat}"


def cells(space: SearchSpace) -> list[tuple[str, str | None]]:
    """``(reward system, model)`` of every cell of ``space`` (model ``None``: the objective's own)."""
    return [(r, m) for m in (space.models or (None,)) for r in space.rewards]


def pilot_grid(space: SearchSpace, settings: RaceSettings = RaceSettings(), seed: int = 0) -> list[PilotPoint]:
    """The IsoFLOP pilot design over ``space`` (module docstring).

    Returns:
        pilot points, ``repeats`` per distinct allocation, ordered by repeat, then model,
        reward system, G and ρ. Deterministic for a given seed.

    Raises:
        ConfigError: a ρ range of one value, or a ``max_pilots`` given below
            ``len(group_sizes) + 3`` per reward system (× model).
    """
    lo, hi = space.rho
    if not lo < hi:
        raise ConfigError(f"space.rho={list(space.rho)!r}: RACE needs a range of rho (low < high)")
    cs = cells(space)
    gs = settings.pilot_gs(space)
    points: list[Allocation] = []
    cap = settings.pilot_cap(space)
    if settings.rho_levels * len(gs) * len(cs) <= cap:
        levels = [round(lo + (hi - lo) * i / (settings.rho_levels - 1), 4) for i in range(settings.rho_levels)]
        points = [Allocation(rho, g, r, m) for r, m in cs for g in gs for rho in levels]
    else:
        n = cap // len(cs)
        need = len(gs) + 3  # quadratic (3) + one offset per further G + one to spare
        if n < need:
            raise ConfigError(f"max_pilots={cap}: too few for {len(cs)} reward "
                              f"system(s) x model(s) with {len(gs)} group size(s); needs at least "
                              f"{need * len(cs)} ({need} each: 3 for the quadratic in rho, one per "
                              "further G, one to spare)")
        for c, (r, m) in enumerate(cs):
            rng = random.Random(f"race-pilots|{seed}|{c}")
            strata = list(range(n))
            rng.shuffle(strata)
            rhos = [round(lo + (hi - lo) * (s + rng.random()) / n, 4) for s in strata]
            deal = [gs[i % len(gs)] for i in range(n)]
            rng.shuffle(deal)
            points += [Allocation(rho, g, r, m) for rho, g in sorted(zip(rhos, deal), key=lambda t: (t[1], t[0]))]
    return [PilotPoint(a, k) for k in range(settings.repeats) for a in points]

