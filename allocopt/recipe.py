"""A GRPO recipe (what ``allocopt account`` prices) as a frozen config, loadable from TOML.

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from allocopt.flops import ConfigError, FlopAccount, LoRASpec, ModelShape
from allocopt.tomlio import check_keys, read_toml
from allocopt.grpo_flops import ENGINES, GRPOStep, grpo_step_flops
from allocopt.lengths import DISTRIBUTIONS, read_lengths, steps_from_rows, synthetic_completions


@dataclass(frozen=True)
class Recipe:
    """A GRPO training run described by its lengths and settings: enough to price it in FLOPs."""

    model: str = "Qwen/Qwen2.5-1.5B"
    """Policy: a preset name, a folder with config.json, or a hub id."""
    prompt_tokens: float = 103.0
    """Mean prompt length (tokens)."""
    completion_tokens: float = 304.0
    """Mean completion length (tokens, EOS included)."""
    completion_max: float = 0.0
    """Longest completion of a step (tokens); 0: the mean. Used with ``length_distribution``."""
    length_distribution: str = "constant"
    """How completion lengths spread between the mean and ``completion_max``: constant,
    uniform or one-long (:data:`allocopt.lengths.DISTRIBUTIONS`)."""
    lengths: str = ""
    """A lengths file (CSV or JSON lines, per completion: prompt_tokens, completion_tokens,
    optional count; :mod:`allocopt.lengths`); when given, the means and the distribution are
    not used and the account is the mean step of the file times ``steps``."""
    prompts: int = 64
    """Prompts per GRPO step (rollout batch = prompts × group_size)."""
    group_size: int = 8
    """G: completions per prompt."""
    steps: int = 1
    """GRPO steps (rollout batches)."""
    update_passes: float = 1.0
    """μ: passes over each rollout batch, each a forward + backward of every row (TRL
    num_iterations, verl ppo_epochs). These cost FLOPs."""
    minibatches: int = 1
    """Optimizer steps per pass (verl train_batch_size / ppo_mini_batch_size, TRL
    steps_per_generation / gradient_accumulation_steps). FLOP-free: they split the rows of a
    pass; more than one makes the old-policy log-prob pass run."""
    beta: float = 0.0
    """KL coefficient; > 0 runs a reference log-prob pass."""
    importance_sampling_correction: bool = True
    """TRL vllm_importance_sampling_correction (default on): with trl-vllm it runs the
    old-policy log-prob pass on every step."""
    lora_rank: int = 32
    """LoRA rank; 0 = full fine-tuning."""
    lora_targets: str = "all-linear"
    """LoRA target modules, comma separated, or all-linear."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward (torch non-reentrant); TRL's GRPOConfig default: on."""
    reward_model: str = ""
    """Reward model (preset, folder or hub id); empty = rule-based reward (0 FLOPs)."""
    reward_steps: float = 0.0
    """Steps per completion scored by a step-level PRM (one marker token each)."""
    engine: str = "trl-vllm"
    """Executed-FLOP model: trl-cpu, trl-gpu, trl-vllm or verl."""

    def __post_init__(self) -> None:
        for f in ("prompt_tokens", "completion_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1:
                raise ConfigError(f"{f}={v!r}: must be a number of tokens >= 1")
        for f in ("gradient_checkpointing", "importance_sampling_correction"):
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise ConfigError(f"{f}={v!r}: must be true or false (a TOML boolean, unquoted)")
        for f in ("model", "lora_targets", "reward_model", "engine", "lengths", "length_distribution"):
            v = getattr(self, f)
            if not isinstance(v, str):
                raise ConfigError(f"{f}={v!r}: must be a string")
        for f, lo in (("prompts", 1), ("group_size", 2), ("steps", 1), ("lora_rank", 0),
                      ("minibatches", 1)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{f}={v!r}: must be an integer >= {lo}")
        from allocopt.allocation import MAX_ROLLOUTS_PER_ITERATION as most

        if self.prompts * self.group_size > most:  # every row is priced: bound time and memory
            raise ConfigError(f"prompts x group_size={self.prompts} x {self.group_size}: must be "
                              f"at most {most} completions per step (each row is priced)")
        for f in ("update_passes", "beta", "reward_steps", "completion_max"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{f}={v!r}: must be a number >= 0")
        if self.update_passes <= 0:
            raise ConfigError(f"update_passes={self.update_passes!r}: must be a positive number")
        if self.completion_max and self.completion_max < self.completion_tokens:
            raise ConfigError(f"completion_max={self.completion_max:g}: must be >= "
                              f"completion_tokens={self.completion_tokens:g} (or 0: the mean)")
        if self.length_distribution not in DISTRIBUTIONS:
            raise ConfigError(f"length_distribution={self.length_distribution!r}: allowed: "
                              f"{', '.join(DISTRIBUTIONS)}")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r}: unknown; allowed: {', '.join(ENGINES)}")
        if self.lora_rank:
            LoRASpec(self.lora_rank, self.lora_targets)  # raises for bad targets

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> "Recipe":
        """Read a recipe from a TOML file (keys as the field names, top level or under
        ``[recipe]``); ``overrides`` that are not ``None`` win. Raises :class:`ConfigError`."""
        data = read_toml(path, "recipe")
        data = data.get("recipe", data)
        check_keys(data, cls, "recipe")
        return replace(cls(**data), **{k: v for k, v in overrides.items() if v is not None})

    def policy_shape(self) -> ModelShape:
        return ModelShape.from_pretrained(self.model)

    def reward_shape(self) -> ModelShape | None:
        return ModelShape.from_pretrained(self.reward_model) if self.reward_model else None

    def grpo_steps(self) -> list[GRPOStep]:
        """The step(s) whose mean, times ``steps``, is the run: every step of a lengths file,
        else one step with completion lengths drawn from ``length_distribution``."""
        n = self.prompts * self.group_size
        kw = dict(update_passes=self.update_passes, reference=self.beta > 0,
                  minibatches=self.minibatches,
                  importance_sampling_correction=self.importance_sampling_correction)
        if self.lengths:
            rows = read_lengths(self.lengths)
            steps = steps_from_rows(rows, self.prompts, self.group_size,
                                    source=f"lengths={self.lengths!r}", **kw)
            return [replace(s, reward_steps=(round(self.reward_steps),) * n) for s in steps]
        completions = synthetic_completions(self.completion_tokens, self.completion_max, n,
                                            self.length_distribution)
        return [GRPOStep(prompt_tokens=(round(self.prompt_tokens),) * self.prompts,
                         completion_tokens=completions, group_size=self.group_size,
                         reward_steps=(round(self.reward_steps),) * n, **kw)]

    def account(self) -> FlopAccount:
        """Useful and executed FLOPs of the whole recipe: the mean of :meth:`grpo_steps`
        times ``steps`` (exact when ``steps`` is a multiple of the number of distinct steps).

        Raises:
            ConfigError: a bad lengths file, or a sequence longer than the model's context or
                sliding window.
        """
        policy = self.policy_shape()
        steps = self.grpo_steps()
        policy.check_length(max(p + c for s in steps for p, c in s.rows))
        lora = LoRASpec(self.lora_rank, self.lora_targets) if self.lora_rank else None
        reward = self.reward_shape()
        total = sum(grpo_step_flops(policy, s, lora=lora,
                                    gradient_checkpointing=self.gradient_checkpointing,
                                    reward_model=reward, engine_name=self.engine) for s in steps)
        if self.steps % len(steps) == 0:
            return total * (self.steps // len(steps))
        return total * (self.steps / len(steps))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
