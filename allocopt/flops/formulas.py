"""Per-pass FLOP formulas: forward, backward, training, generation and reward-model passes of
a :class:`~allocopt.flops.shapes.ModelShape`. Part of :mod:`allocopt.flops` (standard
library only; the conventions and sources are in that package's docstring).
"""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple

from allocopt.flops.shapes import ConfigError, LoRASpec, ModelShape


Attention = Literal["causal", "full"]
"""How prefill attention is counted. ``causal``: a query at position ``i`` sees ``i + 1`` keys
(what is useful; what flash kernels roughly execute). ``full``: every query sees every key of
the block, masked or not (what eager and SDPA-math attention execute, and what
``FlopCounterMode`` counts for both)."""


# ============================================================================ forward
def attention_keys(num_tokens: int, past_tokens: int = 0, attention: Attention = "causal",
                   window: int | None = None) -> int:
    """Keys seen in all by ``num_tokens`` new queries appended to ``past_tokens`` cached ones.

    ``causal``: ``n·c + n(n+1)/2``; ``full``: ``n·(c + n)``. With a sliding ``window`` ``w``
    (causal counting, and any single decode query, whose cache keeps the window): the query at
    position ``t`` (0-based) sees ``min(t + 1, w)`` keys (Beltagy et al. 2020, "Longformer",
    §3.1; Mistral's and Qwen2's sliding windows). Full (eager/SDPA-math) prefill computes the
    whole rectangle, window or not.
    """
    n, c = num_tokens, past_tokens
    if attention not in ("causal", "full"):
        raise ConfigError(f"attention={attention!r}: must be causal or full")
    if window is not None and (attention == "causal" or n == 1):
        lo, hi = c + 1, c + n  # Σ_{x=lo}^{hi} min(x, w)
        below = min(hi, window)
        s = (below * (below + 1) - (lo - 1) * lo) // 2 if below >= lo else 0
        return s + max(0, hi - max(lo - 1, window)) * window
    if attention == "causal":
        return n * c + n * (n + 1) // 2
    return n * (c + n)


def attention_flops(shape: ModelShape, num_tokens: int, past_tokens: int = 0,
                    attention: Attention = "causal") -> int:
    """Attention FLOPs (scores ``QKᵀ`` and the weighted sum ``PV``) of ``num_tokens`` new
    queries over all layers: per layer :attr:`ModelShape.attention_flops_per_key` ×
    :func:`attention_keys` with that layer's window (``4·h·d_h·L·keys`` for a plain model)."""
    return shape.attention_flops_per_key * sum(
        count * attention_keys(num_tokens, past_tokens, attention, w)
        for w, count in shape.windows().items())


