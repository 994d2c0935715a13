"""What both importers share: the result type, the error, and the accounting of logged steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from allocopt.flops import PHASES, ConfigError, FlopAccount
from allocopt.flops.grpo import grpo_step_flops


from allocopt.errors import RunLogError  # noqa: E402,F401  (defined there; imported from here too)
from allocopt.limits import read_number  # noqa: E402
from allocopt.runlogs.keys import OtherReading, Provenance  # noqa: E402


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
    pricing: "Pricing | None" = None
    """What was priced (settings, steps, options), to price the other readings again."""
    others: Mapping[str, OtherReading] = field(default_factory=dict)
    """Assumed field -> its other reading, where the account depends on it."""

    def other_totals(self) -> dict[str, tuple[str, float]]:
        """Assumed field -> (its other reading, the executed total FLOPs under it), for each
        field of :attr:`others` (priced again: :meth:`Pricing.under`)."""
        if self.pricing is None:
            return {}
        return {k: (o.label, float(self.pricing.under(o.changes).account().executed.total_flops))
                for k, o in self.others.items()}

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
        """JSON-friendly: the flat account (as ``allocopt account --json``), the provenance and
        the total under each assumed field's other reading (``other_readings``)."""
        total = float(self.account.executed.total_flops)
        return {"source": self.source, "engine": self.engine, "steps": self.steps,
                "num_devices": self.num_devices, "settings": dict(self.settings),
                **self.account.to_dict(),
                "phase_seconds": None if self.phase_seconds is None else dict(self.phase_seconds),
                "fields_read": dict(self.fields_read),
                "fields_assumed": dict(self.fields_assumed),
                "other_readings": {k: {"reading": label, "total_flops": t,
                                       "change": t / total - 1 if total else 0.0}
                                   for k, (label, t) in self.other_totals().items()}}


@dataclass(frozen=True)
class LoggedStep:
    """Lengths of the rollout batches one log record stands for."""

    prompt_mean: float
    completion_mean: float
    completion_max: float | None
    weight: float
    """Rollout batches this record stands for (several when a record averages them)."""
    generated_per_trained: float = 1.0
    """Prompts generated per prompt trained in this step (verl DAPO: ``train/num_gen_batches ×
    data.gen_batch_size / data.train_batch_size``); the dropped groups' lengths are taken as
    the trained ones' (the log has no others)."""
    actor_update: bool = True
    """The actor is updated in this step (verl: not before ``trainer.critic_warmup``; its
    old-policy and reference passes and the critic still run)."""


MAX_GENERATED_ROWS = 2**20
"""Most completions one logged step may generate (dynamic sampling's generation batches
included): every row is priced."""


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


def no_critic(source: str, given: Mapping[str, Any], tool: str) -> None:
    """Refuse ``--critic`` for a tool whose GRPO trains none (one line naming ``tool``)."""
    if given.get("critic"):
        raise RunLogError(f"{source}: critic={given['critic']!r}: {tool} trains no critic; allowed: "
                          "no --critic")


def run_path(path: str | Path, limit: int, what: str) -> Path:
    """``path`` as a :class:`Path`: a folder, or a regular file of at most ``limit`` bytes
    (:func:`allocopt.limits.check_size`: a FIFO or a device is refused in one line)."""
    from allocopt.limits import check_size

    p = Path(path)
    if not p.is_dir():
        check_size(p, limit, what, RunLogError)
    return p


@dataclass(frozen=True)
class Pricing:
    """What an importer prices: the recipe settings, the logged steps and how they ran.
    :meth:`account` is their FLOPs; :meth:`under` the same with some settings changed (the
    other reading of an assumed key)."""

    source: str
    """Names the run in error lines."""
    settings: Mapping[str, Any]
    """:data:`allocopt.plan.recipe.RECIPE_KEYS` of the run (lengths vary per step)."""
    steps: tuple[LoggedStep, ...]
    spread: str = "one-long"
    """How a step's completions spread between its logged mean and max
    (:data:`allocopt.flops.lengths.DISTRIBUTIONS`); ``constant`` where no max is logged."""
    old_logprobs: bool | None = None
    """Whether the old-policy log-prob pass runs, as the tool decides it (TRL's rule); ``None``:
    as the engine decides (:func:`allocopt.flops.grpo.old_logprobs_pass`)."""

    def account(self) -> FlopAccount:
        """The FLOPs of the steps (:func:`account_steps`)."""
        return account_steps(self.source, dict(self.settings), list(self.steps), spread=self.spread,
                             old_logprobs=self.old_logprobs)

    def under(self, changes: Mapping[str, Any]) -> "Pricing":
        """This pricing with ``changes``: ``spread`` and ``old_logprobs`` are its own fields,
        every other key a recipe setting."""
        own = {k: v for k, v in changes.items() if k in ("spread", "old_logprobs")}
        rest = {k: v for k, v in changes.items() if k not in own}
        return replace(self, settings={**self.settings, **rest}, **own)


