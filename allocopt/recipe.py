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


@dataclass(frozen=True)
class Recipe:
    """A GRPO training run described by its averages: enough to price it in FLOPs."""

    model: str = "Qwen/Qwen2.5-1.5B"
    """Policy: a preset name, a folder with config.json, or a hub id."""
    prompt_tokens: float = 103.0
    """Mean prompt length (tokens)."""
    completion_tokens: float = 304.0
    """Mean completion length (tokens, EOS included)."""
    prompts: int = 64
    """Prompts per GRPO step (rollout batch = prompts × group_size)."""
    group_size: int = 8
    """G: completions per prompt."""
    steps: int = 1
    """GRPO steps (rollout batches)."""
    update_passes: float = 1.0
    """μ: gradient passes over each rollout batch (TRL num_iterations)."""
    beta: float = 0.0
    """KL coefficient; > 0 runs a reference log-prob pass."""
    lora_rank: int = 32
    """LoRA rank; 0 = full fine-tuning."""
    lora_targets: str = "all-linear"
    """LoRA target modules, comma separated, or all-linear."""
    gradient_checkpointing: bool = False
    reward_model: str = ""
    """Reward model (preset, folder or hub id); empty = rule-based reward (0 FLOPs)."""
    reward_steps: float = 0.0
    """Steps per completion scored by a step-level PRM (one marker token each)."""
    engine: str = "trl-vllm"
    """Executed-FLOP model: trl-cpu, trl-gpu or trl-vllm."""

    def __post_init__(self) -> None:
        for f in ("prompt_tokens", "completion_tokens"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 1:
                raise ConfigError(f"{f}={v!r}: must be a number of tokens >= 1")
        for f, lo in (("prompts", 1), ("group_size", 2), ("steps", 1), ("lora_rank", 0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{f}={v!r}: must be an integer >= {lo}")
        from allocopt.allocation import MAX_ROLLOUTS_PER_ITERATION as most

        if self.prompts * self.group_size > most:  # every row is priced: bound time and memory
            raise ConfigError(f"prompts x group_size={self.prompts} x {self.group_size}: must be "
                              f"at most {most} completions per step (each row is priced)")
        if isinstance(self.update_passes, bool) or not isinstance(self.update_passes, (int, float)) \
                or not math.isfinite(self.update_passes) or self.update_passes <= 0:
            raise ConfigError(f"update_passes={self.update_passes!r}: must be a positive number")
        if not isinstance(self.beta, (int, float)) or not math.isfinite(self.beta) or self.beta < 0:
            raise ConfigError(f"beta={self.beta!r}: must be a number >= 0")
        if not isinstance(self.reward_steps, (int, float)) or self.reward_steps < 0:
            raise ConfigError(f"reward_steps={self.reward_steps!r}: must be a number >= 0")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r}: unknown; allowed: {', '.join(ENGINES)}")
        if not isinstance(self.lora_targets, str):
            raise ConfigError(f"lora_targets={self.lora_targets!r}: must be a string such as "
                              "'all-linear' or 'q_proj,v_proj'")
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

    def account(self) -> FlopAccount:
        """Useful and executed FLOPs of the whole recipe (``steps`` identical GRPO steps)."""
        n = self.prompts * self.group_size
        step = GRPOStep(
            prompt_tokens=(round(self.prompt_tokens),) * self.prompts,
            completion_tokens=(round(self.completion_tokens),) * n,
            group_size=self.group_size, update_passes=self.update_passes,
            reference=self.beta > 0, reward_steps=(round(self.reward_steps),) * n)
        lora = LoRASpec(self.lora_rank, self.lora_targets) if self.lora_rank else None
        one = grpo_step_flops(self.policy_shape(), step, lora=lora,
                              gradient_checkpointing=self.gradient_checkpointing,
                              reward_model=self.reward_shape(), engine_name=self.engine)
        return one * self.steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
