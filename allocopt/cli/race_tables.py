"""The tables ``allocopt race`` (and ``allocopt study`` with pilots) prints: regimes, proposals,
the pilot-against-full check. Each fits 80 columns (a default terminal, and what rich gives a
file or a pipe) without cutting a number: short headers, one value per cell, the model as a
section of its own and notes as lines under the table.

rich only; the diagnoses, proposals and validation rows are read by attribute.
"""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def _f(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _table(title: str | None = None) -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, title=title,
                 caption_justify="left")


def _short_model(model: str | None) -> str:
    from allocopt.answer import model_name

    return model_name(model) if model else "-"


def regime_table(diagnoses: list[Any], pilot_budget: float | str, target: str, show_model: bool) -> Group:
    """The regime of each reward system from its pilots (:class:`allocopt.race.RegimeDiagnosis`
    rows): ρ* ± sd, its 90 % credible interval, the G, the slopes at the ends of the ρ range, the
    reward share at ρ*, the regime and its probability. With ``show_model``, one section per
    policy model. At most 80 columns for the 5 reward systems' names; a renderable for
    ``Console.print``. ``pilot_budget``: FLOPs of each pilot, or a text (a time budget: each
    allocation's own FLOPs)."""
    each = pilot_budget if isinstance(pilot_budget, str) else f"{pilot_budget:.2e} FLOPs each"
    parts: list[Any] = [Text(f"RACE regimes from pilots at {each} "
                             f"(target {target})", style="italic")]
    models = list(dict.fromkeys(d.model for d in diagnoses)) if show_model else [None]
    notes = []
    for m in models:
        t = _table(f"model {_short_model(m)}" if show_model else None)
        for c in ("reward", "n", "rho*±sd", "90% CI", "G", "slope lo/hi", "rwd", "regime (P)"):
            t.add_column(c, justify="left" if c in ("reward", "regime (P)") else "right", no_wrap=True)
        for d in diagnoses:
            if show_model and d.model != m:
                continue
            lo, hi = d.rho_interval
            known = not math.isnan(d.rho)
            t.add_row(d.reward, str(d.num_trials), f"{_f(d.rho, '.2f')}±{_f(d.rho_sd, '.2f')}" if known else "unknown",
                      f"{_f(lo, '.2f')}-{_f(hi, '.2f')}", str(d.group_size) if known else "-",
                      f"{_f(d.slope_low, '+.2f')}/{_f(d.slope_high, '+.2f')}", _f(d.reward_share, ".0%"),
                      f"{d.regime} ({_f(d.probability, '.0%')})" if d.probability > 0 else d.regime)
            if d.note:
                notes.append(f"{d.reward}" + (f" ({_short_model(d.model)})" if show_model else "")
                             + f": {d.note}")
        parts.append(t)
    parts += [Text(f"note: {n}") for n in notes]
    parts.append(Text("rho*: maximizer of a local quadratic fit of the target in rho (sd, 90% "
                      "CI and P from its approximate posterior); slopes: d target/d rho at the ends of the range; "
                      "rwd: reward FLOPs / total at rho*", style="dim"))
    return Group(*parts)


def proposal_table(proposals: list[Any]) -> Table:
    """The runs the surrogate proposes (:class:`allocopt.race.Proposal`)."""
    t = _table("Proposed runs (Thompson sampling of the full-budget maximizer)")
    for c in ("run", "rho", "G", "reward", "FLOPs", "iters", "mu", "pred. full", "P(best)"):
        t.add_column(c, justify="left" if c in ("run", "reward") else "right", no_wrap=True)
    for p in proposals:
        a = p.allocation
        t.add_row(p.fidelity, f"{a.rho:.3f}", str(a.group_size), a.reward, f"{p.budget_flops:.1e}",
                  str(p.plan.iterations), f"{p.plan.update_passes:.2f}",
                  f"{p.predicted_mean:.3f}±{p.predicted_sd:.3f}", f"{p.acquisition:.3f}")
    t.caption = "run: pilot or full budget; mu: update passes; pred. full: mean ± sd"
    return t


def validation_table(rows: list[Any], rate: float, rate_all: float) -> Group:
    """Each reward system's pilot regime against its full-budget regime
    (:class:`allocopt.race.ValidationRow`); one section per policy model when rows name one."""
    models = list(dict.fromkeys(r.model for r in rows)) or [None]
    parts: list[Any] = [Text("Pilot regime against the full-budget regime", style="italic")]
    for m in models:
        t = _table(f"model {_short_model(m)}" if m else None)
        for c in ("reward", "pilot", "rho*", "full (P)", "rho*", "same", "regret", "runs"):
            t.add_column(c, justify="left" if c in ("reward", "pilot", "full (P)") else "right", no_wrap=True)
        for r in rows:
            if r.model != m:
                continue
            t.add_row(r.reward, r.pilot_regime, _f(r.pilot_rho, ".2f"),
                      f"{r.full_regime} ({_f(r.full_probability, '.0%')})", _f(r.full_rho, ".2f"),
                      "-" if r.same_regime is None else "yes" if r.same_regime else "NO", _f(r.regret, ".4f"), str(r.num_full))
        parts.append(t)
    parts.append(Text(f"same-regime rate {_f(rate, '.2f')} over reward systems with a full-budget "
                      f"run ({_f(rate_all, '.2f')} over all; a pilot regime left unknown, '-', is "
                      "in neither); full regime and regret from the "
                      "multi-fidelity surrogate's posterior at the full budget; runs: full-budget "
                      "runs of the reward system", style="dim"))
    return Group(*parts)
