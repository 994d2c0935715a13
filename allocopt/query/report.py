"""A visual report of a study: PNG figures and one self-contained HTML page.

:func:`write_report` writes, from query rows (:mod:`allocopt.query.pareto`) and, for an Optuna study,
its :class:`~allocopt.query.report_data.StudyContext` (:func:`~allocopt.query.report_data.study_context`):

* ``frontier_<target>.png``, ``breakdown.png``, ``pareto_<a>__<b>.png``
  (:mod:`allocopt.query.report_figures`);
* ``report.html``: every figure embedded as a base64 ``data:`` URI (no file, script, style
  sheet or font is fetched); a header with the full budget per trial and the pilots apart (their
  budget and its fraction of the full one); the **regime table**: RACE's regimes from the pilots
  (as ``allocopt race`` prints them) and the study's one answer, the recommended allocation with
  its posterior mean, credible interval, P(best) per reward system and the allocations within one
  evaluation's noise, beside the best observed trial as evidence; per reward system and target,
  the best trial and ρ* by the project's estimator (:mod:`allocopt.query.report_data`); the Pareto
  trials.

The data gathering is :mod:`allocopt.query.report_data`, the figures :mod:`allocopt.query.report_figures`;
this module writes the files and the page. matplotlib is imported inside the figure functions.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any, Sequence

from allocopt.query.pareto import field_key, field_label, number, value
from allocopt.query.report_data import (EDGE_TOL, StudyContext, best_table, budget_line, default_pareto_pair, estimates,
                                  fidelity)
from allocopt.query.report_figures import breakdown_figure, frontier_figure, pareto_figure

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:0.9em}.note{color:#555;font-size:0.9em}.answer{font-size:1.1em;font-weight:600}"""


def _png(fig: Any, path: Path) -> None:
    fig.savefig(path, format="png")


