"""Model shapes: :class:`ModelShape` from a preset, a ``config.json`` or the hub, and
:class:`LoRASpec`. Part of :mod:`allocopt.flops` (standard library only; the FLOP conventions
are in that package's docstring).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

HeadKind = Literal["lm", "score", "prm", "value"]

MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The seven linear modules of a Qwen2/Llama decoder layer, in forward order."""


from allocopt.errors import ConfigError  # noqa: E402,F401  (defined there; imported from here too)


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
    position), or ``value`` (a causal LM run whole, its ``d x V`` LM head at every position, plus
    a value head ``Linear(d, num_labels)`` on the last hidden states at every position:
    Skywork-o1-Open-PRM's ``PRM_MODEL``, TRL's ``AutoModelForCausalLMWithValueHead``)."""
    num_labels: int = 2
    """Outputs of a ``score``, ``prm`` or ``value`` head."""
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
        if self.head not in ("lm", "score", "prm", "value"):
            raise ConfigError(f"head={self.head!r}: must be one of lm, score, prm, value")

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
            num_kv_heads=_kv_heads(config, h, name),
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
    def from_pretrained(cls, name_or_path: str, *,
                        fetch_config: Callable[[str], str] | None = None) -> "ModelShape":
        """From a preset name, a local folder (or file) with ``config.json``, or a hub id.

        A hub id (``org/name``, neither a preset nor a local path) is handed to
        ``fetch_config``, which returns the local path of its ``config.json``; this module does
        no network look-up itself (:func:`allocopt.plan.hub.model_shape` passes the hub's).
        Raises :class:`ConfigError` otherwise.
        """
        if _preset_key(name_or_path) in _PRESETS:
            return cls.preset(name_or_path)
        path = name_or_path
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if os.path.isfile(path):
            from allocopt.limits import MAX_CONFIG_BYTES, read_json

            return cls.from_config(read_json(path, MAX_CONFIG_BYTES, "config.json"), name=name_or_path)
        if "/" in name_or_path and not os.path.exists(name_or_path):
            if fetch_config is None:
                raise ConfigError(f"model={name_or_path!r}: not a preset or a local folder "
                                  "(allocopt.plan.hub.model_shape fetches hub ids)")
            return cls.from_pretrained(fetch_config(name_or_path))
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
        if self.head == "value":
            return d * self.vocab_size + d * self.num_labels  # LM head + Linear(d, labels)
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
        elif self.head == "value":  # the LM head (unless tied) + the value head with its bias
            head = (0 if self.tie_word_embeddings else d * self.vocab_size) + d * self.num_labels + self.num_labels
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


__all__ = ["ConfigError", "HeadKind", "LoRASpec", "MODULES", "ModelShape", "preset_names"]


def _kv_heads(config: Mapping[str, Any], heads: Any, name: str | None) -> Any:
    """``num_key_value_heads``; when the config has none, ``num_attention_heads`` (multi-head
    attention, as ``transformers`` assumes), said in a one-line :class:`UserWarning`."""
    kv = config.get("num_key_value_heads")
    if kv is None:
        warnings.warn(f"config {name or config.get('_name_or_path') or ''}: no num_key_value_heads; assumed "
                      f"num_key_value_heads = num_attention_heads = {heads} (multi-head attention, as "
                      "transformers does)", UserWarning, stacklevel=3)
        return heads
    return kv
