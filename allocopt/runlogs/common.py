"""What both importers share: the result type, the error, and the accounting of logged steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from allocopt.flops import PHASES, ConfigError, FlopAccount
from allocopt.flops.grpo import grpo_step_flops


from allocopt.errors import RunLogError  # noqa: E402,F401  (defined there; imported from here too)


@dataclass(frozen=True)
class ImportedRun:
    """FLOPs of an existing GRPO run, and where every number came from."""

    account: FlopAccount
    """Useful and executed FLOPs of the whole run, per phase and item."""
    steps: int
    """GRPO steps (rollout batches) accounted."""
    engine: str
    """The :data:`allocopt.flops.grpo.ENGINES` model used for executed FLOPs."""
    fields_read: Mapping[str, str]
    """Field -> where it came from (file and key, or ``given`` for an override)."""
    fields_assumed: Mapping[str, str]
    """Field -> the value assumed and why (the log does not say)."""
    phase_seconds: Mapping[str, float] | None = None
    """Wall seconds per phase (``search``, ``learning``, ``reward``) summed over the run, when
    the log has timings; else ``None``."""
    num_devices: int | None = None
    """Accelerators the run used (verl ``trainer.n_gpus_per_node × trainer.nnodes``)."""
    source: str = ""
    """The file or folder read."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The recipe settings the account used (:data:`allocopt.plan.recipe.RECIPE_KEYS`; lengths vary per step)."""

    def achieved(self, peak_tflops: float | None = None) -> dict[str, dict[str, float | None]]:
        """Per phase with timings: ``seconds``, executed ``flops_per_second`` (all devices),
        ``flops_per_second_per_device`` and ``mfu`` (per-device rate / ``peak_tflops·1e12``;
        ``None`` without a peak). Empty without timings."""
        if not self.phase_seconds:
            return {}
        n = self.num_devices or 1
        out: dict[str, dict[str, float | None]] = {}
        for phase, secs in self.phase_seconds.items():
            if phase not in PHASES or secs <= 0:
                continue
            rate = getattr(self.account.executed, f"{phase}_flops") / secs
            out[phase] = {"seconds": secs, "flops_per_second": rate,
                          "flops_per_second_per_device": rate / n,
                          "mfu": None if not peak_tflops else rate / n / (peak_tflops * 1e12)}
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: the flat account (as ``allocopt account --json``) and the provenance."""
        return {"source": self.source, "engine": self.engine, "steps": self.steps,
                "num_devices": self.num_devices, "settings": dict(self.settings),
                **self.account.to_dict(),
                "phase_seconds": None if self.phase_seconds is None else dict(self.phase_seconds),
                "fields_read": dict(self.fields_read),
                "fields_assumed": dict(self.fields_assumed)}


@dataclass(frozen=True)
class LoggedStep:
    """Lengths of the rollout batches one log record stands for."""

    prompt_mean: float
    completion_mean: float
    completion_max: float | None
    weight: float
    """Rollout batches this record stands for (several when a record averages them)."""


def recipe_fields() -> set[str]:
    """Keys a recipe may give (:data:`allocopt.plan.recipe.RECIPE_KEYS`)."""
    from allocopt.plan.recipe import RECIPE_KEYS

    return set(RECIPE_KEYS)


def check_overrides(source: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Overrides that are recipe keys (``None`` dropped); else :class:`RunLogError`."""
    known = recipe_fields() - {"lengths", "steps", "prompt_tokens", "completion_tokens",
                               "completion_max", "length_distribution"}
    bad = sorted(set(overrides) - known)
    if bad:
        raise RunLogError(f"{source}: override {bad[0]!r} is not a setting; allowed: "
                          f"{', '.join(sorted(known))}")
    return {k: v for k, v in overrides.items() if v is not None}


