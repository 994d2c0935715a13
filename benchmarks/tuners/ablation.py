"""Ablations of allocopt's tuner on measured worlds, and each choice made leave-one-world-out.

A **variant** is the shipped tuner with one design change, given as keyword arguments of
:class:`allocopt.tuner.study.KGTuner` (:data:`VARIANTS`: the model's hyperparameter grid, where
the answer is chosen). Each variant is replayed like the ``allocopt`` method of the judge
(:func:`benchmarks.tuners.methods.allocopt.run_allocopt`, the same paired replications: target,
held-out seed and draws) on every world and truth, and scored at each level by its own answer
and by the oracle (:mod:`benchmarks.tuners.scoring`); the common rule is left out unless asked:
it depends on the runs alone, and a change of the answer does not move them.

**Leave one world out** (:func:`leave_one_world_out`): for each world, the variant with the
lowest score on the *other* worlds is the choice, and it is reported on the world left out
beside the shipped design's. The score of a variant on some worlds is the mean, over those
worlds, both truths and the levels :data:`CHOICE_LEVELS` (where a team spends), of its mean own
regret over the replications every variant ran there.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from allocopt.tuner.model import HyperGrid

CHOICE_LEVELS: tuple[float, ...] = (8.0, 12.0, 16.0)
"""The compute levels (full runs) a choice is scored on."""
BASE = "shipped"


BEFORE = {"layout": "g-in-turn", "initial": True}
"""The initial design the ablations before 2026-12-06 were replayed with (one full run per reward
system first, at the group sizes in turn; :data:`allocopt.tuner.study.INITIAL_LAYOUTS`): set on
each of them, so that their records stay what this code replays."""
WITH_DESIGN = {"initial": True, "layout": "middle"}
"""The :data:`DESIGN` variants change the tuner as shipped until 2026-12-06, with its initial
design at the middle of ρ and G (:data:`allocopt.tuner.study.INITIAL_DESIGN` turned it off on
2026-12-06; on 2026-12-07 it came back with the wide middle layout, ``initial-wide-middle``):
each is replayed with it unless it says otherwise, so that ``shipped`` and the records made then
stay what this code replays."""


def _grid(**changes: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {"grid": replace(HyperGrid(), **changes), "among": "all", **BEFORE}


VARIANTS: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    BASE: ("the design they were replayed against (the answer over every cell)", lambda: {"among": "all", **BEFORE}),
    "answer-among-tried": ("the answer only among cells with a full run (shipped since)",
                           lambda: {"among": "tried", **BEFORE}),
    "flat-prior-mean": ("no bowl in ρ in the prior mean (rho_bowl 0, shipped 1)", _grid(rho_bowl=0.0)),
    "deeper-bowl": ("a deeper bowl in ρ (rho_bowl 2)", _grid(rho_bowl=2.0)),
    "longer-lengthscales": ("length scales 0.3/0.6/1.2 of the ρ range (shipped 0.15/0.3/0.6)",
                            _grid(lengthscale=(0.3, 0.6, 1.2))),
    "shorter-lengthscales": ("length scales 0.1/0.2/0.4", _grid(lengthscale=(0.1, 0.2, 0.4))),
    "noisier": ("noise shares 0.1/0.3/0.6 of the values' variance (shipped 0.02/0.1/0.5)",
                _grid(noise_share=(0.1, 0.3, 0.6))),
    "categories-alike": ("reward correlations 0.5/0.8/0.95, group 0.7/0.95 (shipped 0.3/0.7/0.9, 0.5/0.9)",
                         _grid(reward_corr=(0.5, 0.8, 0.95), group_corr=(0.7, 0.95))),
}
"""Name -> (what changes, the ``KGTuner`` keyword arguments it sets). Replayed before the answer
rule was chosen (:data:`ANSWER_RULES`), so each answers over every cell, as the design then did;
``answer-among-tried`` is the rule shipped since. All with the initial design then shipped
(:data:`BEFORE`)."""

BEST_RUN_MEAN = "best-run-mean"
"""The answer rule that takes no model: the cell run whose full runs' mean is highest."""
ANSWER_RULES: dict[str, tuple[str, dict[str, Any]]] = {
    BASE: ("the posterior-mean maximizer among cells with a full run (shipped: chosen here)", {}),
    "every-cell": ("the posterior-mean maximizer over every feasible cell (the rule before)", {"among": "all"}),
    "caution-0.5": ("over every cell, the maximizer of the posterior mean less 0.5 posterior sd",
                    {"among": "all", "caution": 0.5}),
    "caution-1": ("over every cell, the maximizer of the posterior mean less 1 posterior sd",
                  {"among": "all", "caution": 1.0}),
    "caution-2": ("over every cell, the maximizer of the posterior mean less 2 posterior sd",
                  {"among": "all", "caution": 2.0}),
    "noise-share-0.8": ("among cells with a full run, the posterior mean of a model that may also find the noise "
                        "0.8 of the values' variance (the grid's shares 0.02/0.1/0.5, and 0.8)",
                        {"grid": HyperGrid(noise_share=(0.02, 0.1, 0.5, 0.8))}),
    "cell-offset": ("among cells with a full run, the posterior mean of a model with a term per cell (variance 0 "
                    "or 1 s², weighed by the runs): a cell's own runs can outweigh the smooth surface",
                    {"grid": HyperGrid(cell_offset=(0.0, 1.0))}),
    BEST_RUN_MEAN: ("the cell whose full runs have the highest mean (Optuna's best trial, its replicates "
                    "averaged): no model", {}),
}
"""The answer rules compared on the same runs (:func:`run_answer_rules`): name -> (what it
is, the :class:`allocopt.tuner.decide.Tuner` fields it sets; :data:`BEST_RUN_MEAN` sets none and
takes no model)."""

