"""Model shapes: :class:`ModelShape` from a preset, a ``config.json`` or the hub, and
:class:`LoRASpec`. Part of :mod:`allocopt.flops` (standard library only; the FLOP conventions
are in that package's docstring).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field, fields
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
    """``w``: keys a query may see in a windowed layer (the ``w`` most recent, itself
    included) when the config turns sliding-window attention on."""
    window_layers: tuple[int, ...] | None = None
    """Layers (0-based) that use :attr:`sliding_window`; ``None``: all of them (Mistral).
    Qwen2: layers ``>= max_window_layers`` with ``use_sliding_window``; Gemma-style configs:
    the ``sliding_attention`` entries of ``layer_types``."""
    num_experts: int = 0
    """``E``: routed experts of a mixture-of-experts MLP; 0: a dense model."""
    num_experts_per_tok: int = 0
    """``k``: experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 0
    """``f_e``: width of one routed expert's SwiGLU MLP."""
    moe_layers: tuple[int, ...] = ()
    """Layers (0-based) whose MLP is the mixture of experts; the others are dense SwiGLU MLPs
    of width :attr:`intermediate_size`."""
    shared_expert_intermediate_size: int = 0
    """Width of the always-active shared expert MLP of a MoE layer (Qwen2-MoE
    ``shared_expert_intermediate_size``; DeepSeek ``n_shared_experts × moe_intermediate_size``);
    0: none."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by ``sigmoid(Linear(d, 1))`` (Qwen2-MoE)."""
    q_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3): rank of the query down-projection
    (``q_a_proj`` then ``q_b_proj``); 0: one ``q_proj``."""
    kv_lora_rank: int = 0
    """Multi-head latent attention: rank of the joint key/value latent (``kv_a_proj_with_mqa``
    then ``kv_b_proj``); 0: plain (GQA) attention."""
    qk_rope_head_dim: int = 0
    """MLA: the rotary part of each query/key head (shared by all heads for keys);
    :attr:`head_dim` is the whole query/key width ``qk_nope_head_dim + qk_rope_head_dim``."""
    v_head_dim: int = 0
    """Width of one value head when it differs from :attr:`head_dim` (MLA); 0: ``head_dim``."""
    model_type: str | None = None
    """``config.json``'s ``model_type`` (``qwen3_moe``, ``mixtral``, ...) of a mixture-of-experts
    model, where it decides what peft adapts for the MLP names (:meth:`LoRASpec.ranks`);
    ``None`` for a dense model or a preset."""

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "num_labels"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{f}={v!r}: must be a positive integer")
        for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank",
                  "qk_rope_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{f}={v!r}: must be an integer >= 0")
        for f in ("moe_layers", "window_layers"):
            v = getattr(self, f)
            if v is None:
                continue
            v = tuple(v)
            object.__setattr__(self, f, v)
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_layers
                   for i in v):
                raise ConfigError(f"{f}={list(v)!r}: must be layer indices from 0 to "
                                  f"{self.num_layers - 1}")
        # one spelling per meaning: no window, or a window on every layer, is None
        if self.sliding_window is None or self.window_layers == tuple(range(self.num_layers)):
            object.__setattr__(self, "window_layers", None)
        if self.moe_layers and not (self.num_experts >= 1 and 1 <= self.num_experts_per_tok
                                    <= self.num_experts and self.moe_intermediate_size >= 1):
            raise ConfigError(f"num_experts_per_tok={self.num_experts_per_tok!r}: a MoE layer needs "
                              f"1 <= k <= num_experts={self.num_experts} and moe_intermediate_size >= 1")
        if self.kv_lora_rank and self.qk_rope_head_dim >= self.head_dim:
            raise ConfigError(f"qk_rope_head_dim={self.qk_rope_head_dim!r}: must be below the "
                              f"query/key head width {self.head_dim} (nope + rope)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_kv_heads={self.num_kv_heads}: must divide num_heads={self.num_heads}")
        if self.head not in ("lm", "score", "prm", "value"):
            raise ConfigError(f"head={self.head!r}: must be one of lm, score, prm, value")
        if self.model_type is not None and not isinstance(self.model_type, str):
            raise ConfigError(f"model_type={self.model_type!r}: must be a string")

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
        extra: dict[str, Any] = {**_moe_fields(config), **_mla_fields(config)}
        if extra.get("kv_lora_rank"):  # MLA: the query/key head is nope + rope wide
            head_dim = config.get("qk_nope_head_dim", 0) + config.get("qk_rope_head_dim", 0)
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
            max_position_embeddings=_context(config),
            sliding_window=_sliding_window(config),
            window_layers=_window_layers(config),
            # kept for a MoE model only (where it decides what peft adapts): a dense shape
            # stays equal to its preset
            model_type=config.get("model_type") if extra.get("moe_layers")
            and isinstance(config.get("model_type"), str) else None,
            **extra,
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
        context (``max_position_embeddings``, extended by a rope scaling factor where the config
        gives one). Sliding windows are counted per layer, at any length."""
        if self.max_position_embeddings and num_tokens > self.max_position_embeddings:
            raise ConfigError(f"{what}={num_tokens}: longer than {self.name}'s context "
                              f"(max_position_embeddings={self.max_position_embeddings})")


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
        """Weights of one dense layer's matrix products: ``d·h·d_h + 2·d·h_kv·d_h + h·d_h·d +
        3·d·f`` (a plain GQA + SwiGLU layer; :attr:`matmul_params_per_token` is the whole
        model's, MoE and MLA layers included)."""
        return sum(i * o for i, o in self.linear_shapes().values())

    # ------------------------------------------------ layers of any kind (MoE, MLA, windows)
    @property
    def v_dim(self) -> int:
        """Width of one value head (``v_head_dim``, else ``head_dim``)."""
        return self.v_head_dim or self.head_dim

    def attention_modules(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each attention projection of one layer, in forward order.
        GQA: ``q_proj, k_proj, v_proj, o_proj``. MLA (DeepSeek-V2/V3, ``kv_lora_rank > 0``):
        ``q_a_proj`` (``d -> q_lora_rank``) and ``q_b_proj`` (``-> h·(nope + rope)``), or one
        ``q_proj``; ``kv_a_proj_with_mqa`` (``d -> kv_lora_rank + rope``), ``kv_b_proj``
        (``kv_lora_rank -> h·(nope + v)``), ``o_proj`` (``h·v -> d``). Keys and values are
        counted as a plain KV cache holds them (each token's ``kv_b_proj`` once, no weight
        absorption)."""
        d, h, dh = self.hidden_size, self.num_heads, self.head_dim
        if not self.kv_lora_rank:
            lin = self.linear_shapes()
            return {m: lin[m] for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
        out: dict[str, tuple[int, int]] = {}
        if self.q_lora_rank:
            out["q_a_proj"] = (d, self.q_lora_rank)
            out["q_b_proj"] = (self.q_lora_rank, h * dh)
        else:
            out["q_proj"] = (d, h * dh)
        nope = dh - self.qk_rope_head_dim
        out["kv_a_proj_with_mqa"] = (d, self.kv_lora_rank + self.qk_rope_head_dim)
        out["kv_b_proj"] = (self.kv_lora_rank, h * (nope + self.v_dim))
        out["o_proj"] = (h * self.v_dim, d)
        return out

    def mlp_modules(self, moe: bool) -> dict[str, tuple[int, int, int]]:
        """``(d_in, d_out, uses per token)`` of each matmul of one layer's MLP, in forward
        order. Dense: ``gate_proj, up_proj, down_proj`` of width ``f``. MoE: ``router``
        (``d -> E``, every token), the routed experts' fused ``experts.gate_up_proj``
        (``d -> 2·f_e``) and ``experts.down_proj`` (``f_e -> d``), each used ``k`` times per
        token (top-k), then the shared expert ``shared.gate_proj, shared.up_proj,
        shared.down_proj`` and its ``shared_expert_gate`` (``d -> 1``) where the model has them."""
        d = self.hidden_size
        if not moe:
            f = self.intermediate_size
            return {"gate_proj": (d, f, 1), "up_proj": (d, f, 1), "down_proj": (f, d, 1)}
        fe, k = self.moe_intermediate_size, self.num_experts_per_tok
        out = {"router": (d, self.num_experts, 1), "experts.gate_up_proj": (d, 2 * fe, k),
               "experts.down_proj": (fe, d, k)}
        fs = self.shared_expert_intermediate_size
        if fs:
            out.update({"shared.gate_proj": (d, fs, 1), "shared.up_proj": (d, fs, 1),
                        "shared.down_proj": (fs, d, 1)})
            if self.shared_expert_gate:
                out["shared_expert_gate"] = (d, 1, 1)
        return out

    def layer_params(self, moe: bool) -> int:
        """Weights one token multiplies in one layer (``Σ d_in·d_out·uses``): attention
        projections plus the dense MLP, or the router, ``k`` routed experts and the shared one."""
        return (sum(i * o for i, o in self.attention_modules().values())
                + sum(i * o * u for i, o, u in self.mlp_modules(moe).values()))

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def matmul_params_per_token(self) -> int:
        """Weights one token multiplies in all decoder layers (the head apart):
        ``(L - L_moe)·dense + L_moe·moe`` of :meth:`layer_params`."""
        n_moe = self.num_moe_layers
        return (self.num_layers - n_moe) * self.layer_params(False) + n_moe * self.layer_params(True)

    @property
    def attention_flops_per_key(self) -> int:
        """FLOPs of one (query, key) pair in one layer: ``2·h·d_qk`` for the score ``q·k`` plus
        ``2·h·d_v`` for the weighted sum (``4·h·d_h`` when they are alike)."""
        return 2 * self.num_heads * (self.head_dim + self.v_dim)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (``None``: full attention)."""
        if self.sliding_window is None:
            return None
        if self.window_layers is None or layer in self.window_layers:
            return self.sliding_window
        return None

    def windows(self) -> dict[int | None, int]:
        """Layers per window (``None``: full attention) → count."""
        out: dict[int | None, int] = {}
        for i in range(self.num_layers):
            w = self.layer_window(i)
            out[w] = out.get(w, 0) + 1
        return out

    def fingerprint_fields(self) -> dict[str, Any]:
        """The shape as a dict, without its name and without the MoE / MLA / window fields
        that are at their defaults (so a dense model's dict is what it was before they
        existed, and fingerprints made from it stay stable)."""
        defaults = {f.name: f.default for f in fields(self)}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if k != "name" and not (k in _EXTENSION_FIELDS and v == defaults[k])}

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
        (q/k/v biases, RMSNorm weights and the embedding included; a tied head counted once).
        Dense GQA models only.

        Raises:
            ConfigError: a MoE or MLA model (its parameters are not counted here)."""
        if self.moe_layers or self.kv_lora_rank:
            raise ConfigError(f"model={self.name!r}: parameters of MoE/MLA models are not counted")
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
    """LoRA adapters on a frozen base (Hu et al. 2021, "LoRA", §4.1: ``W + B·A``).

    On a mixture-of-experts model the routed experts' fused 3-D weights are adapted by name
    (:data:`EXPERT_MODULES`: peft's ``target_parameters``, e.g.
    ``["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]``): one adapter
    per expert, ``A_e`` (``d_in -> r``) and ``B_e`` (``r -> d_out``), and the router's one.
    Two ways to run them are counted (:meth:`adapter_flops_per_token`, :meth:`fold_flops`):
    per token through its ``k`` routed experts (vLLM's fused-MoE LoRA; the useful count), or
    folded into the whole expert stack on every forward call (peft 0.21's ``ParamWrapper``).
    """

    rank: int = 16
    """``r``: adapter rank."""
    target_modules: tuple[str, ...] = MODULES
    """Modules of every layer that carry an adapter (peft ``target_modules``; ``all-linear``
    is the seven of :data:`MODULES`), and on a mixture-of-experts model the fused expert
    weights and the router by their :data:`EXPERT_MODULES` names (peft ``target_parameters``)."""

    all_linear: bool = field(default=False, init=False)
    """The targets were given as ``all-linear`` (or are the default seven, :data:`MODULES`, as a
    tuple); names written out, even all seven, are not (peft adds the router of a converted
    mixture-of-experts model, and Qwen2-MoE's ``shared_expert_gate``, only for ``all-linear``)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"lora_rank={self.rank!r}: must be a positive integer")
        if isinstance(self.target_modules, str):
            object.__setattr__(self, "all_linear", self.target_modules.strip() in ("all-linear", "all"))
            object.__setattr__(self, "target_modules", _parse_targets(self.target_modules))
        else:
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            object.__setattr__(self, "all_linear", self.target_modules == MODULES)
        allowed = MODULES + MLA_MODULES + EXPERT_MODULES
        bad = [m for m in self.target_modules if m not in allowed]
        if bad or not self.target_modules:
            raise ConfigError(f"lora_target_modules={list(self.target_modules)!r}: "
                              f"allowed: {', '.join(allowed)} or all-linear")

    def adapted(self, shape: ModelShape) -> frozenset[str]:
        """Names of ``shape``'s layer modules (:meth:`ModelShape.attention_modules`,
        :meth:`ModelShape.mlp_modules`) that carry an adapter: the keys of :meth:`ranks`.

        Raises:
            ConfigError: as :meth:`ranks`."""
        return frozenset(self.ranks(shape))

    def ranks(self, shape: ModelShape) -> dict[str, int]:
        """Each adapted module of ``shape``'s layers (names of
        :meth:`ModelShape.attention_modules`, :meth:`ModelShape.mlp_modules`) → its adapter's
        rank, as peft 0.21 with transformers 5 adapts them: the names given, on an MLA model
        ``all-linear`` also ``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``.

        On a mixture-of-experts model the MLP names (``gate_proj``, ``up_proj``,
        ``down_proj``; ``all-linear`` names them all) go where peft sends them, per
        :attr:`ModelShape.model_type` (:data:`PEFT_MOE_CONVERSION`; peft
        ``peft/utils/transformers_weight_conversion.py``, ``_convert_peft_config_moe``, run by
        ``BaseTuner.inject_adapter`` under transformers 5):

        * ``qwen3_moe``, ``deepseek_v3`` (transformers ``conversion_mapping.
          _MODEL_TO_CONVERSION_PATTERN`` → ``qwen2_moe``): ``gate_proj`` + ``up_proj`` become
          ``target_parameters`` ``gate_up_proj`` at rank ``2r`` (peft's ``rank_pattern``: the
          two fused), ``down_proj`` becomes ``down_proj`` at ``r``; the names leave
          ``target_modules``, so the dense layers' MLPs and DeepSeek's shared experts lose
          their adapters; ``all-linear`` adds the router (``gate`` → ``gate.weight``).
        * ``mixtral`` (peft adds it to that table): ``all-linear`` adapts ``gate_up_proj`` at
          ``2r``, ``down_proj`` and the router (its v4 names ``w1``, ``w3``, ``w2``,
          ``gate``); the written-out MLP names match nothing (peft refuses them when nothing
          else is targeted).
        * ``qwen2_moe`` (no conversion): the names match the ``nn.Linear`` modules that have
          them, the shared expert's and any dense layer's; ``all-linear`` also the shared
          expert's gate (``Linear(d, 1)``); the fused experts and the router are not adapted.

        Measured with real peft adapters on each family (tests/test_moe.py).

        Raises:
            ConfigError: expert targets on a dense model; MLP names on a mixture-of-experts
                model whose ``model_type`` is not one of the above (the line names the
                explicit targets); ``gate_proj`` without ``up_proj`` (or the other way) where
                peft fuses them (peft raises); on Mixtral, written-out MLP names alone."""
        t = set(self.target_modules)
        if shape.kv_lora_rank and self.all_linear:  # all-linear: every projection
            t |= set(MLA_MODULES)
        mlp = t & {"gate_proj", "up_proj", "down_proj"}
        experts = t & set(EXPERT_MODULES)
        targets = ",".join(self.target_modules) if not self.all_linear else "all-linear"
        if experts and not shape.moe_layers:
            raise ConfigError(f"lora_targets={targets}: "
                              f"{sorted(experts)[0]}: {shape.name} has no mixture-of-experts "
                              "layers; allowed: " + ", ".join(MODULES))
        r = self.rank
        out = {m: r for m in t - mlp}
        if not (shape.moe_layers and mlp):
            return {**out, **{m: r for m in mlp}}
        return self._moe_mlp_ranks(shape, mlp, out, targets)

    def _moe_mlp_ranks(self, shape: ModelShape, mlp: set[str], out: dict[str, int],
                       targets: str) -> dict[str, int]:
        """``out`` plus the MLP names ``mlp`` of a mixture-of-experts model where peft sends them."""
        r = self.rank
        kind = shape.model_type
        if kind not in PEFT_MOE_CONVERSION:
            attn = ",".join(shape.attention_modules())
            raise ConfigError(
                f"lora_targets={targets}: {sorted(mlp)[0]} on a mixture-of-experts model of "
                f"model_type={kind!r} is not counted (peft maps the MLP names per model type; "
                f"counted: {', '.join(PEFT_MOE_CONVERSION)}); name what carries an adapter: "
                f"{attn},experts.gate_up_proj,experts.down_proj[,router] (peft target_modules "
                "plus target_parameters), or fine-tune fully (lora_rank=0)")
        pattern = PEFT_MOE_CONVERSION[kind]
        if pattern is None:  # qwen2_moe: plain nn.Linear matching, shared expert and dense MLPs
            out.update({m: r for m in mlp})
            if shape.shared_expert_intermediate_size:
                out.update({f"shared.{m}": r for m in mlp})
                if self.all_linear and shape.shared_expert_gate:
                    out["shared_expert_gate"] = r
            return out
        if pattern == "mixtral" and not self.all_linear:
            if not out:
                raise ConfigError(
                    f"lora_targets={targets}: model_type={kind!r} has no module named "
                    f"{sorted(mlp)[0]} (peft: target modules not found; its experts are "
                    "experts.gate_up_proj,experts.down_proj, its router router)")
            return out  # the MLP names match nothing
        if pattern == "qwen2_moe" and len(mlp & {"gate_proj", "up_proj"}) == 1:
            raise ConfigError(f"lora_targets={targets}: {sorted(mlp & {'gate_proj', 'up_proj'})[0]} "
                              f"without {sorted({'gate_proj', 'up_proj'} - mlp)[0]}: peft refuses "
                              f"on model_type={kind!r} (they are fused into experts.gate_up_proj); "
                              "name both or neither")
        if self.all_linear or {"gate_proj", "up_proj"} <= mlp:
            out["experts.gate_up_proj"] = 2 * r  # peft rank_pattern: the two fused
        if "down_proj" in mlp:
            out["experts.down_proj"] = r
        if self.all_linear:
            out["router"] = r
        return out

    def adapter_flops_per_token(self, shape: ModelShape, *, folded: bool = False) -> int:
        """Forward FLOPs of all adapters of the model per token: ``Σ 2·r·(d_in + d_out)·uses``
        over the adapted modules (:meth:`adapted`) of every layer; a routed expert's adapter
        runs for each of the ``k`` experts a token is routed to (``uses = k``: the per-token
        path, vLLM's fused-MoE LoRA). ``folded``: the expert and router adapters are folded
        into their weights once per forward call instead (:meth:`fold_flops`) and cost
        nothing per token."""
        ranks = self.ranks(shape)
        if folded:
            ranks = {m: r for m, r in ranks.items() if m not in EXPERT_MODULES}

        def layer(moe: bool) -> int:
            mods = {**{m: (i, o, 1) for m, (i, o) in shape.attention_modules().items()},
                    **shape.mlp_modules(moe)}
            return sum(2 * ranks[m] * (i + o) * u for m, (i, o, u) in mods.items() if m in ranks)

        n_moe = shape.num_moe_layers
        return (shape.num_layers - n_moe) * layer(False) + n_moe * layer(True)

    def fold_parts(self, shape: ModelShape) -> dict[str, int]:
        """FLOPs of one fold of each adapted expert/router weight of one MoE layer, as peft
        0.21's ``ParamWrapper`` runs it on every forward call of the layer
        (``peft/tuners/lora/layer.py``): the expert stack ``W + s·(A_e B_e)`` for all ``E``
        experts, one ``baddbmm`` of ``E x d_in x r`` by ``E x r x d_out``:
        ``2·E·d_in·d_out·r``; the router ``W + s·B·A``: one ``d_out x r`` by ``r x d_in``
        product, ``2·d·E·r``."""
        ranks = self.ranks(shape)
        mods = shape.mlp_modules(True)
        E = shape.num_experts
        return {m: (2 * (1 if m == "router" else E) * mods[m][0] * mods[m][1] * ranks[m])
                for m in EXPERT_MODULES if m in ranks}

    def fold_flops(self, shape: ModelShape) -> int:
        """Forward FLOPs of one call's folds over all MoE layers (peft ``ParamWrapper``): each
        expert stack's fold runs twice, since ``torch.nn.utils.parametrize.register_parametrization``
        evaluates the parametrization once when peft registers it on every call and once when
        the experts read it (cached after); the router's product runs once (peft computes its
        delta before registering, and the parametrization then only adds). Measured with
        ``FlopCounterMode`` (tests/test_moe.py)."""
        parts = self.fold_parts(shape)
        per_layer = sum(v if m == "router" else 2 * v for m, v in parts.items())
        return shape.num_moe_layers * per_layer

    def merge_flops(self, shape: ModelShape) -> int:
        """FLOPs of forming every adapter's weight update once: ``Σ 2·r·d_in·d_out`` (the
        matmul ``B·A`` of a ``d_out x r`` and an ``r x d_in`` matrix) over the adapted modules
        (:meth:`adapted`) of every layer (a fused expert stack: its ``E`` experts' products). peft's ``merge_adapter`` and ``unmerge_adapter`` each
        run it (``LoraLayer.get_delta_weight``); the scaling and the add to the base weight are
        elementwise, not counted."""
        ranks = self.ranks(shape)

        def layer(moe: bool) -> int:
            mods = {**shape.attention_modules(),
                    **{m: (i, o) for m, (i, o, _) in shape.mlp_modules(moe).items()}}
            # a fused expert stack forms all E experts' updates (peft ParamWrapper); the router one
            return sum(2 * ranks[m] * i * o * (shape.num_experts if m in EXPERT_MODULES and m != "router" else 1)
                       for m, (i, o) in mods.items() if m in ranks)

        n_moe = shape.num_moe_layers
        return (shape.num_layers - n_moe) * layer(False) + n_moe * layer(True)


MLA_MODULES: tuple[str, ...] = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
"""The attention projections of a multi-head latent attention layer besides ``q_proj`` and
``o_proj`` (DeepSeek-V2/V3)."""

EXPERT_MODULES: tuple[str, ...] = ("experts.gate_up_proj", "experts.down_proj", "router")
"""LoRA targets of a mixture-of-experts layer (names of :meth:`ModelShape.mlp_modules`): the
routed experts' fused ``gate_up_proj`` (``E x 2·f_e x d`` in transformers 5) and ``down_proj``
weights, and the router's ``gate.weight`` (peft ``target_parameters``
``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``, ``mlp.gate.weight``)."""

PEFT_MOE_CONVERSION: dict[str, str | None] = {
    "qwen3_moe": "qwen2_moe", "deepseek_v3": "qwen2_moe", "mixtral": "mixtral", "qwen2_moe": None}
"""``model_type`` → the pattern by which peft 0.21.2 under transformers 5 re-targets the MLP
names of a mixture-of-experts model (transformers ``conversion_mapping.
_MODEL_TO_CONVERSION_PATTERN``, to which peft's ``utils/transformers_weight_conversion.py``
adds ``mixtral``; ``None``: not converted). The model types measured here
(:meth:`LoRASpec.ranks`); others are refused."""

_EXTENSION_FIELDS = frozenset({
    "window_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_layers",
    "shared_expert_intermediate_size", "shared_expert_gate", "q_lora_rank", "kv_lora_rank",
    "qk_rope_head_dim", "v_head_dim", "model_type"})

_ENC_DEC_KEYS = ("encoder_layers", "num_decoder_layers", "decoder_layers")


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` naming what of ``config`` cannot be counted exactly:
    encoder-decoder and vision-language models."""
    kind = config.get("model_type", "?")
    if config.get("is_encoder_decoder") or any(k in config for k in _ENC_DEC_KEYS):
        raise ConfigError(f"config.json: model_type={kind!r} is an encoder-decoder model; only "
                          "decoder-only models (Qwen2/Llama/Mistral) are counted")
    if "vision_config" in config or "visual" in config or any(
            "VL" in a or "Vision" in a for a in config.get("architectures") or []):
        raise ConfigError(f"config.json: model_type={kind!r} is a vision-language model; its "
                          "vision tower and image tokens are not counted (text-only decoders only)")


def _int(config: Mapping[str, Any], key: str, default: int = 0) -> int:
    v = config.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"config.json: {key}={v!r}: must be an integer >= 0")
    return v


def _moe_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of a ``config.json`` (none for a dense model).

    * Qwen2-MoE / Qwen3-MoE (``num_experts``, ``num_experts_per_tok``,
      ``moe_intermediate_size``): layer ``i`` is sparse unless in ``mlp_only_layers``, and when
      ``(i + 1) % decoder_sparse_step == 0`` (transformers ``Qwen3MoeDecoderLayer``); Qwen2-MoE
      adds ``shared_expert_intermediate_size`` with a sigmoid gate.
    * Mixtral (``num_local_experts``): every layer, experts of width ``intermediate_size``.
    * DeepSeek-V2/V3 (``n_routed_experts``): layers from ``first_k_dense_replace`` on, every
      ``moe_layer_freq``-th; ``n_shared_experts × moe_intermediate_size`` shared, ungated.
    """
    L = config["num_hidden_layers"]
    if not isinstance(L, int) or isinstance(L, bool) or L < 1:
        return {}
    # transformers 5 writes Qwen3-MoE's num_experts as num_local_experts: read either
    E = next((_int(config, key) for key in ("num_experts", "num_local_experts", "n_routed_experts")
              if config.get(key)), 0)
    if not E:
        return {}
    # expert width: moe_intermediate_size (Qwen, DeepSeek), else intermediate_size (Mixtral)
    fe = _int(config, "moe_intermediate_size") or _int(config, "intermediate_size")
    if "first_k_dense_replace" in config or config.get("n_routed_experts"):  # DeepSeek-V2/V3
        first, freq = _int(config, "first_k_dense_replace"), _int(config, "moe_layer_freq", 1) or 1
        layers = tuple(i for i in range(L) if i >= first and i % freq == 0)
    else:  # Qwen2/3-MoE rules (Mixtral: neither key, every layer)
        step = _int(config, "decoder_sparse_step", 1) or 1
        dense = set(config.get("mlp_only_layers") or ())
        layers = tuple(i for i in range(L) if i not in dense and (i + 1) % step == 0)
    gated = _int(config, "shared_expert_intermediate_size")  # Qwen2-MoE: a gated shared expert
    return {"num_experts": E, "num_experts_per_tok": _int(config, "num_experts_per_tok"),
            "moe_intermediate_size": fe, "moe_layers": layers,
            "shared_expert_intermediate_size": gated or _int(config, "n_shared_experts") * fe,
            "shared_expert_gate": bool(gated)}


def _mla_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention fields (DeepSeek-V2/V3: ``kv_lora_rank`` set)."""
    if not config.get("kv_lora_rank"):
        return {}
    return {"q_lora_rank": _int(config, "q_lora_rank"), "kv_lora_rank": _int(config, "kv_lora_rank"),
            "qk_rope_head_dim": _int(config, "qk_rope_head_dim"),
            "v_head_dim": _int(config, "v_head_dim")}


def _context(config: Mapping[str, Any]) -> int | None:
    """Longest sequence: ``max_position_embeddings``, or where a rope scaling (``rope_scaling``
    or transformers 5's ``rope_parameters``: yarn, dynamic, linear, longrope, llama3) gives a
    ``factor``, ``factor × original_max_position_embeddings`` (else ``× max_position_embeddings``)
    when that is longer (Qwen2.5's long-context recipe: yarn, factor 4, 32,768 → 131,072)."""
    base = _opt_int(config.get("max_position_embeddings"))
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if base is None or not isinstance(rope, Mapping):
        return base
    kind = rope.get("rope_type") or rope.get("type") or "default"
    factor = rope.get("factor")
    if kind == "default" or isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not factor > 1:
        return base
    original = _opt_int(rope.get("original_max_position_embeddings")) \
        or _opt_int(config.get("original_max_position_embeddings")) or base
    return max(base, int(factor * original))


def _window_layers(config: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The windowed layers (``None``: all, when a window is on): Gemma-style ``layer_types``
    (``sliding_attention`` entries), else Qwen2's layers ``>= max_window_layers``."""
    types = config.get("layer_types")
    if isinstance(types, (list, tuple)) and types:
        return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if config.get("use_sliding_window") and isinstance(config.get("max_window_layers"), int):
        L = config["num_hidden_layers"]
        return tuple(i for i in range(L) if i >= config["max_window_layers"])
    return None


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
    """``all-linear``: :data:`MODULES`; else comma-separated names, ``experts`` standing for
    ``experts.gate_up_proj,experts.down_proj``."""
    if text.strip() in ("all-linear", "all"):
        return MODULES
    out: list[str] = []
    for t in (t.strip() for t in text.split(",") if t.strip()):
        out += ["experts.gate_up_proj", "experts.down_proj"] if t == "experts" else [t]
    return tuple(dict.fromkeys(out))



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


__all__ = ["ConfigError", "EXPERT_MODULES", "HeadKind", "LoRASpec", "MLA_MODULES", "MODULES", "ModelShape",
           "PEFT_MOE_CONVERSION",
           "preset_names"]


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