def _fmt(v: Any, spec: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def write_report(rows: Sequence[Any], out_dir: str | Path, *, title: str, targets: Sequence[str],
                 context: StudyContext | None = None, pareto_targets: Sequence[str] | None = None,
                 run_id: str | None = None, tracking_uri: str | None = None,
                 artifact_path: str = "report") -> list[Path]:
    """Write the report's PNGs and ``report.html`` into ``out_dir`` (created).

    Args:
        rows: trials (:mod:`allocopt.query.pareto` rows; any fidelity and state).
        out_dir: folder for the files (existing files of the same names are replaced).
        title: heads the page and every figure.
        targets: target names (``pass@1`` or ``pass_at_1``); one frontier figure each.
        context: the study's terms, RACE regimes and recommendation
            (:func:`allocopt.query.report_data.study_context`); ``None`` for rows without a study
            (MLflow across studies): no regime table, no recommendation.
        pareto_targets: the two targets of the Pareto figure; default
            :func:`allocopt.query.report_data.default_pareto_pair` (the study's targets).
        run_id, tracking_uri: when ``run_id`` is given, the written files are also logged as
            artifacts of that MLflow run under ``artifact_path``.

    Returns:
        the written files: the PNGs, then ``report.html`` (last).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(field_key(t) for t in targets))
    pair = [field_key(t) for t in pareto_targets] if pareto_targets else default_pareto_pair(rows, keys, context)
    stars = estimates(rows, keys, context)
    figures: list[tuple[Path, str]] = []
    for k in keys:
        p = out / f"frontier_{k}.png"
        _png(frontier_figure(rows, k, title=title, rho_stars=stars,
                             direction=context.direction(k) if context else "maximize"), p)
        figures.append((p, f"Allocation frontier for {field_label(k)}: the target against the update fraction ρ "
                           "per reward system; circles full-budget trials (colour: G), triangles pilots, star the "
                           "best; black line and grey band: ρ* by RACE's local quadratic with its 90% credible "
                           "interval; blue diamond: the study's recommended allocation with the 90% credible "
                           "interval of its target."
                           + (" Each panel has its own y-axis: native rewards differ in scale per reward system."
                              if k == "native_reward" else "")))
    p = out / "breakdown.png"
    _png(breakdown_figure(rows, title=title), p)
    figures.append((p, "Compute breakdown: executed search, learning and reward FLOPs of each trial that spent "
                       "any, grouped by reward system and sorted by ρ; full-budget trials and pilots in panels of "
                       "their own; dashed: the budget."))
    front: list[Any] = []
    if len(pair) >= 2:
        dirs = [context.direction(k) if context else "maximize" for k in pair[:2]]
        fig, front = pareto_figure(rows, pair, title=title, directions=dirs)
        p = out / f"pareto_{pair[0]}__{pair[1]}.png"
        _png(fig, p)
        figures.append((p, f"Pareto front of {field_label(pair[0])} and {field_label(pair[1])} over the "
                           "complete full-budget trials: coloured non-dominated, grey dominated."))
    page = out / "report.html"
    page.write_text(_html(rows, title, keys, pair, front, figures, context, stars), encoding="utf-8")
    written = [p for p, _ in figures] + [page]
    if run_id:
        from mlflow import MlflowClient

        from allocopt.query.sources import resolve_tracking_uri

        client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
        for f in written:
            client.log_artifact(run_id, str(f), artifact_path)
    return written


def _table(head: Sequence[str], body: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """An HTML table; ``head`` and cells already escaped; columns in ``left`` aligned left."""
    cls = lambda i: " class='l'" if i in left else ""  # noqa: E731
    return ("<table><tr>" + "".join(f"<th{cls(i)}>{h}</th>" for i, h in enumerate(head)) + "</tr>"
            + "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in body)
            + "</table>")


def _alloc_text(a: dict[str, Any]) -> str:
    from allocopt.answer import model_name

    return (f"ρ={float(a['rho']):.3f}, G={a['group_size']}, {a['reward']}"
            + (f", {model_name(a['model'])}" if a.get("model") else ""))


def regime_html(rows: Sequence[Any], ctx: StudyContext | None) -> list[str]:
    """The regime table: RACE's regimes from the pilots and the study's one answer."""
    e = html.escape
    parts = ["<h2>Regime table</h2>"]
    shown = {str(value(r, "reward")) for r in rows}
    diags = [d for d in (ctx.diagnoses if ctx else []) if d.reward in shown]
    if diags:
        pilots = [r for r in rows if fidelity(r) == "pilot"]
        budget = f" at {ctx.pilot_fraction:g} × {ctx.budget_flops:.3e} FLOPs" if ctx.pilot_fraction and ctx.budget_flops else ""
        parts.append(f"<p class='note'>RACE's regimes from {len(pilots)} pilots{e(budget)} (target "
                     f"{e(field_label(ctx.targets[0]) if ctx.targets else '?')}): ρ* maximizes a kernel-weighted local "
                     "quadratic in ρ with G offsets, the 90% credible interval and P(regime) come from its "
                     "approximate posterior; slopes: d target / d ρ at the ends of the range; reward share: reward "
                     "FLOPs / total at ρ*.</p>")
        models = any(d.model for d in diags)
        rec_reward = ((ctx.recommendation or {}).get("allocation") or {}).get("reward")
        body = []
        for d in diags:
            lo, hi = d.rho_interval
            note = d.note
            lo_p, hi_p = ctx.pilot_ranges.get(d.reward, (math.nan, math.nan))
            if math.isfinite(d.rho) and not lo_p - 1e-9 <= d.rho <= hi_p + 1e-9:
                note = (note + "; " if note else "") + f"outside the pilots' ρ range ({lo_p:.2f}-{hi_p:.2f})"
            elif math.isfinite(d.rho) and min(d.rho - lo_p, hi_p - d.rho) <= EDGE_TOL:
                note = (note + "; " if note else "") + (f"at the edge of the pilots' ρ range ({lo_p:.2f}-{hi_p:.2f}): "
                                                        "the optimum may lie beyond")
            body.append([e(d.reward) + (" (recommended)" if d.reward == rec_reward else ""),
                         *([e(d.model or "–")] if models else []), str(d.num_trials),
                         f"{_fmt(d.rho, '.2f')} ± {_fmt(d.rho_sd, '.2f')}" if math.isfinite(d.rho) else "unknown",
                         f"{_fmt(lo, '.2f')}–{_fmt(hi, '.2f')}",
                         e(str(d.group_size)) if math.isfinite(d.rho) else "–",
                         f"{_fmt(d.slope_low, '+.2f')} / {_fmt(d.slope_high, '+.2f')}", _fmt(d.reward_share, '.0%'),
                         e(f"{d.regime} ({_fmt(d.probability, '.0%')})" if d.probability > 0 else d.regime), e(note)])
        head = ["reward", *(["model"] if models else []), "pilots", "ρ* ± sd", "90% CI of ρ*", "G",
                "slope low / high", "reward share", "regime (P)", "note"]
        parts.append(_table(head, body, left=(0, 1, len(head) - 2, len(head) - 1) if models else (0, len(head) - 2, len(head) - 1)))
    else:
        parts.append("<p class='note'>No RACE regimes: the study has no pilots with 3 or more distinct ρ per "
                     "reward system (a plain Bayesian-optimization study, or rows read from MLflow).</p>")
    parts += recommendation_html(rows, ctx)
    return parts


def recommendation_html(rows: Sequence[Any], ctx: StudyContext | None) -> list[str]:
    """The study's one answer (the lines the study prints, then its details) and the evidence."""
    e = html.escape
    rec = ctx.recommendation if ctx else None
    if not rec:
        return ["<p class='note'>No recommendation: the study stored none (plain Bayesian optimization "
                "answers with its best observed trial, below).</p>"]
    from allocopt.answer import from_dict, recommendation_lines

    a = rec["allocation"]
    target = str(rec.get("target", ""))
    level = float(rec.get("level", 0.9))
    paras: list[str] = []  # the study's lines, rejoined where they were wrapped at 80 columns
    for line in recommendation_lines(from_dict(rec), target):
        if line.startswith("    ") and paras:
            paras[-1] += " " + line.strip()
        else:
            paras.append(line.strip())
    paras = [x.replace("`allocopt report` lists them in its report.html", "listed below") for x in paras]
    parts = [f"<h3>Recommendation ({e(ctx.recommendation_source)})</h3>",
             "<p class='answer'>" + "<br>".join(e(x) for x in paras) + "</p>"]
    body = [["allocation to run", e(_alloc_text(a))],
            [f"{e(target)} at the full budget (posterior mean)", _fmt(rec.get("mean"), ".4f")],
            [f"{level:.0%} credible interval", f"{_fmt(rec.get('lower'), '.4f')} – {_fmt(rec.get('upper'), '.4f')}"],
            [f"P({e(a['reward'])} holds the best allocation)", _fmt(rec.get("prob_best"), ".0%")]]
    if rec.get("noise_sd") is not None:
        body.append(["noise of one evaluation (sd)", _fmt(rec.get("noise_sd"), ".4f")])
    if rec.get("full_runs") is not None:
        body.append(["full-budget runs it rests on", str(rec["full_runs"])])
    if rec.get("within_noise"):
        body.append(["within one evaluation's noise", e("; ".join(_alloc_text(b) for b in rec["within_noise"]))])
    parts.append(_table(["", ""], body, left=(0, 1)))
    cells = rec.get("cell_prob_best") or []
    if cells:
        parts.append("<p class='note'>P(best) per reward system: the posterior probability that the best "
                     "full-budget allocation of the space lies in it (joint posterior samples).</p>")
        parts.append(_table(["reward", "P(best)"], [[e(c["reward"] + (f" / {c['model']}" if c.get("model") else "")),
                                                     _fmt(c.get("prob_best"), ".0%")] for c in cells]))
    key = field_key(target)
    done = [r for r in rows if fidelity(r) == "full" and r.state == "COMPLETE" and math.isfinite(number(r, key))]
    if done:
        sign = -1.0 if ctx is not None and ctx.direction(key) == "minimize" else 1.0
        b = max(done, key=lambda r: (sign * number(r, key), -r.number))
        parts.append(f"<p>Evidence: best observed full-budget trial #{b.number}, {e(target)} = "
                     f"{number(b, key):.4f} at ρ={number(b, 'rho'):.3f}, G={e(str(value(b, 'group_size')))}, "
                     f"{e(str(value(b, 'reward')))}.</p>")
    return parts


def _html(rows: Sequence[Any], title: str, keys: Sequence[str], pair: Sequence[str], front: Sequence[Any],
          figures: Sequence[tuple[Path, str]], ctx: StudyContext | None, stars: Any) -> str:
    e = html.escape
    states: dict[str, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    studies = sorted({getattr(r, "study", "") for r in rows} - {""})
    budgets = budget_line(rows, ctx)
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>",
             "<p>" + e(f"{len(rows)} trials" + (f" of {', '.join(studies)}" if studies else "") + ": "
                       + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))) + "</p>",
             f"<p>{e(budgets[:1].upper() + budgets[1:])}</p>" if budgets else "",
             *regime_html(rows, ctx),
             "<h2>Best trials and ρ* per reward system and target</h2><p class='note'>The best complete "
             "full-budget trial and its compute shares; ρ* by the project's estimator (RACE's local quadratic "
             "over the full-budget trials, over the ρ range they span, else over the pilots) with its 90% "
             "credible interval, or the study's recommendation where it is for that reward system and "
             "target.</p>"]
    body = []
    for row in best_table(rows, keys, stars, ctx):
        b = row["best"] or {}
        shares = (" / ".join(f"{b[k]:.0%}" if math.isfinite(b[k]) else "–"
                             for k in ("search_share", "learning_share", "reward_share")) if b else "–")
        trial = (f"{b['study']}#{b['number']}" if len(studies) > 1 else f"#{b['number']}") if b else "–"
        s = row["rho_star"]
        minimized = ctx is not None and ctx.direction(row["target"]) == "minimize"
        star, ci, how = "–", "–", ("none for a minimized target" if minimized else "too few trials to fit") if b else ""
        if s is not None:
            star = _fmt(s.rho, ".2f")
            ci = f"{_fmt(s.interval[0], '.2f')}–{_fmt(s.interval[1], '.2f')}" if s.source != "recommendation" else "–"
            how = s.source + (f" ({s.num_trials})" if s.source != "recommendation" else "")
            how += f"; {s.edge_note()}" if s.edge_note() else ""
        body.append([e(row["reward"]), e(field_label(row["target"])), f"{row['full_trials']} / {row['pilot_trials']}",
                     e(trial), _fmt(b.get("rho")), e(_fmt(b.get("group_size"), "d")), _fmt(b.get("value"), ".4f"),
                     shares, star, ci, e(how)])
    parts.append(_table(["reward", "target", "full / pilot trials", "best trial", "best ρ", "G", "value",
                         "search / learning / reward", "ρ*", "90% CI of ρ*", "ρ* from"], body, left=(0, 1, 10)))
    if len(pair) >= 2:
        cols = list(dict.fromkeys([*pair, *keys]))
        parts.append(f"<h2>Pareto trials: {e(field_label(pair[0]))} and {e(field_label(pair[1]))}</h2>")
        parts.append(_table(["trial", "ρ", "G", "reward", *(e(field_label(k)) for k in cols), "total FLOPs"],
                            [[f"#{r.number}", _fmt(number(r, "rho")), e(_fmt(value(r, "group_size"), "d")),
                              e(str(value(r, "reward"))), *(_fmt(number(r, k), ".4f") for k in cols),
                              _fmt(number(r, "total_flops"), ".3e")] for r in front], left=(3,)))
    parts.append("<h2>Figures</h2>")
    for path, caption in figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<figure><img alt='{e(path.name)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption>{e(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


__all__ = ["recommendation_html", "regime_html", "write_report"]