DESIGN: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    BASE: ("the tuner shipped until 2026-12-06 (8 rho levels, one full run per reward system first, at the middle "
           "of rho and G)", lambda: {}),
    "initial-g-in-turn": ("the initial design's runs at the group sizes in turn (shipped before 2026-12-06; the "
                          "variants below change that tuner)", lambda: dict(BEFORE)),
    "finer-rho-grid": ("15 rho levels (every measured level and the midpoints; shipped 8)",
                       lambda: {"rho_levels": 15, **BEFORE}),
    "zoom-in-rho": ("the grid's 8 levels, and midpoints in rho around the best cell as runs come in (down to 1/64 of "
                    "the range)", lambda: {"refine": True, **BEFORE}),
    "no-initial-design": ("no initial design: the knowledge gradient places every run from the prior on (shipped "
                          "2026-12-06 to 2026-12-07)", lambda: {"initial": False}),
    "reward-offset": ("a kernel term per reward system constant in rho (variance 1 s², shipped none), so a run "
                      "moves its reward system's whole curve",
                      lambda: {"grid": HyperGrid(reward_offset=(1.0,)), **BEFORE}),
    "reward-and-group-offsets": ("the same per reward system and per group size (each 1 s²)",
                                 lambda: {"grid": HyperGrid(reward_offset=(1.0,), group_offset=(1.0,)), **BEFORE}),
    "reward-offset-learned": ("the reward system's offset as a hyperparameter the runs weigh: variance 0 or 1 s² "
                              "(the model averages both by their likelihood)",
                              lambda: {"grid": HyperGrid(reward_offset=(0.0, 1.0)), **BEFORE}),
    "kg-for-the-answer": ("the knowledge gradient is the rise of the best mean among the cells the answer may be "
                          "(those run, and the candidate's own), not among every cell",
                          lambda: {"kg_pool": "answer", **BEFORE}),
    "initial-spread-rho": ("the initial design's runs spread over the ρ levels, one per stratum (shipped: the two "
                           "middle levels), the group sizes in turn", lambda: {"layout": "spread-rho"}),
    "deeper-bowl": ("a deeper bowl in ρ in the prior mean (rho_bowl 2, shipped 1), asked again on the tuner as "
                    "shipped", lambda: {"grid": HyperGrid(rho_bowl=2.0)}),
    "noisier": ("noise shares 0.1/0.3/0.6 of the values' variance (shipped 0.02/0.1/0.5), asked again on the tuner "
                "as shipped", lambda: {"grid": HyperGrid(noise_share=(0.1, 0.3, 0.6))}),
    "shorter-lengthscales": ("length scales 0.1/0.2/0.4 of the ρ range (shipped 0.15/0.3/0.6), asked again on the "
                             "tuner as shipped", lambda: {"grid": HyperGrid(lengthscale=(0.1, 0.2, 0.4))}),
    "cell-offset": ("a kernel term per cell (variance 0 or 1 s², weighed by likelihood; shipped none), so a "
                    "cell's replicated runs can outweigh its neighbours",
                    lambda: {"grid": HyperGrid(cell_offset=(0.0, 1.0))}),
    "answer-caution-0.5": ("the answer among the cells run maximizes the posterior mean less 0.5 posterior sd "
                           "(shipped: the mean), so a cell the runs pinned down is preferred",
                           lambda: {"caution": 0.5}),
    "answer-caution-1": ("the same less 1 posterior sd", lambda: {"caution": 1.0}),
    "initial-spread-rho-middle-g": ("the initial design's runs spread over the ρ levels, one per stratum, at the "
                                    "middle group size", lambda: {"layout": "spread-rho-middle-g"}),
    "flat-prior": ("no bowl in ρ in the prior mean (rho_bowl 0, shipped 1), on the tuner as shipped",
                   lambda: {"grid": HyperGrid(rho_bowl=0.0)}),
    "learned-rho-center": ("the prior mean's bowl in ρ centred at 0.2, 0.5 or 0.8 of the range, a hyperparameter "
                           "the runs weigh (shipped: 0.5)", lambda: {"grid": HyperGrid(rho_center=(0.2, 0.5, 0.8))}),
    "no-middle-bet": ("both: the initial design spread over ρ at the middle group size, and a flat prior mean in ρ",
                      lambda: {"layout": "spread-rho-middle-g", "grid": HyperGrid(rho_bowl=0.0)}),
    "initial-wide-middle": ("the initial design's runs at the levels nearest a third and two thirds of the ρ "
                            "levels alternately (the two middle levels until 2026-12-06), at the middle group "
                            "size (shipped since 2026-12-07)",
                            lambda: {"layout": "wide-middle"}),
    "wide-middle-learned-center": ("both: the initial design at a third and two thirds of the ρ levels, and the "
                                   "bowl's centre in ρ at 0.2, 0.5 or 0.8 of the range, weighed by the runs",
                                   lambda: {"layout": "wide-middle",
                                            "grid": HyperGrid(rho_center=(0.2, 0.5, 0.8))}),
    "shallow-bowl": ("a shallower bowl in ρ in the prior mean (rho_bowl 0.5, shipped 1; 0 is flat-prior)",
                     lambda: {"grid": HyperGrid(rho_bowl=0.5)}),
    "top-two": ("after the wide middle design, each run picked by top-two Thompson sampling over the full-budget "
                "cells (the leader of a posterior draw or, half the time, the challenger; shipped: the knowledge "
                "gradient)", lambda: {"layout": "wide-middle", "acquisition": "top-two"}),
    "top-two-no-design": ("top-two Thompson sampling from the first run on, no initial design",
                          lambda: {"initial": False, "acquisition": "top-two"}),
    "kg-placed-design": ("one full run per reward system first, each where the knowledge gradient puts it among "
                         "the cells of the systems not yet run (shipped: fixed places, a third and two thirds of "
                         "the ρ levels at the middle G)", lambda: {"layout": "kg-placed"}),
    "noise-share-0.9": ("the wide middle design (shipped) with a fourth noise share, 0.9 of the values' variance "
                        "(shipped 0.02/0.1/0.5): the measured tables put one run's noise at 0.56-0.99 of it on "
                        "pass@1 and the judge", lambda: {"layout": "wide-middle",
                                                         "grid": HyperGrid(noise_share=(0.02, 0.1, 0.5, 0.9))}),
}
"""The design choices asked against the tuner as shipped (``--design``): the candidate grid, the
initial design and the model's terms, each a change of the shipped tuner (its answer among the
cells run), so ``shipped`` here is that tuner, not :data:`VARIANTS`' base. From
``finer-rho-grid`` to ``kg-for-the-answer`` they change the tuner as it was before its initial
design took the middle group size (:data:`BEFORE`); ``no-initial-design`` has none to place;
``initial-spread-rho`` and the variants after it change the tuner as shipped since."""

