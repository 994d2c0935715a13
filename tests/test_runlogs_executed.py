"""The importers price what the run executed: verl's critic (from ``--critic`` or the log's own
``critic`` block), GAE logs with several samples per prompt as PPO, DAPO's generation batches
step by step; TRL's old-policy pass as TRL 1.16 decides it, on real TRL runs measured with
``FlopCounterMode``. Each import is checked within 2 % of a reference computed apart from the
importer: the verl logs' steps priced from their settings (``allocopt.plan.recipe.price`` of
each step's recipe, values from ``verl_cases.json``, not from the importer's parser) and the
critic's items by hand from the formulas; the TRL runs against the FLOPs measured in them and
step by step by hand. Fixtures: ``tests/data/runlogs/make_verl_cases.py``,
``make_trl_reuse_fixtures.py``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from allocopt.flops import ModelShape, forward_flops, training_flops
from allocopt.flops.grpo import GRPOStep, critic_shape, grpo_step_flops
from allocopt.flops.lengths import synthetic_completions
from allocopt.flops.shapes import LoRASpec
from allocopt.plan.hub import model_shape
from allocopt.plan.recipe import price
from allocopt.runlogs import RunLogError, import_trl, import_verl

DATA = Path(__file__).parent / "data" / "runlogs"
CASES = json.loads((DATA / "verl_cases.json").read_text())
BAR = 0.02


def _settings_path(case: dict, **changes) -> float:
    """The executed FLOPs of the case's steps, each priced from its recipe (the settings
    path): lengths of the step, one row at the logged max, DAPO's generated prompts from the
    step's generation batches."""
    s = {**case["settings"], **changes}
    gen = s.pop("gen_batch_size", None)
    total = 0
    for st in case["steps"]:
        kw = dict(s, engine="verl", prompt_tokens=st["prompt_length/mean"],
                  completion_tokens=st["response_length/mean"],
                  completion_max=st["response_length/max"], length_distribution="one-long",
                  max_completion_length=math.ceil(st["response_length/max"]))
        if gen:
            kw["generated_per_trained"] = st["train/num_gen_batches"] * gen / s["prompts"]
        total += price(**kw).executed.total_flops
    return total


def _import(name: str, **overrides):
    case = CASES[name]
    if case["critic_given"]:
        overrides.setdefault("critic", case["settings"]["critic"])
    return import_verl(DATA / case["log"], **overrides)


@pytest.mark.parametrize("name", list(CASES))
def test_verl_logs_priced_as_executed(name):
    run = _import(name)
    ref = _settings_path(CASES[name])
    assert abs(run.account.executed.total_flops / ref - 1) <= BAR, (name, run.account.executed.total_flops, ref)


def test_critic_items_by_hand():
    """The GAE log's critic (Qwen2.5-0.5B-Instruct, a d x 1 head at every position, fully
    fine-tuned, checkpointed): per step, values = one forward over each of the 512 rows,
    update = critic.ppo_epochs (2) x (forward + backward + recompute), from the formulas; the
    rows as the verl engine prices them (packed: prompt + response, the LM head at every
    position), lengths one-long from the step's mean and max."""
    case = CASES["gae_n4"]
    critic = critic_shape(model_shape("Qwen/Qwen2.5-0.5B-Instruct"))
    values = update = 0
    for st in case["steps"]:
        comps = synthetic_completions(st["response_length/mean"], st["response_length/max"], 512, "one-long")
        p = round(st["prompt_length/mean"])
        for c in comps:
            n = p + c
            values += forward_flops(critic, n, num_logits=n, attention="causal")
            t = training_flops(critic, n, num_logits=n, attention="causal", gradient_checkpointing=True,
                               fused_attention=True)
            update += 2 * (t["forward"] + t["backward"] + t["recompute"])
    ln = _import("gae_n4").account.executed.learning
    assert ln["critic_values"] == values
    assert ln["critic_forward"] + ln["critic_backward"] + ln["critic_recompute"] == update


