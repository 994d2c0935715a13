"""A stand-in of ``model_utils.prm_model`` from SkyworkAI/skywork-o1-prm-inference (not on
PyPI), for tests only: put this folder's parent on ``sys.path``.

Written here from the architecture the Skywork-o1-Open-PRM model card and that repository
describe, not copied: ``PRM_MODEL`` wraps a causal LM (``pretrained_model``; Qwen2 for the
Qwen-2.5 PRMs) whose last hidden states feed a value head ``v_head.summary = Linear(d, 1)`` at
every position; ``forward(input_ids, attention_mask, return_probs=True)`` returns
``(lm_logits, loss, sigmoid(value))`` with ``value`` of shape ``b x t``. The checkpoint holds
the LM's weights and ``v_head.summary.weight`` / ``v_head.summary.bias`` in one
``model.safetensors`` (:func:`objectives.qwen.standins.build_skywork_prm` writes that layout).
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM


class ValueHead(torch.nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.summary = torch.nn.Linear(hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden_states.to(self.summary.weight.dtype))


class PRM_MODEL(torch.nn.Module):  # noqa: N801 (the package's own name)
    def __init__(self, pretrained_model: torch.nn.Module) -> None:
        super().__init__()
        self.pretrained_model = pretrained_model
        self.v_head = ValueHead(pretrained_model.config.hidden_size)

    @classmethod
    def from_pretrained(cls, path: str, device_map=None, torch_dtype=None) -> "PRM_MODEL":
        from safetensors.torch import load_file

        model = cls(AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype))
        state = load_file(os.path.join(path, "model.safetensors"))
        model.v_head.load_state_dict({k[len("v_head."):]: v for k, v in state.items()
                                      if k.startswith("v_head.")}, strict=True)
        return model.to(torch_dtype) if torch_dtype is not None else model

    def forward(self, input_ids=None, attention_mask=None, return_probs: bool = False, **kwargs):
        out = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask,
                                    output_hidden_states=True)
        value = self.v_head(out.hidden_states[-1]).squeeze(-1)
        if return_probs:
            value = torch.sigmoid(value)
        return out.logits, out.loss, value
