"""The live TRL callback never breaks the user's training: its hooks, called as a ``Trainer``
calls them with a state it cannot price, raise nothing; one warning says why its account is
off, and the run's logs are left as they were. (The real TRL run is tests/test_live_trl.py.)"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", reason="the callback is a transformers TrainerCallback")

ARGS = dict(world_size=1, num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=1,
            num_iterations=1, beta=0.0, max_completion_length=64)


def _state(*records: dict) -> SimpleNamespace:
    return SimpleNamespace(log_history=list(records), is_world_process_zero=True)


def _train(cb, args, state, model=None, steps: int = 3) -> tuple[list[dict], list[warnings.WarningMessage]]:
    """The hooks in a Trainer's order for ``steps`` logging steps; returns the logs each step
    handed to the reporters and the warnings raised."""
    control = SimpleNamespace()
    logged = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_train_begin(args, state, control, model=model)
        for step in range(1, steps + 1):
            cb.on_step_begin(args, state, control)
            cb.on_step_end(args, state, control)
            logs = {"loss": 0.5, "completions/mean_length": 10.0}
            state.log_history.append({"step": step, **logs})
            cb.on_log(args, state, control, logs=logs)
            logged.append(logs)
        cb.on_train_end(args, state, control)
    return logged, [w for w in caught if "allocopt" in str(w.message)]


def _off_once(found: list, needle: str) -> None:
    assert len(found) == 1, [str(w.message) for w in found]
    msg = str(found[0].message)
    assert msg.startswith("allocopt: live FLOP account off for this run: ") and needle in msg, msg
    assert "the training goes on" in msg and "\n" not in msg


def test_a_model_whose_config_cannot_be_fetched_offline(tmp_path, monkeypatch):
    from allocopt.runlogs.live import ACCOUNT_FILE, AllocoptCallback

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path="no-such-org/no-such-model-xyz"))
    logged, found = _train(AllocoptCallback(), SimpleNamespace(output_dir=str(tmp_path), **ARGS), _state(), model)
    _off_once(found, "model='no-such-org/no-such-model-xyz'")
    assert logged == [{"loss": 0.5, "completions/mean_length": 10.0}] * 3  # the logs untouched
    assert not (tmp_path / ACCOUNT_FILE).exists()


def test_training_arguments_without_a_field(tmp_path):
    from allocopt.runlogs.live import AllocoptCallback

    args = SimpleNamespace(**ARGS)  # no output_dir
    logged, found = _train(AllocoptCallback(model="Qwen/Qwen2.5-0.5B"), args, _state())
    _off_once(found, "AttributeError")
    assert all(not any(k.startswith("allocopt/") for k in logs) for logs in logged)


def test_a_log_value_that_is_not_a_number(tmp_path):
    from allocopt.runlogs.live import AllocoptCallback

    state = _state({"step": 0, "completions/mean_length": "many"})
    _, found = _train(AllocoptCallback(model="Qwen/Qwen2.5-0.5B"),
                      SimpleNamespace(output_dir=str(tmp_path), **ARGS), state)
    _off_once(found, "completions/mean_length")


def test_an_output_dir_it_cannot_write_warns_at_the_end_only(tmp_path):
    """Priced at every step (a preset model), then the account file cannot be written: the
    steps' logs carry the ``allocopt/*`` keys, the end is one warning."""
    from allocopt.runlogs.live import AllocoptCallback

    (tmp_path / "out").write_text("a file where the output folder should be")
    logged, found = _train(AllocoptCallback(model="Qwen/Qwen2.5-0.5B"),
                           SimpleNamespace(output_dir=str(tmp_path / "out"), **ARGS), _state())
    _off_once(found, "FileExistsError")
    for logs in logged:
        parts = logs["allocopt/search_flops"] + logs["allocopt/learning_flops"] + logs["allocopt/reward_flops"]
        assert logs["allocopt/total_flops"] == parts > 0
    assert [x["allocopt/total_flops"] for x in logged] == sorted(x["allocopt/total_flops"] for x in logged)
