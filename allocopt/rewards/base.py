"""What every reward system shares: the names, the usage it reports, the TRL interface.

A reward system (:mod:`allocopt.rewards.systems` builds them by name) is a TRL reward function
(``reward(prompts=..., completions=..., **columns) -> list[float]``) that also reports what
it cost since it was last asked (:class:`RewardUsage`, ``consume_usage()``). :class:`_Base`
keeps that bookkeeping for the implementations (rule-based in :mod:`allocopt.rewards.systems`,
model-based in :mod:`allocopt.rewards.model_reward` and :mod:`allocopt.rewards.verifier`).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from allocopt.flops import FlopAccount

REWARD_NAMES: tuple[str, ...] = ("sparse", "structured", "dense", "proxy_prm", "prm")
RULE_BASED: tuple[str, ...] = ("sparse", "structured", "dense")
MODEL_BASED: tuple[str, ...] = ("proxy_prm", "prm")


# ===================================================================== usage
@dataclass(frozen=True)
class RewardUsage:
    """What a reward system spent since its last ``consume_usage()``. Usages add (``a + b``)."""

    useful_flops: int = 0
    """FLOPs of the real tokens (prompt + completion + one marker per step), causal attention."""
    executed_flops: int = 0
    """FLOPs the engine computed: padded batch shapes, attention as executed (budgets charge these)."""
    wall_seconds: float = 0.0
    """Wall-clock seconds spent inside the reward calls."""
    num_completions: int = 0
    """Completions scored."""
    num_tokens: int = 0
    """Real tokens read by the reward model (markers included); 0 for rule-based rewards."""

    def __add__(self, other: "RewardUsage") -> "RewardUsage":
        if not isinstance(other, RewardUsage):
            return NotImplemented
        return RewardUsage(*(getattr(self, f.name) + getattr(other, f.name)
                             for f in dataclasses.fields(self)))

    def account(self) -> "FlopAccount":
        """As an :class:`allocopt.flops.FlopAccount` with one reward item ``reward_model``."""
        from allocopt.flops import ComputeBreakdown, FlopAccount

        return FlopAccount(useful=ComputeBreakdown(reward={"reward_model": self.useful_flops}),
                           executed=ComputeBreakdown(reward={"reward_model": self.executed_flops}))


@runtime_checkable
class RewardSystem(Protocol):
    """The interface shared by all five reward systems (a TRL reward function)."""

    name: str
    """``sparse``, ``structured``, ``dense``, ``proxy_prm`` or ``prm``."""
    model_based: bool
    """Whether it runs a model (and so spends reward FLOPs)."""
    __name__: str

    def __call__(self, prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        """One reward per completion. Prompts and completions are strings or TRL conversational
        message lists; ``answer`` is the gold final answer column; other TRL kwargs ignored."""
        ...

    def consume_usage(self) -> RewardUsage:
        """FLOPs and wall time since the last call of this method; resets them."""
        ...


class _Base:
    """Usage bookkeeping shared by the implementations (thread-safe)."""

    name: str = ""
    model_based: bool = False

    def __init__(self) -> None:
        self.__name__ = self.name  # TRL names reward columns after it
        self._usage = RewardUsage()
        self._lock = threading.Lock()

    def _paired(self, prompts: list[Any] | None, completions: list[Any] | None) -> tuple[list[Any], list[Any]]:
        """``(prompts, completions)`` as lists of one prompt per completion (no prompts: empty
        strings). Raises ``ValueError`` (one line) when the counts differ."""
        completions = list(completions or [])
        prompts = list(prompts) if prompts is not None else [""] * len(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"reward={self.name!r}: got {len(prompts)} prompts but "
                             f"{len(completions)} completions; need one prompt per completion")
        return prompts, completions

    def _add_usage(self, usage: RewardUsage) -> None:
        with self._lock:
            self._usage = self._usage + usage

    def consume_usage(self) -> RewardUsage:
        with self._lock:
            usage, self._usage = self._usage, RewardUsage()
        return usage

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def as_text(item: Any) -> str:
    """Text of a prompt or completion: a string as is; a TRL conversational list of
    ``{"role", "content"}`` messages as its contents joined by newlines; None as ``""``."""
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return as_text(item.get("content"))
    if isinstance(item, (list, tuple)):
        return "\n".join(as_text(m) for m in item)
    return str(item)


__all__ = ["MODEL_BASED", "REWARD_NAMES", "RULE_BASED", "RewardSystem", "RewardUsage", "as_text"]
