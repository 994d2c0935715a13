"""A plan in the words of the engines that run it: TRL's ``GRPOConfig`` and verl's overrides.

One mapping each, used by allocopt's driver (:func:`allocopt.grpo.driver.run_grpo`), by
``allocopt ask`` (:mod:`allocopt.study.asktell`) and by RACE's proposals. One optimizer step
per pass over a rollout batch; the learning rate is per optimizer step::

    plan                 TRL GRPOConfig                          verl (Hydra overrides)
    rollouts N           generation_batch_size = N               data.train_batch_size = N / G
    group size G         num_generations                         actor_rollout_ref.rollout.n
    passes μ             num_iterations                          actor_rollout_ref.actor.ppo_epochs
    one step per pass    per_device_train_batch_size ×           actor_rollout_ref.actor.ppo_mini_batch_size
                         processes × gradient_accumulation_steps   = N / G (verl multiplies by n)
                         = N
    iterations I         max_steps = I × μ                       trainer.total_training_steps = I
    generated per        (not in TRL)                            data.gen_batch_size = K × N / G,
      trained K > 1                                              algorithm.filter_groups.{enable,
                                                                 metric, max_num_gen_batches=1}
    critic               (not in TRL's GRPO)                     algorithm.adv_estimator=gae,
                                                                 critic.{enable, model.path,
                                                                 ppo_epochs, ppo_mini_batch_size, ...}

Over-generation runs verl's DAPO trainer (``python -m recipe.dapo.main_dapo``; volcengine/verl
``recipe/dapo/run_dapo_qwen2.5_32b.sh`` sets the same keys; later trees move it to
``recipe.dapo.src.main_dapo``, and verl 0.9's ``trainer.use_v1`` replay buffer reads
``algorithm.filter_groups`` too but refills one group at a time with no bound, which no
budget can price ahead): it generates ``gen_batch_size``
prompts × ``n``, keeps the groups whose ``filter_groups.metric`` varies, and trains the first
``train_batch_size`` of them (``recipe/dapo/dapo_ray_trainer.py``). The plan priced one
generation batch per step, so ``max_num_gen_batches=1``: a step never generates more, and a
batch with too few kept groups stops verl with its own error (raise ``generated_per_trained``)
rather than spending past the budget. The critic's keys are those of verl's ``critic`` config
group (``verl/trainer/config/critic/critic.yaml``, verl 0.9.1); the critic is fully fine-tuned,
``μ`` passes with one optimizer step each, as the plan priced it.

Standard library only.
"""

from __future__ import annotations

from typing import Any

from allocopt.flops import ConfigError

__all__ = ["DAPO_ENTRYPOINT", "PPO_ENTRYPOINT", "trl_grpo_config", "verl_entrypoint", "verl_overrides"]

PPO_ENTRYPOINT = "verl.trainer.main_ppo"
"""verl's PPO/GRPO trainer module (``python -m``)."""
DAPO_ENTRYPOINT = "recipe.dapo.main_dapo"
"""verl's DAPO recipe trainer module (dynamic sampling: ``algorithm.filter_groups``)."""
FILTER_METRIC = "acc"
"""``algorithm.filter_groups.metric``: the per-row value whose spread within a group keeps
it (DAPO's recipe: ``acc``, the rule-based reward's accuracy)."""


