"""Tables of a benchmark's records, in Markdown: what the docs page shows, regenerated.

Per world and truth: the median regret [interquartile range] per method and level under each
rule (own, common, oracle), the mean [95 % bootstrap interval] under the own and common rules,
allocopt's paired win rate and Wilcoxon p against each peer at the paired levels, and the
method with the lowest median at each level (where a peer beats allocopt, it says so). Every
number is a statistic of :mod:`benchmarks.tuners.stats` over the records' replications.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from benchmarks.tuners import methods as registry
from objectives.synthetic import VARIANTS
from benchmarks.tuners.stats import describe, paired

RULE_COLUMNS = {"own": "regret_pct", "common": "regret_pct_common", "oracle": "regret_pct_oracle"}
RULE_TITLES = {"own": "own rule (each method's recommendation)",
               "common": "common rule (one GP posterior-mean argmax over each method's full runs)",
               "oracle": "oracle (best true value among the full runs made)"}
TRUTH_TITLES = {"seedmean": "truth: the seed-mean", "heldout": "truth: a held-out seed"}
PAIRED_LEVELS: tuple[float, ...] = (4.0, 8.0, 12.0, 16.0)
REFERENCE = "allocopt"


def group_records(records: Sequence[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault((r["world"], r["truth"], r["method"], float(r["level"])), []).append(r)
    return out


def ordered(records: Sequence[dict[str, Any]], key: str) -> list[str]:
    seen = list(dict.fromkeys(r[key] for r in records))
    if key == "method":
        return [m for m in registry.METHODS if m in seen] + [m for m in seen if m not in registry.METHODS]
    return seen


def _fmt(x: float, digits: int = 1) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _cell(d: dict[str, float], runs: int, kind: str) -> str:
    if d["n"] == 0:
        return "—"
    body = (f"{_fmt(d['median'])} [{_fmt(d['q1'])}, {_fmt(d['q3'])}]" if kind == "median"
            else f"{_fmt(d['mean'])} [{_fmt(d['mean_lo'])}, {_fmt(d['mean_hi'])}]")
    return body if d["n"] == runs else f"{body} (n={d['n']})"


def stat_table(records: Sequence[dict[str, Any]], world: str, truth: str, rule: str, kind: str = "median") -> str:
    """A Markdown table: one row a method, one column a level."""
    g = group_records(records)
    levels = sorted({float(r["level"]) for r in records})
    lines = ["| method | replications | " + " | ".join(f"{c:g}" for c in levels) + " |",
             "|---|---|" + "---|" * len(levels)]
    for m in ordered(records, "method"):
        cells = []
        for c in levels:
            rs = g.get((world, truth, m, c), [])
            cells.append(_cell(describe([r[RULE_COLUMNS[rule]] for r in rs]), len(rs), kind) if rs else "—")
        n = len({(r["seed"], r["target"]) for r in records
                 if (r["world"], r["truth"], r["method"]) == (world, truth, m)})
        lines.append(f"| {registry.label(m)} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _by_seed(records: Sequence[dict[str, Any]], world: str, truth: str, method: str, level: float,
             col: str) -> dict[tuple, float]:
    return {(r["seed"], r["target"]): r[col] for r in records
            if r["world"] == world and r["truth"] == truth and r["method"] == method and float(r["level"]) == level}


def paired_table(records: Sequence[dict[str, Any]], world: str, truth: str, rule: str) -> str:
    """allocopt against each peer: win rate (Wilcoxon p, pairs) at :data:`PAIRED_LEVELS`."""
    col = RULE_COLUMNS[rule]
    levels = [c for c in PAIRED_LEVELS if any(float(r["level"]) == c for r in records)]
    lines = ["| allocopt against | " + " | ".join(f"{c:g}" for c in levels) + " |", "|---|" + "---|" * len(levels)]
    for m in ordered(records, "method"):
        if m == REFERENCE:
            continue
        cells = []
        for c in levels:
            mine = _by_seed(records, world, truth, REFERENCE, c, col)
            theirs = _by_seed(records, world, truth, m, c, col)
            both = sorted(set(mine) & set(theirs))
            p = paired([mine[k] for k in both], [theirs[k] for k in both])
            cells.append("—" if not p["n"] else f"{p['win_rate']:.2f} (p={p['p']:.2g}, n={p['n']})")
        lines.append(f"| {registry.label(m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def leaders(records: Sequence[dict[str, Any]], world: str, truth: str, rule: str) -> str:
    """One line: the method with the lowest median at each level, and where a peer beats allocopt."""
    g = group_records(records)
    col = RULE_COLUMNS[rule]
    levels = sorted({float(r["level"]) for r in records})
    lead, beaten = [], []
    for c in levels:
        meds = {m: describe([r[col] for r in g.get((world, truth, m, c), [])])["median"]
                for m in ordered(records, "method")}
        meds = {m: v for m, v in meds.items() if not math.isnan(v)}
        if not meds:
            continue
        best = min(meds.values())
        lead.append(f"{c:g}: " + ", ".join(registry.label(m) for m, v in meds.items() if v == best) + f" ({best:.1f})")
        if REFERENCE in meds:
            better = [registry.label(m) for m, v in meds.items() if v < meds[REFERENCE]]
            if better:
                beaten.append(f"{c:g} ({', '.join(better)})")
    text = "Lowest median at each level: " + "; ".join(lead) + "."
    if any(r["method"] == REFERENCE for r in records):
        text += (" Peers with a lower median than allocopt at: " + "; ".join(beaten) + "." if beaten
                 else " No peer has a lower median than allocopt at any level.")
    return text


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """Every table of the records (module docstring), world by world, truth by truth."""
    out = []
    for world in ordered(records, "world"):
        for truth in ordered([r for r in records if r["world"] == world], "truth"):
            rs = [r for r in records if r["world"] == world and r["truth"] == truth]
            n = len({(r["seed"], r["target"]) for r in rs})
            out.append(f"### {world}, {TRUTH_TITLES.get(truth, truth)} (up to {n} replications a method)\n")
            for rule in ("own", "common", "oracle"):
                out.append(f"**Median regret [IQR], % of range — {RULE_TITLES[rule]}**\n")
                out.append(stat_table(rs, world, truth, rule))
                out.append("\n" + leaders(rs, world, truth, rule) + "\n")
            for rule in ("own", "common"):
                out.append(f"**Mean regret [95 % bootstrap interval], % of range — {rule} rule**\n")
                out.append(stat_table(rs, world, truth, rule, kind="mean") + "\n")
            if any(r["method"] == REFERENCE for r in rs):
                for rule in ("own", "common"):
                    out.append(f"**allocopt's paired win rate against each peer (Wilcoxon signed-rank p, "
                               f"pairs) — {rule} rule**\n")
                    out.append(paired_table(rs, world, truth, rule) + "\n")
    errors = sorted({(r["method"], r["world"], r["error"]) for r in records if r.get("error")})
    for m, w, e in errors:
        k = len({(r["seed"], r["truth"]) for r in records if (r["method"], r["world"], r.get("error")) == (m, w, e)})
        out.append(f"FAILED {registry.label(m)} on {w} ({k} run(s)): {e}\n")
    for m, w, note in sorted({(r["method"], r["world"], r["note"]) for r in records if r.get("note")}):
        out.append(f"note: {registry.label(m)} on {w}: {note}\n")
    return "\n".join(out)


def bar_verdict(records: Sequence[dict[str, Any]], levels: Sequence[float] = (8, 12, 16, 24, 40)) -> str:
    """The issue's bar for allocopt, per world, truth and rule: the lowest median of all methods
    at every level of ``levels`` (and, on a table, <= 3 % at 16 runs; on a synthetic world,
    <= 1 % by 40); its own ablation rows (:data:`~benchmarks.tuners.methods.OWN_ABLATIONS`) are
    not peers. A level no record reaches (``--levels`` left it out) is named as not run:
    the verdict covers the levels run only ("YES at 8 (12, 16, 24, 40 not run)"; with none of
    them run, "not judged")."""
    g = group_records(records)
    peers = [m for m in ordered(records, "method") if m != REFERENCE and m not in registry.OWN_ABLATIONS]
    run = {float(r["level"]) for r in records}
    lines = []
    for world in ordered(records, "world"):
        for truth in ordered([r for r in records if r["world"] == world], "truth"):
            for rule in ("own", "common"):
                def med(m: str, c: float) -> float:
                    return describe([r[RULE_COLUMNS[rule]] for r in g.get((world, truth, m, float(c)), [])])["median"]

                mine = {c: med(REFERENCE, c) for c in (*levels, 16, 40)}
                lost = [f"{c:g}" for c in levels if float(c) in run
                        and (math.isnan(mine[c]) or any(med(m, c) < mine[c] for m in peers))]
                absent = [f"{c:g}" for c in levels if float(c) not in run]
                at, limit = (40, 1) if world in VARIANTS else (16, 3)
                need = f"<= {limit} % {'by' if at == 40 else 'at'} {at}"
                target = (f"{need}: not run" if float(at) not in run else
                          f"{need}: {'YES' if mine[at] <= limit else 'NO'} ({_fmt(mine[at])} %)")
                ran = [f"{c:g}" for c in levels if float(c) in run]
                won = ("NO (not at " + ", ".join(lost) + ")" if lost else "YES" if not absent
                       else f"YES at {', '.join(ran)}" if ran else "not judged")
                if absent:
                    won += f" ({', '.join(absent)} not run)"
                lines.append(f"  {world} / {truth} / {rule}: lowest median at "
                             f"{', '.join(f'{c:g}' for c in levels)}: {won}; {target}")
    return "Bar (allocopt):\n" + "\n".join(lines)
