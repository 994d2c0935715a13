"""The five reward systems: ``sparse``, ``structured``, ``dense`` (rule-based), ``proxy_prm``,
``prm`` (model-based step scorers).

Every reward system is a TRL reward function (``reward(prompts=..., completions=..., **columns)
-> list[float]``, one float per completion, with a ``__name__``) that also reports what it
cost (:class:`RewardUsage`, read and reset with ``consume_usage()``):

========== ============ ==========================================================================
name       FLOPs        reward of one completion (gold: the ``answer`` column)
========== ============ ==========================================================================
sparse     0            ``1[correct]``
structured 0            ``0.2·1[well formed] + 0.8·1[correct]``
dense      0            ``0.5·(correct steps / steps) + 0.5·1[correct]`` (0 steps: first term 0)
proxy_prm  model        ``mean`` (or ``min``) over steps of the step's score: ``P(label 1)`` at its
                        marker (:class:`~allocopt.rewards.model_reward.ModelReward`, a token
                        classifier) or its likelihood (:class:`~allocopt.rewards.verifier.
                        LikelihoodVerifier`, a causal LM: the tiny world's PRMs)
prm        model        same, with the full-size process reward model
========== ============ ==========================================================================

Steps, equations and correctness are read by :mod:`allocopt.rewards.step_parsing`; the usage and
the interface are :mod:`allocopt.rewards.base`'s; the model-based step scorers are
:class:`allocopt.rewards.model_reward.ModelReward` (token classifiers) and
:class:`allocopt.rewards.verifier.LikelihoodVerifier` (causal LMs, the tiny world's PRMs).

Rule-based rewards cost 0 FLOPs (``shared/DESIGN.md`` §2, C_reward); their wall time is still
measured. :class:`ModelReward` counts the FLOPs of exactly what it runs, useful and executed
(``shared/DESIGN.md`` §3). torch and transformers are imported only by the model-based path.
"""

from __future__ import annotations

import time
from typing import Any

from allocopt.rewards.model_reward import ModelReward
from allocopt.rewards.base import REWARD_NAMES, RewardSystem, RewardUsage, _Base, as_text
from allocopt.rewards.step_parsing import is_correct, is_well_formed, step_accuracy

# ============================================================== rule-based
class _RuleReward(_Base):
    """A rule-based reward: 0 FLOPs, wall time measured."""

    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
        start = time.perf_counter()
        completions = list(completions or [])
        if answer is None:
            raise ValueError(f"reward={self.name!r}: needs the gold final answers as the "
                             "'answer' column (keyword answer=[...])")
        answers = [answer] * len(completions) if isinstance(answer, str) else list(answer)
        if len(answers) != len(completions):
            raise ValueError(f"reward={self.name!r}: got {len(completions)} completions but "
                             f"{len(answers)} answers; need one answer per completion")
        rewards = [float(self.score(as_text(c), a)) for c, a in zip(completions, answers)]
        self._add_usage(RewardUsage(wall_seconds=time.perf_counter() - start,
                                    num_completions=len(completions)))
        return rewards

    def score(self, completion: str, gold: Any) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class SparseReward(_RuleReward):
    """``1.0`` if the final answer is correct, else ``0.0``."""

    name = "sparse"

    def score(self, completion: str, gold: Any) -> float:
        return 1.0 if is_correct(completion, gold) else 0.0


class StructuredReward(_RuleReward):
    """Format plus correctness: ``format_weight·1[well formed] + answer_weight·1[correct]``.

    Well formed: :func:`is_well_formed` (steps, then one final ``#### <answer>`` line). With the
    default weights a correct but malformed completion gets 0.8, a well-formed wrong one 0.2.
    """

    name = "structured"

    def __init__(self, format_weight: float = 0.2, answer_weight: float = 0.8) -> None:
        super().__init__()
        _check_weights(self.name, format_weight=format_weight, answer_weight=answer_weight)
        self.format_weight, self.answer_weight = float(format_weight), float(answer_weight)

    def score(self, completion: str, gold: Any) -> float:
        return (self.format_weight * is_well_formed(completion)
                + self.answer_weight * is_correct(completion, gold))


class DenseReward(_RuleReward):
    """Per-step partial credit plus correctness:
    ``step_weight·(correct steps / steps) + answer_weight·1[correct]``.

    Steps and their correctness: :func:`step_accuracy` (a line with arithmetic equations,
    correct when all of them hold). No step: the first term is 0 (work not shown earns
    nothing). Defaults 0.5 / 0.5: a wrong answer reached by correct arithmetic gets 0.5, a right
    answer with every step wrong 0.5. Repeating a correct step raises the share; it is a
    rule-based proxy and can be gamed that way.
    """

    name = "dense"

    def __init__(self, step_weight: float = 0.5, answer_weight: float = 0.5) -> None:
        super().__init__()
        _check_weights(self.name, step_weight=step_weight, answer_weight=answer_weight)
        self.step_weight, self.answer_weight = float(step_weight), float(answer_weight)

    def score(self, completion: str, gold: Any) -> float:
        correct, total = step_accuracy(completion)
        share = correct / total if total else 0.0
        return self.step_weight * share + self.answer_weight * is_correct(completion, gold)


def _check_weights(name: str, **weights: float) -> None:
    for key, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
            raise ValueError(f"reward={name!r}: {key}={w!r}: must be a number in [0, 1]")
    if abs(sum(weights.values()) - 1) > 1e-9:
        raise ValueError(f"reward={name!r}: {' + '.join(weights)} = {sum(weights.values())}: must sum to 1")


# ================================================================== factory
def make_reward(name: str, *, model: Any = None, tokenizer: Any = None, **options: Any) -> RewardSystem:
    """A reward system by name.

    Args:
        name: ``sparse``, ``structured``, ``dense``, ``proxy_prm`` or ``prm``.
        model: for ``proxy_prm``/``prm``: a token-classification model (2 labels), or a local
            folder to load one from with ``AutoModelForTokenClassification``.
        tokenizer: its tokenizer (loaded from ``model`` when that is a folder and this is None).
        options: constructor options: ``format_weight``/``answer_weight`` (structured),
            ``step_weight``/``answer_weight`` (dense), ``marker``, ``aggregate``,
            ``batch_size``, ``max_length`` (model-based).

    Raises:
        ValueError: unknown name, a model-based reward without a model or tokenizer, or a bad
            option (one line naming it).
    """
    if name not in REWARD_NAMES:
        raise ValueError(f"reward={name!r}: unknown reward system; allowed: {', '.join(REWARD_NAMES)}")
    rule = {"sparse": SparseReward, "structured": StructuredReward, "dense": DenseReward}
    if name in rule:
        try:
            return rule[name](**options)
        except TypeError as e:
            raise ValueError(f"reward={name!r}: bad option ({e})") from None
    if model is None:
        raise ValueError(f"reward={name!r}: a model-based reward needs model= (a token-"
                         "classification reward model or a local folder) and tokenizer=")
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        path = str(model)
        model = AutoModelForTokenClassification.from_pretrained(path)
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    if tokenizer is None:
        raise ValueError(f"reward={name!r}: a model-based reward needs tokenizer= with its model")
    try:
        return ModelReward(model, tokenizer, name=name, **options)
    except TypeError as e:
        raise ValueError(f"reward={name!r}: bad option ({e})") from None


__all__ = ["DenseReward", "SparseReward", "StructuredReward", "make_reward"]
