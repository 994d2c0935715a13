"""A generative step verifier: a causal LM scores each step by the likelihood of what it says.

:class:`LikelihoodVerifier` is a model-based reward (``proxy_prm`` / ``prm``) for a language
model trained on *correct* worked solutions only (the tiny world's PRMs are such models). It
reads ``prompt + completion`` once and scores step line ``i`` (the lines
:func:`allocopt.rewards.step_parsing.step_line_ends` lists) by the probability the model gives
to writing exactly that line and the newline that ends it::

    score_i = prod_{t in line i (+ its newline)} P(token_t | everything before it)     (score="line")
    score_i = (that product) ** (1 / number of those tokens)                            (score="token")

A step whose arithmetic is right is what the model would write (score near 1); one wrong
digit, a miscopied operand or a missing step makes one token unlikely (score near 0). This is
the "does the verifier's LM agree with the step" scoring of generative verifiers (Zhang et
al. 2024, *Generative Verifiers*; a step-level likelihood as in Lightman et al. 2023's PRM800K
baselines); ``score="token"`` is the per-token geometric mean, the length-normalized
likelihood that compares lines of different lengths (Brown et al. 2020's per-token likelihood
for ranking completions): a model unsure of every result digit (the tiny world's 3-layer
proxy gives a right result digit 0.65 on average) scores right lines far below 1 as a whole
line, but a wrong digit it rules out still pulls the per-token mean down. The reward is the
``mean`` (default) or ``min`` of the step scores, in ``[0, 1]``
like :class:`allocopt.rewards.model_reward.ModelReward`'s. A completion without step lines gets 0.0 and is
not run.

FLOPs (:func:`allocopt.flops.forward_flops`, shape from the model's config, head ``lm``): the
backbone over every token, and the LM head only at the positions that predict a scored token
(the head is applied to those hidden states alone, not to the whole sequence):

* useful: per sequence, its tokens with causal attention, the head at its scored positions;
* executed: per batch, ``rows x padded length`` tokens with ``full`` attention (eager and
  SDPA/math on CPU compute every query-key pair; ``causal`` for ``flash_attention*``), the
  head at the scored positions.

torch is imported only when the verifier runs.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from allocopt.rewards.model_reward import model_facts
from allocopt.rewards.base import MODEL_BASED, RewardUsage, _Base, as_text
from allocopt.rewards.step_parsing import step_line_ends

Aggregate = Literal["mean", "min"]
Score = Literal["line", "token"]
SCORES: tuple[str, ...] = ("line", "token")
"""How a step line's token log-probabilities become its score (module docstring)."""


