"""The report's figures (matplotlib Figures on an Agg canvas, no pyplot state).

* :func:`frontier_figure`: a target against the update fraction ρ, one panel per reward
  system: full-budget trials as filled circles coloured by group size G, pilots (fidelity
  ``pilot``) as hollow triangles, the best full trial starred, and ρ* with its 90 % credible
  interval (:mod:`allocopt.query.report_data`: RACE's local quadratic as a line and a band; the
  study's recommendation as a diamond with its credible interval on the target). Panels share
  the y-axis except for ``native_reward``, whose scale differs per reward system;
* :func:`breakdown_figure`: executed search / learning / reward FLOPs per trial, stacked,
  grouped by reward system and sorted by ρ, full-budget trials and pilots in panels of their
  own (their budgets differ tenfold), each with its budget;
* :func:`pareto_figure`: the Pareto front of two targets over the complete full-budget trials.

matplotlib and numpy are imported inside the functions.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from allocopt.query.pareto import best, field_key, field_label, number, pareto_front, spent_rho, value
from allocopt.query.report_data import RhoEstimate, budget_of, fidelity, rewards_of

PHASE_STYLE = {"search_flops": ("#4c72b0", "search (rollout generation)"),
               "learning_flops": ("#dd8452", "learning (log-probs, forward + backward)"),
               "reward_flops": ("#55a868", "reward (reward model / verifier)")}
RHO_LABEL = "update fraction ρ = learning / total FLOPs"


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _reward_colors(rewards: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {w: cmap(i % 10) for i, w in enumerate(rewards)}


def _draw_estimate(ax: Any, e: RhoEstimate) -> str:
    """ρ* on a panel; returns the words for its title."""
    if e.source == "recommendation":
        lo, hi = e.value_interval or (e.value, e.value)
        ax.axvline(e.rho, color="#1f4e9c", ls="--", lw=1.2, zorder=2)
        ax.errorbar([e.rho], [e.value], yerr=[[e.value - lo], [hi - e.value]], fmt="D", ms=8, color="#1f4e9c",
                    mec="black", capsize=4, zorder=5)
        words = f"recommended ρ={e.rho:.2f}"
    else:
        a, b = e.interval
        if math.isfinite(a) and math.isfinite(b):
            ax.axvspan(a, b, color="0.5", alpha=0.18, lw=0, zorder=1)
        ax.axvline(e.rho, color="black", lw=1.3, zorder=2)
        words = f"ρ*={e.rho:.2f} [{a:.2f}-{b:.2f}]" + (" (pilots)" if e.source == "pilots" else "")
    lo, hi = e.data_range
    if e.beyond:
        words += f", outside ρ {lo:.2f}-{hi:.2f} of its trials"
    elif e.at_edge:
        words += ", at the edge of the data"
    return words


def frontier_figure(rows: Sequence[Any], target: str, *, title: str,
                    rho_stars: Mapping[tuple[str, str], RhoEstimate] | None = None,
                    direction: str = "maximize") -> Any:
    """Target vs ρ, one panel per reward system (module docstring). Returns the Figure."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    key = field_key(target)
    rewards = rewards_of(rows) or ["(none)"]
    ncols = min(3, len(rewards))
    nrows = math.ceil(len(rewards) / ncols)
    shared = key != "native_reward"  # native rewards of different reward systems differ in scale
    fig = _figure(4.8 * ncols, 3.8 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=shared)
    gs = sorted({int(number(r, "group_size")) for r in rows if math.isfinite(number(r, "group_size"))})
    cmap = colormaps["viridis"]
    gcolor = {g: cmap(i / max(1, len(gs) - 1) * 0.85) for i, g in enumerate(gs)}
    kinds: set[str] = set()
    for ax, reward in zip(axes.flat, rewards):
        done = [r for r in rows if str(value(r, "reward")) == reward and r.state == "COMPLETE"
                and math.isfinite(number(r, key)) and math.isfinite(spent_rho(r))]
        for fid, marker, filled in (("full", "o", True), ("pilot", "^", False)):
            pts = [r for r in done if fidelity(r) == fid]
            if pts:
                colors = [gcolor.get(int(number(r, "group_size")), "C0") for r in pts]
                ax.scatter([spent_rho(r) for r in pts], [number(r, key) for r in pts], s=36, marker=marker,
                           c=colors if filled else "none", edgecolors=colors, linewidths=1.2, zorder=3)
        b = best([r for r in done if fidelity(r) == "full"], key, direction)
        if b is not None:
            ax.scatter([spent_rho(b)], [number(b, key)], marker="*", s=220, c="red",
                       edgecolors="black", linewidths=0.6, zorder=4)
        e = (rho_stars or {}).get((reward, key))
        words = ("no ρ* (a minimized target)" if direction == "minimize"
                 else "no ρ* (fewer than 3 distinct ρ, or too few near the optimum to fit)")
        if e is not None:
            kinds.add(e.source)
            words = _draw_estimate(ax, e)
        ax.set_title(f"{reward}: {words}", fontsize=9)
        if not done:
            ax.text(0.5, 0.5, "no complete trial", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_xlim(0, 1)
        ax.set_xticks([0.2, 0.4, 0.6, 0.8])  # none at 0 and 1: neighbouring panels' labels would touch
        ax.set_xlabel(RHO_LABEL, fontsize=8)
        ax.grid(alpha=0.3)
        if not shared:
            ax.set_ylabel(f"native reward of {reward}", fontsize=9)
    if shared:
        for ax in axes[:, 0]:
            ax.set_ylabel(f"{field_label(key)} (target)")
    for ax in list(axes.flat)[len(rewards):]:
        ax.set_visible(False)
    handles: list[Any] = [Line2D([], [], ls="", marker="o", color=gcolor[g], label=f"full budget, G={g}") for g in gs]
    if any(fidelity(r) == "pilot" for r in rows):
        handles.append(Line2D([], [], ls="", marker="^", mfc="none", color="0.3", label="pilot (fraction of budget)"))
    handles.append(Line2D([], [], ls="", marker="*", ms=12, mfc="red", mec="black", label="best full-budget trial"))
    if kinds - {"recommendation"}:
        handles += [Line2D([], [], color="black", lw=1.3, label="ρ* (RACE local quadratic)"),
                    Patch(color="0.5", alpha=0.3, label="90% credible interval of ρ*")]
    if "recommendation" in kinds:
        handles.append(Line2D([], [], ls="--", marker="D", color="#1f4e9c", mec="black",
                              label="recommended allocation (90% CI of the target)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: {field_label(key)} vs update fraction ρ per reward system"
                 + ("" if shared else " (own y-axis each: native rewards differ in scale)"))
    return fig


def _breakdown_panel(ax: Any, trials: Sequence[Any], order: Mapping[str, int], several: bool, what: str) -> None:
    import numpy as np

    trials = sorted(trials, key=lambda r: (order.get(str(value(r, "reward")), len(order)), spent_rho(r),
                                           getattr(r, "study", ""), r.number))
    n = len(trials)
    x = np.arange(n)
    bottom = np.zeros(n)
    for phase, (color, label) in PHASE_STYLE.items():
        h = np.array([number(r, phase) if math.isfinite(number(r, phase)) else 0.0 for r in trials])
        bars = ax.bar(x, h, bottom=bottom, color=color, width=0.8, label=label)
        for bar, r in zip(bars, trials):
            if r.state != "COMPLETE":
                bar.set_alpha(0.45)
        bottom += h
    for b in sorted({budget_of(r) for r in trials if math.isfinite(budget_of(r))}):
        ax.axhline(b, color="black", ls="--", lw=1, label=f"budget {b:.2e} FLOPs")
    ax.set_ylim(0, max([*bottom, *(budget_of(r) for r in trials if math.isfinite(budget_of(r)))], default=1) * 1.12)
    if n <= 60:
        ax.set_xticks(x, [(f"{getattr(r, 'study', '')}#{r.number}" if several else f"#{r.number}")
                          + f" ρ={spent_rho(r):.2f}" + ("" if r.state == "COMPLETE" else f" {r.state.lower()}")
                          for r in trials], rotation=90, fontsize=7)
    else:
        ax.set_xticks([])
    # reward systems: a name over each group, dotted lines between groups (never one per bar)
    start = 0
    for i in range(1, n + 1):
        if i == n or str(value(trials[i], "reward")) != str(value(trials[start], "reward")):
            ax.text((start + i - 1) / 2, 1.01, str(value(trials[start], "reward")), ha="center", va="bottom",
                    fontsize=8, transform=ax.get_xaxis_transform())
            if i < n:
                ax.axvline(i - 0.5, color="0.5", ls=":", lw=1)
            start = i
    ax.set_xlim(-0.6, n - 0.4)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0), useMathText=True)
    ax.set_ylabel("executed FLOPs per trial")
    ax.set_xlabel("trial #number and asked ρ, grouped by reward system" if n <= 60
                  else f"{n} trials, grouped by reward system, sorted by ρ", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def breakdown_figure(rows: Sequence[Any], *, title: str) -> Any:
    """Stacked executed search / learning / reward FLOPs per trial (module docstring)."""
    spent = [r for r in rows if math.isfinite(number(r, "total_flops")) and number(r, "total_flops") > 0]
    order = {w: i for i, w in enumerate(rewards_of(rows))}
    several = len({getattr(r, "study", "") for r in spent}) > 1
    panels = [(w, [r for r in spent if fidelity(r) == f]) for f, w in (("full", "full-budget trials"),
                                                                       ("pilot", "pilots"))]
    panels = [p for p in panels if p[1]] or [("trials", [])]
    width = min(26.0, max(10.0, 0.22 * max(len(t) for _, t in panels) + 5.5))
    fig = _figure(width, 4.6 * len(panels) + 0.4)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (what, trials) in zip(axes, panels):
        if trials:
            _breakdown_panel(ax, trials, order, several, what)
        else:
            ax.text(0.5, 0.5, "no trial spent FLOPs yet", ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
            ax.set_ylabel("executed FLOPs per trial")
        ax.set_title(f"{what} ({len(trials)}; faded: not complete)", fontsize=10, pad=16)
    fig.suptitle(f"{title}: compute breakdown per trial (executed FLOPs)")
    return fig


def pareto_figure(rows: Sequence[Any], targets: Sequence[str], *, title: str,
                  directions: Sequence[str] = ("maximize", "maximize")) -> tuple[Any, list[Any]]:
    """Two targets over the complete full-budget trials (each in its ``directions``); front
    coloured, dominated grey.

    Returns ``(figure, front rows)``.
    """
    ka, kb = (field_key(t) for t in targets[:2])
    full = [r for r in rows if fidelity(r) == "full" and r.state == "COMPLETE"
            and math.isfinite(number(r, ka)) and math.isfinite(number(r, kb))]
    front = pareto_front(full, [ka, kb], list(directions[:2]))
    ids = {id(r) for r in front}
    fig = _figure(7.0, 5.6)
    ax = fig.subplots()
    dom = [r for r in full if id(r) not in ids]
    ax.scatter([number(r, ka) for r in dom], [number(r, kb) for r in dom], c="0.75", s=30,
               label=f"dominated ({len(dom)})", zorder=2)
    colors = _reward_colors(rewards_of(rows))
    for w in rewards_of(front):
        pts = [r for r in front if str(value(r, "reward")) == w]
        ax.scatter([number(r, ka) for r in pts], [number(r, kb) for r in pts], color=colors[w], s=60,
                   edgecolors="black", linewidths=0.6, label=f"non-dominated, {w}", zorder=3)
    stair = sorted(front, key=lambda r: (-number(r, ka), number(r, kb)))
    if len(stair) > 1:
        ax.step([number(r, ka) for r in stair], [number(r, kb) for r in stair], where="post",
                color="black", lw=0.8, alpha=0.6, zorder=1)
    for r in front:
        ax.annotate(f"#{r.number} ρ={spent_rho(r):.2f}", (number(r, ka), number(r, kb)),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    if not full:
        ax.text(0.5, 0.5, "no complete full-budget trial", ha="center", va="center",
                transform=ax.transAxes, color="0.4")
    better = {"maximize": "higher is better", "minimize": "lower is better"}
    ax.set_xlabel(f"{field_label(ka)} (target, {better[directions[0]]})")
    ax.set_ylabel(f"{field_label(kb)} (target, {better[directions[1]]})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title}: Pareto front of {field_label(ka)} and {field_label(kb)} "
                 f"({len(front)} of {len(full)} trials)", fontsize=10)
    return fig, front


__all__ = ["breakdown_figure", "frontier_figure", "pareto_figure"]
