"""Public process reward models read the way their model cards say.

Two card formats are known (:data:`PRM_FORMATS`):

``qwen2.5-math-prm`` (``Qwen/Qwen2.5-Math-PRM-7B``, ``-72B``; model card "Quick Start"):
    the solution is split into steps on blank lines (``"\\n\\n"``); the input is the model's
    chat template over ``system`` = "Please reason step by step, and put your final answer
    within \\boxed{}.", ``user`` = the problem, ``assistant`` = the steps joined by
    ``<extra_0>`` with one ``<extra_0>`` after the last, rendered with
    ``add_generation_prompt=False`` and encoded with the model's own tokenizer. The step score
    is ``softmax(logits)[..., 1]`` (positive class) at each ``<extra_0>``. Loaded with
    ``AutoModel.from_pretrained(..., trust_remote_code=True)`` (``Qwen2ForProcessRewardModel``).
``skywork-o1-prm`` (``Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B``, ``-7B``; the card's
    ``skywork-o1-prm-inference`` ``prepare_input``):
    ``bos + problem + "\\n"``, then each non-empty line of the solution encoded with a ``"\\n"``
    token after it; the step score is the value head's ``sigmoid`` at each of those tokens.
    Loaded with that repository's ``PRM_MODEL`` (``pip install`` it; not on PyPI).

A completion's reward is an aggregate of its step scores: ``min`` for ``prm`` and
``proxy_prm`` training rewards (a chain is as good as its worst step; Lightman et al. 2023),
``product`` on request (the probability that every step is right, if independent), ``mean``
for the common judge. Reward-model FLOPs are one forward over exactly the ids built here
(template, markers, the model's own tokenizer): :class:`allocopt.rewards.model_reward.ModelReward`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from allocopt.flops import ConfigError
from allocopt.rewards.model_reward import ModelReward
from allocopt.rewards.base import as_text

PRM_FORMATS: dict[str, str] = {
    "Qwen/Qwen2.5-Math-PRM-7B": "qwen2.5-math-prm",
    "Qwen/Qwen2.5-Math-PRM-72B": "qwen2.5-math-prm",
    "Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B": "skywork-o1-prm",
    "Skywork/Skywork-o1-Open-PRM-Qwen-2.5-7B": "skywork-o1-prm",
}
"""Card format of each known public PRM id. A local folder names its format in its
``config.json`` (``allocopt_prm_format``)."""
FORMATS = ("qwen2.5-math-prm", "skywork-o1-prm")
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
"""The system message of the Qwen2.5-Math-PRM card's example."""
QWEN_PRM_MARKER = "<extra_0>"


