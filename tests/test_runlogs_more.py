"""Importers beyond the single-process TRL folder: multi-process TRL runs (world size read from
``training_args.bin``; numbers that cannot be one process's refused), OpenRLHF and NeMo-RL logs,
and the live TRL callback."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from allocopt.flops import LoRASpec, ModelShape
from allocopt.flops.grpo import GRPOStep, grpo_step_flops
from allocopt.flops.lengths import synthetic_completions
from allocopt.runlogs import RunLogError, import_trl
from allocopt.runlogs.argsfile import read_training_args

DATA = Path(__file__).parent / "data" / "runlogs"
TRL, TRL8 = DATA / "trl_tiny", DATA / "trl_tiny_8proc"
BASE = str(TRL / "base")


def _by_hand(folder: Path, rows: int, prompts: int) -> tuple[float, float]:
    """(prompt mean, executed FLOPs) from trainer_state.json's own numbers: TRL's ``num_tokens``
    is the cumulative sum of the gathered prompt + completion lengths of every rollout batch
    (``rows`` completions over all processes); the completion lengths spread one-long."""
    history = [r for r in json.loads((folder / "trainer_state.json").read_text())["log_history"]
               if "completions/mean_length" in r]
    completion = sum(r["completions/mean_length"] * rows for r in history)
    prompt_mean = (history[-1]["num_tokens"] - completion) / (rows * len(history))
    shape = ModelShape.from_pretrained(BASE)
    total = 0
    for r in history:
        comps = synthetic_completions(r["completions/mean_length"], r["completions/max_length"],
                                      rows, "one-long")
        step = GRPOStep(prompt_tokens=(round(prompt_mean),) * prompts, completion_tokens=comps,
                        group_size=3, reference=True)
        total += grpo_step_flops(shape, step, lora=LoRASpec(4), gradient_checkpointing=True,
                                 engine_name="trl-cpu").executed.total_flops
    return prompt_mean, total


def test_trl_eight_process_run_reads_the_process_count():
    """``trl_tiny_8proc`` is ``trl_tiny`` as 8 processes log it (see
    ``tests/data/runlogs/make_trl_8proc_fixture.py``: TRL gathers the lengths of all processes,
    so ``num_tokens`` is 8x and the length means are unchanged; ``generation_batch_size`` = 6 x 8
    and ``distributed_state.num_processes`` = 8 are pickled with the GRPOConfig). Read as one
    process, the prompt came out (8 x 282 - 168) / 24 = 87 tokens; read right it is 4.75."""
    args = read_training_args(TRL8 / "training_args.bin")
    assert (args["generation_batch_size"], args["distributed_state"]["num_processes"]) == (48, 8)
    one = import_trl(TRL, model=BASE)
    run = import_trl(TRL8, model=BASE)
    assert run.settings["prompts"] == 16 and one.settings["prompts"] == 2
    assert run.fields_read["world_size"].startswith("8 ") and "world_size" not in run.fields_assumed
    prompt_mean, total = _by_hand(TRL8, rows=48, prompts=16)
    assert prompt_mean == pytest.approx(4.75) and "= 4.75" in run.fields_read["prompt_tokens"]
    assert run.account.executed.total_flops == total
    # same prompt and completion lengths, 8x the rows: 8x the single process's FLOPs (within
    # the spread of the one long row over 48 instead of 6 rows)
    assert run.account.executed.total_flops == pytest.approx(8 * one.account.executed.total_flops,
                                                             rel=0.01)
    assert run.account.executed.rho == pytest.approx(one.account.executed.rho, rel=0.01)


def _old_trl_folder(tmp_path: Path, mean_lengths: list[float], state_from: Path = TRL,
                    rng_states: tuple[str, ...] = ("rng_state.pth",), **arg_changes) -> Path:
    """A folder as TRL < 0.18 left it: training_args.bin without ``generation_batch_size`` or
    ``distributed_state`` (a plain pickle of the fields; the reader takes both), and a
    ``checkpoint-4`` with the RNG state files ``rng_states`` (transformers writes
    ``rng_state.pth`` from one process, ``rng_state_<rank>.pth`` from each of several)."""
    out = tmp_path / "run"
    (out / "checkpoint-4").mkdir(parents=True)
    for name in rng_states:
        (out / "checkpoint-4" / name).write_bytes(b"")
    shutil.copy(TRL / "adapter_config.json", out)
    args = {k: v for k, v in read_training_args(TRL / "training_args.bin").items()
            if k not in ("generation_batch_size", "distributed_state")}
    args.update(arg_changes)
    (out / "training_args.bin").write_bytes(pickle.dumps(args))
    state = json.loads((state_from / "trainer_state.json").read_text())
    for rec, m in zip(state["log_history"], mean_lengths):
        rec["completions/mean_length"] = m
    (out / "trainer_state.json").write_text(json.dumps(state))
    return out


def test_trl_process_count_is_read_inferred_or_refused(tmp_path):
    """An old TRL's folder names no process count in training_args.bin: it is inferred from
    the checkpoint's RNG state files (``rng_state.pth``: one process; ``rng_state_0..7.pth``:
    eight), never assumed; with none it is refused in one line naming --prompts."""
    one = import_trl(_old_trl_folder(tmp_path / "a", [5.5, 7.5, 8.0, 7.0]), model=BASE)
    assert one.fields_read["world_size"].startswith("1 (checkpoint-4/rng_state.pth")
    assert "world_size" not in one.fields_assumed
    assert one.account == import_trl(TRL, model=BASE).account
    eight = import_trl(_old_trl_folder(tmp_path / "b", [5.5, 7.5, 8.0, 7.0], state_from=TRL8,
                                       rng_states=tuple(f"rng_state_{i}.pth" for i in range(8))),
                       model=BASE)
    assert eight.fields_read["world_size"].startswith("8 (") and eight.settings["prompts"] == 16
    assert eight.account == import_trl(TRL8, model=BASE).account
    bare = _old_trl_folder(tmp_path / "c", [5.5, 7.5, 8.0, 7.0], rng_states=())
    with pytest.raises(RunLogError, match=r"process count is not in training_args.bin .*"
                                          r"rng_state\*\.pth\); pass --prompts") as e:
        import_trl(bare, model=BASE)
    assert "\n" not in str(e.value)
    assert import_trl(bare, model=BASE, prompts=2).account == one.account
    some = _old_trl_folder(tmp_path / "d", [5.5, 7.5, 8.0, 7.0], rng_states=("rng_state_1.pth",))
    with pytest.raises(RunLogError, match=r"rng_state files of ranks \[1\]: not one run's processes"):
        import_trl(some, model=BASE)


def test_trl_numbers_that_cannot_be_the_inferred_processes_are_refused(tmp_path):
    """An 8-process run of an old TRL whose folder holds one node's RNG state only (as if the
    other node's were elsewhere): the mean over 48 gathered lengths (261 / 48 = 5.4375) times
    the 6 rows one process has is 32.625, not a whole number of tokens: refused in one line;
    with --prompts (over all processes) it is accounted."""
    folder = _old_trl_folder(tmp_path, [261 / 48, 7.5, 8.0, 7.0], state_from=TRL8)
    with pytest.raises(RunLogError, match="not a whole number of tokens") as e:
        import_trl(folder, model=BASE)
    assert "\n" not in str(e.value) and "--prompts" in str(e.value)
    run = import_trl(folder, model=BASE, prompts=16)
    assert run.settings["prompts"] == 16 and "world_size" not in run.fields_assumed


def test_trl_lengths_checked_against_the_logged_maxima(tmp_path):
    folder = _old_trl_folder(tmp_path, [5.5, 7.5, 8.0, 7.0], max_completion_length=6)
    with pytest.raises(RunLogError, match="completions/max_length=8 is above max_completion_length=6"):
        import_trl(folder, model=BASE)
    state = json.loads((TRL / "trainer_state.json").read_text())
    state["log_history"][0]["completions/max_length"] = 3.0
    (folder / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(RunLogError, match="max_length=3 is below completions/mean_length=5.5"):
        import_trl(folder, model=BASE)


def test_trl_generation_batch_that_disagrees_with_the_process_count_is_refused(tmp_path):
    folder = _old_trl_folder(tmp_path, [5.5, 7.5, 8.0, 7.0], generation_batch_size=48,
                             distributed_state={"num_processes": 4})
    with pytest.raises(RunLogError, match=r"generation_batch_size=48 is not .* 6 x 4 x 1"):
        import_trl(folder, model=BASE)


# --- OpenRLHF and NeMo-RL (fixtures: tests/data/runlogs/make_engine_fixtures.py, README) ---

from allocopt.runlogs.openrlhf import import_openrlhf  # noqa: E402
from allocopt.runlogs.nemo_rl import import_nemo_rl  # noqa: E402
from allocopt.plan.hub import model_shape  # noqa: E402

VALUES = json.loads((DATA / "engine_fixture_values.json").read_text())
OPENRLHF_LOG = DATA / "openrlhf_grpo_qwen25_3b.log"
has_tb = pytest.mark.skipif(
    __import__("importlib").util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (pip install 'allocopt[tensorboard]')")


def _verl_engine_total(model: str, steps: list[tuple[float, float, float | None, float]], *,
                       prompts: int, G: int, beta: float, gc: bool, minibatches: int) -> int:
    """By hand: one GRPOStep per logged step (prompt and completion lengths from the log, the
    completions spread one-long when a maximum is logged), priced with the verl engine model,
    times the step's share of the planned rows."""
    shape = model_shape(model)
    total = 0.0
    for p, c, cmax, weight in steps:
        comps = synthetic_completions(c, cmax if cmax and cmax > c else None, prompts * G,
                                      "one-long" if cmax and cmax > c else "constant")
        step = GRPOStep(prompt_tokens=(round(p),) * prompts, completion_tokens=comps,
                        group_size=G, reference=beta > 0, minibatches=minibatches)
        total += grpo_step_flops(shape, step, gradient_checkpointing=gc,
                                 engine_name="verl").executed.total_flops * weight
    return total


