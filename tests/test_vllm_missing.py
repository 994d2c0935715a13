"""``engine = trl-vllm`` where vLLM is not installed: one line naming what to install, exit 2,
before anything runs (the ``qwen`` objective's check). Skipped at collection where vLLM is
importable (tests/test_vllm_cpu.py then runs the engine for real)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# for the machine without vLLM (where vLLM is installed, tests/test_vllm_cpu.py runs engine=trl-vllm)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                reason="vLLM is installed here: tests/test_vllm_cpu.py runs engine=trl-vllm")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # an end-to-end run of several seconds (CI runs -m slow)
def test_trl_vllm_without_vllm_is_one_line_exit_2(qwen_world, tmp_path):
    prm = str(qwen_world["prm"])
    sets = {"model": str(qwen_world["policy"]), "reward_model_prm": prm, "reward_model_proxy_prm": prm,
            "judge_model": prm, "dataset": str(ROOT / "objectives/data/polaris_sample/train.jsonl"),
            "lengths_file": str(tmp_path / "lengths.json"), "engine": "trl-vllm"}
    args = ["trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                       timeout=120, cwd=ROOT)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "engine=trl-vllm: vLLM is not installed" in lines[0] and "cpu-vllm" in lines[0]
