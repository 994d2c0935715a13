"""A process reward model read at step markers: a 2-label token classifier scores each step.

:class:`ModelReward` is the model-based reward for token-classification PRMs (the public
Qwen2.5-Math-PRM and Skywork PRMs through :class:`allocopt.rewards.prm.CardPRM`, the qwen
objective's local stand-in). A causal language model judges steps differently (by their
likelihood): :class:`allocopt.rewards.verifier.LikelihoodVerifier`, which the tiny world's PRMs use.
:func:`model_facts` and :func:`reward_shape` are the FLOP-accounting facts both read from a
model. torch and transformers are imported only when a model runs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Literal

from allocopt.rewards.base import MODEL_BASED, RewardUsage, _Base, as_text
from allocopt.rewards.step_parsing import step_line_ends

if TYPE_CHECKING:  # pragma: no cover
    from allocopt.flops import ModelShape

Aggregate = Literal["mean", "min", "product"]


class ModelReward(_Base):
    """A process reward model: scores every step of a completion and aggregates.

    The model is a local HF ``*ForTokenClassification`` with ``num_labels=2`` (e.g.
    ``Qwen2ForTokenClassification``; Qwen2.5-Math-PRM's ``[b x t x 2]`` logits also work). Its
    input is ``prompt + completion`` with one ``marker`` token at the end of every step line
    (:func:`allocopt.rewards.step_parsing.step_line_ends`: the non-blank lines before the final ``#### `` line; that line and
    anything after it are read but not marked), e.g. with ``marker="<step>"``::

        "23+45-12\\n" + "23+45=68<step>\\n68-12=56<step>\\n#### 56"

    the layout the tiny world's step-marked texts have. With ``marker="\\n"`` (the step separator) the newline that ends a step line is
    itself the marker (none is added; a last step line without one gets one). The text is
    tokenized in segments cut at the markers (no special tokens added), so each marker is
    exactly one token whatever the tokenizer merges.

    The step score is ``softmax(logits)[label 1]`` at its marker; the reward is their
    ``aggregate``: ``mean`` (default; smooth, credits partly right work) or ``min`` (a chain is
    as good as its worst step, as in Lightman et al. 2023). A completion without steps gets 0.0
    and is not run. Sequences longer than ``max_length`` are cut at the right; markers cut off
    are not scored (none left: 0.0).

    Batches of ``batch_size`` sequences, longest first, right-padded, run under
    ``torch.inference_mode``. FLOPs (:func:`allocopt.flops.reward_model_flops`, shape from
    ``ModelShape.from_config(model.config.to_dict())``, head ``score``):

    * useful: per sequence, its real tokens with causal attention, the head at every position;
    * executed: per batch, ``rows x padded length`` tokens with ``full`` attention (eager and
      SDPA/math on CPU compute every query-key pair, masked or not; ``causal`` for
      ``flash_attention*`` implementations), the head at every padded position.

    Raises:
        ValueError: the marker is not a single token of the tokenizer, ``aggregate`` or
            ``batch_size`` invalid, the model does not have 2 labels, or it is a causal
            language model (it has an ``lm_head``: its logits are over the vocabulary, not
            two labels; :class:`allocopt.rewards.verifier.LikelihoodVerifier` scores its steps).
    """

    model_based = True
    num_labels_required = 2
    """Outputs per position the model must have (2: a token classifier)."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "prm", marker: str = "\n",
                 aggregate: Aggregate = "mean", batch_size: int = 8, max_length: int | None = None,
                 positive_label: int = 1) -> None:
        if name not in MODEL_BASED:
            raise ValueError(f"name={name!r}: a model-based reward is one of {', '.join(MODEL_BASED)}")
        self.name = name
        super().__init__()
        if aggregate not in ("mean", "min", "product"):
            raise ValueError(f"aggregate={aggregate!r}: allowed: mean, min, product")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be a positive integer")
        self.model, self.tokenizer = model, tokenizer
        self.marker, self.aggregate, self.batch_size = marker, aggregate, batch_size
        self.positive_label = positive_label
        self.marker_id = _single_token_id(tokenizer, marker)
        if hasattr(model, "lm_head"):  # a *ForCausalLM: its config's num_labels is a default
            raise ValueError(f"{name}: {type(model).__name__} is a causal language model "
                             "(lm_head); ModelReward reads a 2-label token classifier at step "
                             "markers; score a causal LM's steps with "
                             "allocopt.rewards.verifier.LikelihoodVerifier")
        config = model.config
        num_labels = getattr(config, "num_labels", 2)
        if num_labels != self.num_labels_required or positive_label not in (0, 1):
            raise ValueError(f"{name}: model has num_labels={num_labels}, positive_label="
                             f"{positive_label}; need a 2-label token classifier and label 0 or 1")
        self.max_length, self.shape, self.executed_attention, self.pad_id = model_facts(
            model, tokenizer, max_length)
        model.eval()

    # ------------------------------------------------------------------- inputs
    def encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[int], int]:
        """``(token ids, marker positions, steps)`` of one prompt + completion, cut at
        ``max_length``; ``steps`` is the number of markers inserted (before the cut)."""
        prompt_text, text = as_text(prompt), as_text(completion)
        ends = step_line_ends(text)
        if not ends:
            return [], [], 0
        ids, positions, start = self._ids(prompt_text), [], 0
        for end in ends:
            ids.extend(self._ids(text[start:end]))
            positions.append(len(ids))
            ids.append(self.marker_id)
            start = end + 1 if self.marker == "\n" and text[end:end + 1] == "\n" else end
        ids.extend(self._ids(text[start:]))
        ids = ids[: self.max_length]
        return ids, [p for p in positions if p < len(ids)], len(ends)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    # ------------------------------------------------------------------- scoring
    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
        import torch

        start = time.perf_counter()
        prompts, completions = self._paired(prompts, completions)
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions)]
        rewards = [0.0] * len(encoded)
        device = _device(self.model)
        batches = self._batches(encoded)
        for rows in batches:
            width = max(len(encoded[i][0]) for i in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                seq = encoded[i][0]
                ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[r, : len(seq)] = 1
            with torch.inference_mode():
                out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device))
                logits = out.logits if hasattr(out, "logits") else out[0]
                probs = self.step_probabilities(logits).cpu()
            for r, i in enumerate(rows):
                scores = probs[r, encoded[i][1]]
                rewards[i] = float(scores.mean() if self.aggregate == "mean" else
                                   scores.min() if self.aggregate == "min" else scores.prod())
        usage = self._batch_usage(encoded, batches)
        self._add_usage(dataclasses.replace(usage, wall_seconds=time.perf_counter() - start))
        return rewards

    def usage_of(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> RewardUsage:
        """The usage a call on the same arguments reports (:meth:`consume_usage`: FLOPs, tokens,
        completions; ``wall_seconds`` 0), computed without running the model, for the budget
        meter's exact admission of a generated batch (:meth:`allocopt.plan.meter.FlopMeter.admit_exact`).
        Tokenizes the texts (no model call); raises as a call does on mismatched counts."""
        prompts, completions = self._paired(prompts, completions)
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions)]
        return self._batch_usage(encoded, self._batches(encoded))

    def _batches(self, encoded: list[tuple[list[int], list[int], int]]) -> list[list[int]]:
        """Indices of the sequences with a scored marker, longest first, in ``batch_size`` chunks."""
        todo = sorted((i for i, (_, pos, _) in enumerate(encoded) if pos),
                      key=lambda i: -len(encoded[i][0]))
        return [todo[b: b + self.batch_size] for b in range(0, len(todo), self.batch_size)]

    def _batch_usage(self, encoded: list[tuple[list[int], list[int], int]],
                     batches: list[list[int]]) -> RewardUsage:
        """FLOPs of running ``batches``: executed per batch at its padded width, useful per
        sequence at its real length (class docstring)."""
        useful = executed = num_tokens = 0
        for rows in batches:
            width = max(len(encoded[i][0]) for i in rows)
            executed += len(rows) * self._flops(width, self.executed_attention)
            for i in rows:
                useful += self._flops(len(encoded[i][0]), "causal", executed=False)
                num_tokens += len(encoded[i][0])
        return RewardUsage(useful_flops=useful, executed_flops=executed,
                           num_completions=len(encoded), num_tokens=num_tokens)

    def step_probabilities(self, logits: Any) -> Any:
        """``b x t`` score of every position from the model's ``b x t x 2`` logits:
        ``softmax(logits)[..., positive_label]`` (read at the markers only)."""
        import torch

        return torch.softmax(logits.float(), dim=-1)[..., self.positive_label]

    def worst_case_flops(self, prompt_tokens: int, completion_tokens: int, num_completions: int) -> int:
        """Most FLOPs one call on ``num_completions`` completions can execute, for the budget
        meter's admission of an iteration: every row at the longest length it can reach
        (prompt + completion + one marker per completion token, capped at ``max_length``; the
        text is re-tokenized, so the completion is counted twice as a margin), full batches.
        """
        n = min(self.max_length, prompt_tokens + 2 * completion_tokens)
        return num_completions * self._flops(n, self.executed_attention)

    def _flops(self, num_tokens: int, attention: str, executed: bool = True) -> int:
        """One forward over ``num_tokens`` tokens (markers included), head at every position
        (``executed=False``: only what the score needs, for useful FLOPs)."""
        from allocopt.flops import reward_model_flops

        # reward_model_flops(n, num_steps=k) reads n + k tokens; the markers are already in ids
        return reward_model_flops(self.shape, num_tokens, attention=attention)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"ModelReward(name={self.name!r}, model={self.shape.name!r}, marker={self.marker!r}, "
                f"aggregate={self.aggregate!r})")


