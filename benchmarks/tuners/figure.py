"""The figure of a benchmark: regret against compute, one panel per truth and rule.

Per world one PNG: rows are the truths (seed-mean, held-out seed), columns the rules (own,
common, oracle); each method a line of its median regret (% of the range) over the
replications with a band from the first to the third quartile; compute (full-run
equivalents, pilots included) on a log axis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from benchmarks.tuners import methods as registry
from benchmarks.tuners.report import RULE_COLUMNS, TRUTH_TITLES, group_records, ordered
from benchmarks.tuners.stats import describe


def plot(records: Sequence[dict[str, Any]], world: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rs = [r for r in records if r["world"] == world]
    truths = ordered(rs, "truth")
    g = group_records(rs)
    levels = sorted({float(r["level"]) for r in rs})
    fig, axes = plt.subplots(len(truths), 3, figsize=(13, 3.6 * len(truths)), squeeze=False, sharey=True)
    for i, truth in enumerate(truths):
        for j, rule in enumerate(("own", "common", "oracle")):
            ax = axes[i][j]
            for k, m in enumerate(ordered(rs, "method")):
                pts = [(c, describe([r[RULE_COLUMNS[rule]] for r in g.get((world, truth, m, c), [])])) for c in levels]
                pts = [(c, d) for c, d in pts if d["n"] and not math.isnan(d["median"])]
                if not pts:
                    continue
                xs = [c for c, _ in pts]
                # past 10 methods the default colours repeat: the second round of them is dashed
                line, = ax.plot(xs, [d["median"] for _, d in pts], marker="o", ms=3, label=registry.label(m),
                                color=f"C{k % 10}", linestyle="-" if k < 10 else "--")
                ax.fill_between(xs, [d["q1"] for _, d in pts], [d["q3"] for _, d in pts], alpha=0.12,
                                color=line.get_color())
            ax.set_xscale("log")
            ax.set_xticks(levels, [f"{c:g}" for c in levels])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_title(f"{TRUTH_TITLES.get(truth, truth)}; {rule} rule", fontsize=9)
            ax.set_xlabel("compute (full-run equivalents)")
        axes[i][0].set_ylabel("regret, % of range (median, IQR)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    n = len({(r["seed"], r["target"]) for r in rs})
    fig.suptitle(f"{world}: simple regret against compute (up to {n} replications a method)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
