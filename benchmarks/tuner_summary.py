"""Where allocopt's median (or mean) regret is the lowest: one row per measured world, truth and rule.

Reads the judge's records (``benchmarks/tuner_results/<world>/results.csv``, one folder per
world) and prints, at each compute level, allocopt's median regret and the lowest median of the
other methods beside it (which one, when it is lower), the numbers the bar of the tuner's issue
asks about ("the lowest median of all methods at every level, under its own rule and under the
common rule"). allocopt's own ablation rows (``allocopt-pilots``, ``allocopt-design``,
``allocopt-no-design``) are not peers and are left out of the comparison; a method whose replications at a level are fewer than
allocopt's is compared on the medians it has (the tables of each world say how many it ran).

    python benchmarks/tuner_summary.py --results benchmarks/tuner_results/{tiny,small,medium}
        [--levels 8,12,16,24,40] [--statistic median|mean] [--rules own,common,oracle] [--out summary.md]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.tuners.methods import OWN_ABLATIONS  # noqa: E402

OURS = "allocopt"
NOT_PEERS = (OURS, *OWN_ABLATIONS)
COLUMNS = {"own": "regret_pct", "common": "regret_pct_common", "oracle": "regret_pct_oracle"}
"""The rules a row may be of: the method's own answer, the common rule's, and the oracle's (the
best truth among the points the method ran: how good its search was, whatever it answers)."""
RULES = (("own", "regret_pct"), ("common", "regret_pct_common"))
STATISTICS = {"median": statistics.median, "mean": statistics.fmean}


def medians(rows: list[dict[str, str]], truth: str, column: str,
            stat: str = "median") -> dict[tuple[str, float], float]:
    """``(method, level) -> median of column`` (``stat``: or another of :data:`STATISTICS`) over
    the rows of ``truth`` (NaN values left out), grouped as the judge's own tables group them."""
    from benchmarks.tuners.report import group_records

    out = {}
    for (_, t, method, level), rs in group_records(rows).items():
        v = [float(r[column]) for r in rs if r.get(column) not in (None, "")]
        v = [x for x in v if math.isfinite(x)]
        if t == truth and v:
            out[(method, level)] = STATISTICS[stat](v)
    return out


def cell(med: dict[tuple[str, float], float], level: float, us: str = OURS) -> str:
    """``ours / best peer`` at ``level``, the peer named where it is lower; ``–`` without ours
    (``us``: the method judged, ``allocopt`` or one of its ablation rows)."""
    ours = med.get((us, level))
    peers = {m: v for (m, lv), v in med.items() if lv == level and m not in NOT_PEERS}
    if ours is None:
        return "–"
    if not peers:
        return f"{ours:.1f}"
    best = min(peers, key=lambda m: (peers[m], m))
    return f"**{ours:.1f}** / {peers[best]:.1f}" if ours <= peers[best] else f"{ours:.1f} / {peers[best]:.1f} {best}"


def summary(folders: list[Path], levels: list[float], us: str = OURS,
            rules: tuple[tuple[str, str], ...] = RULES, stat: str = "median") -> tuple[str, int, int]:
    """The markdown table, and how many (world, truth, rule, level) cells allocopt is lowest in
    and how many there are (``rules``: ``(name, column)`` pairs; ``stat``: of :data:`STATISTICS`)."""
    head = " | ".join(f"{lv:g} runs" for lv in levels)
    lines = ["| world | truth | rule | " + head + " |", "|---|---|---|" + "---|" * len(levels)]
    lowest = total = 0
    for folder in folders:
        with (folder / "results.csv").open() as f:
            rows = list(csv.DictReader(f))
        world = rows[0]["world"] if rows else folder.name
        for truth in sorted({r["truth"] for r in rows}, reverse=True):
            for rule, column in rules:
                med = medians(rows, truth, column, stat)
                cells = [cell(med, lv, us) for lv in levels]
                lowest += sum(c.startswith("**") for c in cells)
                total += sum(c != "–" for c in cells)
                lines.append(f"| {world} | {truth} | {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", lowest, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", nargs="+", type=Path, required=True,
                    help="one folder per world, each holding the judge's results.csv")
    ap.add_argument("--levels", default="8,12,16,24,40", help="compute levels, full runs (default 8,12,16,24,40)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--method", default=OURS, choices=NOT_PEERS,
                    help="the row judged against the peers (default allocopt; or one of its ablation rows)")
    ap.add_argument("--statistic", default="median", choices=tuple(STATISTICS),
                    help="what each cell compares: the median regret (the tuner's bar; default) or the mean")
    ap.add_argument("--rules", default="own,common",
                    help="comma-separated, from own, common, oracle (default own,common; oracle: the best "
                         "truth among the points each method ran)")
    a = ap.parse_args(argv)
    names = [x.strip() for x in a.rules.split(",") if x.strip()]
    if not names or any(n not in COLUMNS for n in names) or len(set(names)) < len(names):
        print(f"error: --rules={a.rules!r}: give comma-separated names from {', '.join(COLUMNS)}, each once",
              file=sys.stderr)
        return 2
    if len(set(map(str, a.results))) < len(a.results):
        print(f"error: --results: {next(str(p) for p in a.results if a.results.count(p) > 1)!r} is given twice; "
              "give each world's folder once", file=sys.stderr)
        return 2
    if a.out is not None and not a.out.parent.is_dir():
        print(f"error: --out={str(a.out)!r}: its folder does not exist", file=sys.stderr)
        return 2
    bad = next((p for p in a.results if not (p / "results.csv").is_file()), None)
    if bad is not None:
        print(f"error: --results={str(bad)!r}: no results.csv there; give folders the judge wrote "
              "(python benchmarks/optimizers.py ... --out DIR)", file=sys.stderr)
        return 2
    try:
        levels = [float(x) for x in a.levels.split(",")]
    except ValueError:
        levels = []
    if not levels or any(not math.isfinite(lv) or lv <= 0 for lv in levels) or len(set(levels)) < len(levels):
        print(f"error: --levels={a.levels!r}: must be positive numbers, comma-separated, each once (e.g. 8,12,16)",
              file=sys.stderr)
        return 2
    text, lowest, total = summary(a.results, levels, a.method, tuple((n, COLUMNS[n]) for n in names), a.statistic)
    if total == 0:
        print(f"error: --results: no {a.method} rows at the levels {a.levels} in these folders; the judge "
              "records the levels 4, 8, 12, 16, 24, 40", file=sys.stderr)
        return 2
    text += (f"\n{a.method}'s {a.statistic} is the lowest (bold; beside it the lowest other {a.statistic}, named "
             f"where it is lower) in {lowest} of {total} world × truth × rule × level cells.\n")
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