KEYS: tuple[str, ...] = ("variant", "world", "truth", "seed", "target", "level", "regret_pct",
                         "regret_pct_common", "regret_pct_oracle")


def run_variant(world: Any, truth_mode: str, seed: int, variant: str, levels: Sequence[float],
                common: bool = False, design: bool = False) -> list[dict[str, Any]]:
    """One replication of ``variant`` (of :data:`DESIGN` if ``design``, else of :data:`VARIANTS`)
    on ``world``: a record per level (:data:`KEYS`)."""
    from benchmarks.tuners.methods.allocopt import run_allocopt
    from benchmarks.tuners.runner import TARGETS
    from benchmarks.tuners.scoring import CommonRule, score
    from benchmarks.tuners.session import Session
    from benchmarks.tuners.truth import truth_for

    target = TARGETS[seed % len(TARGETS)]
    truth = truth_for(world, target, truth_mode, seed, len(TARGETS))
    session = Session(world, truth, seed, max(levels), tuple(levels))
    run_allocopt(session, **({**WITH_DESIGN, **DESIGN[variant][1]()} if design else VARIANTS[variant][1]()))
    rule = CommonRule(world) if common else (lambda full: None)
    return [{"variant": variant, "world": world.name, "truth": truth_mode, "seed": seed, "target": target,
             "level": r["level"], "regret_pct": r["regret_pct"],
             "regret_pct_common": r["regret_pct_common"] if common else math.nan,
             "regret_pct_oracle": r["regret_pct_oracle"]} for r in score(session, "own", truth, rule)]


