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
                    **arg_changes) -> Path:
    """A folder as TRL < 0.18 left it: training_args.bin without ``generation_batch_size`` or
    ``distributed_state`` (a plain pickle of the fields; the reader takes both)."""
    out = tmp_path / "run"
    out.mkdir(parents=True)
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


def test_trl_numbers_that_cannot_be_one_process_are_refused(tmp_path):
    """An 8-process run of an old TRL: the mean over 48 gathered lengths (261 / 48 = 5.4375)
    times the 6 rows one process has is 32.625, not a whole number of tokens: refused in one
    line; with --prompts (over all processes) it is accounted, with the world size not assumed."""
    folder = _old_trl_folder(tmp_path, [261 / 48, 7.5, 8.0, 7.0], state_from=TRL8)
    with pytest.raises(RunLogError, match="not a whole number of tokens") as e:
        import_trl(folder, model=BASE)
    assert "\n" not in str(e.value) and "--prompts" in str(e.value)
    run = import_trl(folder, model=BASE, prompts=16)
    assert run.settings["prompts"] == 16 and "world_size" not in run.fields_assumed
    # a one-process log of an old TRL (whole numbers) is accounted, the world size assumed
    ok = import_trl(_old_trl_folder(tmp_path / "b", [5.5, 7.5, 8.0, 7.0]), model=BASE)
    assert "world_size" in ok.fields_assumed
    assert ok.account == import_trl(TRL, model=BASE).account


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
