"""What the accounting cannot count is refused in one line with exit code 2 (the command run in
this process through conftest's ``cli``; the hub look-ups in a fresh process, whose hub
settings come from its environment): vision-language and encoder-decoder configs, sequences
beyond the context, an unreachable hub id (fast), a quoted TOML boolean, broken run logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from allocopt.flops import ModelShape

BASE = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": 97, "model_type": "qwen2", "max_position_embeddings": 4096}


@pytest.fixture
def run(cli):
    """The command in this process (conftest's ``cli``)."""
    return cli


def run_process(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def one_line(r, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


CONFIGS = {
    "qwen2-vl": ({**BASE, "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
                  "vision_config": {"depth": 32}}, "vision-language"),
    "t5": ({"model_type": "t5", "d_model": 512, "num_layers": 6, "num_decoder_layers": 6,
            "is_encoder_decoder": True, "vocab_size": 32128}, "encoder-decoder"),
}


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_unsupported_configs_refused(kind, tmp_path, run):
    config, needle = CONFIGS[kind]
    (tmp_path / "config.json").write_text(json.dumps(config))
    one_line(run("account", "--model", str(tmp_path)), needle)


def test_sliding_window_counted_at_any_length(tmp_path, run):
    """A Mistral-style window of 512: rows up to 512 tokens see every key (the same count as
    without a window); longer ones are counted with the window (fewer keys), not refused.
    Qwen2's unused window (use_sliding_window=false) is ignored."""
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "mistral",
                                                      "sliding_window": 512}))
    ok = run("account", "--model", str(tmp_path), "--prompt-tokens", "100",
             "--completion-tokens", "400", "--json")
    assert ok.returncode == 0, ok.stderr
    plain = ModelShape.from_config(BASE)
    # the same count as the model without a window (recipe defaults: 64 x 8, LoRA r=32, ...)
    assert json.loads(ok.stdout)["total_flops"] == _account(plain, 100, 400)
    longer = run("account", "--model", str(tmp_path), "--prompt-tokens", "100",
                 "--completion-tokens", "1000", "--json")
    assert longer.returncode == 0, longer.stderr
    windowed = ModelShape.from_config({**BASE, "sliding_window": 512})
    assert json.loads(longer.stdout)["total_flops"] == _account(windowed, 100, 1000) \
        < _account(plain, 100, 1000)
    assert ModelShape.from_config({**BASE, "sliding_window": 256, "use_sliding_window": False}) \
        .sliding_window is None


def _account(shape: ModelShape, p: int, c: int) -> int:
    from allocopt.flops import LoRASpec
    from allocopt.flops.grpo import GRPOStep, grpo_step_flops

    # the set-up's defaults (runner allocopt): no checkpointing, no vLLM IS correction
    step = GRPOStep(prompt_tokens=(p,) * 64, completion_tokens=(c,) * 512, group_size=8,
                    importance_sampling_correction=False)
    return grpo_step_flops(shape, step, lora=LoRASpec(32), gradient_checkpointing=False,
                           engine_name="trl-vllm").executed.total_flops


def test_longer_than_context_refused(run):
    one_line(run("account", "--model", "Qwen/Qwen2.5-1.5B", "--prompt-tokens", "30000",
                 "--completion-tokens", "3000"), "max_position_embeddings=32768")
    one_line(run("account", "--completion-tokens", "300", "--completion-max", "40000",
                 "--length-distribution", "one-long"), "context")
    one_line(run("plan", "--budget", "1e19", "--rho", "0.5", "--completion-tokens", "40000"),
             "context")


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                                  "HF_HUB_OFFLINE": "0"}], ids=["offline", "unreachable"])
def test_hub_id_offline_fails_fast_in_one_line(env, tmp_path):
    """The hub look-up waits at most its timeout (2.5 s): the refusal takes at most 4 s more than
    the same command refused before any look-up (a shipped model's config), so the interpreter's
    start on a loaded machine is not counted."""
    t0 = time.perf_counter()
    base = run_process("account", "--model", "Qwen/Qwen2.5-1.5B", "--prompt-tokens", "30000",
                       "--completion-tokens", "3000", env={**env, "HF_HOME": str(tmp_path)})
    t1 = time.perf_counter()
    r = run_process("account", "--model", "someorg/not-cached-model", env={**env, "HF_HOME": str(tmp_path)})
    t2 = time.perf_counter()
    assert base.returncode == 2
    assert (t2 - t1) - (t1 - t0) < 4.0
    one_line(r, "model='someorg/not-cached-model'")
    assert "could not be fetched from the hub" in r.stderr


def test_quoted_toml_boolean_refused(tmp_path, run):
    f = tmp_path / "r.toml"
    f.write_text('[recipe]\ngradient_checkpointing = "false"\n')
    one_line(run("account", "--recipe", str(f)), "gradient_checkpointing='false'")
    f.write_text('[recipe]\nimportance_sampling_correction = 0\n')
    one_line(run("account", "--recipe", str(f)), "importance_sampling_correction=0")


@pytest.mark.parametrize("args,needle", [
    (["--from-verl", "nope.log"], "from_verl='nope.log': file not found"),
    (["--from-trl", "nope"], "from_trl='nope': not a folder"),
    (["--from-verl", "tests/data/runlogs/verl_r1_qwen25_3b_lora.log", "--peak-tflops", "-1"], "peak_tflops"),
    (["--from-verl", "tests/data/runlogs/verl_r1_qwen25_3b_lora.log", "--from-trl", "x"], "give one run"),
    (["--lengths", "nope.csv"], "lengths='nope.csv': file not found"),
    (["--minibatches", "0"], "minibatches=0"),
    (["--engine", "megatron"], "verl"),
])
def test_bad_account_input(args, needle, run):
    one_line(run("account", *args), needle)