def account_steps(source: str, settings: dict[str, Any], logged: list[LoggedStep], *,
                  spread: str = "one-long", old_logprobs: bool | None = None) -> FlopAccount:
    """Sum of ``weight × grpo_step_flops`` over the logged steps; completion lengths per step
    spread ``spread`` (``one-long``: one row at the logged max, the others equal, the logged
    mean kept), each step generating ``generated_per_trained`` prompts per prompt trained; with
    the settings' ``critic`` priced (its own passes and checkpointing where given). Identical
    steps are priced once.

    Raises:
        RunLogError: the settings or a step's lengths are invalid (the message names which).
    """
    from allocopt.plan.hub import model_shape
    from allocopt.plan.recipe import critic, read_recipe, reward_shape

    if not logged:
        raise RunLogError(f"{source}: no training step with completion lengths in the log")
    longest = max(max(s.completion_max or 0.0, s.completion_mean) for s in logged)
    try:
        setup, base = read_recipe(None, **{"max_completion_length": max(1, math.ceil(longest)),
                                           "completion_tokens": max(1.0, logged[0].completion_mean),
                                           **settings})
        policy = model_shape(setup.model)
        reward = reward_shape(base)
        value_model = critic(setup)
    except ConfigError as e:
        raise RunLogError(f"{source}: {e}") from None
    total: FlopAccount | int = 0
    priced: dict[tuple[Any, ...], FlopAccount] = {}
    for i, s in enumerate(logged):
        key = (s.prompt_mean, s.completion_mean, s.completion_max, s.generated_per_trained,
               s.actor_update)
        if key not in priced:
            priced[key] = _price_step(f"{source}: logged step {i + 1}", setup, base, s, spread,
                                      old_logprobs, policy, reward, value_model)
        one = priced[key]
        total = total + (one * int(s.weight) if float(s.weight).is_integer() else one * s.weight)
    assert isinstance(total, FlopAccount)
    return total


def _price_step(where: str, setup: Any, base: Any, s: LoggedStep, spread: str,
                old_logprobs: bool | None, policy: Any, reward: Any, value_model: Any) -> FlopAccount:
    """``grpo_step_flops`` of one logged step (lengths, generated groups, actor update)."""
    from allocopt.plan.recipe import generated_prompts, grpo_steps

    try:
        cmax = s.completion_max if s.completion_max and s.completion_max > s.completion_mean else 0.0
        st = replace(setup, prompt_tokens=max(1.0, s.prompt_mean),
                     completion_tokens=max(1.0, s.completion_mean),
                     generated_per_trained=max(1.0, s.generated_per_trained))
        r = replace(base, completion_max=cmax, length_distribution=spread if cmax else "constant")
        rows = generated_prompts(st, r) * r.group_size
        if rows > MAX_GENERATED_ROWS:
            raise ConfigError(f"{rows} completions generated, over the limit of {MAX_GENERATED_ROWS} "
                              "a step (each row is priced)")
        (step,) = grpo_steps(st, r)
        if old_logprobs is not None:
            step = replace(step, old_logprobs=old_logprobs)
        if not s.actor_update:
            step = replace(step, update_passes=0.0,
                           critic_update_passes=step.critic_update_passes or step.update_passes)
        longest = max(p + c for p, c in step.rows)
        policy.check_length(longest)
        if value_model is not None:
            value_model.check_length(longest)
    except ConfigError as e:
        raise RunLogError(f"{where}: {e}") from None
    return grpo_step_flops(policy, step, lora=setup.lora,
                           gradient_checkpointing=setup.gradient_checkpointing,
                           reward_model=reward, engine_name=setup.engine, critic=value_model)


def as_number(source: str, key: str, v: Any) -> float:
    """``v`` (a logged metric: a number, or a number written as text in ASCII digits) as a
    finite float. Raises :class:`RunLogError` naming ``key``."""
    if isinstance(v, str):
        f = read_number(v, f"{source}: {key}", RunLogError)
        if f is None:
            raise RunLogError(f"{source}: {key}={v[:40]!r}: not a number")
        v = f
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RunLogError(f"{source}: {key}={str(v)[:40]!r}: not a number")
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise RunLogError(f"{source}: {key}={str(v)[:40]}: not a finite number")
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

    def pricing(self, source: str, settings: dict[str, Any], notes: Provenance, *, lengths: str,
                rows: str, per_row: str, timers: str, rows_tolerance: float = 0.0,
                spread: str = "one-long", old_logprobs: bool | None = None) -> Pricing:
        """The :class:`Pricing` of the steps, with where their numbers came from noted in
        ``notes``: ``lengths`` (the length keys), ``rows`` (when a step's weight is off 1 by
        more than ``rows_tolerance``), ``per_row`` (the assumed spread; its other reading: all
        rows at the logged means, where a maximum is logged), ``timers`` (when timed: which
        timer counts as which phase)."""
        notes.read["lengths"] = lengths
        if any(abs(s.weight - 1.0) > rows_tolerance for s in self.steps):
            notes.read["rows"] = rows
        spread_matters = spread != "constant" and any(s.completion_max for s in self.steps)
        notes.assume("per-row lengths", per_row,
                     OtherReading("all rows at the logged means", {"spread": "constant"})
                     if spread_matters else None)
        if self.timed:
            notes.read["phase_seconds"] = timers
        return Pricing(source, dict(settings), tuple(self.steps), spread, old_logprobs)


def imported(pricing: Pricing, notes: Provenance, given: Mapping[str, Any], **run: Any) -> ImportedRun:
    """The :class:`ImportedRun` of ``pricing`` (its account priced now), with the provenance
    of ``notes``; an other reading that would change a ``given`` setting is dropped (what the
    user gave is not assumed). ``run``: the other :class:`ImportedRun` fields."""
    others = {k: o for k, o in notes.others.items() if not set(o.changes) & set(given)}
    return ImportedRun(account=pricing.account(), fields_read=dict(notes.read),
                       fields_assumed=dict(notes.assumed), settings=dict(pricing.settings),
                       pricing=pricing, others=others, **run)