def model_facts(model: Any, tokenizer: Any, max_length: int | None) -> tuple[int, "ModelShape", str, int]:
    """What a reward model's FLOP accounting and batching need: ``(max_length`` (tokens: the
    given one, else the config's ``max_position_embeddings``), :func:`reward_shape`, the
    executed attention (``causal`` for flash kernels that skip masked blocks, else ``full``),
    the pad token id (0 when the tokenizer has none)``)``."""
    config = model.config
    length = max_length or getattr(config, "max_position_embeddings", None) or 1 << 30
    impl = str(getattr(config, "_attn_implementation", None) or "eager")
    pad = getattr(tokenizer, "pad_token_id", None)
    return length, reward_shape(model), "causal" if impl.startswith("flash") else "full", \
        pad if pad is not None else 0


def reward_shape(model: Any) -> "ModelShape":
    """The :class:`allocopt.flops.ModelShape` of a reward model, from its config.

    ``ModelShape.from_config`` reads the head from ``config.architectures``, which an HF model
    built in memory (not loaded from a saved folder) leaves empty, so it returns head ``lm``;
    the model's class decides then: ``*ForTokenClassification`` / ``*ForSequenceClassification``
    → ``score`` with ``config.num_labels`` outputs.
    """
    from allocopt.flops import ModelShape

    config = model.config
    shape = ModelShape.from_config(config.to_dict())
    cls = type(model).__name__
    if shape.head == "lm" and cls.endswith(("TokenClassification", "SequenceClassification")):
        shape = dataclasses.replace(shape, head="score", num_labels=int(config.num_labels))
    elif shape.head == "lm" and "ProcessRewardModel" in cls:
        shape = dataclasses.replace(shape, head="prm", num_labels=int(config.num_labels))
    return shape


def _single_token_id(tokenizer: Any, marker: str) -> int:
    if not isinstance(marker, str) or not marker:
        raise ValueError(f"marker={marker!r}: must be a non-empty string")
    ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
    unk = getattr(tokenizer, "unk_token_id", None)
    if len(ids) != 1 or (unk is not None and ids[0] == unk):
        raise ValueError(f"marker={marker!r}: the tokenizer encodes it as {ids}; "
                         "need a single known token (e.g. the step separator or <extra_0>)")
    return int(ids[0])


def _device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return "cpu"


__all__ = ["Aggregate", "ModelReward", "model_facts", "reward_shape"]
