"""Exact FLOP accounting for decoder-only transformers: the Qwen2/Llama family, and
mixture-of-experts (Qwen2/3-MoE, Mixtral, DeepSeek-V2/V3 with multi-head latent attention).

Standard library only: the accounting can be used anywhere, with no torch installed.

Conventions (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", §2.1 for the 2·N FLOPs per token of a forward matmul):

* one multiply-add is 2 FLOPs; only matrix products are counted (norms, activations,
  softmax, rotary embeddings and bias additions are elementwise and counted as 0, as
  ``torch.utils.flop_counter.FlopCounterMode`` does);
* the input embedding is a lookup: 0 FLOPs, tied or not;
* a linear map ``d_in -> d_out`` costs ``2·d_in·d_out`` FLOPs per token;
* attention of one query over ``k`` keys costs ``4·h·d_h·k`` per layer (``2·h·d_h·k`` for the
  scores ``QKᵀ`` and as much for the weighted sum ``PV``), with ``h`` the *query* heads;
* backward of a matrix product costs one forward for each operand that needs a gradient
  (input gradient, weight gradient); a frozen weight costs only its input gradient;
* a mixture-of-experts layer costs its router (``d x E``), the ``k`` experts each token is
  routed to and its shared expert, per token (Fedus et al. 2022, "Switch Transformers", §2.1);
  MLA attention (DeepSeek-V2, §2.1) its latent projections, with ``2·h·d_qk + 2·h·d_v`` per
  (query, key); a sliding-window layer at most ``w`` keys per query, layer by layer;
* GAE and the other advantage estimates are elementwise: 0 FLOPs.

Every function returns an exact integer count of FLOPs.  Which tokens are counted is the
caller's choice: *useful* FLOPs use the real token counts, *executed* FLOPs the padded shapes
an engine really computes (see :class:`Engine` and :mod:`allocopt.flops.grpo`).

The package's modules, one job each: :mod:`allocopt.flops.shapes` (model shapes, presets,
LoRA), :mod:`allocopt.flops.formulas` (FLOPs of each pass), :mod:`allocopt.flops.account`
(breakdowns by phase, useful vs executed). Their public names are re-exported here:
``from allocopt.flops import ModelShape, forward_flops, FlopAccount`` is the import to use.
"""

from allocopt.flops.account import PHASES, ComputeBreakdown, FlopAccount
from allocopt.flops.formulas import (Attention, attention_flops, attention_keys, backward_flops, forward_flops,
                                     generation_flops, reward_model_flops, training_flops)
from allocopt.flops.shapes import (MODULES, ConfigError, HeadKind, LoRASpec,
                                   ModelShape, preset_names)

__all__ = [
    "Attention", "ComputeBreakdown", "ConfigError", "FlopAccount", "HeadKind",
    "LoRASpec", "MODULES", "ModelShape", "PHASES", "attention_flops", "attention_keys", "backward_flops", "forward_flops", "generation_flops",
    "preset_names", "reward_model_flops", "training_flops",
]

