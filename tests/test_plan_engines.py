"""One mapping from a plan to TRL's GRPOConfig (allocopt.plan.engines), used by the driver,
``allocopt ask`` and RACE's proposals; the pure modules load the standard library only."""

from __future__ import annotations

import subprocess
import sys

from allocopt.flops import ModelShape
from allocopt.plan.allocation import Allocation, Workload, make_plan
from allocopt.plan.engines import trl_grpo_config

POLICY = ModelShape.preset("Qwen/Qwen2.5-1.5B")


def test_one_optimizer_step_per_pass_over_the_rollout_batch():
    plan = make_plan(1e18, Allocation(0.5, 4, "sparse"), Workload(POLICY))
    N, mu = plan.rollouts_per_iteration, plan.num_iterations_trl
    for micro, procs in ((1, 1), (8, 1), (8, 2)):
        cfg = trl_grpo_config(plan, micro_batch=micro, num_processes=procs)
        assert cfg["per_device_train_batch_size"] * procs * cfg["gradient_accumulation_steps"] == N
        assert cfg["per_device_train_batch_size"] <= micro
        assert (cfg["num_generations"], cfg["generation_batch_size"], cfg["num_iterations"],
                cfg["max_steps"]) == (4, N, mu, plan.iterations * mu)
        assert "learning_rate" not in cfg  # batch and steps only, without a set-up
    full = trl_grpo_config(plan, learning_rate=1e-5, max_completion_length=512,
                           gradient_checkpointing=True)
    assert full["gradient_checkpointing"] is True and full["learning_rate"] == 1e-5


def test_pure_modules_load_the_standard_library_only():
    code = ("import sys, allocopt.errors, allocopt.flops, allocopt.plan.engines, allocopt.plan.hub; "
            "print(sorted(m for m in ('torch', 'optuna', 'trl', 'mlflow', 'transformers', "
            "'huggingface_hub', 'typer', 'objectives') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
