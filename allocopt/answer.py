"""The study's one answer, as lines a user reads and a dict MLflow keeps.

A finished study gives ONE recommendation: the allocation to run, its target's posterior mean
with a credible interval, and the probability that it is the best allocation; the best
observed trial is shown beside it as evidence, not as a second answer.

The recommendation is read through a small interface (attributes, duck-typed), so RACE's
``Recommendation`` plugs in as it is:

* ``allocation``: an :class:`allocopt.plan.allocation.Allocation` (``rho``, ``group_size``,
  ``reward``, ``model``);
* ``mean``: posterior mean of the target at the full budget (target units, e.g. pass@1 in
  [0, 1]);
* ``interval``: ``(lower, upper)`` credible interval of that mean, and ``level`` (e.g. 0.9);
* ``prob_best``: posterior probability that this allocation is the best, in [0, 1].

A bare :class:`~allocopt.plan.allocation.Allocation` (what RACE returned before its
``Recommendation``) is accepted: the line then says that no interval was computed.
Standard library only; no torch, Optuna or MLflow.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from allocopt.errors import short_error

WIDTH = 80
"""Columns the study's lines fit (a default terminal; a file gets the same lines)."""


def _alloc(rec: Any) -> Any:
    return getattr(rec, "allocation", rec)


def model_name(model: Any) -> str:
    """How a line names a policy: its last path part (``Qwen2.5-7B-Instruct``)."""
    return str(model).split("/")[-1]


def allocation_text(a: Any) -> str:
    """``rho=0.620 G=8 structured`` (plus :func:`model_name` when a model is set)."""
    model = getattr(a, "model", None)
    return (f"rho={a.rho:.3f} G={a.group_size} {a.reward}"
            + (f" {model_name(model)}" if model else ""))


def _interval(rec: Any) -> tuple[float, float] | None:
    iv = getattr(rec, "interval", None)
    if iv is None and hasattr(rec, "lower") and hasattr(rec, "upper"):
        iv = (rec.lower, rec.upper)
    if iv is None:
        return None
    lo, hi = float(iv[0]), float(iv[1])
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def recommendation_lines(rec: Any, target: str) -> list[str]:
    """The answer as lines of at most :data:`WIDTH` columns: the allocation, its mean, interval
    and P(best), then (RACE) the allocations within noise of it and the likeliest best reward
    system when that differs.

    >>> from allocopt.plan.allocation import Allocation
    >>> recommendation_lines(Allocation(0.5, 4, "sparse"), "pass@1")[0]
    'recommended: rho=0.500 G=4 sparse'
    """
    a = _alloc(rec)
    lines = [f"recommended: {allocation_text(a)}"]
    mean = getattr(rec, "mean", None)
    if mean is None:
        lines.append(f"  ({target} at the full budget: no interval computed for this study)")
        return lines
    iv = _interval(rec)
    level = float(getattr(rec, "level", 0.9))
    text = f"  {target} = {float(mean):.3f}"
    if iv is not None:
        text += f", {level:.0%} CI {iv[0]:.3f}-{iv[1]:.3f}"
    pb = getattr(rec, "prob_best", None)
    if pb is not None and math.isfinite(float(pb)):
        # the posterior probability that the best allocation of the space lies in this
        # allocation's reward system (x model), not that this exact rho and G is best
        text += f"; P({a.reward} is best) = {float(pb):.0%}"
    lines.append(text)
    lines += _noise_lines(rec, a)
    lines += gain_lines(rec, target)
    return lines


def gain_lines(rec: Any, target: str) -> list[str]:
    """What one more full run is worth (the tuner's knowledge gradient: the expected rise of
    the answer's true value), and where it would run; nothing when not computed."""
    gain = _field(rec, "gain_of_one_more_run")
    if gain is None or not math.isfinite(float(gain)):
        return []
    nxt = _field(rec, "best_next")
    where = ""
    if nxt is not None:
        nxt = nxt if not isinstance(nxt, dict) else from_dict({"allocation": nxt}).allocation
        where = f" (at {allocation_text(nxt)})"
    return _wrap(f"one more full run is worth +{float(gain):.4f} {target}{where}")


def _wrap(text: str) -> list[str]:
    """``text`` as answer lines: indented under the answer, wrapped (never cut) at :data:`WIDTH`."""
    return textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ")


def _field(x: Any, name: str) -> Any:
    return x.get(name) if isinstance(x, dict) else getattr(x, name, None)


def _noise_lines(rec: Any, a: Any) -> list[str]:
    """The allocations within one evaluation's noise of the answer, and the reward system most
    likely to hold the best allocation when that is not the answer's (RACE's ``within_noise``
    and ``cell_prob_best``; nothing for a bare allocation). Each line within :data:`WIDTH`."""
    out: list[str] = []
    close = list(getattr(rec, "within_noise", None) or ())
    others = [b for b in close if (_field(b, "rho"), _field(b, "group_size"), _field(b, "reward"))
              != (a.rho, a.group_size, a.reward)]
    if others:
        rewards = list(dict.fromkeys(str(_field(b, "reward")) for b in close))
        rhos = [float(_field(b, "rho")) for b in close]
        sd = getattr(rec, "noise_sd", None)
        sd_text = f" (sd {float(sd):.3f})" if sd is not None and math.isfinite(float(sd)) else ""
        span = f"{min(rhos):.2f}" if max(rhos) - min(rhos) < 5e-3 else f"{min(rhos):.2f}-{max(rhos):.2f}"
        text = (f"within one evaluation's noise{sd_text}: {len(close)} allocations at rho {span}, "
                f"{len(rewards)} reward system{'s' if len(rewards) > 1 else ''} ({', '.join(rewards)}): "
                "not one winner; `allocopt report` lists them in its report.html")
        out += _wrap(text)
    cells = [(str(_field(c, "reward") if not isinstance(c, tuple) else c[0]),
              float(_field(c, "prob_best") if not isinstance(c, tuple) else c[2]))
             for c in (getattr(rec, "cell_prob_best", None) or ())]
    if cells:
        top, p = max(cells, key=lambda t: t[1])
        if top != a.reward:
            out += _wrap(f"the reward system most likely to hold the best allocation: {top} (P = {p:.0%})")
    untried = [str(u) for u in (getattr(rec, "untried", None) or ())]
    if untried:
        text = (f"no full run yet of {', '.join(untried)}: what it says of "
                f"{'them' if len(untried) > 1 else 'it'} rests on the model's sharing across cells "
                "(and pilots, where run)")
        out += _wrap(text)
    return out


