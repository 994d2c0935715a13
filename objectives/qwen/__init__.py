"""The main objective: GRPO of LoRA Qwen2.5 on Polaris-53K, scored on GSM8K and MATH-500 (:mod:`objectives.qwen.objective`), its evaluation, its own process per trial, and local stand-ins."""

from __future__ import annotations

from typing import Any

from objectives import COMMON_TARGETS
from allocopt.rewards.base import REWARD_NAMES


def make(**settings: Any) -> Any:
    """The ``qwen`` objective built from flat settings (entry point ``allocopt.objectives``:
    ``qwen``; :meth:`objectives.qwen.objective.QwenObjective.from_settings`)."""
    from objectives.qwen.objective import QwenObjective

    return QwenObjective.from_settings(**settings)


make.targets = COMMON_TARGETS[:2] + ("pass_at_1_gsm8k", "pass_at_1_math500") + COMMON_TARGETS[2:]
make.rewards = REWARD_NAMES  # the reward systems its trials can score
