"""Objectives: what one trial runs and scores. TRL, peft and torch are imported inside them.

``get_objective(name)`` returns an objective with ``workload()``, ``run(plan, seed=, progress=)``
and the target names it reports.
"""

from __future__ import annotations

from typing import Any

OBJECTIVES = ("tiny", "qwen", "synthetic")


def get_objective(name: str, **settings: Any) -> Any:
    """An objective by name. Raises ``ValueError`` with one line for an unknown name."""
    if name == "tiny":
        from objectives.tiny import TinyObjective, TinySettings

        return TinyObjective(TinySettings(**settings))
    if name == "qwen":
        from objectives.qwen import QwenObjective, QwenSettings

        return QwenObjective(QwenSettings(**settings))
    if name == "synthetic":
        from objectives.synthetic import SyntheticObjective

        return SyntheticObjective(**settings)
    raise ValueError(f"objective={name!r}: unknown objective; allowed: {', '.join(OBJECTIVES)}")
