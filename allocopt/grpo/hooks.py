"""The GRPO driver's hooks around TRL's loop: two-stage budget admission, the charge of each
iteration, the row schedule of fractional update passes, the trainer's log per iteration.

:class:`_Hooks` holds the state the trainer subclass (:func:`allocopt.grpo.driver._trainer_class`)
calls into; see :mod:`allocopt.grpo.driver` for the whole picture. TRL and transformers are imported
inside functions only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from allocopt.plan.allocation import TrialPlan, min_last_rows, rows_schedule
from allocopt.flops import ComputeBreakdown, FlopAccount, ModelShape
from allocopt.flops.grpo import GRPOStep, grpo_step_flops, old_logprobs_pass
from allocopt.plan.meter import BudgetExhausted, FlopMeter, IterationRecord
from allocopt.plan.setup import TrainingSetup


TRAIN_LOG_KEYS = ("loss", "kl", "entropy", "completions/mean_length", "completions/clipped_ratio",
                  "reward", "reward_std", "frac_reward_zero_std", "clip_ratio/region_mean",
                  "clip_ratio/low_mean", "clip_ratio/high_mean", "grad_norm")
"""Keys of the trainer's ``log`` records kept per iteration (TRL 1.16 names: the Trainer's
``loss`` and ``grad_norm``, GRPOTrainer's ``_metrics`` averaged by ``GRPOTrainer.log``)."""