def run_answer_rules(world: Any, truth_mode: str, seed: int, levels: Sequence[float],
                     rules: Sequence[str] = tuple(ANSWER_RULES),
                     on: Mapping[str, Any] = BEFORE) -> list[dict[str, Any]]:
    """One replication of a tuner on ``world``, each of ``rules``' answers taken on its runs: a
    record per rule and level (:data:`KEYS`, ``variant`` the rule). ``on``: the ``KGTuner``
    settings of the tuner replayed (by default the one the rules were first compared on,
    :data:`BEFORE`; a :data:`DESIGN` variant's settings for another). The runs are one replay, so
    the rules differ only in the answer (their oracle is the same); each answer at a level is made
    from the runs (and the infeasible asks) made by then, as the replay's own answer is, which the
    rule :data:`BASE` reproduces."""
    from benchmarks.tuners.methods.allocopt import make_tuner, run_allocopt
    from benchmarks.tuners.runner import TARGETS
    from benchmarks.tuners.scoring import OWN, own_answer, score
    from benchmarks.tuners.session import EPS, Session
    from benchmarks.tuners.truth import regret_pct, truth_for

    target = TARGETS[seed % len(TARGETS)]
    truth = truth_for(world, target, truth_mode, seed, len(TARGETS))
    session = Session(world, truth, seed, max(levels), tuple(levels))
    run_allocopt(session, **on)
    oracle = {r["level"]: r["regret_pct_oracle"] for r in score(session, "own", truth, lambda full: None)}
    out = []
    for rule in rules:
        kg = make_tuner(Session(world, truth, seed, max(levels), tuple(levels)), **on)
        decide = replace(kg.tuner, **ANSWER_RULES[rule][1])
        for lv in levels:
            evs = [e for e in session.events if e.cost <= lv + EPS]
            kg.refused.clear()
            kg.refused.update((e.allocation, round(e.fraction, 4)) for e in evs if e.value is None)
            obs = kg.observed([observation_of(e) for e in evs if e.value is not None])
            if not any(o.fraction >= 1 for o in obs):
                a = None
            else:
                a = best_run_mean(obs) if rule == BEST_RUN_MEAN else decide.answer(obs).allocation
            if rule == BASE and a != own_answer(session, OWN, lv):  # the same answer, or not the same runs
                raise RuntimeError(f"{world.name} seed {seed} at {lv:g}: the shipped rule answers {a}, "
                                   f"the replay {own_answer(session, OWN, lv)}")
            out.append({"variant": rule, "world": world.name, "truth": truth_mode, "seed": seed, "target": target,
                        "level": lv, "regret_pct": regret_pct(truth, a), "regret_pct_common": math.nan,
                        "regret_pct_oracle": oracle.get(lv, math.nan)})
    return out


def best_run_mean(observed: Sequence[Any]) -> Any:
    """The allocation whose full runs in ``observed`` have the highest mean value (the first of
    a tie, in the order first run)."""
    runs: dict[Any, list[float]] = {}
    for o in observed:
        if o.fraction >= 1:
            runs.setdefault(o.allocation, []).append(o.value)
    return max(runs, key=lambda a: statistics.fmean(runs[a]))