class CardPRM(ModelReward):
    """A :class:`~allocopt.rewards.model_reward.ModelReward` whose input is built by a card format.

    ``__call__(prompts, completions, problem=[...], ...)``: the PRM reads the raw ``problem``
    column when TRL passes it (the policy's rendered prompt otherwise).
    """

    def __init__(self, model: Any, tokenizer: Any, *, prm_format: str, name: str = "prm",
                 aggregate: str = "min", batch_size: int = 8, max_length: int | None = None) -> None:
        if prm_format not in FORMATS:
            raise ConfigError(f"prm_format={prm_format!r}: unknown card format; known: {', '.join(FORMATS)}")
        self.prm_format = prm_format
        self.runs_lm_head = bool(getattr(model, "runs_lm_head", False))
        if prm_format == "skywork-o1-prm":
            self.num_labels_required = 1
        marker = QWEN_PRM_MARKER if prm_format == "qwen2.5-math-prm" else "\n"
        super().__init__(model, tokenizer, name=name, marker=marker, aggregate=aggregate,  # type: ignore[arg-type]
                         batch_size=batch_size, max_length=max_length)
        if prm_format == "skywork-o1-prm":
            self.marker_id = int(tokenizer.encode("\n", add_special_tokens=False)[-1])
            # a value head Linear(d, 1) at every position (skywork-o1-prm-inference ValueHead);
            # PRM_MODEL runs the whole causal LM too (its logits over the vocabulary at every
            # position, unused here): head ``value``
            self.shape = dataclasses.replace(self.shape, head="value" if self.runs_lm_head else "score",
                                             num_labels=1)
        self._overhead = len(self.encode("", "x")[0])  # template tokens around one 1-token step

    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, problem: list[Any] | None = None, **kwargs: Any) -> list[float]:
        return super().__call__(problem if problem is not None else prompts, completions, answer, **kwargs)

    def usage_of(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, problem: list[Any] | None = None, **kwargs: Any) -> Any:
        """As :meth:`ModelReward.usage_of`, reading ``problem`` as a call does."""
        return super().usage_of(problem if problem is not None else prompts, completions, answer, **kwargs)

    def steps(self, completion: str) -> list[str]:
        """The steps the card splits a solution into (marker text removed from them)."""
        text = completion.replace(QWEN_PRM_MARKER, "")
        if self.prm_format == "qwen2.5-math-prm":
            return [s.strip() for s in text.split("\n\n") if s.strip()]
        return [s for s in text.split("\n") if s.strip()]

    def encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[int], int]:
        """``(token ids, marker positions, steps)`` of one problem + solution, in the card's
        format, cut at ``max_length`` (markers cut off are not scored)."""
        problem, steps = as_text(prompt), self.steps(as_text(completion))
        if not steps:
            return [], [], 0
        if self.prm_format == "qwen2.5-math-prm":
            messages = [{"role": "system", "content": QWEN_PRM_SYSTEM},
                        {"role": "user", "content": problem},
                        {"role": "assistant", "content": QWEN_PRM_MARKER.join(steps) + QWEN_PRM_MARKER}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            positions = [i for i, t in enumerate(ids) if t == self.marker_id]
        else:
            bos = getattr(self.tokenizer, "bos_token", None) or ""
            ids = list(self.tokenizer.encode(bos + problem + "\n", add_special_tokens=False))
            positions = []
            for step in steps:
                ids.extend(self.tokenizer.encode(step, add_special_tokens=False))
                positions.append(len(ids))
                ids.append(self.marker_id)
        ids = ids[: self.max_length]
        return ids, [p for p in positions if p < len(ids)], len(steps)

    def step_probabilities(self, logits: Any) -> Any:
        if self.prm_format == "skywork-o1-prm":
            return logits.float()[..., 0]  # the wrapper returns sigmoid(value) already
        return super().step_probabilities(logits)

    def _flops(self, num_tokens: int, attention: str, executed: bool = True) -> int:
        """As :meth:`ModelReward._flops`; useful FLOPs of a ``value``-head model leave out the
        LM head it runs but whose logits nobody reads."""
        if executed or self.shape.head != "value":
            return super()._flops(num_tokens, attention, executed)
        from allocopt.flops import reward_model_flops

        return reward_model_flops(dataclasses.replace(self.shape, head="score"), num_tokens,
                                  attention=attention)  # type: ignore[arg-type]

    def worst_case_flops(self, prompt_tokens: int, completion_tokens: int, num_completions: int) -> int:
        """As :meth:`ModelReward.worst_case_flops`, plus the card template's own tokens."""
        n = min(self.max_length, self._overhead + prompt_tokens + 2 * completion_tokens)
        return num_completions * self._flops(n, self.executed_attention)


def prm_format_of(name: str, path: str) -> str:
    """The card format of PRM ``name`` (a known hub id) or of the folder ``path`` (its
    ``config.json`` key ``allocopt_prm_format``). Raises :class:`ConfigError` otherwise."""
    if name in PRM_FORMATS:
        return PRM_FORMATS[name]
    cfg = os.path.join(path, "config.json")
    fmt = None
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as fh:
            fmt = json.load(fh).get("allocopt_prm_format")
    if fmt not in FORMATS:
        raise ConfigError(f"reward_model={name!r}: its card format is not known (known PRMs: "
                          f"{', '.join(PRM_FORMATS)}; a local folder names one of {', '.join(FORMATS)} "
                          "as 'allocopt_prm_format' in its config.json)")
    return fmt


def load_prm(name: str, *, reward: str = "prm", aggregate: str = "min", batch_size: int = 8,
             field: str = "reward_model") -> CardPRM:
    """A :class:`CardPRM` for hub id or local folder ``name`` (bf16 on a GPU when there is one).

    Raises:
        ConfigError: missing model (offline: within seconds), unknown card format, or the
            Skywork inference package missing (one line each).
    """
    import torch

    from allocopt.resources import resolve

    path = resolve(name, "model", field=field)
    fmt = prm_format_of(name, path)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    if fmt == "skywork-o1-prm":
        model, tokenizer = _load_skywork(path, dtype, field, name)
    else:
        from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification

        from allocopt.resources import load_tokenizer

        arch = (AutoConfig.from_pretrained(path, trust_remote_code=True).architectures or [""])[0]
        if arch == "Qwen2ForProcessRewardModel":  # the real PRM: its own modeling code
            model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=dtype)
        else:
            model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype)
        tokenizer = load_tokenizer(path)
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"{field}={name!r}: its tokenizer has no chat template; the "
                              "qwen2.5-math-prm card format needs one")
    if cuda:
        model = model.to("cuda")
    return CardPRM(model, tokenizer, prm_format=fmt, name=reward, aggregate=aggregate,  # type: ignore[arg-type]
                   batch_size=batch_size)


def _load_skywork(path: str, dtype: Any, field: str, name: str) -> tuple[Any, Any]:
    """Skywork's ``PRM_MODEL`` from ``path`` in :func:`skywork_value` and its tokenizer.
    Raises :class:`ConfigError` (one line naming what to install) without the package."""
    try:
        from model_utils.prm_model import PRM_MODEL  # SkyworkAI/skywork-o1-prm-inference
    except ImportError:
        raise ConfigError(f"{field}={name!r}: the skywork-o1-prm card format needs the "
                          "skywork-o1-prm-inference package (git clone "
                          "https://github.com/SkyworkAI/skywork-o1-prm-inference; pip install -e .)") from None
    from transformers import AutoTokenizer

    inner = PRM_MODEL.from_pretrained(path, device_map=None, torch_dtype=dtype).eval()
    return skywork_value(inner), AutoTokenizer.from_pretrained(path, trust_remote_code=True)


def skywork_value(inner: Any) -> Any:
    """A module returning ``(b x t x 1 sigmoid value,)`` per position from a Skywork
    ``PRM_MODEL`` (``forward(input_ids, attention_mask, return_probs=True)`` gives
    ``(lm_logits, loss, value)``), marked ``runs_lm_head`` for the FLOP count."""
    import torch

    class SkyworkValue(torch.nn.Module):
        runs_lm_head = True

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.config = inner.config if hasattr(inner, "config") else inner.pretrained_model.config
            self.config.num_labels = 1

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            _, _, rewards = self.inner(input_ids=input_ids, attention_mask=attention_mask, return_probs=True)
            return (rewards.unsqueeze(-1),)

    return SkyworkValue(inner)


__all__ = ["CardPRM", "FORMATS", "PRM_FORMATS", "QWEN_PRM_MARKER", "QWEN_PRM_SYSTEM",
           "load_prm", "prm_format_of", "skywork_value"]