def forward_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    past_tokens: int = 0,
    num_logits: int = 0,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
    expert_folds: int = 0,
) -> int:
    """FLOPs of one forward over ``num_tokens`` new tokens of one sequence.

    Args:
        shape: the model.
        num_tokens: new tokens fed (prefill length, or 1 for a decode step).
        past_tokens: tokens already in the KV cache.
        num_logits: positions at which the output head is applied (``lm``: logits).
        attention: ``causal`` or ``full`` counting of attention (module docstring).
        lora: adapters active in this pass (unmerged adapters cost their own matmuls).
        expert_folds: forward calls in this count whose adapted expert/router weights peft
            folds (:meth:`LoRASpec.fold_flops`, each call's folds once; the folded experts
            then cost nothing per token); 0: those adapters run per token (vLLM, useful).

    Returns:
        FLOPs (int). For a batch, sum over its rows (padded rows: pass padded lengths).
    """
    # 1. linear layers: 2 FLOPs per weight per token (Kaplan et al. 2020, Table 1); a MoE
    # layer's router and its k routed experts (+ the shared one) per token (Fedus et al. 2022,
    # "Switch Transformers", §2.1: compute follows the active experts only)
    linear = 2 * shape.matmul_params_per_token * num_tokens
    # 2. LoRA adapters, unmerged: A (d_in -> r) then B (r -> d_out) on every token
    folded = bool(expert_folds)
    adapters = (lora.adapter_flops_per_token(shape, folded=folded) if lora else 0) * num_tokens
    # 2b. peft's folds of the fused expert weights: once per forward call, not per token
    adapters += lora.fold_flops(shape) * expert_folds if lora and folded else 0
    # 3. attention: scores QKᵀ (2·h·d_qk) and weighted sum PV (2·h·d_v) per (query, key),
    # each layer with its own window
    attn = attention_flops(shape, num_tokens, past_tokens, attention)
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
    expert_folds: int = 0,
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
    gradient and nothing is recomputed: at most 2 × the attention forward. (Measured with
    ``FlopCounterMode``: counting the fused case as 2 × misses the recomputed scores.)

    Routed experts and the router under LoRA (:data:`~allocopt.flops.shapes.EXPERT_MODULES`):
    per token (``expert_folds=0``), each of the ``k`` experts a token meets pays its adapter's
    backward as a dense module does. Folded (peft, ``expert_folds`` calls): the folded weight
    ``W' = W + s·A·B`` needs a gradient, so the experts' product pays its weight gradient
    (``2·d_in·d_out`` per routed token, as much as its input gradient), and each call's fold
    its two factor gradients (2 × one fold, :meth:`LoRASpec.fold_parts`).

    Returns:
        ``{"backward": FLOPs}`` split as ``{"backward_layers", "backward_head"}`` plus the total
        under ``"backward"``. The output head is frozen under LoRA (input gradient only) and
        trained under full fine-tuning (input + weight gradient).
    """
    head_fwd = 2 * shape.head_matmul_params * num_logits
    windows = [shape.layer_window(i) for i in range(shape.num_layers)]
    if lora is None:  # full fine-tuning: input and weight gradient everywhere
        layers = 2 * 2 * shape.matmul_params_per_token * num_tokens
        for w in windows:
            layers += _fused_attention_backward(shape, num_tokens, attention, w) if fused_attention \
                else 2 * sum(_attention_products(shape, num_tokens, attention, w))
        head = 2 * head_fwd
        return {"backward_layers": layers, "backward_head": head, "backward": layers + head}

    ranks = lora.ranks(shape)
    folds = {name: flops * expert_folds for name, flops in lora.fold_parts(shape).items()} \
        if expert_folds else {}
    p = _LoRABackward(shape, num_tokens, attention, fused_attention, ranks, folds)
    layers, grad_out = _lora_layers_backward(p, windows, input_requires_grad)
    head = head_fwd if grad_out else 0  # frozen head: input gradient only
    return {"backward_layers": layers, "backward_head": head, "backward": layers + head}


def _attention_products(shape: ModelShape, num_tokens: int, attention: Attention,
                        window: int | None) -> tuple[int, int]:
    """FLOPs of the two attention products of one layer (no KV cache): ``QKᵀ`` and ``PV``."""
    keys = attention_keys(num_tokens, 0, attention, window)
    return (2 * shape.num_heads * shape.head_dim * keys,
            2 * shape.num_heads * shape.v_dim * keys)


def _fused_attention_backward(shape: ModelShape, num_tokens: int, attention: Attention,
                              window: int | None) -> int:
    """Backward FLOPs of one layer's fused attention kernel."""
    # the recomputed scores QKᵀ, dQ, dK (each a QKᵀ-sized product), dP, dV (each PV-sized):
    # 2.5 x the forward when d_qk = d_v
    # (torch.utils.flop_counter.sdpa_backward_flop_count; Dao 2023, FlashAttention-2, Alg. 2)
    qk, pv = _attention_products(shape, num_tokens, attention, window)
    return 3 * qk + 2 * pv


class _LoRABackward(NamedTuple):
    """What stays fixed over the layers of one sequence's backward under LoRA."""

    shape: ModelShape
    num_tokens: int
    attention: Attention
    fused_attention: bool
    ranks: dict[str, int]
    """Adapted modules → rank (:meth:`LoRASpec.ranks`)."""
    folds: dict[str, int]
    """Folded expert/router modules → forward FLOPs of their folds over all the pass's calls
    (:meth:`LoRASpec.fold_parts` × ``expert_folds``); empty when nothing is folded."""