def test_openrlhf_console_log_by_hand():
    run = import_openrlhf(OPENRLHF_LOG)
    a = VALUES["openrlhf"]["args"]
    s = run.settings
    assert (s["prompts"], s["group_size"], s["update_passes"], s["beta"], s["gradient_checkpointing"],
            s["lora_rank"], s["model"]) == (a["rollout.batch_size"], a["rollout.n_samples_per_prompt"],
                                            a["train.max_epochs"], a["algo.kl.init_coef"],
                                            a["actor.gradient_checkpointing_enable"], 0,
                                            a["actor.model_name_or_path"])
    assert s["minibatches"] == 32 * 8 // 128 and run.num_devices == 8
    steps = VALUES["openrlhf"]["steps"]
    logged = [(st["total_length"] - st["response_length"], st["response_length"], None,
               st["rollout/num_samples"] / 256) for st in steps]
    expect = _verl_engine_total(a["actor.model_name_or_path"], logged, prompts=32, G=8,
                                beta=0.001, gc=True, minibatches=2)
    assert run.account.executed.total_flops == pytest.approx(expect, rel=1e-12)
    assert run.phase_seconds == pytest.approx({
        "search": sum(st["timing/generation"] for st in steps),
        "learning": sum(st["timing/make_experience"] + st["timing/ppo_train"] for st in steps),
        "reward": 0.0})