def account_steps(source: str, settings: dict[str, Any], logged: list[LoggedStep]) -> FlopAccount:
    """Sum of ``weight × grpo_step_flops`` over the logged steps; completion lengths per step
    spread ``one-long`` (one row at the logged max, the others equal, the logged mean kept).

    Raises:
        RunLogError: the settings or a step's lengths are invalid (the message names which).
    """
    from allocopt.plan.hub import model_shape
    from allocopt.plan.recipe import grpo_steps, read_recipe, reward_shape

    if not logged:
        raise RunLogError(f"{source}: no training step with completion lengths in the log")
    longest = max(max(s.completion_max or 0.0, s.completion_mean) for s in logged)
    try:
        setup, base = read_recipe(None, **{"max_completion_length": max(1, math.ceil(longest)),
                                           "completion_tokens": max(1.0, logged[0].completion_mean),
                                           **settings})
        policy = model_shape(setup.model)
        reward = reward_shape(base)
    except ConfigError as e:
        raise RunLogError(f"{source}: {e}") from None
    total: FlopAccount | int = 0
    for i, s in enumerate(logged):
        try:
            cmax = s.completion_max if s.completion_max and s.completion_max > s.completion_mean else 0.0
            st = replace(setup, prompt_tokens=max(1.0, s.prompt_mean),
                         completion_tokens=max(1.0, s.completion_mean))
            r = replace(base, completion_max=cmax, length_distribution="one-long" if cmax else "constant")
            (step,) = grpo_steps(st, r)
            policy.check_length(max(p + c for p, c in step.rows))
        except ConfigError as e:
            raise RunLogError(f"{source}: logged step {i + 1}: {e}") from None
        one = grpo_step_flops(policy, step, lora=setup.lora,
                              gradient_checkpointing=setup.gradient_checkpointing,
                              reward_model=reward, engine_name=setup.engine)
        total = total + (one * int(s.weight) if float(s.weight).is_integer() else one * s.weight)
    assert isinstance(total, FlopAccount)
    return total


def as_number(source: str, key: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise RunLogError(f"{source}: {key}={v!r}: not a number") from None
    if isinstance(v, bool) or not math.isfinite(f):
        raise RunLogError(f"{source}: {key}={v!r}: not a finite number")
    return f


@dataclass
class StepLog:
    """A run's training steps as an importer reads them: their lengths (:class:`LoggedStep`),
    and the wall seconds of each phase summed over them from the log's timers."""

    timers: Mapping[str, str]
    """Log key of a timer (seconds per step) -> phase (``search``, ``learning``, ``reward``)."""
    steps: list[LoggedStep] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    timed: bool = False
    """Whether any step had a timer."""

    def add(self, where: str, record: Mapping[str, Any], step: LoggedStep) -> None:
        """One step read from ``record`` (its timers summed into :attr:`seconds`). Raises
        :class:`RunLogError` for a timer that is not a number."""
        self.steps.append(step)
        for key, phase in self.timers.items():
            if key in record:
                self.seconds[phase] += as_number(where, key, record[key])
                self.timed = True

    @property
    def phase_seconds(self) -> dict[str, float] | None:
        """:attr:`seconds`, or ``None`` when no step was timed."""
        return self.seconds if self.timed else None

    def account(self, source: str, settings: dict[str, Any], read: dict[str, str],
                assumed: dict[str, str], *, lengths: str, rows: str, per_row: str, timers: str,
                rows_tolerance: float = 0.0) -> FlopAccount:
        """:func:`account_steps` of the steps, with where their numbers came from noted in
        ``read`` and ``assumed``: ``lengths`` (the length keys), ``rows`` (when a step's weight is
        off 1 by more than ``rows_tolerance``), ``per_row`` (the assumed spread), ``timers``
        (when timed: which timer counts as which phase)."""
        read["lengths"] = lengths
        if any(abs(s.weight - 1.0) > rows_tolerance for s in self.steps):
            read["rows"] = rows
        assumed["per-row lengths"] = per_row
        if self.timed:
            read["phase_seconds"] = timers
        return account_steps(source, settings, self.steps)