def evidence_line(number: int, value: float, allocation: Any, target: str) -> str:
    """The best observed full-budget trial, as evidence beside the answer (<= 80 columns)."""
    return f"evidence: best observed trial {number}, {target} = {value:.3f} at {allocation_text(allocation)}"


def from_dict(rec: dict[str, Any]) -> Any:
    """The answer back from :func:`recommendation_dict` (as the study stores it), with the
    attributes :func:`recommendation_lines` reads (``allocation`` an
    :class:`~allocopt.plan.allocation.Allocation`)."""
    from types import SimpleNamespace

    from allocopt.plan.allocation import Allocation

    a = rec["allocation"]
    return SimpleNamespace(**{k: v for k, v in rec.items() if k != "allocation"},
                           allocation=Allocation(a["rho"], a["group_size"], a["reward"], a.get("model")))


def recommendation_dict(rec: Any, target: str, direction: str = "maximize") -> dict[str, Any]:
    """What :meth:`allocopt.tracking.StudyTracker.log_recommendation` logs, in target units: a
    tuner maximizes, so for a minimized target (``direction``) its mean and interval, fitted on
    the negated values, are turned back (a gain stays a gain)."""
    sign = -1.0 if direction == "minimize" else 1.0
    a = _alloc(rec)
    out: dict[str, Any] = {"target": target, "allocation": {
        "rho": a.rho, "group_size": a.group_size, "reward": a.reward,
        **({"model": a.model} if getattr(a, "model", None) else {})}}
    for k in ("mean", "level", "prob_best"):
        v = getattr(rec, k, None)
        if v is not None:
            out[k] = sign * float(v) if k == "mean" else float(v)
    iv = _interval(rec)
    if iv is not None:
        out["lower"], out["upper"] = sorted((sign * iv[0], sign * iv[1]))
    # RACE's Recommendation also names the allocations within one evaluation's noise of it and
    # P(best) per reward system (x model); the report shows them (allocopt.query.report)
    for k in ("noise_sd", "full_runs"):
        v = getattr(rec, k, None)
        if v is not None:
            out[k] = float(v) if k == "noise_sd" else int(v)
    close = getattr(rec, "within_noise", None)
    if close:
        out["within_noise"] = [{"rho": b.rho, "group_size": b.group_size, "reward": b.reward,
                                **({"model": b.model} if getattr(b, "model", None) else {})} for b in close]
    gain = getattr(rec, "gain_of_one_more_run", None)
    if gain is not None and math.isfinite(float(gain)):
        out["gain_of_one_more_run"] = float(gain)
        nxt = getattr(rec, "best_next", None)
        if nxt is not None:
            out["best_next"] = {"rho": nxt.rho, "group_size": nxt.group_size, "reward": nxt.reward,
                                **({"model": nxt.model} if getattr(nxt, "model", None) else {})}
    untried = getattr(rec, "untried", None)
    if untried:
        out["untried"] = [str(u) for u in untried]
    cells = getattr(rec, "cell_prob_best", None)
    if cells:
        out["cell_prob_best"] = [{"reward": w, **({"model": m} if m else {}), "prob_best": float(p)}
                                 for w, m, p in cells]
    return out


def trial_line(row: Any, spec: Any, width: int = WIDTH) -> str:
    """One line per finished trial, at most ``width`` columns, numbers kept.

    Args:
        row: a :class:`allocopt.record.TrialRow`.
        spec: the :class:`allocopt.spec.StudySpec` (defaults for a fixed dimension).
    """
    p = row.params
    msg = (f"trial {row.number} {row.state}: rho={p.get('rho', spec.space.rho[0]):.3f} "
           f"G={p.get('group_size', spec.space.group_sizes[0])} {p.get('reward', spec.space.rewards[0])}")
    if spec.space.models:  # a model-size study: which policy, named as the answer names it
        msg += f" {model_name(p.get('model', spec.space.models[0]))}"
    if row.state == "COMPLETE":
        msg += " -> " + ", ".join(f"{t}={row.targets.get(k, row.value):.4f}"
                                  for t, k in zip(spec.targets, spec.target_keys))
    elif row.error:
        err = row.error
        if row.state == "INFEASIBLE" and "needs " in err:  # the number that matters
            err = "needs " + err.rsplit("needs ", 1)[1]
        elif row.state == "INFEASIBLE" and "(nearest " in err:  # the allocation is on the line
            err = "nearest realizable rho=" + err.rsplit("(nearest ", 1)[1].rstrip(")")
        msg += " (" + short_error(err, max(10, width - len(msg) - 3)) + ")"
    return msg
