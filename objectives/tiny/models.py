"""The tiny world's models: a character tokenizer, a tiny Qwen2 policy, two step verifiers (PRMs).

torch, transformers and tokenizers are imported inside the functions, so importing this
module is cheap. The size tables are plain dicts (:data:`POLICY_SIZES`, :data:`PRM_SIZES`).

Sizes (vocabulary ``V = 22``, :data:`objectives.tiny.tasks.VOCAB`; per-layer linear weights
``d·h·d_h + 2·d·h_kv·d_h + h·d_h·d + 3·d·f``, ``shared/DESIGN.md`` §3)::

    model           d    L  h  h_kv  f     params      forward FLOPs/token  vs policy
    policy tiny     96   4  4  2     384     556,704    1,110,144            1.00
    policy small    128  4  4  2     512     988,032    1,971,712            1.78
    policy medium   128  9  4  2     512   2,219,392    4,429,312            3.99
    prm proxy       96   3  4  2     384     418,080      833,664            0.75
    prm full        96   4  4  2     384     556,704    1,110,144            1.00

Forward FLOPs per token are the matmuls' ``2·(L·layer weights + head weights)`` (attention
over the context comes on top), with the LM head ``d·V`` (tied to the embedding) at every
position: the PRMs are causal LMs too, generative step verifiers
(:class:`allocopt.rewards.verifier.LikelihoodVerifier`), which apply their head only at the
positions of the steps they score. Why these sizes: the PRMs start
from the SFT'd base policy's weights (``full``: all of them; ``proxy``: the embedding, its
first three layers and the final norm) and are trained further as language models on correct
solutions (:func:`objectives.tiny.train.train_prm`), as real PRMs start from the instruct
model they judge. Per token, search costs about ``2N`` (policy forward), learning ``6N·μ``
and the reward ``2N_rm`` over prompt + completion, so the reward's share of the budget is
about ``(1 - ρ)·N_rm / (N + N_rm)``: at ``ρ = 0.5`` the ``full`` PRM (``N_rm = N``) takes
about 25 % and the ``proxy`` (``N_rm ≈ 0.75N``) about 21 %.

Attention is ``eager`` by default: every query scores every key of the block (what
``FlopCounterMode`` counts, ``attention="full"`` in :mod:`allocopt.flops`), and it works
with left padding in ``generate``. Pass ``attn_implementation="sdpa"`` to change it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from objectives.tiny.tasks import (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, STEP_TOKEN,
                                   UNK_TOKEN, VOCAB)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD_ID, EOS_ID, BOS_ID, STEP_ID = (VOCAB.index(t) for t in (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, STEP_TOKEN))
MAX_LENGTH = 256
"""Longest sequence (tokens) the tokenizer and the models' rotary tables are set up for;
the longest downstream prompt + solution is under 80 characters."""

POLICY_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=384),
    "small": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512),
    "medium": dict(hidden_size=128, num_hidden_layers=9, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=512),
}
"""Policy shapes by name (Qwen2 config fields): the three sizes of the model-size study
(:mod:`objectives.tiny.sizes`), 1.77x and 3.99x the parameters of ``tiny`` (the paper's 1.5B ->
3B -> 7B spans 4.7x): ``small`` is wider, ``medium`` ``small``'s width at 9 layers instead of 4
(a 4x-wide policy, d 192, stayed on the SFT loss plateau at every learning rate tried; head
dimension 32 as in ``small``)."""
PRM_SIZES: dict[str, dict[str, int]] = {
    "proxy": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=384),
    "full": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=384),
}
"""Step verifier shapes by name: ``full`` is the tiny policy's shape, ``proxy`` its first three
layers (three quarters of its FLOPs per token)."""


# ========================================================================== tokenizer
def build_tokenizer(path: str | None = None) -> "PreTrainedTokenizerFast":
    """A character-level tokenizer over :data:`objectives.tiny.tasks.VOCAB` (22 tokens).

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
def _fields(sizes: dict[str, dict[str, int]], size: str, what: str,
            extra: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    if size not in sizes:
        raise ValueError(f"size={size!r}: unknown {what} size; known: {', '.join(sizes)}")
    fields: dict[str, Any] = dict(
        model_type="qwen2", vocab_size=len(VOCAB), max_position_embeddings=MAX_LENGTH, rope_theta=10_000.0,
        rms_norm_eps=1e-6, initializer_range=0.02, use_sliding_window=False,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        attn_implementation="eager")
    fields.update(sizes[size])
    fields.update(extra)
    fields.update(overrides)
    return fields


def _config(fields: dict[str, Any]) -> "Qwen2Config":
    from transformers import Qwen2Config

    return Qwen2Config(**{k: v for k, v in fields.items() if k != "model_type"})


def policy_fields(size: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """The fields of :func:`policy_config` as a plain dict (a ``config.json``'s), without
    transformers: what pricing a plan needs (``ModelShape.from_config``)."""
    return _fields(POLICY_SIZES, size, "policy",
                   dict(tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"]), overrides)


def policy_config(size: str = "tiny", **overrides: Any) -> "Qwen2Config":
    """``Qwen2Config`` of a tiny policy (:data:`POLICY_SIZES`), vocabulary of
    :func:`build_tokenizer`, tied embeddings, eager attention. ``overrides`` are further
    ``Qwen2Config`` fields (``hidden_size=64``, ``attn_implementation="sdpa"``).

    Raises ``ValueError`` for an unknown ``size``.
    """
    return _config(policy_fields(size, **overrides))


def prm_config(size: str = "proxy", **overrides: Any) -> "Qwen2Config":
    """``Qwen2Config`` of a step verifier (:data:`PRM_SIZES`): a ``Qwen2ForCausalLM`` over the
    vocabulary of :func:`build_tokenizer`, tied embeddings, eager attention. It is trained as
    a language model on correct worked solutions and scores a step by the likelihood of its
    line (:class:`allocopt.rewards.verifier.LikelihoodVerifier`, a generative verifier).

    Raises ``ValueError`` for an unknown ``size``.
    """
    return _config(_fields(PRM_SIZES, size, "prm",
                           dict(tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"]), overrides))


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


def build_prm(config: "Qwen2Config | str" = "proxy", seed: int = 0) -> "Qwen2ForCausalLM":
    """A freshly initialised step verifier: a ``Qwen2ForCausalLM`` (``float32``, eval mode),
    deterministic in ``(config, seed)``. ``config`` is a config or a :data:`PRM_SIZES` name."""
    from transformers import Qwen2ForCausalLM

    return _build(Qwen2ForCausalLM, prm_config(config) if isinstance(config, str) else config,
                  seed)
