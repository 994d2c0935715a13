"""Local stand-ins for the Qwen world, built without any download (tests and the GPU check).

* :func:`build_tokenizer`: a byte-level BPE tokenizer trained on the shipped math text, with
  Qwen's special tokens (``<|endoftext|>`` pad, ``<|im_start|>``, ``<|im_end|>`` end of turn,
  ``<extra_0>`` the PRM step marker) and a chat template written here in Qwen2.5's layout
  (``<|im_start|>role\\ncontent<|im_end|>\\n``; ``add_generation_prompt`` opens the assistant
  turn). Saved and loaded back as ``PreTrainedTokenizerFast``.
* :func:`build_policy`: a random ``Qwen2ForCausalLM`` of a given ``config.json`` (tiny by
  default) saved in HF format with that tokenizer: a folder ``--set model=PATH`` accepts.
* :func:`build_prm`: a random ``Qwen2ForTokenClassification`` with 2 labels (the layout
  Qwen2.5-Math-PRM's card reads: positive-class probability at each ``<extra_0>``), saved with
  the tokenizer; its ``config.json`` names the card format it is read with
  (``allocopt_prm_format``), since a local folder has no hub id to look the format up by.

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
"""Qwen2.5's turn layout without its default system message (written here, not copied)."""

TINY_POLICY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                   initializer_range=0.5)
"""A tiny Qwen2: every width differs, so a formula that mixes two up fails; wide initial
weights (``initializer_range`` 0.5) so that greedy decoding does not repeat one token."""


TINY_VLLM_POLICY = dict(hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                        initializer_range=0.5)
"""A tiny Qwen2 that vLLM's CPU attention runs: head_dim 64 (it refuses 16, the head size of
:data:`TINY_POLICY`); 2 query heads, 1 kv head, MLP 192."""


def _corpus() -> Iterable[str]:
    data = Path(__file__).resolve().parent.parent / "data"
    for name in ("gsm8k/test.jsonl", "math500/test.jsonl"):
        with open(data / name, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                yield from (str(v) for v in row.values())


def build_tokenizer(folder: str | os.PathLike, vocab_size: int = 600, chat_template: str | None = CHAT_TEMPLATE) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (every string encodes: 256 byte symbols),
    saved to ``folder`` and loaded back. ``chat_template=None`` leaves it without one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<extra_0>"])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.padding_side = "left"
    fast.save_pretrained(os.fspath(folder))
    out = PreTrainedTokenizerFast.from_pretrained(os.fspath(folder))
    out.padding_side = "left"
    return out


def _config(config: dict | None, tokenizer: Any, **extra: Any) -> Any:
    from transformers import Qwen2Config

    cfg = dict(TINY_POLICY if config is None else config)
    for k in ("architectures", "torch_dtype", "dtype", "transformers_version", "model_type",
              "use_sliding_window", "sliding_window", "max_window_layers", "layer_types"):
        cfg.pop(k, None)
    cfg.setdefault("vocab_size", len(tokenizer))
    cfg["vocab_size"] = max(cfg["vocab_size"], len(tokenizer))
    cfg.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
               bos_token_id=None, **extra)
    c = Qwen2Config(**cfg)
    c._attn_implementation = "eager"
    return c


def build_policy(folder: str | os.PathLike, tokenizer: Any, config: dict | None = None, seed: int = 0) -> Path:
    """A random ``Qwen2ForCausalLM`` (``config``: ``config.json`` keys; default
    :data:`TINY_POLICY`) saved with ``tokenizer`` in ``folder``. Returns the folder."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(_config(config, tokenizer, tie_word_embeddings=True))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(os.fspath(folder))
    tokenizer.save_pretrained(os.fspath(folder))
    return Path(folder)


def build_prm(folder: str | os.PathLike, tokenizer: Any, config: dict | None = None, seed: int = 1,
              prm_format: str = "qwen2.5-math-prm") -> Path:
    """A random 2-label ``Qwen2ForTokenClassification`` saved with ``tokenizer`` in ``folder``,
    its ``config.json`` naming ``prm_format`` (``allocopt_prm_format``). Returns the folder."""
    import torch
    from transformers import Qwen2ForTokenClassification

    torch.manual_seed(seed)
    cfg = _config(config, tokenizer, num_labels=2, allocopt_prm_format=prm_format)
    model = Qwen2ForTokenClassification(cfg)
    model.save_pretrained(os.fspath(folder))
    tokenizer.save_pretrained(os.fspath(folder))
    return Path(folder)


def build_skywork_prm(folder: str | os.PathLike, tokenizer: Any, config: dict | None = None,
                      seed: int = 2) -> Path:
    """A random Skywork-o1-Open-PRM-shaped model in ``folder``: a ``Qwen2ForCausalLM`` and a
    value head ``Linear(d, 1)`` whose weights sit in the same ``model.safetensors`` as
    ``v_head.summary.weight`` / ``v_head.summary.bias`` (the layout Skywork's ``PRM_MODEL``
    loads), ``config.json`` naming ``allocopt_prm_format = "skywork-o1-prm"``."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = _config(config, tokenizer, tie_word_embeddings=True, allocopt_prm_format="skywork-o1-prm")
    Qwen2ForCausalLM(cfg).save_pretrained(os.fspath(folder))
    tokenizer.save_pretrained(os.fspath(folder))
    weights = Path(folder) / "model.safetensors"
    state = load_file(os.fspath(weights))
    head = torch.nn.Linear(cfg.hidden_size, 1)
    state.update({"v_head.summary.weight": head.weight.detach().clone(),
                  "v_head.summary.bias": head.bias.detach().clone()})
    save_file(state, os.fspath(weights), metadata={"format": "pt"})
    return Path(folder)


__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TINY_POLICY", "TINY_VLLM_POLICY", "build_policy", "build_prm",
           "build_skywork_prm", "build_tokenizer"]
