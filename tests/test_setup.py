"""One training set-up (``allocopt.plan.setup.TrainingSetup``) read by the plan, the meter and the
driver: the plan's fingerprint is what the driver computes from the model it loads and the
settings it runs, every FLOP-relevant field changes it, and the driver refuses a mismatch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from allocopt.plan.allocation import Allocation, Workload, make_plan, min_budget
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.setup import PRICED_FIELDS, TrainingSetup

POLICY = ModelShape.preset("Qwen/Qwen2.5-0.5B")
SAMPLE = str(Path(__file__).resolve().parents[1] / "objectives" / "data" / "polaris_sample" / "train.jsonl")


def test_plan_fingerprint_is_the_drivers():
    from allocopt.grpo.driver import check_setup

    setup = TrainingSetup(lora_rank=16, engine="trl-gpu", gradient_checkpointing=True, beta=0.04,
                          max_completion_length=512, completion_tokens=300)
    w = Workload(POLICY, setup)
    alloc = Allocation(rho=0.5, group_size=8, reward="sparse")
    plan = make_plan(10 * min_budget(alloc, w), alloc, w)
    # the driver's own check, on a shape read another way (config dict, other name): passes
    other_name = dataclasses.replace(POLICY, name="/some/local/copy")
    check_setup(plan, setup, other_name)
    assert plan.setup_fingerprint == setup.fingerprint(other_name) == setup.fingerprint(POLICY)
    assert len(plan.setup_fingerprint) == 12
    # the workload carries every set-up field the plan prices
    assert (w.setup.lora.rank, w.setup.engine, w.setup.gradient_checkpointing, w.setup.reference, w.setup.max_completion_length,
            w.setup.rollouts_per_iteration) == (16, "trl-gpu", True, True, 512, 64)


def test_a_default_workload_prices_the_default_setup():
    """``Workload(policy)`` holds no set-up field of its own: it prices ``TrainingSetup()``,
    field for field (the generation limit 1024 tokens, not unset), with the same fingerprint
    and the same plan; it survives pickling (plans go to a trial's own process)."""
    import pickle

    w, setup = Workload(POLICY), TrainingSetup()
    assert [f.name for f in dataclasses.fields(Workload)] == ["policy", "setup", "reward_models", "rule_rewards",
                                                          "reward_scoring", "policies"]
    assert w.setup == setup
    for f in dataclasses.fields(TrainingSetup):  # one place for each field: workload.setup
        assert not hasattr(w, f.name), f.name
    assert (w.setup.max_completion_length, w.setup.gradient_checkpointing, w.setup.importance_sampling_correction,
            w.setup.rollouts_per_iteration, w.setup.engine) == (1024, False, False, 64, "trl-vllm")
    assert (w.setup.lora.rank, w.setup.reference) == (32, False)
    assert w.fingerprint() == setup.fingerprint(POLICY)
    alloc = Allocation(rho=0.5, group_size=8, reward="prm")
    plan = make_plan(1e19, alloc, w)
    assert plan == make_plan(1e19, alloc, Workload(POLICY, setup))
    assert plan.setup_fingerprint == setup.fingerprint(POLICY)
    assert plan.setup == dataclasses.replace(setup, rollouts_per_iteration=plan.rollouts_per_iteration)
    assert pickle.loads(pickle.dumps(w)) == w and pickle.loads(pickle.dumps(plan)) == plan
    with pytest.raises(AttributeError, match="no attribute 'lora_rnak'"):
        w.lora_rnak  # noqa: B018


def test_with_setup_derives_a_workload():
    w = Workload(POLICY, TrainingSetup(completion_tokens=300))
    short = w.with_setup(completion_tokens=100.0, prompt_tokens=50.0)
    assert (short.setup.completion_tokens, short.setup.prompt_tokens, short.policy, short.reward_models) == \
        (100.0, 50.0, w.policy, w.reward_models)
    assert short.setup.max_completion_length == w.setup.max_completion_length == 1024  # resolved once
    assert short.fingerprint() == w.fingerprint()  # lengths price a plan, they are not the set-up
    assert w.with_setup(lora_rank=8).fingerprint() != w.fingerprint()
    with pytest.raises(ConfigError, match=r"^rollouts_per_iteration=1: must be an integer from 2"):
        w.with_setup(rollouts_per_iteration=1)
    with pytest.raises(ConfigError, match=r"^setting 'lora_rnak': unknown; allowed: "):
        w.with_setup(lora_rnak=8)


CHANGED = {"lora_rank": 8, "lora_targets": "q_proj,v_proj", "engine": "trl-cpu",
           "gradient_checkpointing": True, "beta": 0.04, "max_completion_length": 2048,
           "importance_sampling_correction": True, "generated_per_trained": 3.0,
           "critic": "Qwen/Qwen2.5-0.5B"}


def test_every_priced_field_has_a_change_below():
    assert set(CHANGED) == set(PRICED_FIELDS)


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_the_driver_names_the_field_a_changed_setup_differs_in(field):
    """A plan made from a set-up passes the driver's check with that set-up (and with one
    whose unpriced fields or expected lengths differ); a set-up with one priced field
    changed is refused in one line that starts with that field, its value and the plan's."""
    from allocopt.grpo.driver import SetupMismatch, check_setup

    setup = TrainingSetup(completion_tokens=300)
    w = Workload(POLICY, setup)
    alloc = Allocation(rho=0.5, group_size=8, reward="sparse")
    plan = make_plan(10 * min_budget(alloc, w), alloc, w)
    check_setup(plan, setup, POLICY)
    check_setup(plan, dataclasses.replace(setup, learning_rate=3e-4, temperature=0.7, lora_alpha=8,
                                          completion_tokens=500.0, prompt_tokens=160.0), POLICY)
    changed = dataclasses.replace(setup, **{field: CHANGED[field]})
    with pytest.raises(SetupMismatch) as e:
        check_setup(plan, changed, POLICY)
    msg = str(e.value)
    planned = {"beta": 0.0}.get(field, getattr(setup, field))
    assert "\n" not in msg and msg.startswith(f"{field}={CHANGED[field]!r} (the plan priced {planned!r}):")
    assert plan.setup_fingerprint in msg and changed.fingerprint(POLICY) in msg


def test_the_driver_names_the_model_when_only_its_shape_differs():
    from allocopt.grpo.driver import SetupMismatch, check_setup

    w = Workload(POLICY)
    alloc = Allocation(rho=0.5, group_size=8, reward="sparse")
    plan = make_plan(1e19, alloc, w)
    deeper = dataclasses.replace(POLICY, num_layers=POLICY.num_layers + 4)
    with pytest.raises(SetupMismatch, match=rf"^model='Qwen/Qwen2.5-1.5B-Instruct' \({POLICY.num_layers + 4} "
                                            "layers x d=896, .*: not the shape the plan priced"):
        check_setup(plan, TrainingSetup(), deeper)


def test_one_default_per_field_the_runner_named():
    """Fields not given take one default, in TrainingSetup; the two that depend on who runs
    the training follow ``runner`` (allocopt's driver: off; a plain TRL job: GRPOConfig's
    defaults, on), and given values win. The generation limit is 1024 tokens, or the longest
    expected completion when longer."""
    mine, theirs = TrainingSetup(), TrainingSetup(runner="trl")  # TRL's: tests/test_engines.py
    assert (mine.gradient_checkpointing, mine.importance_sampling_correction) == (False, False)
    assert (theirs.gradient_checkpointing, theirs.importance_sampling_correction) == (True, True)
    assert mine.fingerprint(POLICY) != theirs.fingerprint(POLICY)
    same = TrainingSetup(runner="trl", gradient_checkpointing=False, importance_sampling_correction=False)
    assert same.fingerprint(POLICY) == mine.fingerprint(POLICY)  # the values count, not the name
    assert (mine.max_completion_length, TrainingSetup(completion_tokens=1500.5).max_completion_length,
            TrainingSetup(padded_completion_tokens=2000).max_completion_length) == (1024, 1501, 2000)
    # replace() keeps what was resolved (measured lengths do not move the limit)
    assert mine.with_lengths(completion_tokens=900.0).max_completion_length == 1024
    with pytest.raises(ConfigError, match="runner='verl': unknown; allowed: allocopt, trl"):
        TrainingSetup(runner="verl")


@pytest.mark.parametrize("change", [
    {"lora_rank": 8}, {"lora_targets": "q_proj,v_proj"}, {"engine": "trl-cpu"},
    {"gradient_checkpointing": True}, {"beta": 0.1}, {"max_completion_length": 2048}])
def test_every_flop_relevant_field_changes_the_fingerprint(change):
    base = TrainingSetup()
    assert dataclasses.replace(base, **change).fingerprint(POLICY) != base.fingerprint(POLICY)


def test_fingerprint_ignores_what_does_not_change_flops():
    base = TrainingSetup()
    same = dataclasses.replace(base, learning_rate=3e-4, temperature=0.7, lora_alpha=8, beta=0.0)
    assert same.fingerprint(POLICY) == base.fingerprint(POLICY)
    wider = dataclasses.replace(POLICY, hidden_size=POLICY.hidden_size + 64)
    assert base.fingerprint(wider) != base.fingerprint(POLICY)


@pytest.mark.parametrize("field,value", [
    ("lora_rank", -1), ("max_completion_length", 0), ("engine", "megatron"), ("beta", -0.1),
    ("learning_rate", 0.0), ("rollouts_per_iteration", 1), ("prompt_tokens", float("nan")),
    ("lora_targets", "q_proj,bogus"), ("model", "")])
def test_bad_fields_are_one_line_naming_the_field(field, value):
    with pytest.raises(ConfigError) as e:
        TrainingSetup(**{field: value})
    msg = str(e.value)
    assert "\n" not in msg and (field in msg or "lora_target" in msg)


def test_completion_estimate_above_the_limit_is_refused():
    with pytest.raises(ConfigError, match="completion_tokens=400.*max_completion_length=256"):
        TrainingSetup(max_completion_length=256, completion_tokens=400)


def test_from_mapping_names_an_unknown_key():
    assert TrainingSetup.from_mapping({"lora_rank": 4}).lora_rank == 4
    with pytest.raises(ConfigError, match="'lora_rnak': unknown"):
        TrainingSetup.from_mapping({"lora_rnak": 4})


def test_driver_refuses_a_plan_priced_for_another_setup():
    """The plan prices LoRA r 8; the driver is asked to run r 4: one line, nothing run."""
    from allocopt.grpo.driver import SetupMismatch, run_grpo
    from objectives.tiny.models import build_policy, policy_config

    setup = TrainingSetup(lora_rank=8, engine="trl-cpu", max_completion_length=12,
                          completion_tokens=12, rollouts_per_iteration=8, prompt_tokens=10)
    w = Workload(ModelShape.from_config(policy_config("tiny").to_dict()), setup)
    alloc = Allocation(rho=0.5, group_size=4, reward="sparse")
    plan = make_plan(3 * min_budget(alloc, w), alloc, w)
    model = build_policy("tiny", seed=0)
    for wrong, shown in ((dataclasses.replace(setup, lora_rank=4), "lora_rank=4 (the plan priced 8):"),
                         # a plain TRL job's defaults (checkpointing, IS correction): not planned
                         (TrainingSetup(**{**setup.to_dict(), "runner": "trl",
                                           "gradient_checkpointing": None,
                                           "importance_sampling_correction": None}),
                          "gradient_checkpointing=True (the plan priced False), "
                          "importance_sampling_correction=True (the plan priced False):")):
        with pytest.raises(SetupMismatch) as e:  # before TRL is touched: no tokenizer, no rows
            run_grpo(plan, model=model, tokenizer=None, train_rows=[], reward=None, setup=wrong)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(shown) and plan.setup_fingerprint in msg
        assert wrong.fingerprint(w.policy) in msg


def test_driver_refuses_a_batch_the_setup_does_not_allow():
    """A set-up of 64 rollouts at G 4 (16 prompts), min_batch_share 0.5 and target_steps off
    runs 8 to 16 prompts: plans priced at 7 or 32 prompts are refused with one line, 8 and 16 pass (the
    fingerprint does not depend on the batch), and so does what make_plan gives."""
    from allocopt.plan.allocation import _plan_at, batch_workload
    from allocopt.grpo.driver import SetupMismatch, check_setup

    setup = TrainingSetup(lora_rank=8, engine="trl-cpu", max_completion_length=12,
                          completion_tokens=12, prompt_tokens=10, rollouts_per_iteration=64,
                          target_steps=0)
    policy = ModelShape.preset("qwen2.5-0.5b")
    w = Workload(policy, setup)
    alloc = Allocation(rho=0.5, group_size=4, reward="sparse")
    for prompts in (7, 8, 16, 32):
        plan = _plan_at(1e15, alloc, batch_workload(w, prompts * 4))  # a plan at this batch
        assert plan.prompts_per_iteration == prompts
        if 8 <= prompts <= 16:
            check_setup(plan, setup, policy)
            continue
        with pytest.raises(SetupMismatch) as e:
            check_setup(plan, setup, policy)
        msg = str(e.value)
        assert "\n" not in msg and f"prompts_per_iteration={prompts}" in msg
        assert "runs 8 to 16 prompts of G=4" in msg
    one = min_budget(alloc, w)
    for factor in (1.0, 1.5, 2.7, 10.3):
        check_setup(make_plan(factor * one, alloc, w), setup, policy)


@pytest.mark.parametrize("engine_name,correction", [("trl-vllm", True), ("trl-vllm", False),
                                                    ("trl-gpu", True)])
def test_meter_charges_the_passes_the_plan_priced(engine_name, correction):
    """The driver's per-iteration charge (``_Hooks._step``) at the plan's token counts equals
    the plan's iteration FLOPs, including the old-policy pass TRL + vLLM runs at one update
    pass while its importance-sampling correction is on (and not otherwise)."""
    from allocopt.plan.allocation import iteration_flops, plan_workload
    from allocopt.grpo.hooks import _Hooks

    setup = TrainingSetup(engine=engine_name, importance_sampling_correction=correction,
                          completion_tokens=300, prompt_tokens=100)
    w = Workload(POLICY, setup)
    alloc = Allocation(rho=0.3, group_size=8, reward="sparse")
    plan = make_plan(50 * min_budget(alloc, w), alloc, w)
    N = plan.rollouts_per_iteration
    hooks = _Hooks(plan=plan, meter=None, policy=POLICY, setup=setup, reward=None, tokenizer=None)
    for rows in (N // 2, N):
        charged = hooks._step([100] * (N // 8), [300] * N, rows).executed
        assert charged == iteration_flops(plan_workload(w, plan), alloc, rows).executed  # its batch
        old = charged.learning.get("old_logprobs", 0)
        assert (old > 0) is (engine_name == "trl-vllm" and correction)


def test_one_toml_one_fingerprint_in_account_and_in_the_driver(tmp_path, cli):
    """``allocopt account --recipe FILE`` and the ``qwen`` driver read the same TOML into the
    same :class:`TrainingSetup`: the fingerprint account prints is the one the driver computes
    from the model it loads (its config through transformers) and the settings it runs."""
    import json

    from transformers import Qwen2Config

    from objectives.qwen.objective import QwenObjective
    from allocopt.tomlio import read_toml

    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 2048,
           "tie_word_embeddings": True}
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text(json.dumps(cfg))
    f = tmp_path / "setup.toml"
    f.write_text(f'[recipe]\nmodel = "{tmp_path / "policy"}"\nlora_rank = 16\nlora_targets = "q_proj,v_proj"\n'
                 'engine = "trl-gpu"\ngradient_checkpointing = false\nbeta = 0.04\n'
                 'max_completion_length = 512\nimportance_sampling_correction = false\n')
    r = cli("account", "--recipe", str(f), "--json")
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)["setup_fingerprint"]
    setup = QwenObjective.from_settings(**read_toml(f, "recipe")["recipe"]).settings.setup
    loaded = ModelShape.from_config(Qwen2Config(**cfg).to_dict())
    assert setup.fingerprint(loaded) == printed
    # the flags win over the file, and the fingerprint follows them
    from allocopt.plan.recipe import read_recipe

    assert read_recipe(f)[0].fingerprint(loaded) == printed
    assert read_recipe(f, lora_rank=8)[0].fingerprint(loaded) != printed


def test_a_toml_that_omits_the_defaulted_fields_gives_one_fingerprint(qwen_world, tmp_path, monkeypatch):
    """A recipe that gives neither gradient checkpointing, the importance-sampling correction,
    the generation limit nor the engine: ``allocopt account --recipe`` and the ``qwen`` driver's
    set-up take the same defaults (TrainingSetup's, runner ``allocopt``; the driver's engine
    ``auto`` on the machine it is meant for, CUDA + vLLM), so the same fingerprint, which is the
    one of those values written out here. ``runner = "trl"`` prices a plain TRL job instead
    (GRPOConfig's defaults: both on): another fingerprint, and the driver refuses its plan."""
    import json

    from transformers import AutoConfig
    from typer.testing import CliRunner

    from allocopt.plan import machine
    from allocopt.plan.setup import setup_fingerprint
    from allocopt.cli import app
    from allocopt.flops import LoRASpec
    from allocopt.plan.recipe import read_recipe
    from allocopt.tomlio import read_toml
    from allocopt.grpo.driver import SetupMismatch, check_setup
    from objectives.qwen.objective import QwenObjective

    policy = str(qwen_world["policy"])
    f = tmp_path / "setup.toml"
    f.write_text(f'[recipe]\nmodel = "{policy}"\nlora_rank = 8\nlora_alpha = 16\n')
    res = CliRunner().invoke(app, ["account", "--recipe", str(f), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert {k: printed["recipe"][k] for k in ("runner", "gradient_checkpointing",
                                              "importance_sampling_correction", "max_completion_length",
                                              "engine")} == \
        {"runner": "allocopt", "gradient_checkpointing": False,
         "importance_sampling_correction": False, "max_completion_length": 1024, "engine": "trl-vllm"}
    monkeypatch.setattr(machine, "has_cuda", lambda: True)
    monkeypatch.setattr(machine, "has_vllm", lambda: True)
    obj = QwenObjective.from_settings(**read_toml(f, "recipe")["recipe"], dataset=SAMPLE,
                                      lengths_file=str(tmp_path / "lengths.json"))
    setup = obj.setup()  # what run_here hands the driver
    loaded = ModelShape.from_config(AutoConfig.from_pretrained(policy).to_dict())
    by_hand = setup_fingerprint(loaded, lora=LoRASpec(8), engine_name="trl-vllm",
                                gradient_checkpointing=False, reference=False,
                                max_completion_length=1024, importance_sampling_correction=False)
    assert setup.fingerprint(loaded) == printed["setup_fingerprint"] == by_hand
    alloc = Allocation(rho=0.5, group_size=4, reward="sparse")
    w = obj.workload()
    check_setup(make_plan(3 * min_budget(alloc, w), alloc, w), setup, loaded)  # runs
    # a plain TRL job, said so: GRPOConfig's defaults priced; the driver will not run that plan
    trl_setup, _ = read_recipe(f, runner="trl")
    assert (trl_setup.gradient_checkpointing, trl_setup.importance_sampling_correction) == (True, True)
    assert trl_setup.fingerprint(loaded) != by_hand
    trl_w = Workload(loaded, trl_setup.with_lengths(rollouts_per_iteration=w.setup.rollouts_per_iteration))
    with pytest.raises(SetupMismatch, match=r"^gradient_checkpointing=False \(the plan priced True\), "
                                            r"importance_sampling_correction=False \(the plan priced True\):"):
        check_setup(make_plan(3 * min_budget(alloc, trl_w), alloc, trl_w), setup, loaded)