def _lora_layers_backward(p: _LoRABackward, windows: list[int | None],
                          input_requires_grad: bool) -> tuple[int, bool]:
    """Backward FLOPs of all decoder layers under LoRA, and whether the head's input needs a gradient."""
    moes = set(p.shape.moe_layers)
    layers = 0
    grad_in = input_requires_grad  # does the residual stream entering this layer need a gradient?
    seen: dict[tuple, tuple[int, bool]] = {}  # layers of a kind are alike given grad_in
    for i in range(p.shape.num_layers):
        key = (grad_in, i in moes, windows[i])
        if key not in seen:
            seen[key] = _lora_layer_backward(p, *key)
        cost, grad_in = seen[key]
        layers += cost
    return layers, grad_in


def _lora_layer_backward(p: _LoRABackward, grad_in: bool, moe: bool,
                         window: int | None) -> tuple[int, bool]:
    """Backward FLOPs of one decoder layer whose input needs a gradient iff ``grad_in``,
    and whether the residual stream entering the next layer needs one."""
    cost = 0
    mods = {**p.shape.attention_modules(), **p.shape.mlp_modules(moe)}

    def module(name: str, input_grad: bool) -> bool:
        """Backward of one linear module; returns whether its output needs a gradient."""
        nonlocal cost
        cost += _lora_module_backward(p, name, mods[name], input_grad)
        return input_grad or name in p.ranks

    attn_out, attn_cost = _lora_attention_backward(p, module, grad_in, window)
    cost += attn_cost
    o = module("o_proj", attn_out)
    h1 = grad_in or o
    out = _moe_mlp_backward(p.shape, module, h1) if moe else _dense_mlp_backward(module, h1)
    return cost, out


def _lora_module_backward(p: _LoRABackward, name: str, dims: tuple[int, ...],
                          input_grad: bool) -> int:
    """Backward FLOPs of one linear module (``dims``: ``d_in``, ``d_out``[, uses per token])."""
    d_in, d_out = dims[0], dims[1]
    uses = dims[2] if len(dims) > 2 else 1
    n = p.num_tokens
    cost = 0
    if input_grad:
        cost += 2 * d_in * d_out * n * uses  # frozen W: input gradient only
    if name in p.folds:  # W' = W + s·A·B: its weight gradient, then A's and B's
        cost += 2 * d_in * d_out * n * uses
        cost += 2 * p.folds[name]
    elif name in p.ranks:  # per token (each of the `uses` routed experts)
        r = p.ranks[name]
        cost += 2 * r * d_out * n * 2 * uses  # B: weight grad + grad of A·x
        cost += 2 * r * d_in * n * uses  # A: weight grad
        if input_grad:
            cost += 2 * r * d_in * n * uses  # A: input grad
    return cost


def _lora_attention_backward(p: _LoRABackward, module: Callable[[str, bool], bool],
                             grad_in: bool, window: int | None) -> tuple[bool, int]:
    """Whether a layer's attention output needs a gradient, and its attention backward FLOPs."""
    shape = p.shape
    if shape.kv_lora_rank:  # MLA: q through its latent (or one q_proj), k and v through theirs
        q = module("q_b_proj", module("q_a_proj", grad_in)) if shape.q_lora_rank \
            else module("q_proj", grad_in)
        kv_a = module("kv_a_proj_with_mqa", grad_in)
        kv_b = module("kv_b_proj", kv_a)
        k, v = kv_a or kv_b, kv_b
    else:
        q, k, v = (module(m, grad_in) for m in ("q_proj", "k_proj", "v_proj"))
    attn_out = q or k or v
    qk, pv = _attention_products(shape, p.num_tokens, p.attention, window)
    if attn_out and p.fused_attention:
        # dQ, dK, dP, dV and the recomputed scores, one kernel
        return attn_out, _fused_attention_backward(shape, p.num_tokens, p.attention, window)
    if attn_out:  # each product's backward, per operand that needs a gradient
        return attn_out, qk * q + qk * k + pv * (q or k) + pv * v  # dQ, dK, dP, dV
    return attn_out, 0