def observation_of(e: Any) -> Any:
    """A replay's trial (:class:`benchmarks.tuners.session.Event`) as the study's tuner reads it."""
    from allocopt.race.data import Observation

    return Observation(0, e.allocation, e.value, math.nan, e.fraction, "full" if e.fraction >= 1 else "pilot")


def _values(records: Iterable[Mapping[str, Any]], rule: str) -> dict[tuple, dict[int, float]]:
    out: dict[tuple, dict[int, float]] = {}
    for r in records:
        v = float(r[rule]) if r[rule] not in ("", None) else math.nan
        if math.isfinite(v):
            out.setdefault((r["variant"], r["world"], r["truth"], float(r["level"])), {})[int(r["seed"])] = v
    return out


def score_on(records: Sequence[Mapping[str, Any]], variant: str, worlds: Sequence[str],
             variants: Sequence[str], rule: str = "regret_pct",
             levels: Sequence[float] = CHOICE_LEVELS, vals: dict | None = None) -> float:
    """Mean over ``worlds``, their truths and ``levels`` of ``variant``'s mean regret over the
    replications every one of ``variants`` has there (NaN when none); ``vals``: the records'
    values, read once by a caller that scores many."""
    vals = _values(records, rule) if vals is None else vals
    truths = sorted({r["truth"] for r in records})
    parts = []
    for w in worlds:
        for t in truths:
            for lv in levels:
                seeds = set.intersection(*(set(vals.get((v, w, t, lv), {})) for v in variants))
                if seeds:
                    parts.append(statistics.fmean(vals[(variant, w, t, lv)][s] for s in seeds))
    return statistics.fmean(parts) if parts else math.nan


def leave_one_world_out(records: Sequence[Mapping[str, Any]], variants: Sequence[str],
                        rule: str = "regret_pct", base: str = BASE,
                        levels: Sequence[float] = CHOICE_LEVELS) -> list[dict[str, Any]]:
    """For each world: the variant chosen on the others (lowest :func:`score_on` at ``levels``;
    ``base``, the shipped design unless said, on a tie), its score there and on the world left
    out, and ``base``'s."""
    worlds = list(dict.fromkeys(r["world"] for r in records))
    order = [base] + [v for v in variants if v != base] if base in variants else list(variants)
    vals = _values(records, rule)
    out = []
    for held in worlds:
        others = [w for w in worlds if w != held]
        if not others:
            continue
        scores = {v: score_on(records, v, others, variants, rule, levels, vals) for v in order}
        pick = min(order, key=lambda v: (scores[v] if math.isfinite(scores[v]) else math.inf, order.index(v)))
        out.append({"held_out": held, "chosen_on": others, "choice": pick, "score_on_others": scores[pick],
                    "scores_on_others": scores,
                    "on_held_out": score_on(records, pick, [held], variants, rule, levels, vals),
                    "shipped_on_held_out": score_on(records, base, [held], variants, rule, levels, vals)
                    if base in variants else math.nan})
    return out


def against_shipped(records: Sequence[Mapping[str, Any]], variants: Sequence[str],
                    rule: str = "regret_pct", base: str = BASE,
                    levels: Sequence[float] = CHOICE_LEVELS) -> list[dict[str, Any]]:
    """Each variant alone against the shipped design, leave one world out: for each variant and
    world left out, the variant's :func:`score_on` the other worlds less the shipped design's
    (below 0: chosen there) and the same difference on the world left out (each pair scored on
    the replications both ran). The menu's choice (:func:`leave_one_world_out`) picks the best of
    many variants on two worlds, a noisy pick; this asks of each one change whether it transfers.
    ``base``: the design each is asked against (the shipped one unless said); ``levels``: the
    score's."""
    worlds = list(dict.fromkeys(r["world"] for r in records))
    vals = _values(records, rule)
    out = []
    for v in variants:
        if v == base:
            continue
        pair = [base, v]
        for held in worlds:
            others = [w for w in worlds if w != held]
            if not others:
                continue

            def diff(ws: list[str]) -> float:
                return (score_on(records, v, ws, pair, rule, levels, vals)
                        - score_on(records, base, ws, pair, rule, levels, vals))

            out.append({"variant": v, "held_out": held, "on_others": diff(others), "on_held_out": diff([held])})
    return out


def _base_name(base: str) -> str:
    return "the shipped design" if base == BASE else f"`{base}`"


