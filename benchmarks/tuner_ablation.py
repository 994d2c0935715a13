"""Ablate allocopt's tuner on measured worlds (each change chosen leave-one-world-out) or on synthetic ones.

    python benchmarks/tuner_ablation.py --tables A.csv B.csv [C.csv] [--seeds 50]
        [--variants shipped,answer-among-tried,...] [--common] [--nice 10] [--out DIR]
    python benchmarks/tuner_ablation.py --tables A.csv B.csv C.csv --answer-rules [--on VARIANT] [--out DIR]
    python benchmarks/tuner_ablation.py --tables A.csv B.csv C.csv --design [--against initial-wide-middle] [--out DIR]
    python benchmarks/tuner_ablation.py --synthetic all --design --variants shipped,... [--seeds 10]

``--answer-rules``: the rules of :data:`benchmarks.tuners.ablation.ANSWER_RULES` instead, each
taken on the same runs of the shipped tuner (one replay per world, truth and seed,
:func:`benchmarks.tuners.ablation.run_answer_rules`), to ``DIR/answer_rules.csv`` and
``DIR/answer_rules.md``; ``--on VARIANT`` takes them on the runs of a ``--design`` variant (e.g.
``initial-wide-middle``, the tuner as shipped) instead of the tuner they were first compared on.
``--design``: the changes of :data:`benchmarks.tuners.ablation.DESIGN` (the candidate grid, the
initial design) to today's shipped tuner instead, to ``DIR/design.csv`` and ``DIR/design.md``.

``--synthetic NAMES`` (``all``, or names of ``objectives/synthetic.py``'s variants) replays on the
synthetic worlds instead of tables, a regression check only (their truth is the noise-free
response: the seed-mean truth only): to ``DIR/<stem>_synthetic.csv`` and ``.md``, each change
paired against the shipped design, no choice made.

Each table (the grid runner's format) is one world. Every variant of
:data:`benchmarks.tuners.ablation.VARIANTS` is replayed ``--seeds`` paired replications per
world and truth (seed-mean and held-out seed), as the judge replays ``allocopt``
(``benchmarks/optimizers.py``), one process at ``--nice``. Records are appended to
``DIR/ablation.csv`` as each replication ends (a rerun skips what is there); at the end
``DIR/ablation.md`` holds each variant's mean regret at 8 / 16 / 40 runs and the choice made on
each set of worlds with its result on the world left out (:mod:`benchmarks.tuners.ablation`),
also printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tuners.ablation import (ANSWER_RULES, BASE, CHOICE_LEVELS, DESIGN, KEYS,  # noqa: E402
                                        VARIANTS, WITH_DESIGN, run_answer_rules, run_variant, tables)
from allocopt.errors import ConfigError  # noqa: E402
from benchmarks.tuners.records import append_rows, read_rows  # noqa: E402
from benchmarks.tuners.runner import LEVELS, world_of  # noqa: E402
from benchmarks.tuners.truth import truths_of  # noqa: E402
from benchmarks.tuners.cli import tables_refusal  # noqa: E402


def _synthetic(names: str | None) -> list[str] | str:
    """The synthetic worlds ``--synthetic`` names, or one line saying what is allowed."""
    from objectives.synthetic import VARIANTS as SYNTHETIC

    got = list(SYNTHETIC) if names == "all" else [n.strip() for n in (names or "").split(",") if n.strip()]
    unknown = [n for n in got if n not in SYNTHETIC]
    if unknown or not got:
        return f"synthetic={unknown[0] if unknown else names!r}: allowed: all, or some of {', '.join(SYNTHETIC)}"
    return got


def _refusal(variants: list[str], tables: list[Path], seeds: int, allowed: dict = VARIANTS,
             mode: str = "", synthetic: str | None = None) -> str | None:
    """One line for a bad flag, or None; ``mode``: the flag that chose ``allowed`` ("" for none)."""
    unknown = [v for v in variants if v not in allowed]
    if unknown or not variants:
        return (f"--variants={unknown[0] if unknown else ''!r}: allowed{' with ' + mode if mode else ''}: "
                f"{', '.join(allowed)}")
    if seeds < 1:
        return f"--seeds={seeds!r}: must be >= 1"
    if synthetic is not None:
        if tables:
            return "tables: give --tables or --synthetic, not both"
        got = _synthetic(synthetic)
        return got if isinstance(got, str) else None
    bad = tables_refusal(tables)
    if bad:
        return bad
    if len(tables) < 2:
        return (f"--tables={[str(t) for t in tables]!r}: give two or more worlds (one table each; a choice is made "
                "on the others and reported on the one left out; the measured ones: benchmarks/tiny_grid*/trials.csv), "
                "or --synthetic NAMES for the synthetic worlds")
    return None


def _score_levels(text: str) -> tuple[tuple[float, ...], str | None]:
    """``--score-levels``' levels, or the one line saying what is allowed."""
    bad = f"--score-levels={text!r}: give comma-separated levels from {', '.join(f'{lv:g}' for lv in LEVELS)}"
    try:
        levels = tuple(sorted({float(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        return (), bad
    return (levels, None) if levels and all(lv in LEVELS for lv in levels) else ((), bad)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, default=[], help="one measured table per world")
    ap.add_argument("--synthetic", metavar="NAMES",
                    help="replay on synthetic worlds instead (all, or comma-separated names): a regression check")
    ap.add_argument("--seeds", type=int, default=50, help="replications per world and truth (default 50)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, from {', '.join(VARIANTS)} (with --design: from "
                         f"{', '.join(DESIGN)}; with --answer-rules: from {', '.join(ANSWER_RULES)}; "
                         "default: every one)")
    ap.add_argument("--common", action="store_true", help="also score the common rule (a GP fit per level)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--answer-rules", action="store_true",
                      help="compare the answer rules on the same runs instead (the rules: see --variants)")
    mode.add_argument("--design", action="store_true",
                      help="the candidate grid, initial design and model terms instead, each against the variant "
                           "'shipped': the tuner shipped until 2026-12-06, with its middle initial design (today's "
                           "tuner is the variant initial-wide-middle: give --against initial-wide-middle to pair "
                           "with it; the variants: see --variants)")
    ap.add_argument("--on", metavar="VARIANT",
                    help="with --answer-rules: the tuner whose runs the rules are taken on, a --design variant "
                         "(initial-wide-middle is the tuner as shipped since 2026-12-07; the variant named shipped is "
                         "the one shipped until 2026-12-06); default: the tuner of 2026-12-05 the rules were first "
                         "compared on")
    ap.add_argument("--paired-on", metavar="WORLD", action="append", default=[],
                    help="also the paired table on this world alone (a world: its table's folder, tiny_grid dropped, "
                         "e.g. small_1e11); repeat it for more")
    ap.add_argument("--against", metavar="VARIANT", default=BASE,
                    help="the variant each other one is paired and chosen against in the tables (default shipped; "
                         "e.g. initial-wide-middle with --design: the tuner as shipped since 2026-12-07)")
    ap.add_argument("--score-levels", metavar="LEVELS", default=",".join(f"{lv:g}" for lv in CHOICE_LEVELS),
                    help="comma-separated compute levels (full runs) the choices' score is the mean over, each one "
                         "the replay records (4, 8, 12, 16, 24, 40; default "
                         + ",".join(f"{lv:g}" for lv in CHOICE_LEVELS) + ")")
    ap.add_argument("--nice", type=int, default=10, help="niceness added to this process (default 10)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/tuner_results/ablation"),
                    help="folder of the CSV (resumed) and the markdown tables (default benchmarks/tuner_results/ablation)")
    a = ap.parse_args(argv)
    allowed = ANSWER_RULES if a.answer_rules else DESIGN if a.design else VARIANTS
    given = a.variants if a.variants != ",".join(VARIANTS) else ",".join(allowed)
    variants = [v.strip() for v in given.split(",") if v.strip()]
    error = (f"--against={a.against!r}: must be one of --variants ({', '.join(variants)})"
             if a.against != BASE and a.against not in variants else None)
    error = error or _refusal(variants, a.tables, a.seeds, allowed,
                     "--answer-rules" if a.answer_rules else "--design" if a.design else "", a.synthetic)
    if not error and a.on is not None:
        error = ("--on: give it with --answer-rules" if not a.answer_rules else
                 f"--on={a.on!r}: allowed: {', '.join(DESIGN)}" if a.on not in DESIGN else None)
    levels, error = _score_levels(a.score_levels) if not error else ((), error)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if a.nice:
        os.nice(a.nice)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        worlds = ([world_of(n) for n in _synthetic(a.synthetic)] if a.synthetic is not None
                  else [world_of("tiny-table", (str(t),)) for t in a.tables])
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = [w.name for w in worlds]
    unknown = [w for w in a.paired_on if w not in names]
    if unknown:
        print(f"error: --paired-on={unknown[0]!r}: not a world of this run; its worlds: {', '.join(names)}",
              file=sys.stderr)
        return 2
    if len(set(names)) < len(names):
        same = next(n for n in names if names.count(n) > 1)
        print(f"error: --tables={[str(t) for t in a.tables]!r}: two tables are world {same!r} (a world is named by "
              "its table's folder); give tables of different worlds", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    stem = ("answer_rules" if a.answer_rules else "design" if a.design else "ablation") \
        + ("_synthetic" if a.synthetic is not None else "")
    path = a.out / f"{stem}.csv"
    done = {(r["variant"], r["world"], r["truth"], int(r["seed"])) for r in read_rows(path)}
    todo = [(s, w, t, v) for s in range(a.seeds) for w in worlds for t in truths_of(w)
            for v in (["rules"] if a.answer_rules else variants)
            if any((u, w.name, t, s) not in done for u in (variants if a.answer_rules else [v]))]
    on = {} if a.on is None else {"on": {**WITH_DESIGN, **DESIGN[a.on][1]()}}
    t0 = time.perf_counter()
    for k, (s, w, t, v) in enumerate(todo, 1):
        rows = (run_answer_rules(w, t, s, LEVELS, variants, **on) if a.answer_rules
                else run_variant(w, t, s, v, LEVELS, common=a.common, design=a.design))
        append_rows(path, KEYS, rows)
        if k % 20 == 0 or k == len(todo):
            spent = time.perf_counter() - t0
            print(f"  [{k}/{len(todo)}] {spent:.0f} s, about {spent / k * (len(todo) - k) / 60:.0f} min left",
                  file=sys.stderr, flush=True)
    about = {k: v[0] for k, v in allowed.items()}
    text = tables(read_rows(path), variants, about=about, choices=a.synthetic is None, per_world=a.paired_on,
                  base=a.against, score_levels=levels)
    (a.out / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
