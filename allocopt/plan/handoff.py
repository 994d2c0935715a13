"""A plan handed to a training engine outside allocopt: realized with whole update passes and
written as TRL ``GRPOConfig`` fields or verl overrides, in the trial folder the run reads.

``allocopt ask`` (:mod:`allocopt.study.asktell`) and the ``command`` objective hand runs over
this way. Neither TRL nor verl can train part of a batch, so a plan's ρ is realized in steps of
one pass (:func:`whole_pass_run`: the whole-pass count nearest the plan's ρ, and the iterations
that count buys within the budget); the run's ``expected_rho`` can differ from the asked ρ
(allocopt's own driver realizes fractional passes).

Mappings (one optimizer step per pass over a rollout batch, as the allocopt driver runs it;
the learning rate is per optimizer step and is not scaled by the passes):

===================  ===========================================  =================================================
plan                 TRL ``GRPOConfig``                            verl (Hydra overrides)
===================  ===========================================  =================================================
rollouts N           ``generation_batch_size = N``                 ``data.train_batch_size = N / G`` (prompts)
group size G         ``num_generations``                           ``actor_rollout_ref.rollout.n``
passes μ             ``num_iterations``                            ``actor_rollout_ref.actor.ppo_epochs``
one step per pass    ``per_device_train_batch_size × processes ×   ``actor_rollout_ref.actor.ppo_mini_batch_size =
                     gradient_accumulation_steps = N``             N / G`` (prompts; verl multiplies by n)
iterations I         ``max_steps = I × μ`` (optimizer steps)       ``trainer.total_training_steps = I``
===================  ===========================================  =================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from allocopt.flops import FlopAccount
from allocopt.plan.allocation import InfeasiblePlan, TrialPlan, Workload, iteration_flops, plan_workload
from allocopt.plan.engines import trl_grpo_config, verl_entrypoint, verl_overrides as _verl_overrides

FORMATS = ("trl", "verl")
"""The engines a run is handed to."""


@dataclass(frozen=True)
class AskedRun:
    """One reserved trial and the run that realizes it with whole update passes."""

    trial_number: int
    budget_flops: float
    fidelity: str
    """``full`` or ``pilot``."""
    plan: TrialPlan
    """allocopt's own plan (may have fractional passes μ)."""
    passes: int
    """Whole update passes over each rollout batch (TRL ``num_iterations``, verl ``ppo_epochs``)."""
    iterations: int
    """Rollout batches (GRPO iterations) the budget buys at ``passes``."""
    expected: FlopAccount
    """Expected FLOPs of the run at ``passes`` × ``iterations`` (mean lengths of the workload)."""

    @property
    def expected_rho(self) -> float:
        return self.expected.executed.rho

    def to_dict(self) -> dict[str, Any]:
        a = self.plan.allocation
        return {"trial": self.trial_number, "budget_flops": self.budget_flops,
                "fidelity": self.fidelity, "rho": a.rho, "group_size": a.group_size,
                "reward": a.reward, "model": self.plan.policy, "reward_model": self.plan.reward_model,
                "prompts_per_iteration": self.plan.prompts_per_iteration,
                "rollouts_per_iteration": self.plan.rollouts_per_iteration,
                "update_passes": self.passes, "iterations": self.iterations,
                "expected_rho": self.expected_rho,
                "expected_total_flops": self.expected.executed.total_flops,
                "plan_update_passes": self.plan.update_passes, "plan_iterations": self.plan.iterations}


