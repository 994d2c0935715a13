"""The tiny world's models: a character tokenizer, a tiny Qwen2 policy, two step-level PRMs.

torch, transformers and tokenizers are imported inside the functions, so importing this
module is cheap. The size tables are plain dicts (:data:`POLICY_SIZES`, :data:`PRM_SIZES`).

Sizes (vocabulary ``V = 22``, :data:`objectives.tiny_tasks.VOCAB`; per-layer linear weights
``d·h·d_h + 2·d·h_kv·d_h + h·d_h·d + 3·d·f``, ``shared/DESIGN.md`` §3)::

    model           d    L  h  h_kv  f     params      forward FLOPs/token  vs policy
    policy tiny     96   4  4  2     384     556,704    1,110,144            1.00
    policy small    128  4  4  2     512     988,032    1,971,712            1.78
    prm proxy       64   4  4  2     256     248,384      491,776            0.44
    prm full        192  4  4  2     768   2,219,712    4,424,448            3.99

Forward FLOPs per token are the matmuls' ``2·(L·layer weights + head weights)`` (attention
over the context comes on top): the policy's head is the LM head
``d·V`` (tied to the embedding), a PRM's the token-classification head ``d·2`` (no bias, so
:meth:`allocopt.flops.ModelShape.num_params` counts it exactly). Why these sizes: per token,
search costs about ``2N`` (policy forward), learning ``6N·μ`` (full fine-tuning) and the
reward ``2N_rm`` over prompt + completion, so the reward's share of the budget is
``(1 - ρ)·N_rm / (N + N_rm)``: at ``ρ = 0.5`` the ``full`` PRM (``N_rm ≈ 4N``) takes about
40 % and the ``proxy`` PRM (``N_rm ≈ 0.44N``) about 15 %.

Attention is ``eager`` by default: every query scores every key of the block (what
``FlopCounterMode`` counts, ``attention="full"`` in :mod:`allocopt.flops`), and it works
with left padding in ``generate``. Pass ``attn_implementation="sdpa"`` to change it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from objectives.tiny_tasks import (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, STEP_TOKEN,
                                   UNK_TOKEN, VOCAB)

if TYPE_CHECKING:
    from transformers import (PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                              Qwen2ForTokenClassification)

PAD_ID, EOS_ID, BOS_ID, STEP_ID = (VOCAB.index(t) for t in (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, STEP_TOKEN))
MAX_LENGTH = 256
"""Longest sequence (tokens) the tokenizer and the models' rotary tables are set up for;
the longest downstream prompt + solution is under 80 characters."""

POLICY_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=384),
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512),
}
"""Policy shapes by name (Qwen2 config fields)."""
PRM_SIZES: dict[str, dict[str, int]] = {
    "proxy": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=256),
    "full": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=768),
}
"""Step-level reward model shapes by name: ``proxy`` is cheaper than the tiny policy,
``full`` about 4× its FLOPs per token."""
PRM_LABELS = {0: "wrong", 1: "correct"}
"""Labels of a PRM's two outputs at each ``<step>`` marker."""


# ========================================================================== tokenizer
def build_tokenizer(path: str | None = None) -> "PreTrainedTokenizerFast":
    """A character-level tokenizer over :data:`objectives.tiny_tasks.VOCAB` (22 tokens).

    WordLevel model, one token per character (pre-tokenizer: split before every character),
    decoder ``Fuse`` (tokens joined with nothing, so spaces and newlines survive a round
    trip). Special tokens ``<pad>`` (0), ``<eos>`` (1), ``<bos>`` (2), ``<step>`` (3),
    ``<unk>`` (4); nothing is added around the text on encoding (no BOS/EOS: prompts are
    plain text, the trainer appends ``<eos>`` to targets). ``padding_side="left"``, for
    generation. Characters outside the alphabet become ``<unk>``.

    When ``path`` is given the tokenizer is saved there with ``save_pretrained``; load it
    back with ``PreTrainedTokenizerFast.from_pretrained(path)`` (not ``AutoTokenizer``, which
    does not keep this tokenizer as it is).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN, bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN, additional_special_tokens=[STEP_TOKEN],
        padding_side="left", model_max_length=MAX_LENGTH)
    if path is not None:
        tokenizer.save_pretrained(str(path))
    return tokenizer


# ============================================================================ configs
def _config(sizes: dict[str, dict[str, int]], size: str, what: str,
            extra: dict[str, Any], overrides: dict[str, Any]) -> "Qwen2Config":
    if size not in sizes:
        raise ValueError(f"size={size!r}: unknown {what} size; known: {', '.join(sizes)}")
    from transformers import Qwen2Config

    fields: dict[str, Any] = dict(
        vocab_size=len(VOCAB), max_position_embeddings=MAX_LENGTH, rope_theta=10_000.0,
        rms_norm_eps=1e-6, initializer_range=0.02, use_sliding_window=False,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        attn_implementation="eager")
    fields.update(sizes[size])
    fields.update(extra)
    fields.update(overrides)
    return Qwen2Config(**fields)


def policy_config(size: str = "tiny", **overrides: Any) -> "Qwen2Config":
    """``Qwen2Config`` of a tiny policy (:data:`POLICY_SIZES`), vocabulary of
    :func:`build_tokenizer`, tied embeddings, eager attention. ``overrides`` are further
    ``Qwen2Config`` fields (``hidden_size=64``, ``attn_implementation="sdpa"``).

    Raises ``ValueError`` for an unknown ``size``.
    """
    return _config(POLICY_SIZES, size, "policy",
                   dict(tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"]), overrides)


def prm_config(size: str = "proxy", **overrides: Any) -> "Qwen2Config":
    """``Qwen2Config`` of a step-level reward model (:data:`PRM_SIZES`): a
    ``Qwen2ForTokenClassification`` with 2 labels (:data:`PRM_LABELS`), read at the
    ``<step>`` markers; score head without bias, no classifier dropout.

    Raises ``ValueError`` for an unknown ``size``.
    """
    return _config(PRM_SIZES, size, "prm", dict(
        tie_word_embeddings=False, architectures=["Qwen2ForTokenClassification"],
        num_labels=2, id2label=dict(PRM_LABELS), label2id={v: k for k, v in PRM_LABELS.items()},
        token_classification_bias=False, classifier_dropout=0.0), overrides)


# ============================================================================= models
def _build(model_cls: Any, config: "Qwen2Config", seed: int) -> Any:
    import torch

    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.eval()


def build_policy(config: "Qwen2Config | str" = "tiny", seed: int = 0) -> "Qwen2ForCausalLM":
    """A freshly initialised ``Qwen2ForCausalLM`` (``float32``, eval mode), the same weights
    for the same ``(config, seed)``. ``config`` is a config or a :data:`POLICY_SIZES` name."""
    from transformers import Qwen2ForCausalLM

    return _build(Qwen2ForCausalLM, policy_config(config) if isinstance(config, str) else config,
                  seed)


def build_prm(config: "Qwen2Config | str" = "proxy", seed: int = 0) -> "Qwen2ForTokenClassification":
    """A freshly initialised ``Qwen2ForTokenClassification`` step-level reward model
    (``float32``, eval mode), deterministic in ``(config, seed)``. ``config`` is a config or a
    :data:`PRM_SIZES` name. Its logits are ``batch x tokens x 2``; read them at ``<step>``."""
    from transformers import Qwen2ForTokenClassification

    return _build(Qwen2ForTokenClassification,
                  prm_config(config) if isinstance(config, str) else config, seed)