@has_tb
def test_openrlhf_tensorboard_equals_the_console(tmp_path):
    """The event files (``train/<key>`` scalars, float32) with the console's config next to them
    give the console's account (lengths equal to float32 precision)."""
    shutil.copytree(DATA / "openrlhf_tb", tmp_path / "tb")
    text = OPENRLHF_LOG.read_text(encoding="utf-8").splitlines()
    (tmp_path / "tb" / "train.log").write_text(text[1] + "\n")  # the config line only
    tb, console = import_openrlhf(tmp_path / "tb"), import_openrlhf(OPENRLHF_LOG)
    assert tb.settings == console.settings and tb.steps == console.steps == 3
    assert tb.account.executed.total_flops == pytest.approx(console.account.executed.total_flops,
                                                            rel=1e-6)
    with pytest.raises(RunLogError, match="no config") as e:
        import_openrlhf(DATA / "openrlhf_tb")
    assert "\n" not in str(e.value)


def test_openrlhf_ppo_with_a_critic_is_refused(tmp_path):
    f = tmp_path / "ppo.log"
    f.write_text(OPENRLHF_LOG.read_text(encoding="utf-8").replace("'group_norm'", "'gae'"),
                 encoding="utf-8")
    with pytest.raises(RunLogError, match="estimator='gae'.*PPO with a critic is not priced"):
        import_openrlhf(f)


