"""Exact FLOP accounting for decoder-only transformers of the Qwen2/Llama family.

Standard library only: the accounting can be used anywhere, with no torch installed.

Conventions (``shared/DESIGN.md`` §3, and Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", §2.1 for the 2·N FLOPs per token of a forward matmul):

* one multiply-add is 2 FLOPs; only matrix products are counted (norms, activations,
  softmax, rotary embeddings and bias additions are elementwise and counted as 0, as
  ``torch.utils.flop_counter.FlopCounterMode`` does);
* the input embedding is a lookup: 0 FLOPs, tied or not;
* a linear map ``d_in -> d_out`` costs ``2·d_in·d_out`` FLOPs per token;
* attention of one query over ``k`` keys costs ``4·h·d_h·k`` per layer (``2·h·d_h·k`` for the
  scores ``QKᵀ`` and as much for the weighted sum ``PV``), with ``h`` the *query* heads;
* backward of a matrix product costs one forward for each operand that needs a gradient
  (input gradient, weight gradient); a frozen weight costs only its input gradient.

Every function returns an exact integer count of FLOPs.  Which tokens are counted is the
caller's choice: *useful* FLOPs use the real token counts, *executed* FLOPs the padded shapes
an engine really computes (see :class:`Engine` and :mod:`allocopt.grpo_flops`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

Attention = Literal["causal", "full"]
"""How prefill attention is counted. ``causal``: a query at position ``i`` sees ``i + 1`` keys
(what is useful; what flash kernels roughly execute). ``full``: every query sees every key of
the block, masked or not (what eager and SDPA-math attention execute, and what
``FlopCounterMode`` counts for both)."""

HeadKind = Literal["lm", "score", "prm"]

MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The seven linear modules of a Qwen2/Llama decoder layer, in forward order."""