def whole_pass_run(plan: TrialPlan, workload: Workload, trial_number: int = -1,
                   fidelity: str = "full") -> AskedRun:
    """The plan realized with whole passes: μ in {floor, ceil} of the plan's, whichever's ρ is
    nearer the asked one, and the most iterations whose expected FLOPs fit the budget.

    Raises:
        InfeasiblePlan: not one iteration fits.
    """
    a, N = plan.allocation, plan.rollouts_per_iteration
    workload = plan_workload(workload, plan)  # the plan's batch (it may be smaller than the workload's)
    best = None
    for passes in sorted({max(1, math.floor(plan.update_passes)), max(1, math.ceil(plan.update_passes))}):
        per = iteration_flops(workload, a, passes * N)
        iters = int(plan.budget_flops // max(1, per.executed.total_flops))
        if iters < 1:
            continue
        cand = (abs(per.executed.rho - a.rho), passes, iters, per * iters)
        best = cand if best is None or cand < best else best
    if best is None:
        need = iteration_flops(workload, a, max(1, round(plan.update_passes)) * N).executed.total_flops
        raise InfeasiblePlan(f"budget_flops={plan.budget_flops:.3g}: no whole-pass run fits one "
                             f"iteration (needs {need:.3g})", min_budget_flops=need)
    _, passes, iters, expected = best
    return AskedRun(trial_number, plan.budget_flops, fidelity, plan, passes, iters, expected)


def trl_config(run: AskedRun, *, learning_rate: float, max_completion_length: int,
               temperature: float = 1.0, beta: float = 0.0, micro_batch: int = 8,
               num_processes: int = 1, seed: int = 0,
               importance_sampling_correction: bool = False,
               gradient_checkpointing: bool = False) -> dict[str, Any]:
    """``GRPOConfig`` fields that realize ``run`` (see the module table).

    ``vllm_importance_sampling_correction`` and ``gradient_checkpointing`` are written as the
    plan priced them (the study's set-up; allocopt's runner: both off, where TRL's own
    defaults are on, :data:`allocopt.plan.setup.RUNNERS`).

    ``per_device_train_batch_size`` is the largest divisor of ``N / num_processes`` that is at
    most ``micro_batch``; ``gradient_accumulation_steps`` makes one optimizer step per pass.

    Raises:
        ConfigError: ``N`` is not a multiple of ``num_processes``.
    """
    return trl_grpo_config(run.plan, passes=run.passes, iterations=run.iterations,
                           micro_batch=micro_batch, num_processes=num_processes,
                           learning_rate=learning_rate, max_completion_length=max_completion_length,
                           temperature=temperature, beta=beta, seed=seed,
                           importance_sampling_correction=importance_sampling_correction,
                           gradient_checkpointing=gradient_checkpointing)


def trl_command(cfg: Mapping[str, Any], config_path: str) -> str:
    """A ``trl grpo`` command line reading the fields from ``config_path`` (model, data and
    reward functions are the user's: placeholders in capitals)."""
    return (f"trl grpo --config {config_path} --model_name_or_path POLICY --dataset_name DATASET "
            "--reward_funcs REWARD --output_dir OUT")


def verl_overrides(run: AskedRun, *, learning_rate: float, max_completion_length: int,
                   temperature: float = 1.0, beta: float = 0.0,
                   gradient_checkpointing: bool = False) -> list[str]:
    """Hydra overrides for verl's ``main_ppo`` with ``algorithm.adv_estimator=grpo`` that realize
    ``run`` (see the module table). A model-based reward names its reward model; a rule-based
    one expects the user's ``custom_reward_function``."""
    return _verl_overrides(run.plan, passes=run.passes, iterations=run.iterations,
                           learning_rate=learning_rate, max_completion_length=max_completion_length,
                           temperature=temperature, beta=beta,
                           gradient_checkpointing=gradient_checkpointing)


def write_asked_folder(run: AskedRun, folder: Any, *, study: str, storage: str, fmt: str, setup: Any,
                       learning_rate: float, seed: int = 0, targets: Mapping[str, str] | None = None,
                       micro_batch: int = 8, num_processes: int = 1, tell: bool = True) -> dict[str, Any]:
    """Write one trial's folder as ``allocopt ask`` does: ``ask.json`` (study, trial, budget,
    fidelity, allocation with its reward system, the study's targets, the whole-pass run, the
    config, a command line and, with ``tell``, the ``allocopt tell`` line to run afterwards) and
    ``grpo_config.json`` (TRL ``GRPOConfig`` fields, :func:`trl_config`) or
    ``verl_overrides.txt`` (one Hydra override a line, :func:`verl_overrides`).

    Args:
        run: the reserved run (:func:`whole_pass_run`).
        folder: the trial's folder (``pathlib.Path``; made if missing).
        fmt: ``trl`` or ``verl``.
        setup: the workload's :class:`~allocopt.plan.setup.TrainingSetup` (lengths, temperature,
            β, gradient checkpointing and the importance-sampling correction as priced).
        learning_rate: per optimizer step.
        seed: the study's seed; the run's is ``seed + trial number``.
        targets: the study's targets as declared, name -> ``maximize`` / ``minimize``: the
            names the run's metrics file reports under (``ask.json``'s ``targets``).

    Returns:
        what ``ask.json`` holds, plus ``folder``.
    """
    import json
    from pathlib import Path

    from allocopt.redact import without_password

    folder = Path(folder)
    bare, variable = without_password(storage)
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"study": study, "storage": bare, **run.to_dict(),
                            "targets": dict(targets or {}), "format": fmt, "learning_rate": learning_rate}
    if variable:  # the password is never written: the database client reads it from there
        info["credentials"] = f"set {variable} (the storage's password) before running `tell`"
    if tell:
        info["tell"] = (f"allocopt tell --study {study} --storage '{bare}' --trial "
                        f"{run.trial_number} --metrics metrics.json"
                        + (" --from-trl OUT" if fmt == "trl" else " --from-verl LOG"))
    info.update(_write_config(run, folder, fmt, setup, learning_rate=learning_rate, seed=seed + run.trial_number,
                              micro_batch=micro_batch, num_processes=num_processes))
    (folder / "ask.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return {**info, "folder": str(folder)}


def _write_config(run: AskedRun, folder: Any, fmt: str, setup: Any, *, learning_rate: float, seed: int,
                  micro_batch: int, num_processes: int) -> dict[str, Any]:
    """Write the engine's own config into ``folder``: TRL's ``grpo_config.json`` or verl's
    ``verl_overrides.txt``. Returns what ``ask.json`` tells of it (``config`` or ``overrides``,
    and the ``command`` line)."""
    import json

    run_kw = dict(max_completion_length=setup.max_completion_length, temperature=setup.temperature,
                  beta=setup.beta, gradient_checkpointing=setup.gradient_checkpointing)
    if fmt == "trl":
        cfg = trl_config(run, learning_rate=learning_rate, **run_kw, micro_batch=micro_batch,
                         num_processes=num_processes, seed=seed,
                         importance_sampling_correction=setup.importance_sampling_correction)
        (folder / "grpo_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        return {"config": cfg, "command": trl_command(cfg, str(folder / "grpo_config.json"))}
    ov = verl_overrides(run, learning_rate=learning_rate, **run_kw)
    (folder / "verl_overrides.txt").write_text("\n".join(ov) + "\n")
    return {"overrides": ov, "command": f"python -m {verl_entrypoint(ov)} " + " ".join(ov)}


__all__ = ["AskedRun", "FORMATS", "trl_command", "trl_config", "verl_overrides", "whole_pass_run",
           "write_asked_folder"]