def _against_shipped_lines(records: Sequence[Mapping[str, Any]], variants: Sequence[str], at: str,
                           base: str = BASE, levels: Sequence[float] = CHOICE_LEVELS) -> list[str]:
    rows = against_shipped(records, variants, base=base, levels=levels)
    held = list(dict.fromkeys(r["held_out"] for r in rows))
    lines = ["", f"**Each change alone against {_base_name(base)}, leave one world out** (difference in the score, "
             f"mean own regret at {at} runs, both truths; below 0 the change is lower: on the other worlds it is "
             "chosen, on the world left out it transfers)", "",
             "| variant | " + " | ".join(f"{h} left out: others / {h}" for h in held) + " | folds where it is chosen, "
             "and of those where it is lower on the world left out |", "|---|" + "---|" * (len(held) + 1)]
    for v in dict.fromkeys(r["variant"] for r in rows):
        cells = [r for r in rows if r["variant"] == v]
        good = sum(1 for r in cells if r["on_others"] < 0 and r["on_held_out"] < 0)
        chosen = sum(1 for r in cells if r["on_others"] < 0)
        lines.append(f"| {v} | " + " | ".join(f"{r['on_others']:+.2f} / {r['on_held_out']:+.2f}" for r in cells)
                     + f" | chosen in {chosen} of {len(cells)}; lower where left out in {good} of those |")
    return lines


PAIRED_SPANS: tuple[tuple[float, ...], ...] = ((4.0,), (8.0, 12.0, 16.0), (24.0, 40.0))
"""The compute levels pooled in :func:`paired_lines`."""