class ConfigError(ValueError):
    """A model configuration or a FLOP query is invalid; the message names the field."""


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer (Qwen2/Llama: GQA attention, SwiGLU MLP, RMSNorm).

    Build one with :meth:`preset`, :meth:`from_config` or :meth:`from_pretrained`.
    """

    name: str
    """A label for tables and tracking (an HF id or preset name)."""
    hidden_size: int
    """``d``: width of the residual stream."""
    num_layers: int
    """``L``: decoder layers."""
    num_heads: int
    """``h``: query heads."""
    num_kv_heads: int
    """``h_kv``: key/value heads (grouped-query attention)."""
    head_dim: int
    """``d_h``: width of one head."""
    intermediate_size: int
    """``f``: width of the SwiGLU MLP."""
    vocab_size: int
    """``V``: rows of the embedding and of the LM head."""
    tie_word_embeddings: bool = True
    """Whether the LM head shares the input embedding (changes parameters, not FLOPs)."""
    head: HeadKind = "lm"
    """Output head: ``lm`` (``d x V`` LM head), ``score`` (a ``d x num_labels`` linear head at
    every position, HF ``*ForSequenceClassification``/``*ForTokenClassification``), or
    ``prm`` (Qwen2.5-Math-PRM: ``Linear(d, d)`` → ReLU → ``Linear(d, num_labels)`` at every
    position)."""
    num_labels: int = 2
    """Outputs of a ``score`` or ``prm`` head."""
    max_position_embeddings: int | None = None
    """Longest sequence (prompt + completion, tokens) the model takes; ``None``: unchecked."""
    sliding_window: int | None = None
    """Keys a query may see when the config turns sliding-window attention on; the counts are
    exact only while no sequence is longer (longer ones are refused by the callers)."""

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "num_labels"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{f}={v!r}: must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_kv_heads={self.num_kv_heads}: must divide num_heads={self.num_heads}")
        if self.head not in ("lm", "score", "prm"):
            raise ConfigError(f"head={self.head!r}: must be one of lm, score, prm")

    # ----------------------------------------------------------------- construction
    @classmethod
    def preset(cls, name: str) -> "ModelShape":
        """A shipped preset by HF id or short name (``Qwen/Qwen2.5-1.5B``, ``qwen2.5-1.5b``,
        ``Qwen2.5-1.5B-Instruct``). Raises :class:`ConfigError` listing the known names."""
        key = _preset_key(name)
        if key not in _PRESETS:
            known = ", ".join(sorted(p.name for p in _PRESETS.values()))
            raise ConfigError(f"model={name!r}: unknown model; known presets: {known}, "
                              "or a local folder with a config.json")
        return _PRESETS[key]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str | None = None) -> "ModelShape":
        """From a Hugging Face ``config.json`` dict (Qwen2, Llama, Mistral keys).

        Raises:
            ConfigError: a required field is missing or invalid (the message names it).
        """
        if not isinstance(config, Mapping):
            raise ConfigError(f"config: expected a JSON object, got {type(config).__name__}")
        _refuse_unsupported(config)
        if "text_config" in config and "hidden_size" not in config:
            config = config["text_config"]
        required = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "vocab_size")
        for key in required:
            if key not in config:
                raise ConfigError(f"config.json: missing field {key!r} (needed: {', '.join(required)})")
        d, h = config["hidden_size"], config["num_attention_heads"]
        head_dim = config.get("head_dim") or (d // h if isinstance(d, int) and isinstance(h, int) and h else 0)
        archs = config.get("architectures") or []
        head: HeadKind = "lm"
        if any("ProcessRewardModel" in a for a in archs):
            head = "prm"
        elif any(a.endswith(("SequenceClassification", "TokenClassification")) for a in archs):
            head = "score"
        return cls(
            name=name or config.get("_name_or_path") or config.get("model_type", "model"),
            hidden_size=d,
            num_layers=config["num_hidden_layers"],
            num_heads=h,
            num_kv_heads=config.get("num_key_value_heads") or h,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head=head,
            num_labels=int(config.get("num_labels", len(config.get("id2label", {})) or 2)),
            max_position_embeddings=_opt_int(config.get("max_position_embeddings")),
            sliding_window=_sliding_window(config),
        )

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> "ModelShape":
        """From a preset name, a local folder (or file) with ``config.json``, or a hub id.

        The hub is asked only when neither a preset nor a local path matches, and needs
        ``huggingface_hub`` and the network. Raises :class:`ConfigError` otherwise.
        """
        if _preset_key(name_or_path) in _PRESETS:
            return cls.preset(name_or_path)
        path = name_or_path
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    return cls.from_config(json.load(fh), name=name_or_path)
            except json.JSONDecodeError as e:
                raise ConfigError(f"config.json at {path}: not valid JSON ({e})") from None
        if "/" in name_or_path and not os.path.exists(name_or_path):
            return cls.from_pretrained(_hub_config(name_or_path))
        return cls.preset(name_or_path)  # raises with the known names

    def check_length(self, num_tokens: int, what: str = "prompt_tokens + completion_tokens") -> None:
        """Raise :class:`ConfigError` when a sequence of ``num_tokens`` is longer than the model's
        context or its sliding window (where counts would no longer be exact)."""
        if self.max_position_embeddings and num_tokens > self.max_position_embeddings:
            raise ConfigError(f"{what}={num_tokens}: longer than {self.name}'s context "
                              f"(max_position_embeddings={self.max_position_embeddings})")
        if self.sliding_window and num_tokens > self.sliding_window:
            raise ConfigError(f"{what}={num_tokens}: longer than {self.name}'s sliding window "
                              f"({self.sliding_window} tokens); sliding-window attention is not "
                              "counted")

    # ------------------------------------------------------------------- parameters
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each linear module of one decoder layer."""
        d, h, kv, dh, f = (self.hidden_size, self.num_heads, self.num_kv_heads,
                           self.head_dim, self.intermediate_size)
        return {
            "q_proj": (d, h * dh), "k_proj": (d, kv * dh), "v_proj": (d, kv * dh),
            "o_proj": (h * dh, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d),
        }

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix products: ``d·h·d_h + 2·d·h_kv·d_h + h·d_h·d + 3·d·f``."""
        return sum(i * o for i, o in self.linear_shapes().values())

    @property
    def head_matmul_params(self) -> int:
        """Weights the output head multiplies per scored position."""
        d = self.hidden_size
        if self.head == "lm":
            return d * self.vocab_size
        if self.head == "score":
            return d * self.num_labels
        return d * d + d * self.num_labels  # prm: Linear(d, d) -> ReLU -> Linear(d, labels)

    def num_params(self) -> int:
        """Total parameters, as ``sum(p.numel() for p in model.parameters())`` counts them
        (q/k/v biases, RMSNorm weights and the embedding included; a tied head counted once)."""
        d, h, kv, dh = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = self.layer_matmul_params + (h + 2 * kv) * dh + 2 * d  # + qkv bias, 2 norms
        embed = self.vocab_size * d
        if self.head == "lm":
            head = 0 if self.tie_word_embeddings else self.head_matmul_params
        elif self.head == "score":
            head = self.head_matmul_params
        else:
            head = self.head_matmul_params + d + self.num_labels  # two biases
        return embed + self.num_layers * per_layer + d + head


@dataclass(frozen=True)
class LoRASpec:
    """LoRA adapters on a frozen base (Hu et al. 2021, "LoRA", §4.1: ``W + B·A``)."""

    rank: int = 16
    """``r``: adapter rank."""
    target_modules: tuple[str, ...] = MODULES
    """Linear modules of every layer that carry an adapter (peft ``target_modules``;
    ``all-linear`` is all seven)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"lora_rank={self.rank!r}: must be a positive integer")
        if isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", _parse_targets(self.target_modules))
        bad = [m for m in self.target_modules if m not in MODULES]
        if bad or not self.target_modules:
            raise ConfigError(f"lora_target_modules={list(self.target_modules)!r}: "
                              f"allowed: {', '.join(MODULES)} or all-linear")

    def adapter_flops_per_token(self, shape: ModelShape) -> int:
        """Forward FLOPs of all adapters of the model per token: ``Σ 2·r·(d_in + d_out)``."""
        lin = shape.linear_shapes()
        return shape.num_layers * sum(2 * self.rank * (lin[m][0] + lin[m][1]) for m in self.target_modules)