def trl_grpo_config(plan: Any, *, passes: int | None = None, iterations: int | None = None,
                    micro_batch: int = 1, num_processes: int = 1,
                    learning_rate: float | None = None, max_completion_length: int | None = None,
                    temperature: float = 1.0, beta: float = 0.0, seed: int = 0,
                    importance_sampling_correction: bool = False,
                    gradient_checkpointing: bool = False) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that realize ``plan``
    (:class:`~allocopt.plan.allocation.TrialPlan`; see the module table).

    Args:
        plan: the plan (its ``rollouts_per_iteration`` N, ``group_size``,
            ``num_iterations_trl`` and ``iterations``).
        passes: passes μ over each rollout batch (default: the plan's ``num_iterations_trl``).
        iterations: iterations I (default: the plan's).
        micro_batch: most rows per device and forward; ``per_device_train_batch_size`` is the
            largest divisor of ``N / num_processes`` at most this, and
            ``gradient_accumulation_steps`` makes one optimizer step per pass.
        num_processes: training processes.
        learning_rate: per optimizer step; ``None``: the batch and step fields only (no
            set-up fields, no ``save_strategy``/``logging_steps``).
        max_completion_length, temperature, beta, seed: the set-up's.
        importance_sampling_correction, gradient_checkpointing: as the plan priced them
            (``vllm_importance_sampling_correction``, ``gradient_checkpointing``).

    Raises:
        ConfigError: ``N`` is not a multiple of ``num_processes``.
    """
    N = plan.rollouts_per_iteration
    mu = plan.num_iterations_trl if passes is None else passes
    its = plan.iterations if iterations is None else iterations
    if num_processes < 1 or N % num_processes:
        raise ConfigError(f"num_processes={num_processes!r}: must divide the {N} rollouts per iteration")
    per_proc = N // num_processes
    b = max(d for d in range(1, min(micro_batch, per_proc) + 1) if per_proc % d == 0)
    out: dict[str, Any] = {
        "num_generations": plan.group_size, "generation_batch_size": N,
        "per_device_train_batch_size": b, "gradient_accumulation_steps": per_proc // b,
        "num_iterations": mu, "max_steps": its * mu}
    if learning_rate is None:
        return out
    return {**out, "learning_rate": learning_rate, "max_completion_length": max_completion_length,
            "temperature": temperature, "beta": beta, "seed": seed,
            "vllm_importance_sampling_correction": bool(importance_sampling_correction),
            "gradient_checkpointing": bool(gradient_checkpointing),
            "save_strategy": "no", "logging_steps": 1}


def verl_overrides(plan: Any, *, passes: int, iterations: int, learning_rate: float,
                   max_completion_length: int, temperature: float = 1.0, beta: float = 0.0,
                   gradient_checkpointing: bool = False,
                   critic_learning_rate: float = 1e-5, micro_batch: int = 1,
                   num_gpus: int = 1) -> list[str]:
    """Hydra overrides for verl that realize ``plan`` with ``passes`` passes and ``iterations``
    iterations (see the module table): ``main_ppo`` with ``algorithm.adv_estimator=grpo``; with
    the plan's set-up over-generating (``generated_per_trained`` > 1) the DAPO trainer's
    ``data.gen_batch_size`` and ``algorithm.filter_groups.*`` (run with
    :func:`verl_entrypoint`); with a critic, ``algorithm.adv_estimator=gae`` and the
    ``critic.*`` keys (``critic_learning_rate``: its per-step rate, verl's default 1e-5). A
    model-based reward names its reward model; a rule-based one expects the user's
    ``custom_reward_function``.

    The micro-batches (rows per GPU and forward call of the actor's update, old-policy and
    reference log-prob passes: ``*.ppo_micro_batch_size_per_gpu``,
    ``*.log_prob_micro_batch_size_per_gpu``, which verl requires without ``use_dynamic_bsz``)
    are the largest divisor of the rollouts per GPU (``N / num_gpus``) at most
    ``micro_batch`` (verl asserts the division), with ``use_dynamic_bsz=False``: the plan's
    price folds LoRA on experts once per call of ``micro_batch`` rows (default 1).

    Raises:
        ConfigError: ``N`` is not a multiple of ``num_gpus``, or ``micro_batch`` < 1."""
    p = plan
    N = p.prompts_per_iteration * p.group_size
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1 or N % num_gpus:
        raise ConfigError(f"num_gpus={num_gpus!r}: must divide the {N} rollouts per iteration")
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ConfigError(f"micro_batch={micro_batch!r}: must be a positive integer")
    per_gpu = N // num_gpus
    b = max(d for d in range(1, min(micro_batch, per_gpu) + 1) if per_gpu % d == 0)
    setup = getattr(p, "setup", None)
    critic = getattr(setup, "critic", "") if setup is not None else ""
    ratio = getattr(setup, "generated_per_trained", 1.0) if setup is not None else 1.0
    out = [f"algorithm.adv_estimator={'gae' if critic else 'grpo'}",
           f"data.train_batch_size={p.prompts_per_iteration}",
           f"actor_rollout_ref.rollout.n={p.group_size}",
           f"actor_rollout_ref.actor.ppo_epochs={passes}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={p.prompts_per_iteration}",
           f"actor_rollout_ref.actor.optim.lr={learning_rate!r}",
           f"actor_rollout_ref.rollout.temperature={temperature!r}",
           f"data.max_response_length={max_completion_length}",
           f"actor_rollout_ref.actor.use_kl_loss={'True' if beta > 0 else 'False'}",
           f"actor_rollout_ref.actor.kl_loss_coef={beta!r}",
           "algorithm.use_kl_in_reward=False",
           f"actor_rollout_ref.model.enable_gradient_checkpointing={bool(gradient_checkpointing)}",
           f"actor_rollout_ref.model.path={p.policy}",
           f"trainer.total_training_steps={iterations}",
           "actor_rollout_ref.actor.use_dynamic_bsz=False",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={b}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={b}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={b}"]
    if p.reward_model:
        out += ["reward_model.enable=True", f"reward_model.model.path={p.reward_model}"]
    else:
        out += ["reward_model.enable=False"]
    if ratio > 1:  # the same rounding as the plan's price (plan.recipe.generated_prompts)
        gen = max(p.prompts_per_iteration, round(p.prompts_per_iteration * ratio))
        out += [f"data.gen_batch_size={gen}", "algorithm.filter_groups.enable=True",
                f"algorithm.filter_groups.metric={FILTER_METRIC}",
                "algorithm.filter_groups.max_num_gen_batches=1"]
    if critic:
        out += ["critic.enable=True", f"critic.model.path={critic}",
                f"critic.ppo_epochs={passes}",
                f"critic.ppo_mini_batch_size={p.prompts_per_iteration}",
                f"critic.ppo_micro_batch_size_per_gpu={b}",
                f"critic.forward_micro_batch_size_per_gpu={b}",
                f"critic.optim.lr={critic_learning_rate!r}",
                f"critic.model.enable_gradient_checkpointing={bool(gradient_checkpointing)}"]
    return out


def verl_entrypoint(overrides: list[str]) -> str:
    """The module to run ``overrides`` with: :data:`DAPO_ENTRYPOINT` when they filter groups
    (verl's ``main_ppo`` has no ``gen_batch_size`` loop), else :data:`PPO_ENTRYPOINT`."""
    dapo = "algorithm.filter_groups.enable=True" in overrides
    return DAPO_ENTRYPOINT if dapo else PPO_ENTRYPOINT
