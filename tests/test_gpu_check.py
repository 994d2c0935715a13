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
