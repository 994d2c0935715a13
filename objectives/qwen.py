"""The GPU objective: GRPO of Qwen2.5 (LoRA) on Polaris-53K, scored on GSM8K and MATH-500.

Its workload (shapes, rollout batch, lengths) is real and used by ``--dry-run`` and planning;
running trials needs a CUDA GPU with vLLM and is not built yet: :meth:`QwenObjective.run`
says so before anything is spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from allocopt.allocation import TrialPlan, Workload, _default_reward_models
from allocopt.flops import LoRASpec, ModelShape
from allocopt.objective import ObjectiveUnavailable  # noqa: F401  (re-exported: old imports work)


@dataclass(frozen=True)
class QwenSettings:
    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    rollouts_per_iteration: int = 64
    prompt_tokens: float = 103.0
    completion_tokens: float = 304.0
    lora_rank: int = 32


@dataclass
class QwenObjective:
    settings: QwenSettings = QwenSettings()
    name: str = "qwen"

    def workload(self) -> Workload:
        s = self.settings
        return Workload(policy=ModelShape.from_pretrained(s.model), reward_models=_default_reward_models(),
                        rollouts_per_iteration=s.rollouts_per_iteration, prompt_tokens=s.prompt_tokens,
                        completion_tokens=s.completion_tokens, lora=LoRASpec(s.lora_rank),
                        engine="trl-vllm")

    def check_available(self) -> None:
        """Raise :class:`ObjectiveUnavailable` unless trials can run here."""
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            raise ObjectiveUnavailable(
                f"objective=qwen: training {self.settings.model} needs a CUDA GPU with vLLM (this "
                "machine has none) and its GPU trial driver is not built yet; use --objective tiny "
                "(a real GRPO world that runs on CPU), or plan without running: `allocopt plan` or "
                "`allocopt study --dry-run`")
        raise ObjectiveUnavailable(
            "objective=qwen: the GPU trial driver for Qwen2.5 is not built yet; use --objective tiny, "
            "or plan without running: `allocopt plan` or `allocopt study --dry-run`")

    def run(self, plan: TrialPlan, *, seed: int = 0, progress: Any = None) -> Any:
        self.check_available()
