"""The tiny world: real GRPO of a tiny Qwen2 on seeded multi-step arithmetic, on the CPU (:mod:`objectives.tiny.objective`); its tasks, models, build and shipped artifacts (``world/``)."""
