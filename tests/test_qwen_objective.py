"""The ``qwen`` objective end to end on CPU with local stand-ins of every part (tiny random
Qwen2 policy with a chat template, tiny 2-label PRM read by the Qwen2.5-Math-PRM card format,
the shipped Polaris-shaped slice, GSM8K and MATH-500).

* one whole trial per reward kind (``sparse``, ``prm``): the meter agrees with
  ``FlopCounterMode`` over the training part of the trial (total and per phase) within 2 %,
  the total stays within the budget, the realized ρ is the plan's within 0.03, and the
  evaluation reports every target with its FLOPs outside the budget;
* a trial in its own process returns the same kind of result; a child that dies fails the trial;
* ``allocopt study --objective qwen --set model=PATH ... --trials 2`` in a subprocess;
* bad input: one line, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from allocopt.plan.allocation import Allocation, InfeasiblePlan, make_plan, min_budget
from allocopt.flops import ConfigError
from objectives.qwen.objective import QwenObjective

from test_trial import PhaseCounter

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "objectives" / "data" / "polaris_sample" / "train.jsonl")
C = 16


def flat_settings(qwen_world, tmp_path, **over) -> dict:
    prm = str(qwen_world["prm"])
    return {"model": str(qwen_world["policy"]), "reward_model_prm": prm,
            "reward_model_proxy_prm": prm, "judge_model": prm, "dataset": SAMPLE,
            "heldout_problems": 4, "eval_problems": 2, "max_completion_length": C,
            "completion_tokens": C, "rollouts_per_iteration": 8, "lora_rank": 8, "lora_alpha": 16,
            "lengths_file": str(tmp_path / "lengths.json"), **over}


@pytest.mark.parametrize("reward", ["sparse", "prm"])
def test_one_cpu_trial_agrees_with_flopcounter(qwen_world, tmp_path, reward):
    obj = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path, isolate=False))
    obj.check_available()
    w = obj.workload()
    assert obj.setup().engine == "trl-cpu" and w.setup.engine == "trl-cpu"
    alloc = Allocation(0.5, 4, reward)
    plan = make_plan(4 * min_budget(alloc, w), alloc, w)
    assert plan.iterations >= 2
    import objectives.qwen.eval as qe

    seen: dict = {}
    real_eval = qe.evaluate
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp, PhaseCounter(mp) as counter:
        def snap_then_eval(*a, **k):
            seen.update(counter.phases())  # training ends here: evaluation is outside the budget
            return real_eval(*a, **k)
        mp.setattr(qe, "evaluate", snap_then_eval)
        result = obj.run(plan, seed=0)
        measured_all = counter.phases()["total"]
    wall = time.perf_counter() - t0
    spent = result.spent.executed
    metered = {"search": spent.search_flops, "reward": spent.reward_flops,
               "learning": spent.learning_flops, "total": spent.total_flops}
    print(f"\n{reward}: {len(result.curves)} iterations, wall {wall:.1f}s, metered {metered}, "
          f"measured {seen}, eval_flops {result.eval_flops}, targets {result.targets}")
    for phase in ("search", "learning", "total"):
        assert metered[phase] == pytest.approx(seen[phase], rel=0.02), phase
    if reward == "prm":
        assert metered["reward"] == pytest.approx(seen["reward"], rel=0.02) and metered["reward"] > 0
    else:
        assert metered["reward"] == seen["reward"] == 0
    assert 0 < spent.total_flops <= plan.budget_flops
    assert spent.rho == pytest.approx(plan.realized_rho, abs=0.03)
    assert set(result.targets) == {"native_reward", "pass_at_1", "pass_at_1_gsm8k",
                                   "pass_at_1_math500", "judge"}
    assert all(0.0 <= v <= 1.0 for v in result.targets.values())
    # evaluation's FLOPs: everything counted after training, charged nowhere in the budget
    assert result.eval_flops > 0
    assert measured_all - seen["total"] == pytest.approx(result.eval_flops, rel=0.05)
    # the ledger now holds this set-up's completion lengths for the next plans
    ledger = json.loads((tmp_path / "lengths.json").read_text())
    (entry,) = ledger.values()
    assert entry["rows"] == 8 * len(result.curves) and entry["trials"] == 1
    again = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path))
    assert "finished trial" in again.length_sources()["completion_tokens"]


def test_a_trial_trains_the_allocations_model(qwen_world, tmp_path):
    """A model-size study's allocation names another policy than the set-up's: the trial loads
    and trains that one (it used to load the set-up's model, and the set-up check refused the
    plan because the shapes differ)."""
    from objectives.qwen.standins import TINY_POLICY, build_policy

    other = build_policy(tmp_path / "wider", qwen_world["tokenizer"],
                         config={**TINY_POLICY, "num_hidden_layers": 3}, seed=3)
    obj = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path, isolate=False))
    w = obj.workload()
    alloc = Allocation(0.5, 4, "sparse", model=str(other))
    plan = make_plan(3 * min_budget(alloc, w), alloc, w)
    default = make_plan(3 * min_budget(Allocation(0.5, 4, "sparse"), w), Allocation(0.5, 4, "sparse"), w)
    assert plan.setup_fingerprint != default.setup_fingerprint  # priced on the wider model
    result = obj.run(plan, seed=0)
    spent = result.spent.executed
    assert result.status == "complete" and 0 < spent.total_flops <= plan.budget_flops
    assert spent.rho == pytest.approx(plan.realized_rho, abs=0.03)
    # the completion lengths went into the ledger under the wider model's set-up
    ledger = json.loads((tmp_path / "lengths.json").read_text())
    assert set(ledger) == {plan.setup_fingerprint}


@pytest.mark.slow  # a qwen trial in a child process, end to end: ~100 s on 2 loaded cores
def test_trial_in_its_own_process(qwen_world, tmp_path):
    obj = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path))
    w = obj.workload()
    alloc = Allocation(0.5, 4, "dense")
    plan = make_plan(3 * min_budget(alloc, w), alloc, w)
    seen = []
    result = obj.run(plan, seed=1, progress=lambda rec, meter: seen.append(meter.executed_flops))
    assert seen and seen[-1] == result.spent.executed.total_flops <= plan.budget_flops
    assert result.targets["pass_at_1"] >= 0 and result.eval_flops > 0
    # a plan priced on 5-token prompts (the real ones are ~165): the meter's worst case of the
    # first batch does not fit, so the child reports an infeasible plan, nothing spent
    short = w.with_setup(prompt_tokens=5)
    tight = make_plan(min_budget(alloc, short), alloc, short)
    with pytest.raises(InfeasiblePlan):
        obj.run(tight, seed=1)


def test_a_dying_trial_process_fails_the_trial(qwen_world, tmp_path, monkeypatch):
    from allocopt.objective import TrialFailed
    import objectives.qwen.process as qp

    obj = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path))
    w = obj.workload()
    alloc = Allocation(0.5, 4, "sparse")
    plan = make_plan(3 * min_budget(alloc, w), alloc, w)
    monkeypatch.setattr(qp, "_child", _die)
    with pytest.raises(TrialFailed, match="exit code 3"):
        obj.run(plan)


def _die(*args):  # a child process that dies without a word
    os._exit(3)


def _cli(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "allocopt.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture
def qcli(cli):
    """The command in this process (conftest's ``cli``), as ``_cli`` runs it."""
    return lambda *args, timeout=None: cli(*args, cwd=ROOT, env={"HF_HUB_OFFLINE": "1"})


def _sets(qwen_world, tmp_path, **over):
    out = []
    for k, v in flat_settings(qwen_world, tmp_path, **over).items():
        out += ["--set", f"{k}={v}"]
    return out


@pytest.mark.slow
def test_study_cli_runs_two_qwen_trials(qwen_world, tmp_path):
    t0 = time.perf_counter()
    r = _cli("study", "--objective", "qwen", "--budget", "2e10", "--target", "pass@1",
             "--trials", "2", "--tuner", "bo", "--sampler", "random", "--no-mlflow",
             "--storage", f"sqlite:///{tmp_path / 'o.db'}", "--study-name", "q",
             *_sets(qwen_world, tmp_path))
    print(f"study wall {time.perf_counter() - t0:.0f}s\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    import optuna

    st = optuna.load_study(study_name="q", storage=f"sqlite:///{tmp_path / 'o.db'}")
    states = [t.user_attrs.get("state") for t in st.trials]
    assert len(states) == 2 and set(states) <= {"COMPLETE", "INFEASIBLE"} and "COMPLETE" in states
    for t in st.trials:
        if t.user_attrs.get("state") == "COMPLETE":
            m = t.user_attrs["metrics"]
            assert 0 < m["total_flops"] <= 2e10 and m["eval_flops"] > 0


@pytest.mark.parametrize("over,needle", [
    ({"model": "nobody/no-such-model"}, "model='nobody/no-such-model'"),
    ({"dataset": "nobody/no-such-data"}, "dataset='nobody/no-such-data'"),
    ({"lora_rnak": 3}, "'lora_rnak': unknown"),
    ({"max_completion_length": 4096, "completion_tokens": 100}, "max_completion_length=4096"),
])
def test_bad_input_is_one_line_exit_2(qwen_world, tmp_path, over, needle, qcli):
    t0 = time.perf_counter()
    r = qcli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5",
             *_sets(qwen_world, tmp_path, **over), timeout=120)
    assert r.returncode == 2, r.stderr[-1500:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert time.perf_counter() - t0 < 30


def test_unknown_prm_format_and_missing_template_exit_2(qwen_world, tmp_path, qcli):
    from objectives.qwen.standins import build_policy, build_tokenizer

    bare = build_tokenizer(tmp_path / "bare_tok", vocab_size=300, chat_template=None)
    no_template = build_policy(tmp_path / "no_template", bare)
    r = qcli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5",
             *_sets(qwen_world, tmp_path, model=str(no_template)), timeout=120)
    assert r.returncode == 2 and "no chat template" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = qcli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5", "--reward", "prm",
             *_sets(qwen_world, tmp_path, reward_model_prm=str(qwen_world["policy"])), timeout=120)
    assert r.returncode == 2 and "card format is not known" in r.stderr, r.stderr


