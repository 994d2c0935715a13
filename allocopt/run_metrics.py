"""A run's metrics read back: the targets it reports, checked against the study's vocabulary,
and the compute it spent by phase.

``allocopt tell --metrics`` (:mod:`allocopt.study.asktell`) and the ``command`` objective read
the metrics file of a run launched outside allocopt with these: the targets at the top level or
under ``targets`` (each spelled as declared, ``pass@1``, or as its key, ``pass_at_1``), the FLOPs
as ``search_flops``, ``learning_flops``, ``reward_flops`` (at the top level or under ``breakdown``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

from allocopt.errors import ConfigError
from allocopt.flops import ComputeBreakdown, FlopAccount

if TYPE_CHECKING:
    from allocopt.spec import StudySpec

MAX_TOLD_FLOPS = 1e30
"""Most FLOPs one phase of a told trial may report: about 30,000 years of a 1 EFLOP/s cluster;
a larger count is a unit mistake, not a run."""


def account_from_metrics(d: Mapping[str, Any]) -> FlopAccount | None:
    """A :class:`FlopAccount` from ``search_flops``/``learning_flops``/``reward_flops`` (executed;
    ``useful_*`` optional, else the same) at the top level or under ``breakdown``; ``None``
    when none is given.

    Raises:
        ConfigError: a value that is not a number from 0 to :data:`MAX_TOLD_FLOPS`, or only
            some phases given.
    """
    src = d.get("breakdown") if isinstance(d.get("breakdown"), Mapping) else d
    keys = ("search_flops", "learning_flops", "reward_flops")
    if not any(k in src for k in keys):
        return None

    def phases(prefix: str) -> ComputeBreakdown:
        vals = {}
        for k in keys:
            v = src.get(prefix + k, src.get(k) if prefix else None)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or v > MAX_TOLD_FLOPS:
                raise ConfigError(f"{prefix}{k}={v!r}: must be a number of FLOPs from 0 to "
                                  f"{MAX_TOLD_FLOPS:.0e}")
            vals[k.split("_")[0]] = {"total": int(round(v))}
        return ComputeBreakdown(**vals)

    return FlopAccount(useful=phases("useful_"), executed=phases(""))


def targets_from_metrics(d: Mapping[str, Any], spec: StudySpec) -> dict[str, float]:
    """The study's targets (by key: ``pass_at_1``) from ``d`` or ``d["targets"]``, spelled
    either way (``pass@1`` or ``pass_at_1``), checked against the study's vocabulary.

    Raises:
        ConfigError: a target is missing, not a finite number or outside its declared range,
            or ``d["targets"]`` names a target the study does not know.
    """
    out = metric_targets(d, spec.vocabulary)
    missing = [t for t, k in zip(spec.targets, spec.target_keys) if k not in out]
    if missing:
        wanted = ", ".join(f"{t} ({dr})" for t, dr in zip(spec.targets, spec.directions))
        raise ConfigError(f"metrics: target {', '.join(missing)} missing; the study's targets: {wanted}")
    return out


def metric_targets(d: Mapping[str, Any], vocabulary: Any = None) -> dict[str, float]:
    """Every known target ``d`` (or ``d["targets"]``) holds, by key, each checked by its
    definition (a finite number, inside its range: ``pass@1`` a share in [0, 1]). With a study's
    ``vocabulary``, a ``targets`` table may name no other target; without one (``tell`` checks
    its metrics file so before it opens the storage) the built-in targets are checked and
    other names left to the study.

    Raises:
        ConfigError: a value that is not a finite number or is outside its range; an
            undeclared name in ``d["targets"]`` (with ``vocabulary``).
    """
    from allocopt.vocabulary import Vocabulary

    vocab = vocabulary if vocabulary is not None else Vocabulary()
    table = d.get("targets") if isinstance(d.get("targets"), Mapping) else None
    src = table if table is not None else d
    out: dict[str, float] = {}
    for t in vocab.targets:
        v = src.get(t.name, src.get(t.key))
        if v is not None:
            out[t.key] = t.check_value(v)
    if table is not None and vocabulary is not None:
        known = {n for t in vocab.targets for n in (t.name, t.key)}
        extra = next((str(k) for k in table if k not in known), None)
        if extra is not None:
            raise ConfigError(f"metrics: target {extra[:80]!r} is not declared by the study; declared: "
                              f"{', '.join(t.name for t in vocab.targets)} (declare it in the study "
                              "file's [targets] table, or leave it out of \"targets\")")
    return out


__all__ = ["MAX_TOLD_FLOPS", "account_from_metrics", "metric_targets", "targets_from_metrics"]
