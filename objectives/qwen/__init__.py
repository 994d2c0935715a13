"""The main objective: GRPO of LoRA Qwen2.5 on Polaris-53K, scored on GSM8K and MATH-500 (:mod:`objectives.qwen.objective`), its evaluation, its own process per trial, and local stand-ins."""
