"""Objectives: what one trial runs and scores. TRL, peft and torch are imported inside them.

Each objective follows the contract of :mod:`allocopt.objective` (``workload()``,
``check_available()``, ``run(plan, seed=, progress=) -> TrialResult``). The built-in ones are
declared as entry points of group ``allocopt.objectives`` in ``pyproject.toml``, each a small
factory that imports its module when called (:func:`allocopt.objective.get_objective` finds
them by name):

* ``tiny``: the CPU arithmetic world (:func:`objectives.tiny.make`);
* ``synthetic``: a closed-form test function (:func:`objectives.synthetic.make`);
* ``qwen``: GRPO of LoRA Qwen2.5 (:func:`objectives.qwen.make`);
* ``command``: the user's own training command per trial (:func:`objectives.command.make`).
"""

from __future__ import annotations

from allocopt.objective import get_objective, objective_names, register_objective

__all__ = ["COMMON_TARGETS", "OBJECTIVES", "get_objective", "objective_names", "register_objective"]

OBJECTIVES = ("tiny", "qwen", "synthetic")
"""The built-in objectives."""

COMMON_TARGETS = ("native_reward", "pass_at_1", "judge")
"""The target keys every built-in objective reports (``qwen`` adds one ``pass_at_1`` per
downstream set)."""