def paired_lines(records: Sequence[Mapping[str, Any]], variants: Sequence[str], world: str | None = None,
                 base: str = BASE, score_levels: Sequence[float] = CHOICE_LEVELS) -> list[str]:
    """Markdown: each variant against ``base`` (the shipped design unless said) over every world
    (``world``: that one alone), truth and replication both ran, per span of
    :data:`PAIRED_SPANS` (and the span of ``score_levels`` when it is not one of them): the mean
    own regret of each, the pairs where the variant is lower and higher, and the two-sided
    Wilcoxon signed-rank p (:func:`benchmarks.tuners.stats.paired`)."""
    from benchmarks.tuners.stats import paired

    vals = {k: v for k, v in _values(records, "regret_pct").items() if world in (None, k[1])}
    extra = () if tuple(score_levels) in PAIRED_SPANS else (tuple(score_levels),)
    spans = [s for s in PAIRED_SPANS + extra if any(k[3] in s for k in vals)]
    head = " | ".join(f"{s[0]:g}–{s[-1]:g} runs" if len(s) > 1 else f"{s[0]:g} runs" for s in spans)
    lines = ["", f"**Each change against {_base_name(base)}, paired{' on ' + world + ' alone' if world else ''}** "
             f"(mean own regret {'shipped' if base == BASE else base} → change; pairs lower / higher; Wilcoxon p)",
             "", f"| variant | {head} |", "|---|" + "---|" * len(spans)]
    for v in variants:
        if v == base:
            continue
        cells = []
        for span in spans:
            pairs = [(vals[k][seed], vals[(v,) + k[1:]][seed]) for k in vals if k[0] == base and k[3] in span
                     for seed in vals[k] if seed in vals.get((v,) + k[1:], {})]
            d = [b - a for a, b in pairs]
            if not pairs:
                cells.append("–")
                continue
            p = paired([b for _, b in pairs], [a for a, _ in pairs])["p"]
            before, after = statistics.fmean(a for a, _ in pairs), statistics.fmean(b for _, b in pairs)
            lower, higher = sum(x < 0 for x in d), sum(x > 0 for x in d)
            cells.append(f"{before:.2f} → {after:.2f}; {lower} / {higher}; p = {p:.2g}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


def tables(records: Sequence[Mapping[str, Any]], variants: Sequence[str],
           levels: Sequence[float] = (8.0, 16.0, 40.0), about: Mapping[str, str] | None = None,
           choices: bool = True, per_world: Sequence[str] = (), base: str = BASE,
           score_levels: Sequence[float] = CHOICE_LEVELS) -> str:
    """Markdown: what the table holds (``about``: each variant's description), each variant's
    mean own regret per world and truth at ``levels``, its oracle beside it, then the
    leave-one-world-out choices (``choices=False``, worlds that choose nothing, such as the
    synthetic ones: not these), and each change paired against ``base``, the shipped design unless
    said (:func:`paired_lines`), over every world and on each of ``per_world`` alone; the choices
    score the mean at ``score_levels``."""
    vals, orc = _values(records, "regret_pct"), _values(records, "regret_pct_oracle")
    worlds = list(dict.fromkeys((r["world"], r["truth"]) for r in records))
    reps = [len(set.intersection(*(set(vals.get((v, w, t, lv), {})) for v in variants)))
            for w, t in worlds for lv in levels]
    head = " | ".join(f"{w}/{t} at {', '.join(f'{lv:g}' for lv in levels)}" for w, t in worlds)
    n = f"{min(reps, default=0)}" if min(reps, default=0) == max(reps, default=0) else \
        f"{min(reps, default=0)}–{max(reps, default=0)}"
    said = {"seedmean": "`seedmean`: the truth is the mean of a cell's measured seeds (a synthetic world's: its "
                        "noise-free response)", "heldout": "`heldout`: one seed is the truth and runs draw the others"}
    truths = "; ".join(said[t] for t in dict.fromkeys(t for _, t in worlds) if t in said)
    lines = [f"Each variant replayed on every world and truth ({n} paired replication{'' if n == '1' else 's'} "
             f"each; {truths}). Regret: the truth's best less the truth of the answer, in % of its range "
             "over the cells (0: the best cell); the oracle, in brackets, is the best truth among the full runs "
             "made.", ""]
    lines += [f"* `{v}`: {about[v]}" for v in variants if about and v in about] + ([""] if about else [])
    lines += ["**Mean regret, % of range — own rule (oracle in brackets), replications every variant ran**", "",
              f"| variant | {head} |", "|---|" + "---|" * len(worlds)]
    for v in variants:
        cells = []
        for w, t in worlds:
            parts = []
            for lv in levels:
                seeds = set.intersection(*(set(vals.get((u, w, t, lv), {})) for u in variants))
                if not seeds:
                    parts.append("–")
                    continue
                m = statistics.fmean(vals[(v, w, t, lv)][s] for s in seeds)
                o = statistics.fmean(orc.get((v, w, t, lv), {}).get(s, math.nan) for s in seeds)
                parts.append(f"{m:.1f} ({o:.1f})")
            cells.append(" / ".join(parts))
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    if choices:
        lines += _choice_lines(records, variants, list(dict.fromkeys(w for w, _ in worlds)), vals, base,
                               score_levels)
    if base in variants:
        lines += paired_lines(records, variants, base=base, score_levels=score_levels)
        for w in per_world:
            lines += paired_lines(records, variants, w, base, score_levels)
    return "\n".join(lines) + "\n"


def _choice_lines(records: Sequence[Mapping[str, Any]], variants: Sequence[str], names: Sequence[str],
                  vals: dict, base: str = BASE, levels: Sequence[float] = CHOICE_LEVELS) -> list[str]:
    """Markdown: each variant's score per world, the leave-one-world-out choices and each change
    alone against ``base`` (:func:`tables`' part for worlds that choose)."""
    at = ", ".join(f"{lv:g}" for lv in levels)
    lines = ["", f"**Score on each world** (mean own regret at {at} runs, both truths; what the choices below compare)",
             "", "| variant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(f"{score_on(records, v, [w], variants, levels=levels, vals=vals):.2f}"
                                                for w in names) + " |")
    lines += ["", f"**Leave one world out** (score: mean own regret at {at}"
              " runs, both truths)", "", "| left out | chosen on | choice | its score there | on the world left out "
              f"| {_base_name(base)} there |", "|---|---|---|---|---|---|"]
    for c in leave_one_world_out(records, variants, base=base, levels=levels):
        lines.append(f"| {c['held_out']} | {', '.join(c['chosen_on'])} | {c['choice']} | {c['score_on_others']:.2f} "
                     f"| {c['on_held_out']:.2f} | {c['shipped_on_held_out']:.2f} |")
    if base in variants:
        lines += _against_shipped_lines(records, variants, at, base, levels)
    return lines


__all__ = ["ANSWER_RULES", "BASE", "BEFORE", "BEST_RUN_MEAN", "CHOICE_LEVELS", "DESIGN", "KEYS", "PAIRED_SPANS", "VARIANTS", "WITH_DESIGN",
           "against_shipped", "leave_one_world_out", "paired_lines", "best_run_mean", "observation_of", "run_answer_rules", "run_variant", "score_on",
           "tables"]
