"""What ``allocopt account`` prices: one :class:`~allocopt.plan.setup.TrainingSetup` run at one
allocation for some steps, read from flags or a TOML file.

Standard library only. :func:`read_recipe` splits the keys (the long flags with ``_``) into

* the :class:`~allocopt.plan.setup.TrainingSetup` (the same class the plan, the meter and the
  driver read, so the same TOML gives the same :meth:`~allocopt.plan.setup.TrainingSetup.fingerprint`
  here and in the driver), with two flag names kept: ``prompts × group_size`` is
  :attr:`~allocopt.plan.setup.TrainingSetup.rollouts_per_iteration` and ``reward_steps`` is
  :attr:`~allocopt.plan.setup.TrainingSetup.steps_per_completion`;
* :class:`AccountedRun`: what an account adds to a set-up (steps, G, passes, minibatches, a
  reward model, a lengths file or spread).

Keys neither file nor flags give take the set-up's own defaults (:class:`TrainingSetup`, the
same ones the plan and the driver take); to price a plain TRL job, say so: ``runner = "trl"``
(``--runner trl``) takes ``GRPOConfig``'s defaults for gradient checkpointing and the vLLM
importance-sampling correction (:data:`allocopt.plan.setup.RUNNERS`). The generation limit
defaults as the set-up's (:func:`allocopt.plan.setup.default_max_completion_length`), of the
longest completion the account prices.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from allocopt.flops import ConfigError, FlopAccount, ModelShape
from allocopt.flops.grpo import GRPOStep, grpo_step_flops
from allocopt.flops.lengths import DISTRIBUTIONS, read_lengths, steps_from_rows, synthetic_completions
from allocopt.plan.setup import MAX_ROLLOUTS_PER_ITERATION, TrainingSetup, default_max_completion_length
from allocopt.plan.hub import model_shape
from allocopt.tomlio import read_toml, unknown_key

ALIASES = {"reward_steps": "steps_per_completion"}
"""Flag names of set-up fields (``--reward-steps`` is :attr:`TrainingSetup.steps_per_completion`)."""


@dataclass(frozen=True)
class AccountedRun:
    """What an account adds to a :class:`TrainingSetup`: how many steps, at which G and
    passes, with which reward model and completion-length spread."""

    prompts: int = 64
    """Prompts trained per GRPO step (rollout batch = prompts × group_size); with the set-up's
    ``generated_per_trained`` > 1, ``round(prompts × generated_per_trained)`` are generated."""
    group_size: int = 8
    """G: completions per prompt (1 only with a critic: PPO)."""
    steps: int = 1
    """GRPO steps (rollout batches)."""
    update_passes: float = 1.0
    """μ: passes over each rollout batch, each a forward + backward of every row (TRL
    num_iterations, verl ppo_epochs). These cost FLOPs."""
    minibatches: int = 1
    """Optimizer steps per pass (verl train_batch_size / ppo_mini_batch_size, TRL
    steps_per_generation / gradient_accumulation_steps). FLOP-free: they split the rows of a
    pass; more than one makes the old-policy log-prob pass run."""
    micro_batch_size: int = 1
    """Trained rows per device in one forward call of the update (verl
    ``actor.ppo_micro_batch_size_per_gpu``, which verl requires unless ``use_dynamic_bsz``;
    TRL ``per_device_train_batch_size``, default 8; allocopt's driver: 1). Only LoRA on fused
    expert weights reads it (peft folds them once per call:
    :attr:`~allocopt.flops.grpo.GRPOStep.rows_per_forward`)."""
    log_prob_micro_batch_size: int = 0
    """Rows per device in one forward call of the old-policy log-prob pass (verl
    ``rollout.log_prob_micro_batch_size_per_gpu``); 0: ``micro_batch_size`` (TRL's is
    ``per_device_train_batch_size``)."""
    critic_update_passes: float = 0.0
    """The critic's passes over each rollout batch (verl ``critic.ppo_epochs``); 0: as
    ``update_passes`` (verl's default). Read only with the set-up's ``critic``."""
    critic_gradient_checkpointing: bool | None = None
    """The critic recomputes its layers in backward (verl
    ``critic.model.enable_gradient_checkpointing``); ``None``: as the set-up's
    ``gradient_checkpointing``. Read only with a critic."""
    reward_model: str = ""
    """Reward model (preset, folder or hub id); empty = rule-based reward (0 FLOPs)."""
    lengths: str = ""
    """A lengths file (CSV or JSON lines, per completion: prompt_tokens, completion_tokens,
    optional count; :mod:`allocopt.flops.lengths`); when given, the means and the distribution are
    not used and the account is the mean step of the file times ``steps``."""
    completion_max: float = 0.0
    """Longest completion of a step (tokens); 0: the mean. Used with ``length_distribution``."""
    length_distribution: str = "constant"
    """How completion lengths spread between the mean and ``completion_max``: constant,
    uniform or one-long (:data:`allocopt.flops.lengths.DISTRIBUTIONS`)."""

    def __post_init__(self) -> None:
        for f in ("reward_model", "lengths", "length_distribution"):
            if not isinstance(getattr(self, f), str):
                raise ConfigError(f"{f}={getattr(self, f)!r}: must be a string")
        for f, lo in (("prompts", 1), ("group_size", 1), ("steps", 1), ("minibatches", 1),
                      ("micro_batch_size", 1), ("log_prob_micro_batch_size", 0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{f}={v!r}: must be an integer >= {lo}")
        if self.prompts * self.group_size > MAX_ROLLOUTS_PER_ITERATION:  # every row is priced
            raise ConfigError(f"prompts x group_size={self.prompts} x {self.group_size}: must be "
                              f"at most {MAX_ROLLOUTS_PER_ITERATION} completions per step (each row is priced)")
        if self.critic_gradient_checkpointing not in (None, True, False):
            raise ConfigError(f"critic_gradient_checkpointing={self.critic_gradient_checkpointing!r}: "
                              "must be true or false")
        for f in ("update_passes", "completion_max", "critic_update_passes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{f}={v!r}: must be a number >= 0")
        if self.update_passes <= 0:
            raise ConfigError(f"update_passes={self.update_passes!r}: must be a positive number")
        if self.length_distribution not in DISTRIBUTIONS:
            raise ConfigError(f"length_distribution={self.length_distribution!r}: allowed: "
                              f"{', '.join(DISTRIBUTIONS)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SETUP_KEYS = frozenset(f.name for f in fields(TrainingSetup)) - {"rollouts_per_iteration"}
RUN_KEYS = frozenset(f.name for f in fields(AccountedRun))
RECIPE_KEYS = SETUP_KEYS | RUN_KEYS | set(ALIASES)
"""Every key a recipe (TOML or flags) may give."""
_SETUP_DEFAULTS = {f.name: f.default for f in fields(TrainingSetup)}


def read_recipe(path: str | Path | None = None, **given: Any) -> tuple[TrainingSetup, AccountedRun]:
    """The set-up and the run an account prices, from a TOML file (keys at top level or under
    ``[recipe]``) and keyword overrides (``None``: not given; they win over the file).

    Raises:
        ConfigError: a missing or malformed file, an unknown key, a bad value (one line
            naming the key), or a completion longer than ``max_completion_length``.
    """
    data: dict[str, Any] = {}
    if path is not None:
        table = read_toml(path, "recipe")
        data.update(table.get("recipe", table))
    data.update({k: v for k, v in given.items() if v is not None})
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise ConfigError(unknown_key("recipe", unknown[0], RECIPE_KEYS))
    for alias, name in ALIASES.items():
        if alias in data and name in data:
            raise ConfigError(f"{alias}, {name}: the same setting given twice; give one")
        if alias in data:
            data[name] = data.pop(alias)
    run = AccountedRun(**{k: v for k, v in data.items() if k in RUN_KEYS})
    kw = {k: v for k, v in data.items() if k in SETUP_KEYS}
    if "max_completion_length" not in kw:  # the set-up's rule, of the longest completion priced
        kw["max_completion_length"] = default_max_completion_length(*_priced_completions(run, kw))
    if run.group_size == 1 and not kw.get("critic"):
        raise ConfigError("group_size=1: GRPO's baseline needs >= 2 completions per prompt; "
                          "give a critic (--critic MODEL) to price PPO at G = 1")
    setup = TrainingSetup(**kw, rollouts_per_iteration=max(2, run.prompts * run.group_size))
    if run.completion_max and run.completion_max < setup.completion_tokens:
        raise ConfigError(f"completion_max={run.completion_max:g}: must be >= "
                          f"completion_tokens={setup.completion_tokens:g} (or 0: the mean)")
    longest = max([run.completion_max] + ([c for _, c in read_lengths(run.lengths)] if run.lengths else []))
    if longest > setup.max_completion_length:
        what = f"lengths={run.lengths!r}: a completion of" if run.lengths else "completion_max="
        raise ConfigError(f"{what} {longest:g} tokens: longer than max_completion_length="
                          f"{setup.max_completion_length} (the generation limit cuts there)")
    if generated_prompts(setup, run) * run.group_size > MAX_ROLLOUTS_PER_ITERATION:
        raise ConfigError(f"generated_per_trained={setup.generated_per_trained:g}: "
                          f"{generated_prompts(setup, run)} prompts x group_size {run.group_size} "
                          f"generated per step; must be at most {MAX_ROLLOUTS_PER_ITERATION} "
                          "completions (each row is priced)")
    return setup, run


def generated_prompts(setup: TrainingSetup, run: AccountedRun) -> int:
    """Prompts generated per step: ``round(prompts × generated_per_trained)`` (at least
    ``prompts``); exact for a whole product, else within half a prompt's group."""
    return max(run.prompts, round(run.prompts * setup.generated_per_trained))


def _priced_completions(run: AccountedRun, kw: Mapping[str, Any]) -> list[Any]:
    """The completion lengths (tokens) that decide the default generation limit: the mean
    (given or the set-up's default), the padded and longest ones, a lengths file's rows."""
    mean = kw.get("completion_tokens", _SETUP_DEFAULTS["completion_tokens"])
    out = [mean, kw.get("padded_completion_tokens"), run.completion_max]
    if run.lengths:  # the file's lengths are priced; the mean must still be within the limit
        out += [c for _, c in read_lengths(run.lengths)]
    return out


def grpo_steps(setup: TrainingSetup, run: AccountedRun) -> list[GRPOStep]:
    """The step(s) whose mean, times ``run.steps``, is the run: every step of a lengths file,
    else one step with completion lengths drawn from ``run.length_distribution``.

    With ``generated_per_trained`` > 1 a step generates :func:`generated_prompts` groups and
    trains the first ``run.prompts`` of them (:attr:`GRPOStep.trained_prompts`); a lengths
    file then holds every generated row, the trained groups first in each step."""
    gen = generated_prompts(setup, run)
    n = gen * run.group_size
    reward_steps = (round(setup.steps_per_completion),) * n
    kw = dict(update_passes=run.update_passes, reference=setup.reference,
              minibatches=run.minibatches, rows_per_forward=run.micro_batch_size,
              logprob_rows_per_forward=run.log_prob_micro_batch_size or None,
              importance_sampling_correction=setup.importance_sampling_correction,
              trained_prompts=None if gen == run.prompts else run.prompts,
              critic_update_passes=run.critic_update_passes or None,
              critic_gradient_checkpointing=run.critic_gradient_checkpointing)
    if run.lengths:
        rows = read_lengths(run.lengths)
        steps = steps_from_rows(rows, gen, run.group_size,
                                source=f"lengths={run.lengths!r}", **kw)
        return [replace(s, reward_steps=reward_steps) for s in steps]
    completions = synthetic_completions(setup.completion_tokens, run.completion_max, n,
                                        run.length_distribution)
    return [GRPOStep(prompt_tokens=(round(setup.prompt_tokens),) * gen,
                     completion_tokens=completions, group_size=run.group_size,
                     reward_steps=reward_steps, **kw)]


def reward_shape(run: AccountedRun) -> ModelShape | None:
    return model_shape(run.reward_model) if run.reward_model else None


def critic(setup: TrainingSetup) -> ModelShape | None:
    """The critic's shape (:attr:`TrainingSetup.critic`), or ``None`` without one."""
    return model_shape(setup.critic) if setup.critic else None


def account(setup: TrainingSetup, run: AccountedRun, policy: ModelShape | None = None) -> FlopAccount:
    """Useful and executed FLOPs of the whole run: the mean of :func:`grpo_steps` times
    ``run.steps`` (exact when ``steps`` is a multiple of the number of distinct steps).

    Args:
        policy: the policy's shape (default: read from ``setup.model``).

    Raises:
        ConfigError: a bad lengths file, or a sequence longer than the model's context or
            sliding window.
    """
    policy = policy or model_shape(setup.model)
    steps = grpo_steps(setup, run)
    longest = max(p + c for s in steps for p, c in s.rows)
    policy.check_length(longest)
    value_model = critic(setup)
    if value_model is not None:
        value_model.check_length(longest)
    reward = reward_shape(run)
    total = sum(grpo_step_flops(policy, s, lora=setup.lora,
                                gradient_checkpointing=setup.gradient_checkpointing,
                                reward_model=reward, engine_name=setup.engine,
                                critic=value_model) for s in steps)
    if run.steps % len(steps) == 0:
        return total * (run.steps // len(steps))
    return total * (run.steps / len(steps))


def price(path: str | Path | None = None, **given: Any) -> FlopAccount:
    """``account(*read_recipe(path, **given))``: the FLOPs ``allocopt account`` prints."""
    return account(*read_recipe(path, **given))


def recipe_dict(setup: TrainingSetup, run: AccountedRun) -> dict[str, Any]:
    """The recipe as ``account --json`` prints it: every set-up and run field."""
    return {**setup.to_dict(), **run.to_dict()}


__all__ = ["AccountedRun", "RECIPE_KEYS", "account", "critic", "generated_prompts", "grpo_steps", "price",
           "read_recipe", "recipe_dict", "reward_shape"]