class LikelihoodVerifier(_Base):
    """Scores each step of a completion by its likelihood under a causal LM (module docstring).

    Args:
        model: an HF ``*ForCausalLM`` with ``.model`` (the backbone) and ``.lm_head``.
        tokenizer: its tokenizer; the text is tokenized in segments cut at the step lines'
            ends, so a step's tokens never straddle two steps.
        name: ``proxy_prm`` or ``prm``.
        aggregate: ``mean`` or ``min`` of the step scores.
        score: ``line`` (the line's likelihood) or ``token`` (its per-token geometric mean).
        batch_size: sequences per forward (longest first, right-padded).
        max_length: longest sequence read (cut at the right; steps cut off are not scored,
            none left: 0.0). Default: the config's ``max_position_embeddings``.
        token_margin: the admission bound's tokens per completion token (1 when the verifier
            shares the policy's tokenizer and so re-tokenizes into at most as many tokens;
            2 otherwise, as :class:`allocopt.rewards.model_reward.ModelReward` assumes).

    Raises:
        ValueError: an unknown ``name``, ``aggregate``, ``score``, ``batch_size`` or
            ``token_margin``, or
            a model without ``lm_head``.
    """

    model_based = True

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "prm",
                 aggregate: Aggregate = "mean", score: Score = "line", batch_size: int = 64,
                 max_length: int | None = None, token_margin: float = 2.0) -> None:
        if name not in MODEL_BASED:
            raise ValueError(f"name={name!r}: a model-based reward is one of {', '.join(MODEL_BASED)}")
        self.name = name
        super().__init__()
        if aggregate not in ("mean", "min"):
            raise ValueError(f"aggregate={aggregate!r}: allowed: mean, min")
        if score not in SCORES:
            raise ValueError(f"score={score!r}: allowed: {', '.join(SCORES)}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be a positive integer")
        if isinstance(token_margin, bool) or not isinstance(token_margin, (int, float)) \
                or token_margin < 1:
            raise ValueError(f"token_margin={token_margin!r}: must be a number >= 1")
        if not hasattr(model, "lm_head") or not hasattr(model, "model"):
            raise ValueError(f"{name}: {type(model).__name__} has no lm_head; the verifier needs "
                             "a causal language model (*ForCausalLM)")
        self.model, self.tokenizer = model, tokenizer
        self.aggregate, self.batch_size, self.token_margin = aggregate, batch_size, token_margin
        self.score = score
        self.max_length, self.shape, self.executed_attention, self.pad_id = model_facts(
            model, tokenizer, max_length)
        model.eval()

    # ------------------------------------------------------------------- inputs
    def encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[tuple[int, int]]]:
        """``(token ids, spans)``: ``spans[i] = (start, end)`` are the token positions of step
        line ``i`` and its ending newline, cut at ``max_length`` (a step cut short is dropped).
        No step lines: ``([], [])``."""
        prompt_text, text = as_text(prompt), as_text(completion)
        ends = step_line_ends(text)
        if not ends:
            return [], []
        ids, spans, start = self._ids(prompt_text), [], 0
        for end in ends:
            stop = end + 1 if text[end:end + 1] == "\n" else end
            line_start = max(start, text.rfind("\n", 0, end) + 1)
            ids.extend(self._ids(text[start:line_start]))  # blank lines before: read, not scored
            first = len(ids)
            ids.extend(self._ids(text[line_start:stop]))
            spans.append((max(first, 1), len(ids)))  # token 0 has no prediction
            start = stop
        ids.extend(self._ids(text[start:]))
        ids = ids[: self.max_length]
        return ids, [(a, b) for a, b in spans if b <= len(ids) and b > a]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    # ------------------------------------------------------------------- scoring
    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
        """One reward per completion: the ``aggregate`` of its :meth:`step_scores` (0.0 when
        it has no step line); charges the FLOPs to :meth:`consume_usage`."""
        return [0.0 if not s else sum(s) / len(s) if self.aggregate == "mean" else min(s)
                for s in self.step_scores(prompts, completions)]

    def step_scores(self, prompts: list[Any] | None, completions: list[Any] | None) -> list[list[float]]:
        """Per completion, the score in ``[0, 1]`` of each of its step lines (``[]`` for none);
        the FLOPs are charged as for a reward call."""
        import torch

        start = time.perf_counter()
        prompts, completions = self._paired(prompts, completions)
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions)]
        scored: list[list[float]] = [[] for _ in encoded]
        todo = sorted((i for i, (_, spans) in enumerate(encoded) if spans),
                      key=lambda i: -len(encoded[i][0]))
        useful = executed = num_tokens = 0
        device = next(self.model.parameters()).device
        for b in range(0, len(todo), self.batch_size):
            rows = todo[b: b + self.batch_size]
            width = max(len(encoded[i][0]) for i in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            row_of, pos_of, tok_of = [], [], []
            for r, i in enumerate(rows):
                seq, spans = encoded[i]
                ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[r, : len(seq)] = 1
                for a, z in spans:
                    for t in range(a, z):  # token t is predicted at position t - 1
                        row_of.append(r)
                        pos_of.append(t - 1)
                        tok_of.append(seq[t])
            with torch.inference_mode():
                hidden = self.model.model(input_ids=ids.to(device),
                                          attention_mask=mask.to(device)).last_hidden_state
                picked = hidden[torch.tensor(row_of), torch.tensor(pos_of)]
                logp = torch.log_softmax(self.model.lm_head(picked).float(), dim=-1)
                token_logp = logp[torch.arange(len(tok_of)), torch.tensor(tok_of)].cpu().tolist()
            k = 0
            for r, i in enumerate(rows):
                scores = []
                for a, z in encoded[i][1]:
                    logp_line = sum(token_logp[k: k + z - a])
                    scores.append(math.exp(logp_line / (z - a) if self.score == "token"
                                           else logp_line))
                    k += z - a
                scored[i] = scores
            executed += len(rows) * self._flops(width, 0, self.executed_attention) \
                + self._flops(0, len(tok_of), self.executed_attention)
            for i in rows:
                seq, spans = encoded[i]
                useful += self._flops(len(seq), sum(z - a for a, z in spans), "causal")
                num_tokens += len(seq)
        self._add_usage(RewardUsage(useful_flops=useful, executed_flops=executed,
                                    wall_seconds=time.perf_counter() - start,
                                    num_completions=len(completions), num_tokens=num_tokens))
        return scored

    def usage_of(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> RewardUsage:
        """The usage a call on the same arguments reports (FLOPs, tokens, completions;
        ``wall_seconds`` 0), computed as :meth:`step_scores` does without running the model:
        for the budget meter's exact admission of a generated batch
        (:meth:`allocopt.plan.meter.FlopMeter.admit_exact`)."""
        prompts, completions = self._paired(prompts, completions)
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions)]
        todo = sorted((i for i, (_, spans) in enumerate(encoded) if spans),
                      key=lambda i: -len(encoded[i][0]))
        useful = executed = num_tokens = 0
        for b in range(0, len(todo), self.batch_size):
            rows = todo[b: b + self.batch_size]
            width = max(len(encoded[i][0]) for i in rows)
            picked = sum(z - a for i in rows for a, z in encoded[i][1])
            executed += len(rows) * self._flops(width, 0, self.executed_attention) \
                + self._flops(0, picked, self.executed_attention)
            for i in rows:
                seq, spans = encoded[i]
                useful += self._flops(len(seq), sum(z - a for a, z in spans), "causal")
                num_tokens += len(seq)
        return RewardUsage(useful_flops=useful, executed_flops=executed,
                           num_completions=len(completions), num_tokens=num_tokens)

    def worst_case_flops(self, prompt_tokens: int, completion_tokens: int, num_completions: int) -> int:
        """Most FLOPs one call on ``num_completions`` completions can execute, for the budget
        meter's admission of an iteration: every row at the longest length it can reach
        (``prompt + token_margin x completion`` tokens, capped at ``max_length``), the head at
        every one of its positions."""
        n = min(self.max_length, prompt_tokens + int(self.token_margin * completion_tokens))
        return num_completions * self._flops(n, n, self.executed_attention)

    def _flops(self, num_tokens: int, num_logits: int, attention: str) -> int:
        from allocopt.flops import forward_flops

        return forward_flops(self.shape, num_tokens, num_logits=num_logits,
                             attention=attention)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"LikelihoodVerifier(name={self.name!r}, model={self.shape.name!r}, "
                f"aggregate={self.aggregate!r}, score={self.score!r})")


__all__ = ["SCORES", "LikelihoodVerifier"]