def _dense_mlp_backward(module: Callable[[str, bool], bool], h1: bool) -> bool:
    """Whether the residual stream leaving a dense MLP (charged via ``module``) needs a gradient."""
    gate, up = module("gate_proj", h1), module("up_proj", h1)
    down = module("down_proj", gate or up)
    return h1 or down


def _moe_mlp_backward(shape: ModelShape, module: Callable[[str, bool], bool], h1: bool) -> bool:
    """Whether the residual stream leaving a MoE MLP (charged via ``module``) needs a gradient."""
    # the router, the routed experts and the shared expert's gate, frozen, pay input
    # gradients only, when the layer's input needs one (the routing weights pass the
    # gradient to the router's logits); adapted ones (EXPERT_MODULES) their adapters' too
    routed = module("router", h1)  # an adapted router passes gradients to its logits
    routed = module("experts.down_proj", module("experts.gate_up_proj", h1)) or routed
    out = h1 or routed
    if shape.shared_expert_intermediate_size:
        sg, su = module("shared.gate_proj", h1), module("shared.up_proj", h1)
        sd = module("shared.down_proj", sg or su)
        out = out or sd
        if shape.shared_expert_gate:
            module("shared_expert_gate", h1)
    return out


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
    expert_folds: int = 0,
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
            or the ``B`` of its adapter when ``down_proj`` carries one. (Measured with
            ``FlopCounterMode``: counting the whole layer overcounts by that matmul.)
        input_requires_grad: whether the embedding output needs a gradient; default: with
            gradient checkpointing under LoRA (transformers' ``gradient_checkpointing_enable``
            and TRL both call ``enable_input_require_grads``).
        head_recompute: the head's forward runs again in backward (TRL's chunked fused LM
            head recomputes each logits tile rather than storing it).
        fused_attention: attention backward as one fused kernel (SDPA, with the scores
            recomputed) or per product (eager); see :func:`backward_flops`.
        reentrant_checkpoint: the checkpoint is torch's reentrant one
            (``use_reentrant=True``), which recomputes each layer's whole forward.
        expert_folds: forward calls whose adapted expert weights peft folds (see
            :func:`forward_flops`); the checkpoint's recompute folds them again.

    Returns:
        ``{"forward", "backward", "recompute"}`` in FLOPs (and ``"total"``).
    """
    if input_requires_grad is None:
        input_requires_grad = gradient_checkpointing and lora is not None
    fwd = forward_flops(shape, num_tokens, num_logits=num_logits, attention=attention, lora=lora,
                        expert_folds=expert_folds)
    bwd = backward_flops(shape, num_tokens, num_logits=num_logits, attention=attention, lora=lora,
                         input_requires_grad=input_requires_grad,
                         fused_attention=fused_attention, expert_folds=expert_folds)["backward"]
    recompute = 0
    if gradient_checkpointing:  # the decoder layers' forward again; the head is not checkpointed
        recompute += forward_flops(shape, num_tokens, attention=attention, lora=lora,
                                   expert_folds=expert_folds)
        if not reentrant_checkpoint:  # early stop: each layer's last matmul is not rerun
            recompute -= _unsaved_last_matmul(shape, lora) * num_tokens
    if head_recompute:
        recompute += 2 * shape.head_matmul_params * num_logits
    return {"forward": fwd, "backward": bwd, "recompute": recompute, "total": fwd + bwd + recompute}


def _unsaved_last_matmul(shape: ModelShape, lora: LoRASpec | None) -> int:
    """FLOPs per token, over all layers, of each layer's last matmul when nothing saves its
    output (non-reentrant checkpointing then stops before it): a dense layer's ``down_proj``
    (or the ``B`` of its adapter), a MoE layer's ungated shared expert's ``down_proj``
    (DeepSeek: added to the routed output). A MoE layer without one ends in the routed
    experts, whose output the routing-weight product saves; a gated shared expert's output is
    saved by the gate's product: those layers rerun whole."""
    t = lora.ranks(shape) if lora else {}

    def last(name: str, d_in: int, d_out: int) -> int:
        return 2 * t[name] * d_out if name in t else 2 * d_in * d_out

    f, d = shape.intermediate_size, shape.hidden_size
    dense = last("down_proj", f, d)
    moe = 0
    if shape.shared_expert_intermediate_size and not shape.shared_expert_gate:
        moe = last("shared.down_proj", shape.shared_expert_intermediate_size, d)
    n_moe = shape.num_moe_layers
    return (shape.num_layers - n_moe) * dense + n_moe * moe


