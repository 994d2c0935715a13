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

from allocopt.allocation import Allocation, InfeasiblePlan, make_plan, min_budget
from allocopt.flops import ConfigError
from objectives.qwen import QwenObjective

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
    assert obj.setup().engine == "trl-cpu" and w.engine == "trl-cpu"
    alloc = Allocation(0.5, 4, reward)
    plan = make_plan(4 * min_budget(alloc, w), alloc, w)
    assert plan.iterations >= 2
    import objectives.qwen_eval as qe

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
    import dataclasses

    short = dataclasses.replace(w, prompt_tokens=5)
    tight = make_plan(min_budget(alloc, short), alloc, short)
    with pytest.raises(InfeasiblePlan):
        obj.run(tight, seed=1)


def test_a_dying_trial_process_fails_the_trial(qwen_world, tmp_path, monkeypatch):
    from allocopt.objective import TrialFailed
    import objectives.qwen_process as qp

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


def _sets(qwen_world, tmp_path, **over):
    out = []
    for k, v in flat_settings(qwen_world, tmp_path, **over).items():
        out += ["--set", f"{k}={v}"]
    return out


@pytest.mark.slow
def test_study_cli_runs_two_qwen_trials(qwen_world, tmp_path):
    t0 = time.perf_counter()
    r = _cli("study", "--objective", "qwen", "--budget", "2e10", "--target", "pass@1",
             "--trials", "2", "--pilots", "0", "--sampler", "random", "--no-mlflow",
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
def test_bad_input_is_one_line_exit_2(qwen_world, tmp_path, over, needle):
    t0 = time.perf_counter()
    r = _cli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5",
             *_sets(qwen_world, tmp_path, **over), timeout=120)
    assert r.returncode == 2, r.stderr[-1500:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert time.perf_counter() - t0 < 30


def test_unknown_prm_format_and_missing_template_exit_2(qwen_world, tmp_path):
    from objectives.standins import build_policy, build_tokenizer

    bare = build_tokenizer(tmp_path / "bare_tok", vocab_size=300, chat_template=None)
    no_template = build_policy(tmp_path / "no_template", bare)
    r = _cli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5",
             *_sets(qwen_world, tmp_path, model=str(no_template)), timeout=120)
    assert r.returncode == 2 and "no chat template" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("trial", "--objective", "qwen", "--budget", "1e12", "--rho", "0.5", "--reward", "prm",
             *_sets(qwen_world, tmp_path, reward_model_prm=str(qwen_world["policy"])), timeout=120)
    assert r.returncode == 2 and "card format is not known" in r.stderr, r.stderr


def test_budget_below_one_iteration_is_one_line_exit_2(qwen_world, tmp_path):
    r = _cli("trial", "--objective", "qwen", "--budget", "1e6", "--rho", "0.5",
             *_sets(qwen_world, tmp_path), timeout=120)
    assert r.returncode == 2 and "smallest feasible plan needs" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal; this machine has CUDA")
def test_cpu_refuses_a_full_size_policy_before_spending():
    obj = QwenObjective.from_settings()
    from allocopt.objective import ObjectiveUnavailable

    with pytest.raises(ObjectiveUnavailable, match="needs a CUDA GPU"):
        obj.check_available()
    assert obj.workload().engine == "trl-vllm"  # plans price the engine the study is meant for
    with pytest.raises(ConfigError):
        QwenObjective.from_settings(heldout_problems=0)