def test_budget_below_one_iteration_is_one_line_exit_2(qwen_world, tmp_path, qcli):
    r = qcli("trial", "--objective", "qwen", "--budget", "1e6", "--rho", "0.5",
             *_sets(qwen_world, tmp_path), timeout=120)
    assert r.returncode == 2 and "smallest feasible plan needs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal; this machine has CUDA")
def test_cpu_refuses_a_full_size_policy_before_spending():
    obj = QwenObjective.from_settings()
    from allocopt.objective import ObjectiveUnavailable

    with pytest.raises(ObjectiveUnavailable, match="needs a CUDA GPU"):
        obj.check_available()
    assert obj.workload().setup.engine == "trl-vllm"  # plans price the engine the study is meant for
    with pytest.raises(ConfigError):
        QwenObjective.from_settings(heldout_problems=0)


def test_vllm_eval_path_is_given_the_transformers_paths_prompts_and_the_trials_adapter(
        qwen_world, tmp_path, monkeypatch):
    """The vLLM evaluation path cannot run here (no GPU, no vLLM): a recording stand-in of
    ``vllm`` checks what it is given. With CUDA and vLLM reported present, ``evaluate`` picks
    it; it serves the base policy with the LoRA adapter the trial trained (saved, then read
    back here while vLLM would load it), greedy at the set-up's ``max_completion_length``, on
    the same token ids the transformers path feeds ``generate``; its FLOPs are each request's
    generation FLOPs with the adapters unmerged. Whether real vLLM runs it is for
    ``benchmarks/gpu_check.py``."""
    import types

    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from allocopt.plan import machine
    import objectives.qwen.eval as qe
    from allocopt.flops import LoRASpec, ModelShape, generation_flops
    from objectives.data.polaris import load_polaris, split_heldout
    from allocopt.rewards.systems import make_reward

    assert qe.eval_backend(True, True) == "vllm"
    assert qe.eval_backend(True, False) == qe.eval_backend(False, True) == qe.eval_backend(False, False) == "transformers"
    tok = qwen_world["tokenizer"]
    obj = QwenObjective.from_settings(**flat_settings(qwen_world, tmp_path, isolate=False))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(qwen_world["policy"])),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # as after training: not peft's zero initialization
            p.data.normal_()
    trained = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    seen: dict = {}
    answer = tok("\\boxed{3}", add_special_tokens=False)["input_ids"]

    class LLM:
        def __init__(self, **kw):
            seen["llm"] = kw

        def generate(self, prompts, params, lora_request, use_tqdm):
            seen["prompts"], seen["params"] = prompts, params.kw
            folder = Path(lora_request.path)
            seen["adapter_config"] = json.loads((folder / "adapter_config.json").read_text())
            seen["adapter"] = load_file(str(folder / "adapter_model.safetensors"))
            return [types.SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[
                types.SimpleNamespace(text="\\boxed{3}", token_ids=answer)]) for p in prompts]

    fake = types.ModuleType("vllm")
    fake.LLM = LLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(kw=kw)
    lora_mod = types.ModuleType("vllm.lora.request")
    lora_mod.LoRARequest = lambda name, id_, path: types.SimpleNamespace(path=path)
    for name, mod in (("vllm", fake), ("vllm.lora", types.ModuleType("vllm.lora")),
                      ("vllm.lora.request", lora_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(machine, "has_vllm", lambda: True)
    import allocopt.rewards.prm as prm_mod

    judges = []
    real_load = prm_mod.load_prm
    monkeypatch.setattr(prm_mod, "load_prm", lambda *a, **k: judges.append(real_load(*a, **k)) or judges[-1])
    rows = load_polaris(SAMPLE)
    _, held = split_heldout(rows, 4, seed=0)
    targets, flops = qe.evaluate(obj, model, tok, make_reward("sparse"), held)

    native, down, down_pairs, _ = qe.eval_prompts(obj, tok, held)
    assert [p["prompt_token_ids"] for p in seen["prompts"]] == \
        [tok(p, add_special_tokens=False)["input_ids"] for p in native + down]
    assert seen["params"] == {"temperature": 0.0, "max_tokens": C, "skip_special_tokens": True}
    greedy = qe.Greedy(C).transformers_kwargs(tok)
    assert greedy["do_sample"] is False and greedy["max_new_tokens"] == seen["params"]["max_tokens"]
    assert seen["llm"]["model"] == str(qwen_world["policy"]) and seen["llm"]["enable_lora"] is True
    assert seen["llm"]["max_lora_rank"] >= 8
    assert seen["adapter_config"]["r"] == 8
    assert seen["adapter"].keys() == trained.keys()
    assert all(torch.equal(seen["adapter"][k], trained[k]) for k in trained)
    assert set(targets) == {"native_reward", "pass_at_1", "pass_at_1_gsm8k", "pass_at_1_math500", "judge"}
    shape = ModelShape.from_pretrained(str(qwen_world["policy"]))
    generation = sum(generation_flops(shape, len(p["prompt_token_ids"]), len(answer), attention="causal",
                                      lora=LoRASpec(8))["total"] for p in seen["prompts"])
    (judge,) = judges  # the sparse reward costs 0; the judge one forward over the outputs
    judge(prompts=[q for q, _ in down_pairs], completions=["\\boxed{3}"] * len(down_pairs),
          problem=[q for q, _ in down_pairs])
    assert flops == generation + judge.consume_usage().executed_flops
