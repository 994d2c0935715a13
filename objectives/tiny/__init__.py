"""The tiny world: real GRPO of a tiny Qwen2 on seeded multi-step arithmetic, on the CPU (:mod:`objectives.tiny.objective`); its tasks, models, build and shipped artifacts (``world/``)."""

from __future__ import annotations

from typing import Any

from objectives import COMMON_TARGETS
from allocopt.rewards.base import REWARD_NAMES


def make(**settings: Any) -> Any:
    """The ``tiny`` objective built from flat settings (entry point ``allocopt.objectives``:
    ``tiny``). Raises ``ValueError`` (one line) for an unknown or ill-typed setting."""
    from objectives.tiny.objective import TinyObjective, TinySettings

    return TinyObjective(TinySettings.from_flat(**settings))


make.targets = COMMON_TARGETS
make.rewards = REWARD_NAMES  # the reward systems its trials can score