def test_critic_from_the_log_equals_critic_given():
    """--critic with the log's own critic prices the same; the log's critic.ppo_epochs (2)
    counts: priced at the actor's one pass the critic update halves."""
    run = _import("gae_n4")
    assert run.settings["critic"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert run.settings["critic_update_passes"] == 2.0
    assert _import("gae_n4", critic="Qwen/Qwen2.5-0.5B-Instruct").account == run.account
    one = _import("gae_n4", critic_update_passes=1.0).account.executed.learning
    two = run.account.executed.learning
    assert two["critic_forward"] == 2 * one["critic_forward"] and two["critic_values"] == one["critic_values"]


def test_a_ppo_log_without_its_critic_names_critic_and_critic_then_works(tmp_path):
    case = CASES["ppo_critic"]
    with pytest.raises(RunLogError, match=r"adv_estimator='gae': verl trains a critic.*pass --critic MODEL") as e:
        import_verl(DATA / case["log"])
    assert "\n" not in str(e.value)
    run = _import("ppo_critic")
    assert run.account.executed.learning["critic_values"] > 0 and run.fields_read["critic"] == "given"
    # GRPO at n = 1: refused without suggesting a critic (verl runs none for grpo)
    log = (DATA / case["log"]).read_text().replace("adv_estimator=gae", "adv_estimator=grpo")
    (tmp_path / "grpo1.log").write_text(log)
    with pytest.raises(RunLogError, match=r"n=1 with algorithm.adv_estimator='grpo'.*allowed: n >= 2") as e:
        import_verl(tmp_path / "grpo1.log")
    assert "--critic" not in str(e.value)


def test_gae_with_several_samples_is_ppo_and_the_critic_block_is_read(tmp_path):
    """n = 4 with adv_estimator=gae: the critic counts (priced as GRPO it would be the
    critic's share lower); critic.enable=False turns it off as verl does."""
    run = _import("gae_n4")
    grpo = _settings_path(CASES["gae_n4"], critic="", critic_update_passes=0.0)
    assert run.account.executed.total_flops > 1.1 * grpo
    text = (DATA / CASES["gae_n4"]["log"]).read_text().replace("'enable': None", "'enable': False")
    (tmp_path / "off.log").write_text(text)
    off = import_verl(tmp_path / "off.log")
    assert "critic_values" not in off.account.executed.learning
    assert abs(off.account.executed.total_flops / grpo - 1) <= BAR


def test_dapo_generation_batches_vary_per_step_and_are_required(tmp_path):
    run = _import("dapo")
    steps = run.pricing.steps
    assert [s.generated_per_trained for s in steps] == [n * 96 / 32 for n in (1, 3, 2, 2, 1, 3)]
    # the over-generation is search: the same log priced as one generation batch per step
    one = _import("dapo", generated_per_trained=1.0).account.executed
    assert run.account.executed.search_flops > 3 * one.search_flops
    text = re.sub(r" - train/num_gen_batches:\d+", "", (DATA / CASES["dapo"]["log"]).read_text())
    (tmp_path / "nocount.log").write_text(text)
    with pytest.raises(RunLogError, match=r"filter_groups.enable=True: no step logs train/num_gen_batches") as e:
        import_verl(tmp_path / "nocount.log")
    assert "\n" not in str(e.value)


def test_critic_warmup_steps_update_no_actor(tmp_path):
    """trainer.critic_warmup=3: steps 1 and 2 run the old-policy, reference and critic passes
    but no actor update (verl: ``if critic_warmup <= global_steps: update_actor``)."""
    text = (DATA / CASES["gae_n4"]["log"]).read_text().replace("'critic_warmup': 0", "'critic_warmup': 3")
    (tmp_path / "warm.log").write_text(text)
    warm, run = import_verl(tmp_path / "warm.log"), _import("gae_n4")
    per_step = [import_verl(_one_step(tmp_path, i)).account.executed for i in range(5)]
    actor = [s.learning["forward"] + s.learning["backward"] + s.learning["recompute"] for s in per_step]
    assert warm.account.executed.learning["forward"] + warm.account.executed.learning["backward"] \
        + warm.account.executed.learning["recompute"] == sum(actor[2:])
    assert warm.account.executed.learning["critic_forward"] == run.account.executed.learning["critic_forward"]
    assert warm.account.executed.learning["old_logprobs"] == run.account.executed.learning["old_logprobs"]


def _one_step(tmp_path: Path, i: int) -> Path:
    """The GAE log with only its ``i``-th step line."""
    lines = (DATA / CASES["gae_n4"]["log"]).read_text().splitlines()
    steps = [ln for ln in lines if " step:" in ln]
    out = tmp_path / f"step{i}.log"
    out.write_text("\n".join([ln for ln in lines if ln not in steps] + [steps[i]]) + "\n")
    return out


def test_other_readings_are_the_totals_under_them():
    """The other reading of an assumed key is the import with that key given the other way."""
    run = _import("ppo_critic")
    others = run.other_totals()
    label, total = others["critic.model.enable_gradient_checkpointing"]
    assert label == "False"
    assert total == _import("ppo_critic", critic_gradient_checkpointing=False).account.executed.total_flops
    assert "critic.model.enable_gradient_checkpointing" not in _import(
        "ppo_critic", critic_gradient_checkpointing=True).others  # given: not assumed


def test_cli_prints_each_assumption_under_the_total(cli):
    case = CASES["ppo_critic"]
    r = cli("account", "--from-verl", str(DATA / case["log"]), "--critic", case["settings"]["critic"],
            env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("total ") and " assumes " in ln]
    run = _import("ppo_critic")
    assert len(lines) == len(run.fields_assumed)
    total = run.account.executed.total_flops
    gc = next(ln for ln in lines if "critic.model.enable_gradient_checkpointing" in ln)
    other = run.other_totals()["critic.model.enable_gradient_checkpointing"][1]
    assert f"if False: {other:.3e} ({other / total - 1:+.1%})" in gc and abs(other / total - 1) > BAR
    spread = next(ln for ln in lines if "per-row lengths" in ln)
    assert spread.endswith("within 2%")


# ------------------------------------------------------------------------------ TRL
TRL_CASES = ["trl_reuse_aligned", "trl_reuse_misaligned"]


@pytest.mark.parametrize("name", TRL_CASES)
def test_trl_reused_batches_against_flop_counter_and_by_hand(name):
    """TRL 1.16 skips the old-policy pass at ga 4 = steps_per_generation 2 x num_iterations 2,
    and runs it at ga 3 with steps_per_generation 2 (its no-grad log-prob calls: one
    reference pass per batch, plus the old-policy one there); the import is within 2 % of the
    FLOPs FlopCounterMode measured in the run, and equals the step-by-step account by hand
    (prompts of one length, so no padding is unknown)."""
    folder = DATA / name
    measured = json.loads((folder / "measured.json").read_text())
    batches = len(measured["batches"])
    old = measured["no_grad_logprob_calls"] == 2 * batches
    assert measured["no_grad_logprob_calls"] in (batches, 2 * batches)
    s = measured["settings"]
    assert old == (s["gradient_accumulation_steps"] % (s["steps_per_generation"] * s["num_iterations"]) != 0)
    run = import_trl(folder, model=str(folder / "base"))
    got = run.account.executed.total_flops
    assert abs(got / measured["flop_counter_mode_total_flops"] - 1) <= BAR
    shape = ModelShape.from_pretrained(str(folder / "base"))
    by_hand = 0
    for b in measured["batches"]:
        comps = b["completion_tokens"]
        step = GRPOStep(prompt_tokens=(6, 6), completion_tokens=comps, group_size=3, reference=True,
                        update_passes=float(s["num_iterations"]), old_logprobs=old)
        by_hand += grpo_step_flops(shape, step, lora=LoRASpec(4), gradient_checkpointing=True,
                                   engine_name="trl-cpu").executed.total_flops
    assert got == by_hand == measured["flop_counter_mode_total_flops"]


def test_trl_rule_is_the_installed_trainers():
    """The rule priced is the condition in the installed TRL's grpo_trainer.py (this fails when
    TRL changes it, so the rule is read again)."""
    import trl
    import trl.trainer.grpo_trainer as g

    source = Path(g.__file__).read_text()
    assert trl.__version__.startswith("1.16")
    assert "generate_every = self.args.steps_per_generation * self.num_iterations" in source
    assert re.search(r"if self\.args\.gradient_accumulation_steps % generate_every != 0 or \(\s*"
                     r"self\.use_vllm and self\.vllm_importance_sampling_correction\s*\):", source)


def test_group_of_one_refusals_name_critic_only_where_it_works():
    """G = 1 is refused without suggesting --critic by the importers that refuse --critic (TRL,
    OpenRLHF, NeMo-RL: their GRPO trains none); verl, which prices --critic, names it."""
    from allocopt.runlogs import import_nemo_rl, import_openrlhf

    for call in (lambda: import_trl(DATA / "trl_tiny", model=str(DATA / "trl_tiny" / "base"), group_size=1),
                 lambda: import_openrlhf(DATA / "openrlhf_grpo_qwen25_3b.log", group_size=1),
                 lambda: import_nemo_rl(DATA / "nemo_rl_tb", group_size=1)):
        with pytest.raises(RunLogError, match=r"(group_size|n_samples_per_prompt)=1") as e:
            call()
        assert "--critic" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RunLogError, match=r"pass --critic MODEL"):
        import_verl(DATA / CASES["ppo_critic"]["log"])


def test_trl_critic_is_refused():
    with pytest.raises(RunLogError, match="TRL's GRPOTrainer trains no critic"):
        import_trl(DATA / "trl_tiny", model=str(DATA / "trl_tiny" / "base"), critic="Qwen/Qwen2.5-0.5B")
