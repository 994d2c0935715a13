"""A plan in the words of the engines that run it: TRL's ``GRPOConfig`` and verl's overrides.

One mapping each, used by allocopt's driver (:func:`objectives.grpo.driver.run_grpo`), by
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

Standard library only.
"""

from __future__ import annotations

from typing import Any

from allocopt.flops import ConfigError

__all__ = ["trl_grpo_config", "verl_overrides"]


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
                   gradient_checkpointing: bool = False) -> list[str]:
    """Hydra overrides for verl's ``main_ppo`` with ``algorithm.adv_estimator=grpo`` that realize
    ``plan`` with ``passes`` passes and ``iterations`` iterations (see the module table). A
    model-based reward names its reward model; a rule-based one expects the user's
    ``custom_reward_function``."""
    p = plan
    out = ["algorithm.adv_estimator=grpo",
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
           f"trainer.total_training_steps={iterations}"]
    if p.reward_model:
        out += ["reward_model.enable=True", f"reward_model.model.path={p.reward_model}"]
    else:
        out += ["reward_model.enable=False"]
    return out
