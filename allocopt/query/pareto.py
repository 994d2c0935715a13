"""Queries over finished trials: Pareto fronts over several targets, best per target, filters.

Rows come from an Optuna study or from MLflow experiments, across studies
(:mod:`allocopt.query.sources`); both give :class:`allocopt.record.TrialRow`. The query functions
take any rows with ``number``, ``state``, ``params``, ``targets`` and ``metrics``
(a row without ``fidelity`` counts as ``full``).

Names
=====

A *field* of a row is looked up, in this order, in its targets, its allocation params, its
breakdown metrics and its own attributes (``number``, ``state``, ``fidelity``, ``study``):

* targets under their snake_case key (``pass_at_1``); the CLI spelling (``pass@1``,
  ``pass@1:gsm8k``) is accepted everywhere and translated with :func:`allocopt.spec.target_key`;
* ``rho`` is the *asked* update fraction of the allocation (the search variable); the
  realized executed ρ = learning / total FLOPs (the breakdown's metric ``rho``) is queried as
  ``realized_rho`` (plans whose ρ cannot be realized within 0.01 are never run, so the two
  differ by at most 0.01);
* breakdown metrics: ``search_flops``, ``learning_flops``, ``reward_flops``, ``total_flops``
  (executed FLOPs), ``useful_*``, ``budget_utilization``, ``eval_flops``, ...

Only ``COMPLETE`` trials with a finite value of every queried field take part in
:func:`pareto_front` and :func:`best`: failed and infeasible trials measured no target (NaN or
missing) and are left out.

Optuna, MLflow and pandas are imported inside the functions that need them; no torch.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Sequence

from allocopt.record import observed_rho
from allocopt.spec import TARGETS, target_key, target_label

DIRECTIONS = ("maximize", "minimize")
ALLOCATION = ("rho", "group_size", "reward", "model")
"""Allocation params every row carries (``model`` may be ``None``)."""
BREAKDOWN = ("search_flops", "learning_flops", "reward_flops", "total_flops", "realized_rho")
"""The main breakdown columns, in table order (executed FLOPs and ρ = learning / total)."""
TARGET_KEYS = tuple(target_key(t) for t in TARGETS)
WHERE_FORMS = "KEY=VALUE, KEY!=VALUE, KEY>NUMBER, KEY>=NUMBER, KEY<NUMBER, KEY<=NUMBER"
_ROW_FIELDS = ("number", "state", "fidelity", "study")
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_@:.]*)\s*(!=|>=|<=|==|=|>|<)\s*(\S(?:.*\S)?)\s*$")


from allocopt.errors import QueryError  # noqa: E402,F401  (defined there; imported from here too)


# ============================================================================ fields
def field_key(name: str, vocabulary: Any = None) -> str:
    """The row key of a field name: a target in CLI spelling -> its stored key (``pass@1`` ->
    ``pass_at_1``; a study's declared target by its vocabulary); anything else unchanged
    (stripped)."""
    name = name.strip()
    if vocabulary is not None and any(t.name == name for t in vocabulary.targets):
        return vocabulary.key(name)
    return target_key(name) if name in TARGETS else name


def field_label(key: str, vocabulary: Any = None) -> str:
    """How people read a key: ``pass_at_1`` -> ``pass@1`` (a declared target's key -> its
    declared name, given the study's vocabulary); other keys unchanged."""
    return target_label(key, vocabulary)


def value(row: Any, key: str) -> Any:
    """The value of field ``key`` (see :func:`field_key`) in a row, or ``None`` if absent.

    Looked up in the targets, the allocation params, then the metrics (``realized_rho`` is the
    metric ``rho``), then the row's own attributes.
    """
    if key == "realized_rho":
        return row.metrics.get("rho")
    for d in (row.targets, row.params, row.metrics):
        if key in d:
            return d[key]
    if key in _ROW_FIELDS:
        return getattr(row, key, "full" if key == "fidelity" else None)
    return None


def number(row: Any, key: str) -> float:
    """Field ``key`` as a float; NaN when absent or not a number."""
    v = value(row, key)
    if isinstance(v, bool):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def spent_rho(row: Any) -> float:
    """The ρ a trial's result belongs to (:func:`allocopt.record.observed_rho`, as the tuner
    places it): what the report's figures plot and its fits read."""
    return observed_rho(getattr(row, "source", None), number(row, "rho"), number(row, "realized_rho"))


def known_fields(rows: Iterable[Any]) -> list[str]:
    """Every field name some row has (sorted), plus the allocation and row fields."""
    keys = set(ALLOCATION) | set(_ROW_FIELDS)
    for r in rows:
        keys.update(r.targets, r.params, (k if k != "rho" else "realized_rho" for k in r.metrics))
    keys.discard("value")
    return sorted(keys)


def measured_targets(rows: Iterable[Any]) -> list[str]:
    """Target keys some complete row measured, in :data:`allocopt.spec.TARGETS` order."""
    seen = {k for r in rows if r.state == "COMPLETE" for k, v in r.targets.items()
            if _finite(v)}
    return [k for k in TARGET_KEYS if k in seen] + sorted(seen - set(TARGET_KEYS))


def check_fields(rows: Sequence[Any], names: Sequence[str], what: str = "objective",
                 vocabulary: Any = None) -> list[str]:
    """Keys of ``names`` (CLI spelling allowed), each measured by at least one complete row.

    Raises:
        QueryError: a name is neither a target nor a field of any row, or no complete row has
            a finite value of it; the message lists the targets measured.
    """
    keys = []
    known = set(known_fields(rows))
    measured = ", ".join(field_label(k, vocabulary) for k in measured_targets(rows)) or "none"
    for name in names:
        key = field_key(name, vocabulary)
        if key not in known and key not in TARGET_KEYS:
            raise QueryError(f"{what}={name!r}: unknown; targets measured: {measured} "
                             f"(or a breakdown field such as total_flops, realized_rho)")
        if not any(r.state == "COMPLETE" and math.isfinite(number(r, key)) for r in rows):
            raise QueryError(f"{what}={name!r}: no complete trial measured it; "
                             f"targets measured: {measured}")
        keys.append(key)
    return keys


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


# ============================================================================ queries
def default_direction(key: str, vocabulary: Any = None) -> str:
    """A target's declared direction (given the study's vocabulary); else ``minimize`` for
    costs (``*_flops``, ``*_seconds``), ``maximize`` otherwise."""
    if vocabulary is not None:
        t = next((t for t in vocabulary.targets if t.key == key), None)
        if t is not None:
            return t.direction
    return "minimize" if key.endswith(("_flops", "_seconds")) else "maximize"


def _signs(objectives: Sequence[str], directions: Sequence[str]) -> list[float]:
    if len(objectives) != len(directions):
        raise QueryError(f"directions={','.join(directions)!r}: need one per objective "
                         f"({len(objectives)}: {', '.join(field_label(o) for o in objectives)})")
    signs = []
    for d in directions:
        if d not in DIRECTIONS:
            raise QueryError(f"direction={d!r}: allowed: {', '.join(DIRECTIONS)}")
        signs.append(1.0 if d == "maximize" else -1.0)
    return signs


def pareto_front(rows: Sequence[Any], objectives: Sequence[str],
                 directions: Sequence[str] | None = None) -> list[Any]:
    """The non-dominated complete trials over several objectives.

    Trial ``a`` dominates ``b`` when ``a`` is at least as good in every objective and strictly
    better in one. Ties: trials with *identical* objective values never dominate each other,
    so all of them are kept (a duplicated optimum is reported once per trial). Rows that are
    not ``COMPLETE`` or lack a finite value of some objective (NaN, missing) are excluded.

    Args:
        rows: trials (:class:`allocopt.record.TrialRow`).
        objectives: ``k`` field names (``pass@1``, ``judge``, ``total_flops``, ...; see the
            module docstring).
        directions: ``k`` of ``maximize`` / ``minimize``; default :func:`default_direction`.

    Returns:
        the non-dominated rows, in the order given. Sweep over the rows sorted
        lexicographically from best to worst (every dominator of a row comes before it):
        ``O(n log n + n·f·k)`` for ``f`` points on the front.

    Raises:
        QueryError: ``directions`` of the wrong length or with an unknown word.
    """
    keys = [field_key(o) for o in objectives]
    signs = _signs(keys, directions if directions is not None else [default_direction(k) for k in keys])
    points = []
    for i, r in enumerate(rows):
        if r.state != "COMPLETE":
            continue
        p = tuple(s * number(r, k) for s, k in zip(signs, keys))
        if all(math.isfinite(v) for v in p):
            points.append((p, i))
    points.sort(key=lambda t: t[0], reverse=True)
    front: list[tuple[tuple[float, ...], int]] = []
    for p, i in points:
        if not any(all(a >= b for a, b in zip(q, p)) and q != p for q, _ in front):
            front.append((p, i))
    return [rows[i] for i in sorted(i for _, i in front)]


def best(rows: Sequence[Any], target: str, direction: str | None = None) -> Any | None:
    """The complete trial with the best finite value of ``target``; ``None`` if there is none.

    Ties go to the lowest trial number (then the first row given). ``direction`` defaults to
    :func:`default_direction` (``maximize`` for targets). Raises :class:`QueryError` for an
    unknown direction.
    """
    key = field_key(target)
    (sign,) = _signs([key], [direction or default_direction(key)])
    done = [(-sign * number(r, key), r.number, i) for i, r in enumerate(rows)
            if r.state == "COMPLETE" and math.isfinite(number(r, key))]
    return rows[min(done)[2]] if done else None


def best_per(rows: Sequence[Any], target: str, by: str = "reward",
             direction: str | None = None) -> dict[Any, Any]:
    """:func:`best` within each value of field ``by`` (default: per reward system), sorted."""
    groups: dict[Any, list[Any]] = {}
    for r in rows:
        groups.setdefault(value(r, by), []).append(r)
    out = {g: best(rs, target, direction) for g, rs in groups.items()}
    return {g: out[g] for g in sorted((g for g in out if out[g] is not None), key=str)}


# ============================================================================ filters
def parse_where(clause: str) -> tuple[str, str, str]:
    """``"rho>0.5"`` -> ``("rho", ">", "0.5")``. Raises :class:`QueryError` (malformed)."""
    m = _WHERE.match(clause)
    if not m:
        raise QueryError(f"where={clause!r}: malformed; allowed forms: {WHERE_FORMS} "
                         f"(e.g. reward=prm, rho>0.5, group_size=8, fidelity=full)")
    key, op, text = m.groups()
    op = "=" if op == "==" else op
    if op in (">", ">=", "<", "<=") and not _finite(text):
        raise QueryError(f"where={clause!r}: {op} needs a number; allowed forms: {WHERE_FORMS}")
    return field_key(key), op, text


def filter_rows(rows: Sequence[Any], where: Sequence[str]) -> list[Any]:
    """Rows matching every clause of ``where`` (an AND).

    A clause is ``KEY OP VALUE`` with ``OP`` one of ``= == != > >= < <=``, e.g. ``reward=prm``,
    ``rho>0.5``, ``rho<=0.7``, ``group_size=8``, ``fidelity=full``, ``pass@1>=0.6``. Numbers
    compare as numbers (``group_size=8`` matches ``8`` and ``"8"``), anything else as text. A
    row without the field matches no clause about it (``!=`` included).

    Raises:
        QueryError: a malformed clause, an ordering with a non-number, or a key no row has.
    """
    parsed = [(c, *parse_where(c)) for c in where]
    known = set(known_fields(rows)) | set(TARGET_KEYS)
    for clause, key, _, _ in parsed:
        if key not in known:
            main = [*ALLOCATION, *_ROW_FIELDS, *(field_label(k) for k in measured_targets(rows)), *BREAKDOWN]
            raise QueryError(f"where={clause!r}: unknown field {key!r}; known: {', '.join(main)} "
                             f"and the other breakdown metrics")
    return [r for r in rows if all(_match(value(r, key), op, text) for _, key, op, text in parsed)]


def _match(v: Any, op: str, text: str) -> bool:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return False
    if _finite(text) and _finite(v):
        a, b = float(v), float(text)
    else:
        a, b = str(v), text  # type: ignore[assignment]
        if op not in ("=", "!="):
            return False
    return {"=": a == b, "!=": a != b, ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[op]


# ============================================================================ tables
def to_dataframe(rows: Sequence[Any]) -> Any:
    """One row per trial as a pandas DataFrame.

    Columns, in this order: ``study``, ``number``, ``state``, ``fidelity``; the allocation
    ``rho`` (asked), ``group_size``, ``reward``, ``model``; the targets under their
    **snake_case** keys (``native_reward``, ``pass_at_1``, ``pass_at_1_gsm8k``, ``judge``: valid
    Python names, so ``df.pass_at_1`` and ``df.query("pass_at_1 > 0.5")`` work, and the same as
    the MLflow metric keys; :func:`field_label` gives the CLI spelling); the breakdown
    :data:`BREAKDOWN` (executed FLOPs as floats, ``realized_rho``); then every other metric
    (sorted), and ``error``. A target or metric a trial did not measure is NaN.
    """
    import pandas as pd

    seen = {k for r in rows for k in r.targets}
    targets = [k for k in TARGET_KEYS if k in seen] + sorted(seen - set(TARGET_KEYS))
    other = sorted({("realized_rho" if k == "rho" else k) for r in rows for k in r.metrics}
                   - set(BREAKDOWN) - {"value"} - set(targets))
    records = []
    for r in rows:
        rec: dict[str, Any] = {"study": getattr(r, "study", ""), "number": r.number, "state": r.state,
                               "fidelity": getattr(r, "fidelity", "full")}
        for k in ALLOCATION:
            rec[k] = r.params.get(k)
        for k in targets:
            rec[k] = number(r, k) if k in r.targets else math.nan
        for k in (*BREAKDOWN, *other):
            m = "rho" if k == "realized_rho" else k
            rec[k] = number(r, k) if m in r.metrics else math.nan
        rec["error"] = r.error
        records.append(rec)
    cols = ["study", "number", "state", "fidelity", *ALLOCATION, *targets, *BREAKDOWN, *other, "error"]
    return pd.DataFrame.from_records(records, columns=cols)


def row_dict(row: Any) -> dict[str, Any]:
    """A JSON-ready dict of a row: allocation, targets (snake_case keys), breakdown, plan budget."""
    m = row.metrics
    return {"study": getattr(row, "study", ""), "number": row.number, "state": row.state,
            "fidelity": getattr(row, "fidelity", "full"),
            "allocation": {k: row.params.get(k) for k in ALLOCATION},
            "targets": {k: v for k, v in row.targets.items() if _finite(v)},
            "breakdown": {k: number(row, k) for k in BREAKDOWN
                          if (m.get("rho") if k == "realized_rho" else m.get(k)) is not None},
            "budget_flops": getattr(row, "plan", {}).get("budget_flops"),
            "run_id": getattr(row, "run_id", None)}


__all__ = ["ALLOCATION", "BREAKDOWN", "DIRECTIONS", "QueryError", "best", "best_per",
           "check_fields", "default_direction", "field_key", "field_label", "filter_rows",
           "known_fields", "measured_targets",
           "number", "pareto_front", "parse_where", "row_dict", "spent_rho", "to_dataframe"]
