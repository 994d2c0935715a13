"""A visual report of a study: PNG figures and one self-contained HTML page.

:func:`write_report` draws, from query rows (:mod:`allocopt.pareto`):

* ``frontier_<target>.png``: the allocation frontier, one panel per reward system: the target
  against the update fraction ρ, full-budget trials as filled circles coloured by group size G,
  pilots (fidelity ``pilot``) as hollow triangles, the best full trial starred, and a smoothed
  mean with a band (:func:`kernel_smoother`, or the ``surrogate`` passed in);
* ``breakdown.png``: the compute breakdown of every trial that spent FLOPs, stacked bars of
  executed search / learning / reward FLOPs, sorted by reward system then ρ, with the budget;
* ``pareto_<a>__<b>.png``: the Pareto front of two targets over the complete full-budget
  trials, the non-dominated ones coloured by reward system and joined by a staircase, the
  dominated ones grey;
* ``report.html``: every figure embedded as a base64 ``data:`` URI (no file, script, style
  sheet or font is fetched), the regime table (per reward system and target: best trial, its ρ,
  G, value and compute shares, and the ρ where the smoothed mean peaks) and the Pareto trials.

matplotlib (Agg canvas, no pyplot state) and numpy are imported inside the functions.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from allocopt.pareto import best, field_key, field_label, number, pareto_front, value
from allocopt.query_sources import resolve_tracking_uri

PHASE_COLORS = {"search_flops": "#4c72b0", "learning_flops": "#dd8452", "reward_flops": "#55a868"}
REWARD_ORDER = ("sparse", "structured", "dense", "proxy_prm", "prm")
RHO_LABEL = "update fraction ρ = learning / total FLOPs"
_CURVE_STYLE = {"smoother": ({"color": "black", "lw": 1.5}, "0.6"),
                "surrogate": ({"color": "#1f4e9c", "lw": 1.5, "ls": "--"}, "#7fa7e0")}
"""(line style, band colour) of the kernel smoother and of a surrogate."""
Surrogate = Callable[[Any], tuple[Any, Any]]
"""``rho`` (``n`` array) -> ``(mean, std)`` (two ``n`` arrays) of the target."""


# ============================================================================ smoothing
def kernel_smoother(x: Sequence[float], y: Sequence[float], grid: Sequence[float], *,
                    bandwidth: float | None = None, n_boot: int = 200, level: float = 0.9,
                    seed: int = 0) -> tuple[Any, Any, Any, float]:
    """Nadaraya–Watson mean of ``y`` over ``x`` with a Gaussian kernel and a bootstrap band.

    ``m(g) = Σ_i K((g - x_i)/h) y_i / Σ_i K((g - x_i)/h)``, ``K(u) = exp(-u²/2)``. Bandwidth
    ``h`` defaults to Silverman's rule ``1.06 · sd(x) · n^(-1/5)``, at least 0.04 (ρ units). The
    band is the pointwise ``level`` percentile interval of ``m`` over ``n_boot`` resamples of
    the ``(x, y)`` pairs with replacement (seeded): it shows how much the curve depends on the
    few trials behind it, not a predictive interval.

    Args:
        x, y: ``n`` trial values of ρ and of the target (``n >= 1``).
        grid: ``m`` points where the curve is evaluated.

    Returns:
        ``(mean, low, high, h)``: three ``m`` arrays and the bandwidth used.
    """
    import numpy as np

    x, y, g = (np.asarray(v, dtype=float) for v in (x, y, grid))
    h = bandwidth or max(0.04, 1.06 * float(np.std(x)) * len(x) ** -0.2)

    def fit(xs: Any, ys: Any) -> Any:
        w = np.exp(-0.5 * ((g[:, None] - xs[None, :]) / h) ** 2)
        s = w.sum(axis=1)
        return np.where(s > 1e-300, (w * ys[None, :]).sum(axis=1) / np.maximum(s, 1e-300), np.nan)

    mean = fit(x, y)
    rng = np.random.default_rng(seed)
    boots = np.array([fit(x[i], y[i]) for i in (rng.integers(0, len(x), len(x)) for _ in range(n_boot))])
    a = (1 - level) / 2
    lo, hi = np.nanquantile(boots, [a, 1 - a], axis=0)
    return mean, lo, hi, h


def _surrogate_for(surrogate: Any, reward: str, key: str) -> Surrogate | None:
    """A callable, or a mapping keyed by ``(reward, target key)`` or by reward."""
    if surrogate is None or callable(surrogate):
        return surrogate
    if isinstance(surrogate, Mapping):
        return surrogate.get((reward, key)) or surrogate.get(reward)
    raise TypeError(f"surrogate={surrogate!r}: must be a callable rho -> (mean, std) or a mapping of them")


def _curve(rows: Sequence[Any], key: str, reward: str, surrogate: Any) -> dict[str, Any] | None:
    """Smoothed mean and band of a panel over the full-budget complete trials, or ``None``."""
    import numpy as np

    pts = [(number(r, "rho"), number(r, key)) for r in rows
           if r.state == "COMPLETE" and getattr(r, "fidelity", "full") == "full"]
    pts = [(a, b) for a, b in pts if math.isfinite(a) and math.isfinite(b)]
    f = _surrogate_for(surrogate, reward, key)
    if f is not None:
        lo_x = min([a for a, _ in pts], default=0.05)
        hi_x = max([a for a, _ in pts], default=0.95)
        grid = np.linspace(min(lo_x, 0.05), max(hi_x, 0.95), 200)
        mean, std = (np.asarray(v, dtype=float).reshape(-1) for v in f(grid))
        return {"grid": grid, "mean": mean, "low": mean - 2 * std, "high": mean + 2 * std,
                "kind": "surrogate"}
    if len(pts) < 3 or len({a for a, _ in pts}) < 2:
        return None
    xs = np.array([a for a, _ in pts])
    grid = np.linspace(xs.min(), xs.max(), 200)
    mean, lo, hi, h = kernel_smoother(xs, [b for _, b in pts], grid)
    return {"grid": grid, "mean": mean, "low": lo, "high": hi,
            "kind": "smoother", "bandwidth": h}


# ============================================================================ figures
def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _rewards(rows: Sequence[Any]) -> list[str]:
    seen = {str(value(r, "reward")) for r in rows if value(r, "reward") is not None}
    return [w for w in REWARD_ORDER if w in seen] + sorted(seen - set(REWARD_ORDER))


def _reward_colors(rewards: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {w: cmap(i % 10) for i, w in enumerate(rewards)}


def frontier_figure(rows: Sequence[Any], target: str, *, title: str, surrogate: Any = None) -> Any:
    """Target vs ρ, one panel per reward system (module docstring). Returns the Figure."""
    from matplotlib import colormaps
    from matplotlib.lines import Line2D

    key = field_key(target)
    rewards = _rewards(rows) or ["(none)"]
    ncols = min(3, len(rewards))
    nrows = math.ceil(len(rewards) / ncols)
    fig = _figure(4.6 * ncols, 3.6 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    gs = sorted({int(number(r, "group_size")) for r in rows if math.isfinite(number(r, "group_size"))})
    cmap = colormaps["viridis"]
    used: set[str] = set()
    gcolor = {g: cmap(i / max(1, len(gs) - 1) * 0.85) for i, g in enumerate(gs)}
    for ax, reward in zip(axes.flat, rewards):
        mine = [r for r in rows if str(value(r, "reward")) == reward]
        done = [r for r in mine if r.state == "COMPLETE" and math.isfinite(number(r, key))
                and math.isfinite(number(r, "rho"))]
        curve = _curve(mine, key, reward, surrogate)
        if curve is not None:
            used.add(curve["kind"])
            line, band = _CURVE_STYLE[curve["kind"]]
            ax.fill_between(curve["grid"], curve["low"], curve["high"], color=band, alpha=0.3, lw=0)
            ax.plot(curve["grid"], curve["mean"], **line)
        for fid, marker, filled in (("full", "o", True), ("pilot", "^", False)):
            pts = [r for r in done if getattr(r, "fidelity", "full") == fid]
            if not pts:
                continue
            colors = [gcolor.get(int(number(r, "group_size")), "C0") for r in pts]
            ax.scatter([number(r, "rho") for r in pts], [number(r, key) for r in pts], s=36, marker=marker,
                       c=colors if filled else "none", edgecolors=colors, linewidths=1.2, zorder=3)
        b = best([r for r in done if getattr(r, "fidelity", "full") == "full"], key)
        if b is not None:
            ax.scatter([number(b, "rho")], [number(b, key)], marker="*", s=220, c="red",
                       edgecolors="black", linewidths=0.6, zorder=4)
            ax.set_title(f"{reward}: best ρ={number(b, 'rho'):.2f} ({field_label(key)}={number(b, key):.3f})",
                         fontsize=10)
        else:
            ax.set_title(f"{reward}: no complete full-budget trial", fontsize=10)
        if not done:
            ax.text(0.5, 0.5, "no complete trial", ha="center", va="center", transform=ax.transAxes, color="0.4")
        ax.set_xlim(0, 1)
        ax.set_xlabel(RHO_LABEL, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{field_label(key)} (target)")
    for ax in list(axes.flat)[len(rewards):]:
        ax.set_visible(False)
    handles = [Line2D([], [], ls="", marker="o", color=gcolor[g], label=f"full budget, G={g}") for g in gs]
    if any(getattr(r, "fidelity", "full") == "pilot" for r in rows):
        handles.append(Line2D([], [], ls="", marker="^", mfc="none", color="0.3", label="pilot (fraction of budget)"))
    handles.append(Line2D([], [], ls="", marker="*", ms=12, mfc="red", mec="black", label="best full-budget trial"))
    for kind, mean_label, band_label in (("smoother", "kernel smoother of full-budget trials", "90% bootstrap band"),
                                         ("surrogate", "surrogate mean", "surrogate ±2σ")):
        if kind in used:
            line, band = _CURVE_STYLE[kind]
            handles += [Line2D([], [], label=mean_label, **line),
                        Line2D([], [], color=band, lw=6, alpha=0.5, label=band_label)]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.suptitle(f"{title}: {field_label(key)} vs update fraction ρ per reward system")
    return fig


def breakdown_figure(rows: Sequence[Any], *, title: str) -> Any:
    """Stacked executed search / learning / reward FLOPs per trial. Returns the Figure."""
    import numpy as np

    spent = [r for r in rows if math.isfinite(number(r, "total_flops")) and number(r, "total_flops") > 0]
    order = {w: i for i, w in enumerate(_rewards(rows))}
    spent.sort(key=lambda r: (order.get(str(value(r, "reward")), len(order)), number(r, "rho"),
                              getattr(r, "study", ""), r.number))
    n = len(spent)
    fig = _figure(min(24.0, max(7.0, 0.38 * n + 2)), 5.2)
    ax = fig.subplots()
    x = np.arange(n)
    bottom = np.zeros(n)
    several = len({getattr(r, "study", "") for r in spent}) > 1
    for phase, color in PHASE_COLORS.items():
        h = np.array([number(r, phase) if math.isfinite(number(r, phase)) else 0.0 for r in spent])
        bars = ax.bar(x, h, bottom=bottom, color=color, width=0.8, label=phase.replace("_flops", ""))
        for bar, r in zip(bars, spent):
            if getattr(r, "fidelity", "full") == "pilot":
                bar.set_hatch("//")
                bar.set_edgecolor("white")
            if r.state != "COMPLETE":
                bar.set_alpha(0.45)
        bottom += h
    budgets = sorted({float(b) for r in spent if getattr(r, "fidelity", "full") == "full"
                      and (b := getattr(r, "plan", {}).get("budget_flops")) is not None and _ok(b)})
    for b in budgets:
        ax.axhline(b, color="black", ls="--", lw=1, label=f"budget {b:.2e} FLOPs")
    if n <= 40:
        labels = []
        for r in spent:
            s = f"{getattr(r, 'study', '')}#{r.number}" if several else f"#{r.number}"
            s += f"\n{value(r, 'reward')}\nρ={number(r, 'rho'):.2f}"
            if getattr(r, "fidelity", "full") == "pilot":
                s += "\npilot"
            if r.state != "COMPLETE":
                s += f"\n{r.state}"
            labels.append(s)
        ax.set_xticks(x, labels, fontsize=7)
    else:
        ax.set_xticks([])
        ax.set_xlabel(f"{n} trials, sorted by reward system then ρ")
    if not spent:
        ax.text(0.5, 0.5, "no trial spent FLOPs yet", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0), useMathText=True)
    ax.set_ylabel("executed FLOPs")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(f"{title}: compute breakdown per trial (hatched: pilot; faded: not complete)")
    return fig


def _ok(v: Any) -> bool:
    try:
        return math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False


def pareto_figure(rows: Sequence[Any], targets: Sequence[str], *, title: str) -> tuple[Any, list[Any]]:
    """Two targets over the complete full-budget trials; front coloured, dominated grey.

    Returns ``(figure, front rows)``.
    """
    ka, kb = (field_key(t) for t in targets[:2])
    full = [r for r in rows if getattr(r, "fidelity", "full") == "full" and r.state == "COMPLETE"
            and math.isfinite(number(r, ka)) and math.isfinite(number(r, kb))]
    front = pareto_front(full, [ka, kb], ["maximize", "maximize"])
    ids = {id(r) for r in front}
    fig = _figure(7.0, 5.6)
    ax = fig.subplots()
    dom = [r for r in full if id(r) not in ids]
    ax.scatter([number(r, ka) for r in dom], [number(r, kb) for r in dom], c="0.75", s=30,
               label=f"dominated ({len(dom)})", zorder=2)
    colors = _reward_colors(_rewards(rows))
    for w in _rewards(front):
        pts = [r for r in front if str(value(r, "reward")) == w]
        ax.scatter([number(r, ka) for r in pts], [number(r, kb) for r in pts], color=colors[w], s=60,
                   edgecolors="black", linewidths=0.6, label=f"non-dominated, {w}", zorder=3)
    stair = sorted(front, key=lambda r: (-number(r, ka), number(r, kb)))
    if len(stair) > 1:
        ax.step([number(r, ka) for r in stair], [number(r, kb) for r in stair], where="post",
                color="black", lw=0.8, alpha=0.6, zorder=1)
    for r in front:
        ax.annotate(f"#{r.number} ρ={number(r, 'rho'):.2f}", (number(r, ka), number(r, kb)),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    if not full:
        ax.text(0.5, 0.5, "no complete full-budget trial", ha="center", va="center",
                transform=ax.transAxes, color="0.4")
    ax.set_xlabel(f"{field_label(ka)} (target, higher is better)")
    ax.set_ylabel(f"{field_label(kb)} (target, higher is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{title}: Pareto front of {field_label(ka)} and {field_label(kb)} "
                 f"({len(front)} of {len(full)} trials)")
    return fig, front


# ============================================================================ the page
def regime_table(rows: Sequence[Any], targets: Sequence[str], surrogate: Any = None) -> list[dict[str, Any]]:
    """Per reward system and target: complete trial counts, the best full-budget trial (number,
    ρ, G, value, executed search / learning / reward shares) and ``smoothed_rho``, the ρ where
    the smoothed mean (or the surrogate) peaks (``None`` with fewer than 3 trials)."""
    import numpy as np

    out = []
    for reward in _rewards(rows):
        mine = [r for r in rows if str(value(r, "reward")) == reward]
        full = [r for r in mine if r.state == "COMPLETE" and getattr(r, "fidelity", "full") == "full"]
        pilots = [r for r in mine if r.state == "COMPLETE" and getattr(r, "fidelity", "full") == "pilot"]
        for t in targets:
            key = field_key(t)
            b = best(full, key)
            curve = _curve(mine, key, reward, surrogate)
            smoothed = None
            if curve is not None and np.isfinite(curve["mean"]).any():
                smoothed = float(curve["grid"][int(np.nanargmax(curve["mean"]))])
            row: dict[str, Any] = {"reward": reward, "target": field_label(key), "full_trials": len(full),
                                   "pilot_trials": len(pilots), "smoothed_rho": smoothed, "best": None}
            if b is not None:
                total = number(b, "total_flops")
                row["best"] = {"number": b.number, "study": getattr(b, "study", ""), "rho": number(b, "rho"),
                               "group_size": value(b, "group_size"), "value": number(b, key),
                               **{p.replace("_flops", "_share"): (number(b, p) / total if total > 0 else math.nan)
                                  for p in PHASE_COLORS}}
            out.append(row)
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}.note{color:#555;font-size:0.9em}"""