HUB_TIMEOUT_S = 2.5
"""Seconds a hub look-up of a ``config.json`` may take before it is given up (offline, the
whole command fails in under 5 s with one line, not half a minute of retries)."""


def _hub_config(repo_id: str) -> str:
    """Local path of ``repo_id``'s ``config.json`` from the Hugging Face hub (cache first).

    Honours ``HF_HUB_OFFLINE``; gives up after :data:`HUB_TIMEOUT_S` (the download runs in a
    daemon thread, its retry warnings silenced). Raises :class:`ConfigError` in one line.
    """
    import logging
    import threading

    try:
        from huggingface_hub import hf_hub_download  # optional, network only
    except ImportError:
        raise ConfigError(f"model={repo_id!r}: not a preset or a local folder, and "
                          "huggingface_hub is not installed to fetch it") from None
    result: dict[str, Any] = {}

    def fetch() -> None:
        try:
            result["path"] = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - reported as one line below
            result["error"] = e

    for name in ("huggingface_hub", "urllib3", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t = threading.Thread(target=fetch, daemon=True)
    t.start()
    t.join(HUB_TIMEOUT_S)
    if "path" in result:
        return result["path"]
    why = (f"no answer in {HUB_TIMEOUT_S:g} s" if t.is_alive()
           else type(result.get("error")).__name__)
    raise ConfigError(f"model={repo_id!r}: not a preset or a local folder, and its config.json "
                      f"could not be fetched from the hub ({why}); pass a folder with "
                      f"config.json or a preset ({', '.join(p.name for p in _PRESET_LIST)})")


_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
_ENC_DEC_KEYS = ("encoder_layers", "num_decoder_layers", "decoder_layers")


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming what of ``config`` cannot be counted exactly:
    encoder-decoder, vision-language and mixture-of-experts models."""
    kind = config.get("model_type", "?")
    if config.get("is_encoder_decoder") or any(k in config for k in _ENC_DEC_KEYS):
        raise ConfigError(f"config.json: model_type={kind!r} is an encoder-decoder model; only "
                          "decoder-only models (Qwen2/Llama/Mistral) are counted")
    if "vision_config" in config or "visual" in config or any(
            "VL" in a or "Vision" in a for a in config.get("architectures") or []):
        raise ConfigError(f"config.json: model_type={kind!r} is a vision-language model; its "
                          "vision tower and image tokens are not counted (text-only decoders only)")
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    moe = [k for k in _MOE_KEYS if text.get(k)]
    if moe:
        raise ConfigError(f"config.json: model_type={kind!r} is a mixture-of-experts model "
                          f"({moe[0]}={text[moe[0]]!r}); top-k expert routing is not counted")


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _sliding_window(config: Mapping[str, Any]) -> int | None:
    """The window when the config turns sliding-window attention on (Mistral: a
    ``sliding_window``; Qwen2: only with ``use_sliding_window``), else ``None``."""
    window = _opt_int(config.get("sliding_window"))
    if window is None or config.get("use_sliding_window") is False:
        return None
    return window


def _parse_targets(text: str) -> tuple[str, ...]:
    if text.strip() in ("all-linear", "all"):
        return MODULES
    return tuple(t.strip() for t in text.split(",") if t.strip())


# ============================================================================ forward
def attention_keys(num_tokens: int, past_tokens: int = 0, attention: Attention = "causal") -> int:
    """Keys seen in all by ``num_tokens`` new queries appended to ``past_tokens`` cached ones.

    ``causal``: ``n·c + n(n+1)/2``; ``full``: ``n·(c + n)``.
    """
    n, c = num_tokens, past_tokens
    if attention == "causal":
        return n * c + n * (n + 1) // 2
    if attention == "full":
        return n * (c + n)
    raise ConfigError(f"attention={attention!r}: must be causal or full")


def forward_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    past_tokens: int = 0,
    num_logits: int = 0,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
) -> int:
    """FLOPs of one forward over ``num_tokens`` new tokens of one sequence.

    Args:
        shape: the model.
        num_tokens: new tokens fed (prefill length, or 1 for a decode step).
        past_tokens: tokens already in the KV cache.
        num_logits: positions at which the output head is applied (``lm``: logits).
        attention: ``causal`` or ``full`` counting of attention (module docstring).
        lora: adapters active in this pass (unmerged adapters cost their own matmuls).

    Returns:
        FLOPs (int). For a batch, sum over its rows (padded rows: pass padded lengths).
    """
    # 1. linear layers: 2 FLOPs per weight per token (Kaplan et al. 2020, Table 1)
    linear = 2 * shape.layer_matmul_params * shape.num_layers * num_tokens
    # 2. LoRA adapters, unmerged: A (d_in -> r) then B (r -> d_out) on every token
    adapters = (lora.adapter_flops_per_token(shape) if lora else 0) * num_tokens
    # 3. attention: scores QKᵀ and weighted sum PV, 2·h·d_h FLOPs per (query, key) each
    attn = 4 * shape.num_heads * shape.head_dim * shape.num_layers * attention_keys(
        num_tokens, past_tokens, attention)
    # 4. output head at the positions asked for; the input embedding is a lookup (0 FLOPs)
    head = 2 * shape.head_matmul_params * num_logits
    return linear + adapters + attn + head


def backward_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    num_logits: int,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
    input_requires_grad: bool = False,
    fused_attention: bool = True,
) -> dict[str, int]:
    """FLOPs of the backward pass of one forward (no KV cache) of one sequence.

    Full fine-tuning (``lora=None``): every matrix product needs both the input and the weight
    gradient, so backward = 2 × forward (the embedding gradient is a scatter-add, 0 FLOPs).

    LoRA on a frozen base: frozen weights pay only their input gradient (1 × forward), the
    attention products 2 × forward, each adapter its two weight gradients and its input
    gradients. Autograd skips input gradients no parameter needs: in the first layer, a
    frozen module that reads the embedding output directly (q/k/v, and gate/up when no
    attention module carries an adapter) pays nothing unless ``input_requires_grad``
    (``enable_input_require_grads``, which transformers and TRL turn on with gradient
    checkpointing).

    Attention backward. With ``fused_attention`` (SDPA's fused kernels: flash, memory-efficient,
    and ``_scaled_dot_product_flash_attention_for_cpu`` on CPU) attention pays dQ, dK, dP, dV
    whenever any of Q, K, V needs a gradient, *and* recomputes the scores ``QKᵀ`` (the kernel
    keeps only the log-sum-exp): five products, 2.5 × the attention forward, as
    ``torch.utils.flop_counter.sdpa_backward_flop_count`` counts them. Without it (eager
    attention under autograd) each of the four products is paid only when its operand needs a
    gradient and nothing is recomputed: at most 2 × the attention forward. (Fix, measured with
    ``FlopCounterMode``: the fused case used to count 2 ×, missing the recomputed scores.)

    Returns:
        ``{"backward": FLOPs}`` split as ``{"backward_layers", "backward_head"}`` plus the total
        under ``"backward"``. The output head is frozen under LoRA (input gradient only) and
        trained under full fine-tuning (input + weight gradient).
    """
    lin = shape.linear_shapes()
    attn_fwd = 4 * shape.num_heads * shape.head_dim * attention_keys(num_tokens, 0, attention)
    # fused kernel: dQ, dK, dP, dV plus the recomputed scores QKᵀ, 5 × (attn_fwd / 2)
    # (torch.utils.flop_counter.sdpa_backward_flop_count; Dao 2023, FlashAttention-2, Alg. 2)
    attn_fused = attn_fwd // 2 * 5
    head_fwd = 2 * shape.head_matmul_params * num_logits
    if lora is None:  # full fine-tuning: input and weight gradient everywhere
        attn_bwd = attn_fused if fused_attention else 2 * attn_fwd
        layers = shape.num_layers * (2 * 2 * shape.layer_matmul_params * num_tokens + attn_bwd)
        head = 2 * head_fwd
        return {"backward_layers": layers, "backward_head": head, "backward": layers + head}

    targets, r = set(lora.target_modules), lora.rank
    layers = 0
    grad_in = input_requires_grad  # does the residual stream entering this layer need a gradient?
    for _ in range(shape.num_layers):
        cost = 0

        def module(name: str, input_grad: bool) -> bool:
            """Backward of one linear module; returns whether its output needs a gradient."""
            nonlocal cost
            d_in, d_out = lin[name]
            if input_grad:
                cost += 2 * d_in * d_out * num_tokens  # frozen W: input gradient only
            if name in targets:
                cost += 2 * r * d_out * num_tokens * 2  # B: weight grad + grad of A·x
                cost += 2 * r * d_in * num_tokens  # A: weight grad
                if input_grad:
                    cost += 2 * r * d_in * num_tokens  # A: input grad
            return input_grad or name in targets

        q, k, v = (module(m, grad_in) for m in ("q_proj", "k_proj", "v_proj"))
        attn_out = q or k or v
        if attn_out and fused_attention:
            cost += attn_fused  # dQ, dK, dP, dV and the recomputed scores, one kernel
        elif attn_out:  # each half of attn_fwd is one product; its backward, per operand
            cost += attn_fwd // 2 * (q + k + (q or k) + v)  # dQ, dK, dP, dV
        o = module("o_proj", attn_out)
        h1 = grad_in or o
        gate, up = module("gate_proj", h1), module("up_proj", h1)
        down = module("down_proj", gate or up)
        grad_in = h1 or down
        layers += cost
    head = head_fwd if grad_in else 0  # frozen head: input gradient only
    return {"backward_layers": layers, "backward_head": head, "backward": layers + head}


def training_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    num_logits: int,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
    gradient_checkpointing: bool = False,
    input_requires_grad: bool | None = None,
    head_recompute: bool = False,
    fused_attention: bool = True,
    reentrant_checkpoint: bool = False,
) -> dict[str, int]:
    """Forward + backward FLOPs of one training pass over one sequence (no KV cache).

    Args:
        shape: the model.
        num_tokens: tokens of the sequence (prompt + completion).
        num_logits: positions where the head is applied (completion tokens in GRPO).
        attention, lora: as in :func:`forward_flops`.
        gradient_checkpointing: each decoder layer's forward runs again during backward (HF
            checkpoints whole decoder layers; the head is not recomputed). With torch's
            non-reentrant checkpoint (``use_reentrant=False``: the default of transformers 5
            and of TRL) the recompute stops as soon as the last tensor saved for backward is
            back ("early stop", ``torch.utils.checkpoint``). A matmul saves its *inputs*, which
            exist before it runs, so each layer's last matmul is not recomputed: ``down_proj``,
            or the ``B`` of its adapter when ``down_proj`` carries one. (Fix, measured with
            ``FlopCounterMode``: the whole layer used to be counted.)
        input_requires_grad: whether the embedding output needs a gradient; default: with
            gradient checkpointing under LoRA (transformers' ``gradient_checkpointing_enable``
            and TRL both call ``enable_input_require_grads``).
        head_recompute: the head's forward runs again in backward (TRL's chunked fused LM
            head recomputes each logits tile rather than storing it).
        fused_attention: attention backward as one fused kernel (SDPA, with the scores
            recomputed) or per product (eager); see :func:`backward_flops`.
        reentrant_checkpoint: the checkpoint is torch's reentrant one
            (``use_reentrant=True``), which recomputes each layer's whole forward.

    Returns:
        ``{"forward", "backward", "recompute"}`` in FLOPs (and ``"total"``).
    """
    if input_requires_grad is None:
        input_requires_grad = gradient_checkpointing and lora is not None
    fwd = forward_flops(shape, num_tokens, num_logits=num_logits, attention=attention, lora=lora)
    bwd = backward_flops(shape, num_tokens, num_logits=num_logits, attention=attention, lora=lora,
                         input_requires_grad=input_requires_grad,
                         fused_attention=fused_attention)["backward"]
    recompute = 0
    if gradient_checkpointing:  # the decoder layers' forward again; the head is not checkpointed
        recompute += forward_flops(shape, num_tokens, attention=attention, lora=lora)
        if not reentrant_checkpoint:  # early stop: each layer's last matmul is not rerun
            d_in, d_out = shape.linear_shapes()["down_proj"]
            on_adapter = lora is not None and "down_proj" in lora.target_modules
            last = 2 * lora.rank * d_out if on_adapter else 2 * d_in * d_out
            recompute -= shape.num_layers * last * num_tokens
    if head_recompute:
        recompute += 2 * shape.head_matmul_params * num_logits
    return {"forward": fwd, "backward": bwd, "recompute": recompute, "total": fwd + bwd + recompute}


def generation_flops(
    shape: ModelShape,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
) -> dict[str, int]:
    """FLOPs of sampling one completion with a KV cache.

    The prompt is prefilled in one forward with logits at its last position only; that
    position yields completion token 1. Each further token costs one decode step that feeds
    the previous token: step ``j`` (``j = 1 … T-1``) sees ``prompt + j`` keys. A completion of
    ``T`` tokens (EOS included) costs one prefill and ``T - 1`` decode steps.

    Returns:
        ``{"prefill", "decode", "total"}`` in FLOPs.
    """
    if completion_tokens < 0 or prompt_tokens < 1:
        raise ConfigError(f"prompt_tokens={prompt_tokens}, completion_tokens={completion_tokens}: "
                          "need prompt_tokens >= 1 and completion_tokens >= 0")
    if completion_tokens == 0:
        return {"prefill": 0, "decode": 0, "total": 0}
    prefill = forward_flops(shape, prompt_tokens, num_logits=1, attention=attention, lora=lora)
    steps = completion_tokens - 1
    # Σ_{j=1}^{T-1} keys(prompt + j): one query per step, closed form of the arithmetic series
    decode_keys = steps * prompt_tokens + steps * (steps + 1) // 2
    per_token = (2 * shape.layer_matmul_params * shape.num_layers
                 + (lora.adapter_flops_per_token(shape) if lora else 0)
                 + 2 * shape.head_matmul_params)
    decode = steps * per_token + 4 * shape.num_heads * shape.head_dim * shape.num_layers * decode_keys
    return {"prefill": prefill, "decode": decode, "total": prefill + decode}


def reward_model_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    num_steps: int = 0,
    attention: Attention = "causal",
) -> int:
    """FLOPs of one reward-model forward over prompt + completion (no decoding).

    A step-level PRM (Qwen2.5-Math-PRM style) reads one extra marker token per step
    (``num_steps``). ``score`` and ``prm`` heads run at every position (as HF's heads do);
    an ``lm`` head is treated as a verifier that reads the logits at the last position.
    """
    n = num_tokens + num_steps
    head_positions = 1 if shape.head == "lm" else n
    return forward_flops(shape, n, num_logits=head_positions, attention=attention)


# ========================================================================= breakdown
PHASES = ("search", "learning", "reward")


@dataclass(frozen=True)
class ComputeBreakdown:
    """FLOPs of a run by phase, each phase split into named items.

    ``search``: rollout generation (``prefill``, ``decode``). ``learning``: everything the update
    needs (``old_logprobs``, ``ref_logprobs``, ``forward``, ``backward``, ``recompute``).
    ``reward``: reward-model inference (``reward_model``). All values are FLOPs (int).
    ``rho = learning / (search + learning + reward)`` (the update fraction ρ).
    Breakdowns add (``a + b``) and scale (``a * k``, rounded down per item).
    """

    search: Mapping[str, int] = field(default_factory=dict)
    learning: Mapping[str, int] = field(default_factory=dict)
    reward: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for phase in PHASES:
            for item, v in getattr(self, phase).items():
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ConfigError(f"{phase}.{item}={v!r}: FLOPs must be a non-negative int")

    @property
    def search_flops(self) -> int:
        return sum(self.search.values())

    @property
    def learning_flops(self) -> int:
        return sum(self.learning.values())

    @property
    def reward_flops(self) -> int:
        return sum(self.reward.values())

    @property
    def total_flops(self) -> int:
        return self.search_flops + self.learning_flops + self.reward_flops

    @property
    def rho(self) -> float:
        """Update fraction ρ = learning / total (NaN for an empty breakdown)."""
        t = self.total_flops
        return self.learning_flops / t if t else math.nan

    def __add__(self, other: "ComputeBreakdown") -> "ComputeBreakdown":
        if not isinstance(other, ComputeBreakdown):
            return NotImplemented
        return ComputeBreakdown(**{p: _add(getattr(self, p), getattr(other, p)) for p in PHASES})

    def __radd__(self, other: Any) -> "ComputeBreakdown":  # sum() starts at 0
        return self if other == 0 else NotImplemented

    def __mul__(self, k: float) -> "ComputeBreakdown":
        if k < 0 or math.isnan(k):
            raise ConfigError(f"scale={k!r}: must be a non-negative number")
        return ComputeBreakdown(**{p: {i: int(v * k) for i, v in getattr(self, p).items()}
                                   for p in PHASES})

    __rmul__ = __mul__

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat dict for tracking: ``search_flops``, ``learning_flops``, ``reward_flops``,
        ``total_flops``, ``rho`` and one ``<phase>_<item>_flops`` per item, each key prefixed."""
        out: dict[str, float] = {}
        for p in PHASES:
            out[f"{prefix}{p}_flops"] = getattr(self, f"{p}_flops")
        out[f"{prefix}total_flops"] = self.total_flops
        out[f"{prefix}rho"] = self.rho
        for p in PHASES:
            for item, v in sorted(getattr(self, p).items()):
                out[f"{prefix}{p}_{item}_flops"] = v
        return out


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


@dataclass(frozen=True)
class FlopAccount:
    """Useful and executed FLOPs of the same work. Budgets are charged ``executed``."""

    useful: ComputeBreakdown
    """FLOPs of the actual tokens (no padding, causal attention, only needed logits)."""
    executed: ComputeBreakdown
    """FLOPs the engine in use computes (padding, masked attention, extra logits)."""

    def __add__(self, other: "FlopAccount") -> "FlopAccount":
        if not isinstance(other, FlopAccount):
            return NotImplemented
        return FlopAccount(self.useful + other.useful, self.executed + other.executed)

    def __radd__(self, other: Any) -> "FlopAccount":
        return self if other == 0 else NotImplemented

    def __mul__(self, k: float) -> "FlopAccount":
        return FlopAccount(self.useful * k, self.executed * k)

    __rmul__ = __mul__

    def to_dict(self) -> dict[str, float]:
        """Executed numbers under the plain names, useful ones prefixed ``useful_``."""
        return {**self.executed.to_dict(), **self.useful.to_dict("useful_")}


# =========================================================================== presets
def _qwen(name: str, d: int, L: int, h: int, kv: int, f: int, V: int, tied: bool,
          head: HeadKind = "lm", context: int | None = 32768) -> ModelShape:
    return ModelShape(name=name, hidden_size=d, num_layers=L, num_heads=h, num_kv_heads=kv,
                      head_dim=d // h, intermediate_size=f, vocab_size=V,
                      tie_word_embeddings=tied, head=head, max_position_embeddings=context)


# Source: the models' public config.json (shared/data/README.md).
_PRESET_LIST = (
    _qwen("Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True),
    _qwen("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
    _qwen("Qwen/Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True),
    _qwen("Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, context=131072),
    _qwen("Qwen/Qwen2.5-Math-PRM-7B", 3584, 28, 28, 4, 18944, 152064, False, head="prm",
          context=None),
)


def _preset_key(name: str) -> str:
    key = name.strip().lower().split("/")[-1]
    for suffix in ("-instruct",):
        key = key.removesuffix(suffix)
    return key


_PRESETS = {_preset_key(p.name): p for p in _PRESET_LIST}


def preset_names() -> list[str]:
    """HF ids of the shipped presets (``-Instruct`` variants share their base's shape)."""
    return [p.name for p in _PRESET_LIST]


__all__ = [
    "Attention", "ComputeBreakdown", "ConfigError", "FlopAccount", "LoRASpec", "MODULES",
    "ModelShape", "attention_keys", "backward_flops", "forward_flops", "generation_flops",
    "preset_names", "reward_model_flops", "training_flops",
]