def _train_log_callback(hooks: "_Hooks") -> Any:
    """A ``transformers.TrainerCallback`` whose ``on_log`` (public Trainer API) passes each log
    record to :meth:`_Hooks.on_train_log`."""
    from transformers import TrainerCallback

    class _TrainLog(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            hooks.on_train_log(logs or {})

    return _TrainLog()


@dataclass
class _Hooks:
    """State shared between the trainer hooks and the driver."""

    plan: TrialPlan
    meter: FlopMeter
    policy: ModelShape
    setup: TrainingSetup
    """The set-up the driver runs and the plan priced (LoRA, engine, limit, β, …)."""
    reward: Any
    tokenizer: Any
    progress: Callable[[IterationRecord, FlopMeter], None] | None = None
    on_batch: Callable[[list[int], list[int]], None] | None = None
    """Called with each rollout batch's prompt and completion token counts."""
    engine: Any = None
    """The :class:`~allocopt.flops.grpo.Engine` whose executed FLOPs are charged."""
    iteration: int = -1
    inputs: list = field(default_factory=list)
    """The dataset rows of the iteration in progress (the reward's extra columns)."""
    awaiting_rollouts: bool = False
    """Between :meth:`before_iteration` and :meth:`after_rollouts` (its second admission)."""
    reward_floor: int | None = None
    """Least executed reward FLOPs of the run's batches so far (``None`` before the first)."""
    micro: int = 0
    rows: int = 0
    t_iter: float = 0.0
    train_log_counts: dict = field(default_factory=dict)
    """(iteration, key) -> number of log records averaged into ``records[iteration].train``."""

    @property
    def N(self) -> int:
        return self.plan.rollouts_per_iteration

    def needs_old_logprobs(self) -> bool:
        """Whether the old-policy pass must run: a second pass over the batch, or TRL's vLLM
        importance-sampling correction (which reads it on every iteration)."""
        return self._old_logprobs(self.rows)

    def _old_logprobs(self, rows: int) -> bool:
        # as the engine decides (allocopt.flops.grpo.old_logprobs_pass): a reused batch, or on
        # every iteration with TRL + vLLM and its importance-sampling correction
        return old_logprobs_pass(self.engine or self.setup.engine, rows / self.N,
                                 importance_sampling_correction=self.setup.importance_sampling_correction)

    def _step(self, prompt_tokens: Sequence[int], completion_tokens: Sequence[int], rows: int) -> FlopAccount:
        step = GRPOStep(prompt_tokens=tuple(prompt_tokens), completion_tokens=tuple(completion_tokens),
                        group_size=self.plan.group_size, update_passes=rows / self.N,
                        reference=self.setup.reference, old_logprobs=self._old_logprobs(rows))
        return grpo_step_flops(self.policy, step, lora=self.setup.lora,
                               engine_name=self.engine or self.setup.engine,
                               gradient_checkpointing=self.setup.gradient_checkpointing)

    def before_iteration(self, trainer: Any, inputs: list[dict]) -> None:
        self.iteration += 1
        self.micro = 0
        self.t_iter = time.perf_counter()
        if self.iteration >= self.setup.max_iterations:
            self.meter.stopped_reason = f"max_iterations={self.setup.max_iterations}"
            raise BudgetExhausted(self.meter.stopped_reason)
        self.rows = rows_schedule(self.plan.rows_trained_per_iteration, self.iteration)
        G = self.plan.group_size
        prompts = [x["prompt"] for x in inputs][::G]
        p_tok = [len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        C = self.setup.max_completion_length
        # after the first iteration, stage 2 may cut the rows to what fits (the run's last
        # iteration), so stage 1 bounds the fewest rows it may train
        worst = self._step(p_tok, [C] * len(inputs), self._fewest_rows()).executed.total_flops
        if not hasattr(self.reward, "usage_of") and hasattr(self.reward, "worst_case_flops"):
            worst += self.reward.worst_case_flops(max(p_tok), C, len(inputs))
        elif self.reward_floor:
            # not a bound (stage 2 is): the cheapest reward seen, so that stage 2 rarely refuses
            # a batch already generated (its generation would be spent on nothing)
            worst += self.reward_floor
        self.meter.admit(worst)
        self.inputs, self.awaiting_rollouts = inputs, True

    def _fewest_rows(self) -> int:
        """Fewest rows the iteration in progress may train: its schedule's in the first
        iteration, else :func:`allocopt.plan.allocation.min_last_rows` of them (a cut last one)."""
        return self.rows if self.iteration == 0 else min_last_rows(self.rows)

    def after_rollouts(self, prompts: list, prompt_ids: Sequence[Sequence[int]],
                       completion_ids: Sequence[Sequence[int]], completions: list) -> None:
        """Second admission of the iteration, once its completions exist: its exact cost
        (search and learning from the token counts, as :meth:`after_generation` charges them,
        plus the reward's ``usage_of`` the texts when it has one). When that does not fit,
        an iteration after the first trains the most rows that do, down to
        :func:`~allocopt.plan.allocation.min_last_rows` of its schedule (the plan's last-iteration
        rule, :meth:`FlopMeter.largest_fitting`). Refused even then: the generation is charged
        and :class:`BudgetExhausted` stops the run before the reward model runs."""
        if not self.awaiting_rollouts:  # a generation outside the training loop
            return
        self.awaiting_rollouts = False
        G = self.plan.group_size
        p_tok = [len(ids) for ids in prompt_ids][::G]
        c_tok = [max(1, len(ids)) for ids in completion_ids]
        acct = self._step(p_tok, c_tok, self.rows)
        reward = 0
        if hasattr(self.reward, "usage_of"):
            skip = ("prompt", "completion", "completion_ids")  # as TRL passes the columns
            columns = {k: [row[k] for row in self.inputs] for k in self.inputs[0] if k not in skip}
            reward = self.reward.usage_of(prompts, completions, **columns).executed_flops
        elif hasattr(self.reward, "worst_case_flops"):
            reward = self.reward.worst_case_flops(max(p_tok), self.setup.max_completion_length,
                                                  len(c_tok))
        exact = acct.executed.total_flops + reward
        if exact > self.meter.remaining_flops and self._fewest_rows() < self.rows:
            rows = self.meter.largest_fitting(
                lambda r: self._step(p_tok, c_tok, r).executed.total_flops + reward,
                self._fewest_rows(), self.rows)
            if rows is not None:  # the run's last iteration, cut to fit
                self.rows = rows
                acct = self._step(p_tok, c_tok, rows)
                exact = acct.executed.total_flops + reward
        search = FlopAccount(ComputeBreakdown(search=dict(acct.useful.search)),
                             ComputeBreakdown(search=dict(acct.executed.search)))
        self.meter.admit_exact(exact, done=search)

    def after_generation(self, trainer: Any, out: dict, seconds: float) -> None:
        G = self.plan.group_size
        p_tok = out["prompt_mask"].sum(1).tolist()[::G]
        c_tok = [max(1, int(c)) for c in out["completion_mask"].sum(1).tolist()]
        acct = self._step(p_tok, c_tok, self.rows)
        if self.on_batch:
            self.on_batch(p_tok, c_tok)
        usage = self.reward.consume_usage() if hasattr(self.reward, "consume_usage") else None
        if usage is not None:
            floor = self.reward_floor
            self.reward_floor = usage.executed_flops if floor is None else min(floor, usage.executed_flops)
        if usage is not None and (usage.useful_flops or usage.executed_flops):
            acct = acct + usage.account()
        if usage is not None:
            self.meter.add_wall("reward", usage.wall_seconds)
        self.meter.add_wall("search+reward", seconds)
        metrics = getattr(trainer, "_metrics", {}).get("train", {})
        reward_mean = float(metrics["reward"][-1]) if metrics.get("reward") else math.nan
        rec = self.meter.charge(acct, rows_trained=self.rows, reward_mean=reward_mean,
                                wall_seconds=time.perf_counter() - self.t_iter)
        if self.progress:
            self.progress(rec, self.meter)

    def on_train_log(self, logs: dict) -> None:
        """Average the trainer's logged :data:`TRAIN_LOG_KEYS` into the current iteration's
        record (one log per optimizer step; an iteration has ``update_passes`` of them)."""
        if not self.meter.records:
            return
        rec = self.meter.records[-1]
        for key in TRAIN_LOG_KEYS:
            v = logs.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                k = self.train_log_counts.setdefault((rec.iteration, key), 0)
                rec.train[key] = (rec.train.get(key, 0.0) * k + float(v)) / (k + 1)
                self.train_log_counts[(rec.iteration, key)] = k + 1

    def next_micro_batch(self) -> float:
        """Loss scale of the next micro-batch (one row each): 0 beyond the schedule, else
        N / rows trained in this pass, so a partly trained pass is a mean over its rows."""
        idx = self.micro
        self.micro += 1
        if idx >= self.rows:
            return 0.0
        p = idx // self.N
        in_pass = min(self.N, self.rows - p * self.N)
        return self.N / in_pass