def _png(fig: Any, path: Path) -> bytes:
    fig.savefig(path, format="png")
    return path.read_bytes()


def _fmt(v: Any, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def write_report(rows: Sequence[Any], out_dir: str | Path, *, title: str, targets: Sequence[str],
                 surrogate: Surrogate | Mapping[Any, Surrogate] | None = None,
                 pareto_targets: Sequence[str] | None = None, run_id: str | None = None,
                 tracking_uri: str | None = None, artifact_path: str = "report") -> list[Path]:
    """Write the report's PNGs and ``report.html`` into ``out_dir`` (created).

    Args:
        rows: trials (:mod:`allocopt.pareto` rows; any fidelity and state).
        out_dir: folder for the files (existing files of the same names are replaced).
        title: heads the page and every figure.
        targets: target names (``pass@1`` or ``pass_at_1``); one frontier figure each.
        surrogate: a callable ``rho (n array) -> (mean, std)`` (``n`` arrays) drawn as the mean
            with a ±2σ band instead of the kernel smoother, or a mapping from ``(reward,
            target key)`` or reward to such callables (panels without one use the smoother).
        pareto_targets: the two targets of the Pareto figure; default the first two of
            ``targets`` (with fewer than two, no Pareto figure).
        run_id, tracking_uri: when ``run_id`` is given, the written files are also logged as
            artifacts of that MLflow run under ``artifact_path``.

    Returns:
        the written files: the PNGs, then ``report.html`` (last).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys = [field_key(t) for t in targets]
    pair = [field_key(t) for t in (pareto_targets or keys[:2])]
    figures: list[tuple[Path, str]] = []
    for k in keys:
        p = out / f"frontier_{k}.png"
        _png(frontier_figure(rows, k, title=title, surrogate=surrogate), p)
        figures.append((p, f"Allocation frontier for {field_label(k)}: the target against the update "
                           f"fraction ρ per reward system; circles full-budget trials (colour: G), "
                           f"triangles pilots, star the best; "
                           + ("dashed blue: the surrogate's mean ±2σ; " if surrogate is not None else "")
                           + "solid black: a Gaussian kernel smoother of the full-budget trials with a "
                             "90% bootstrap band (drawn with 3 or more trials at 2 or more ρ)."))
    p = out / "breakdown.png"
    _png(breakdown_figure(rows, title=title), p)
    figures.append((p, "Compute breakdown: executed search, learning and reward FLOPs of each trial "
                       "that spent any, sorted by reward system then ρ; dashed: the budget."))
    front: list[Any] = []
    if len(pair) >= 2:
        fig, front = pareto_figure(rows, pair, title=title)
        p = out / f"pareto_{pair[0]}__{pair[1]}.png"
        _png(fig, p)
        figures.append((p, f"Pareto front of {field_label(pair[0])} and {field_label(pair[1])} over the "
                           f"complete full-budget trials: coloured non-dominated, grey dominated."))
    page = out / "report.html"
    page.write_text(_html(rows, title, keys, pair, front, figures, surrogate), encoding="utf-8")
    written = [p for p, _ in figures] + [page]
    if run_id:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
        for f in written:
            client.log_artifact(run_id, str(f), artifact_path)
    return written


def _html(rows: Sequence[Any], title: str, keys: Sequence[str], pair: Sequence[str], front: Sequence[Any],
          figures: Sequence[tuple[Path, str]], surrogate: Any) -> str:
    e = html.escape
    states: dict[str, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    studies = sorted({getattr(r, "study", "") for r in rows} - {""})
    budgets = sorted({float(b) for r in rows if _ok(b := getattr(r, "plan", {}).get("budget_flops"))})
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>",
             "<p>" + e(f"{len(rows)} trials" + (f" of {', '.join(studies)}" if studies else "") + ": "
                       + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
                       + (f"; budget {', '.join(f'{b:.3e}' for b in budgets)} FLOPs per full trial" if budgets else ""))
             + "</p>",
             "<h2>Regime table</h2><p class='note'>Per reward system and target: the best complete "
             "full-budget trial, its compute shares, and the ρ where the smoothed mean peaks "
             "(less noisy than one trial).</p>",
             "<table><tr><th class='l'>reward</th><th class='l'>target</th><th>full / pilot trials</th>"
             "<th>best trial</th><th>best ρ</th><th>G</th><th>value</th><th>search / learning / reward</th>"
             "<th>smoothed-peak ρ</th></tr>"]
    for row in regime_table(rows, keys, surrogate):
        b = row["best"] or {}
        shares = (" / ".join(f"{b[k]:.0%}" if math.isfinite(b[k]) else "–"
                             for k in ("search_share", "learning_share", "reward_share")) if b else "–")
        trial = (f"{b['study']}#{b['number']}" if len(studies) > 1 else f"#{b['number']}") if b else "–"
        parts.append(f"<tr><td class='l'>{e(row['reward'])}</td><td class='l'>{e(row['target'])}</td>"
                     f"<td>{row['full_trials']} / {row['pilot_trials']}</td><td>{e(trial)}</td>"
                     f"<td>{_fmt(b.get('rho'))}</td><td>{e(_fmt(b.get('group_size'), 'd'))}</td>"
                     f"<td>{_fmt(b.get('value'), '.4f')}</td><td>{shares}</td>"
                     f"<td>{_fmt(row['smoothed_rho'], '.2f')}</td></tr>")
    parts.append("</table>")
    if len(pair) >= 2:
        parts.append(f"<h2>Pareto trials: {e(field_label(pair[0]))} and {e(field_label(pair[1]))}</h2>"
                     "<table><tr><th>trial</th><th>ρ</th><th>G</th><th class='l'>reward</th>"
                     + "".join(f"<th>{e(field_label(k))}</th>" for k in dict.fromkeys([*pair, *keys]))
                     + "<th>total FLOPs</th></tr>")
        for r in front:
            parts.append(f"<tr><td>#{r.number}</td><td>{_fmt(number(r, 'rho'))}</td>"
                         f"<td>{e(_fmt(value(r, 'group_size'), 'd'))}</td><td class='l'>{e(str(value(r, 'reward')))}</td>"
                         + "".join(f"<td>{_fmt(number(r, k), '.4f')}</td>" for k in dict.fromkeys([*pair, *keys]))
                         + f"<td>{_fmt(number(r, 'total_flops'), '.3e')}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Figures</h2>")
    for path, caption in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{e(path.name)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{e(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


__all__ = ["breakdown_figure", "frontier_figure", "kernel_smoother", "pareto_figure", "regime_table",
           "write_report"]
