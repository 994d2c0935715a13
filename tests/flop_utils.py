"""Helpers for the FLOP tests: tiny Qwen2 models, a character tokenizer and FLOP counting.

``torch.utils.flop_counter.FlopCounterMode`` counts only the operators in its registry. Two
that these tests meet are missing from it in torch 2.13 and are registered here (with torch's
own formulas), so that what is measured is what the hardware computes:

* ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward): SDPA on CPU;
  unregistered it counts 0 for all attention.
* ``aten.addmm_``: the in-place ``acc += a @ b`` that TRL's chunked LM head
  (``trl/kernels/chunked_logprob.py``, ``_addmm_fp32``) uses on CPU for the gradient of the
  hidden states in backward; unregistered it counts 0.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from allocopt.flops import ModelShape

torch.set_num_threads(1)
aten = torch.ops.aten

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
"""A tiny Qwen2: ``d=64``, ``L=2``, ``h=4``, ``h_kv=2`` (GQA), ``d_h=16``, ``f=96``, ``V=97``.
Every width differs, so a formula that mixes two of them up fails."""


# ------------------------------------------------------------------ FLOP counting
def register_cpu_sdpa_flops() -> None:
    """Teach ``FlopCounterMode`` the CPU SDPA kernels (forward and backward) and ``addmm_``.

    Uses torch's own ``sdpa_flop_count`` (``QKᵀ`` and ``PV``: the full rectangle, masks and
    ``is_causal`` ignored) and ``sdpa_backward_flop_count`` (five products: the scores are
    recomputed, then dP, dV, dQ, dK). Idempotent; call before creating a ``FlopCounterMode``.
    """
    registry = flop_counter.flop_registry
    if aten._scaled_dot_product_flash_attention_for_cpu not in registry:
        @flop_counter.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
        def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    if aten._scaled_dot_product_flash_attention_for_cpu_backward not in registry:
        @flop_counter.register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
        def _sdpa_cpu_bwd(grad_out_shape, query_shape, key_shape, value_shape, *args,
                          out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape,
                                                         value_shape)

    if aten.addmm_ not in registry:
        @flop_counter.register_flop_formula(aten.addmm_)
        def _addmm_inplace(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.mm_flop(a_shape, b_shape)


def count_flops(fn: Callable[[], Any]) -> tuple[int, Any]:
    """``(FLOPs, result)`` of ``fn()`` measured by ``FlopCounterMode``."""
    register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as mode:
        out = fn()
    return mode.get_total_flops(), out


class FlopMeter:
    """One ``FlopCounterMode`` with named marks, to split a long run into phases.

    ``with FlopMeter() as m: ...``; inside, ``m.now()`` is the running total (FLOPs) and
    ``with m.phase("generate"): ...`` adds the FLOPs of that block to ``m.phases["generate"]``.
    """

    def __init__(self) -> None:
        register_cpu_sdpa_flops()
        self.mode = FlopCounterMode(display=False)
        self.phases: dict[str, int] = {}

    def __enter__(self) -> "FlopMeter":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)

    def now(self) -> int:
        return self.mode.get_total_flops()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0) + self.now() - start

    @property
    def total(self) -> int:
        return self.now()


# ------------------------------------------------------------------- tiny models
def tiny_config(attn: str = "eager", **overrides: Any):
    """A ``Qwen2Config`` of :data:`TINY` size with ``attn`` (``eager`` or ``sdpa``) attention."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(**{**TINY, "tie_word_embeddings": True, **overrides})
    cfg._attn_implementation = attn
    return cfg


def tiny_causal_lm(attn: str = "eager", seed: int = 0, **overrides: Any):
    """A randomly initialised ``Qwen2ForCausalLM`` (float32, CPU, eval mode: no dropout)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config(attn, **overrides)).eval()


def shape_of(model_or_config: Any, head: str | None = None) -> ModelShape:
    """The :class:`ModelShape` of a transformers model or config (through ``config.json`` keys)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    d = cfg.to_dict()
    shape = ModelShape.from_config(d, name="tiny")
    if head is not None and head != shape.head:
        import dataclasses

        shape = dataclasses.replace(shape, head=head)
    return shape


def config_from_shape(shape: ModelShape, attn: str = "eager"):
    """A ``Qwen2Config`` with the widths of ``shape`` (for real sizes on the meta device)."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=4096)
    cfg._attn_implementation = attn
    return cfg


def lora(model: nn.Module, targets: Any = "all-linear", rank: int = 4):
    """``peft.get_peft_model`` with LoRA of rank ``rank`` on ``targets`` (no dropout)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets,
                     task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, cfg)


class PRMModel(nn.Module):
    """A step-level PRM in the Qwen2.5-Math-PRM layout: ``Qwen2Model`` then
    ``Linear(d, d)`` → ReLU → ``Linear(d, num_labels)`` at every position.

    ``forward(input_ids: b x n) -> b x n x num_labels`` logits.
    """

    def __init__(self, config, num_labels: int = 2) -> None:
        super().__init__()
        from transformers import Qwen2Model

        self.model = Qwen2Model(config)
        d = config.hidden_size
        self.score = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, num_labels))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.score(hidden)


# -------------------------------------------------------------------- tokenizer
CHARS = "0123456789+-*=? "
"""Characters of :func:`char_tokenizer`: few, so that a random model samples EOS often."""


def char_tokenizer(folder: str | os.PathLike, chars: str = CHARS):
    """A character-level ``PreTrainedTokenizerFast`` (WordLevel over single characters, with
    ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2), saved to ``folder`` and loaded back from it.

    ``AutoTokenizer`` is not used: on this folder it would build a Qwen2 BPE tokenizer.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
                   "eos_token": "<eos>", "unk_token": "<unk>", "model_max_length": 512}, fh)
    return PreTrainedTokenizerFast.from_pretrained(folder)