@has_tb
def test_nemo_rl_tensorboard_by_hand_and_its_own_flops():
    run = import_nemo_rl(DATA / "nemo_rl_tb")
    c = VALUES["nemo_rl"]["config"]
    s = run.settings
    assert (s["prompts"], s["group_size"], s["model"], s["beta"], s["minibatches"],
            s["gradient_checkpointing"], s["lora_rank"]) == (32, 16, "Qwen/Qwen2.5-1.5B", 0.01,
                                                              1, False, 0)
    assert run.num_devices == c["cluster"]["gpus_per_node"] * c["cluster"]["num_nodes"]
    steps = VALUES["nemo_rl"]["steps"]
    # TensorBoard stores float32: the lengths as written, read back
    f32 = lambda x: __import__("struct").unpack("f", __import__("struct").pack("f", x))[0]  # noqa: E731
    logged = [(f32(st["train/mean_prompt_length"]), f32(st["train/mean_gen_tokens_per_sample"]),
               f32(st["train/max_gen_tokens_per_sample"]),
               f32(st["train/total_num_tokens"]) / (f32(st["train/mean_prompt_length"])
                                                    + f32(st["train/mean_gen_tokens_per_sample"])) / 512)
              for st in steps]
    expect = _verl_engine_total("Qwen/Qwen2.5-1.5B", logged, prompts=32, G=16, beta=0.01,
                                gc=False, minibatches=1)
    assert run.account.executed.total_flops == pytest.approx(expect, rel=1e-9)
    secs = {"search": sum(st["timing/train/generation"] for st in steps),
            "reward": sum(st["timing/train/reward_calculation"] for st in steps),
            "learning": sum(st["timing/train/policy_and_reference_logprobs"]
                            + st["timing/train/policy_training"] for st in steps)}
    assert run.phase_seconds == pytest.approx(secs, rel=1e-6)
    # NeMo-RL's own training TFLOP/s per GPU next to allocopt's update FLOPs over the same seconds
    ln = run.account.executed.learning
    train_s = sum(st["timing/train/policy_training"] for st in steps)
    ours = (ln["forward"] + ln["backward"]) / train_s / 8 / 1e12
    theirs = sum(st["performance/train_flops_per_gpu"] * st["timing/train/policy_training"]
                 for st in steps) / train_s
    line = run.fields_read["performance/train_flops_per_gpu"]
    assert f"NeMo-RL {theirs:.3g} TFLOP/s" in line and f"same seconds {ours:.3g}" in line
    # the fixture's value is NeMo-RL's own: nemo_rl/utils/flops_formulas.py lines 127-167
    # (qwen2), summed over the step's rows by FLOPTracker.track_batch, over policy_training
    # seconds, per GPU (nemo_rl/algorithms/utils.py lines 861-874); written here in closed
    # form per row of s tokens: 6·L·s·d²·(4 + s/d) + 18·L·s·d·f + 6·s·d·V (Qwen2.5-1.5B)
    d, L, f, V = 1536, 28, 8960, 151936
    nemo = lambda n: 6 * L * n * d * d * (4 + n / d) + 18 * L * n * d * f + 6 * n * d * V  # noqa: E731
    for st, rows in zip(steps, VALUES["nemo_rl"]["rows"]):
        assert len(rows) == 512 and st["train/total_num_tokens"] == sum(p + c for p, c in rows)
        by_hand = sum(nemo(p + c) for p, c in rows) / st["timing/train/policy_training"] / 1e12 / 8
        assert st["performance/train_flops_per_gpu"] == pytest.approx(by_hand, rel=1e-12)
        assert f32(st["performance/train_flops_per_gpu"]) == pytest.approx(by_hand, rel=1e-6)  # as logged


def test_cli_from_openrlhf_and_nemo_rl(capsys):
    from typer.testing import CliRunner

    from allocopt.cli import app, main

    r = CliRunner().invoke(app, ["account", "--from-openrlhf", str(OPENRLHF_LOG), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["total_flops"] == import_openrlhf(OPENRLHF_LOG).account.executed.total_flops
    for argv, needle in (
            (["--from-openrlhf", str(OPENRLHF_LOG), "--from-verl", str(OPENRLHF_LOG)],
             "from_verl, from_openrlhf: give one run, not 2"),
            (["--from-nemo-rl", str(DATA / "nope")], "file not found")):
        with pytest.raises(SystemExit) as e:
            main(["account", *argv])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and needle in err and "\n" not in err
