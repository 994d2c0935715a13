"""Objectives: what one trial runs and scores. TRL, peft and torch are imported inside them.

Each objective follows the contract of :mod:`allocopt.objective` (``workload()``,
``check_available()``, ``run(plan, seed=, progress=) -> TrialResult``). Importing this package
registers the built-in ones by name, lazily (a factory imports its module when called):

* ``tiny``: the CPU arithmetic world (:mod:`objectives.tiny.objective`);
* ``synthetic``: a closed-form test function (:mod:`objectives.synthetic`);
* ``qwen``: GRPO of LoRA Qwen2.5 (:mod:`objectives.qwen.objective`).
"""

from __future__ import annotations

from typing import Any

from allocopt.objective import check_settings, get_objective, objective_names, register_objective

__all__ = ["OBJECTIVES", "get_objective", "objective_names", "register_objective"]

OBJECTIVES = ("tiny", "qwen", "synthetic")
"""The built-in objectives."""


def _tiny(**settings: Any) -> Any:
    from objectives.tiny.objective import TinyObjective, TinySettings

    check_settings(TinySettings, settings, "tiny")
    return TinyObjective(TinySettings(**settings))


def _qwen(**settings: Any) -> Any:
    from objectives.qwen.objective import QwenObjective

    return QwenObjective.from_settings(**settings)


def _synthetic(**settings: Any) -> Any:
    from objectives.synthetic import SyntheticObjective

    check_settings(SyntheticObjective, settings, "synthetic")
    return SyntheticObjective(**settings)


_TARGETS = ("native_reward", "pass_at_1", "judge")
for _name, _factory, _targets in (
        ("tiny", _tiny, _TARGETS),
        ("qwen", _qwen, ("native_reward", "pass_at_1", "pass_at_1_gsm8k", "pass_at_1_math500", "judge")),
        ("synthetic", _synthetic, _TARGETS)):
    register_objective(_name, _factory, targets=_targets, replace=True)