def generation_flops(
    shape: ModelShape,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    attention: Attention = "causal",
    lora: LoRASpec | None = None,
    expert_folds: bool = False,
) -> dict[str, int]:
    """FLOPs of sampling one completion with a KV cache.

    The prompt is prefilled in one forward with logits at its last position only; that
    position yields completion token 1. Each further token costs one decode step that feeds
    the previous token: step ``j`` (``j = 1 … T-1``) sees ``prompt + j`` keys. A completion of
    ``T`` tokens (EOS included) costs one prefill and ``T - 1`` decode steps.

    With ``expert_folds`` (transformers ``generate`` on a peft model), every forward call (the
    prefill and each decode step) folds the adapted expert weights once
    (:meth:`LoRASpec.fold_flops`), and they cost nothing per token; a batch shares each call's
    fold (count it once per batch, not per row).

    Returns:
        ``{"prefill", "decode", "total"}`` in FLOPs.
    """
    if completion_tokens < 0 or prompt_tokens < 1:
        raise ConfigError(f"prompt_tokens={prompt_tokens}, completion_tokens={completion_tokens}: "
                          "need prompt_tokens >= 1 and completion_tokens >= 0")
    if completion_tokens == 0:
        return {"prefill": 0, "decode": 0, "total": 0}
    folds = int(bool(expert_folds and lora and lora.fold_parts(shape)))
    prefill = forward_flops(shape, prompt_tokens, num_logits=1, attention=attention, lora=lora,
                            expert_folds=folds)
    steps = completion_tokens - 1
    # Σ_{j=1}^{T-1} keys(prompt + j): one query per step (windowed layers: at most w keys),
    # the closed form of attention_keys for `steps` queries after `prompt` cached keys
    per_token = (2 * shape.matmul_params_per_token
                 + (lora.adapter_flops_per_token(shape, folded=bool(folds)) if lora else 0)
                 + 2 * shape.head_matmul_params
                 + (lora.fold_flops(shape) * folds if lora else 0))
    decode = steps * per_token + attention_flops(shape, steps, prompt_tokens, "causal")
    return {"prefill": prefill, "decode": decode, "total": prefill + decode}


def reward_model_flops(
    shape: ModelShape,
    num_tokens: int,
    *,
    num_steps: int = 0,
    attention: Attention = "causal",
    last_position: bool = False,
) -> int:
    """FLOPs of one reward-model forward over prompt + completion (no decoding).

    A step-level PRM (Qwen2.5-Math-PRM style) reads one extra marker token per step
    (``num_steps``). ``score`` and ``prm`` heads run at every position (as HF's heads do)
    unless ``last_position`` (an outcome head that reads the last hidden state only); an
    ``lm`` head is treated as a verifier that reads the logits at the last position.
    """
    n = num_tokens + num_steps
    head_positions = 1 if shape.head == "lm" or last_position else n
    return forward_flops(shape, n, num_logits=head_positions, attention=attention)


__all__ = ["Attention", "attention_flops", "attention_keys", "backward_flops", "forward_flops", "generation_flops",
           "reward_model_flops", "training_flops"]
