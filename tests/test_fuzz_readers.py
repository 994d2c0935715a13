"""Fuzz every reader of a user's file (hypothesis): random bytes, truncations of a real file,
and real files with a number, a name or a line changed for a hostile one (too long, in other
scripts, out of range, a backtracking pattern, nesting past Python's recursion limit, a line
repeated past the repeat limit). Whatever the file holds, the reader returns or raises its one
error type (a ``ValueError`` of :mod:`allocopt.errors`: ``ConfigError``, ``RunLogError``; a
failed trial for the ``command`` objective) with a one-line message, never another exception;
each example within the hypothesis deadline (:data:`DEADLINE`, the same example run again if
it overruns) and 2 GB more address space.

Readers: the four run importers (``import_verl``, ``import_trl`` of each of its three files,
``import_openrlhf``, ``import_nemo_rl`` of an event file), ``tell --metrics`` (its reading and
checks), a study file (``StudySpec.from_toml``), a throughput profile (JSON and TOML), a
lengths file (CSV and JSON lines), the ``tiny-table`` objective's table, the ``command``
objective's metrics file and a model's ``config.json``. Derandomized (the same examples every
run); :data:`FUZZ_EXAMPLES` per reader by default, :data:`SLOW_EXAMPLES` under ``-m slow``.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocopt.errors import ConfigError, RunLogError, TrialFailed
from test_bad_inputs import MEMORY_LIMIT, _address_space_grows_at_most

DATA = Path(__file__).resolve().parent / "data" / "runlogs"
FUZZ_EXAMPLES = 12
SLOW_EXAMPLES = 200
DEADLINE = timedelta(seconds=10)
"""Bound on one example: a refusal takes milliseconds, a file that is still valid is read and
priced (a few steps: well under a second); 10 s leaves room for a loaded machine."""

NUMBERS = ["1e400", "-1e400", "1" * 5000, "1" * 70, "-3", "0", "52", "NaN", "Infinity", '"8"', '"abc"',
           "true", "null", "1e300", "-0.0", "[]", "{}", "١٢٣", "1_000", '"١٢"', "0x10"]
"""Values spliced in where a number was: out of range, out of float range, too many digits,
zero, negative, strings, wrong types, digits of another script, Python-only spellings."""
NAMES = ["(a+)+$", "(a|aa)*b", ".*.*.*.*x", "x" * 70_000, "\x1b[2J", "", "..", "/dev/zero", "١٢٣"]
"""Values spliced in where a quoted name was: backtracking patterns, a string past the limit,
control characters, empty, paths that are not files, digits of another script."""
DEPTHS = [1, 2, 63, 65, 1000, 100_000]
"""Nesting depths tried: around :data:`allocopt.limits.MAX_DEPTH` and past Python's recursion limit."""
REPEATS = [2, 1001, 3000]
"""Times one line is repeated: around :data:`allocopt.limits.MAX_REPEATS`."""


def _splice(text: str, pattern: str, which: int, value: str) -> str:
    spans = [m.span() for m in re.finditer(pattern, text)]
    if not spans:
        return text + value
    a, b = spans[which % len(spans)]
    return text[:a] + value + text[b:]


def _repeat_line(text: str, which: int, times: int) -> str:
    lines = text.splitlines(keepends=True) or [text]
    i = which % len(lines)
    return "".join(lines[:i] + [lines[i]] * times + lines[i + 1:])


def contents(seed: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes; ``seed`` cut short; ``seed`` with a number or a quoted name replaced; a
    line of it repeated; nesting :data:`DEPTHS` deep (alone or as a value in ``seed``)."""
    text = seed.decode("utf-8", errors="replace")
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    name = r"""(?<=["'])[A-Za-z_./@-][\w./@ -]*(?=["'])"""
    return st.one_of(
        st.binary(max_size=2000),
        st.integers(0, max(0, len(seed) - 1)).map(lambda n: seed[:n]),
        st.tuples(st.integers(0, 10_000), st.sampled_from(NUMBERS)).map(
            lambda t: _splice(text, number, *t).encode()),
        st.tuples(st.integers(0, 10_000), st.sampled_from(NAMES)).map(
            lambda t: _splice(text, name, *t).encode()),
        st.tuples(st.integers(0, 10_000), st.sampled_from(REPEATS)).map(
            lambda t: _repeat_line(text, *t).encode()),
        st.tuples(st.sampled_from(DEPTHS), st.sampled_from(["[", "{\"a\":", "{a=", "(", "{'a':"]),
                  st.booleans()).map(
            lambda t: (t[1] * t[0]).encode() if not t[2] else _splice(text, number, t[0], t[1] * t[0]).encode()),
    )


def _tell(path: Path) -> None:
    from allocopt.cli.asktell import _read_metrics
    from allocopt.spec import StudySpec
    from allocopt.run_metrics import account_from_metrics, targets_from_metrics

    data = _read_metrics(path)
    targets_from_metrics(data, StudySpec())
    account_from_metrics(data)


def _command_metrics(path: Path) -> None:
    from objectives.command import _nothing_spent, make

    make(command="run {trial_dir}", log="metrics")._metrics(path, "trial folder x", _nothing_spent(1e16))


def _tiny_table(path: Path) -> None:
    from objectives.tiny_table import TinyTableObjective

    TinyTableObjective(table=str(path))


def _spec(path: Path) -> None:
    from allocopt.spec import StudySpec

    StudySpec.from_toml(path)


def _profile(path: Path) -> None:
    from allocopt.plan.throughput import load_profile

    load_profile(path)


def _lengths(path: Path) -> None:
    from allocopt.flops.lengths import read_lengths

    read_lengths(path)


def _model(path: Path) -> None:
    from allocopt.flops import ModelShape

    ModelShape.from_pretrained(str(path.parent))


def _verl(path: Path) -> None:
    from allocopt.runlogs import import_verl

    import_verl(path)


def _trl(path: Path) -> None:
    from allocopt.runlogs import import_trl

    import_trl(path.parent, model=str(path.parent / "base"))


def _openrlhf(path: Path) -> None:
    from allocopt.runlogs import import_openrlhf

    import_openrlhf(path)


def _nemo(path: Path) -> None:
    from allocopt.runlogs import import_nemo_rl

    import_nemo_rl(path.parent)


TABLE = ("reward,group_size,rho,fidelity,budget_flops,seed,status,native_reward,pass_at_1,judge,"
         "search_flops,learning_flops,reward_flops\n"
         + "".join(f"sparse,2,{r},full,3e11,0,complete,0.5,0.{i},0.5,1e11,1e11,0\n"
                   for i, r in enumerate((0.2, 0.5, 0.8), 1)))
SPEC = ('name = "f"\nobjective = "synthetic"\ntarget = "pass@1"\nbudget_flops = 1e18\ntrials = 2\n'
        'pilots = 0\n[space]\nrho = [0.3, 0.8]\ngroup_sizes = [4, 8]\nrewards = ["sparse", "dense"]\n')
PROFILE = {"gpu": "H100-80GB", "setup_fingerprint": "*", "search_prefill": 4e14, "search_decode": 1e14,
           "learning": 3e14, "gpus": 8}

NEMO_EVENTS = next((DATA / "nemo_rl_tb" / "tensorboard").glob("events.*"))
NEMO_HPARAMS = next((DATA / "nemo_rl_tb" / "tensorboard").glob("*/events.*"))

READERS: dict[str, tuple[str, Callable[[], bytes], Callable[[Path], None], type]] = {
    # reader: (the file's path in the place, its seed, the call, its one error type)
    "verl log": ("verl.log", lambda: (DATA / "verl_gae_n4.log").read_bytes(), _verl, RunLogError),
    "verl DAPO log": ("verl.log", lambda: (DATA / "verl_dapo.log").read_bytes(), _verl, RunLogError),
    "verl JSON lines": ("verl.log", lambda: "".join(
        json.dumps({"step": i, "data": {"response_length/mean": 300.0 + i, "prompt_length/mean": 100.0}}) + "\n"
        for i in range(1, 4)).encode() + b"data.train_batch_size=8\nactor_rollout_ref.rollout.n=4\n"
        b"actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B\n", _verl, RunLogError),
    "trl trainer_state.json": ("trl/trainer_state.json",
                               lambda: (DATA / "trl_reuse_aligned" / "trainer_state.json").read_bytes(), _trl, RunLogError),
    "trl training_args.bin": ("trl/training_args.bin",
                              lambda: (DATA / "trl_reuse_aligned" / "training_args.bin").read_bytes(), _trl, RunLogError),
    "trl adapter_config.json": ("trl/adapter_config.json",
                                lambda: (DATA / "trl_reuse_aligned" / "adapter_config.json").read_bytes(), _trl, RunLogError),
    "openrlhf log": ("openrlhf.log", lambda: (DATA / "openrlhf_grpo_qwen25_3b.log").read_bytes(), _openrlhf, RunLogError),
    "nemo-rl event file": ("nemo/" + NEMO_EVENTS.name, lambda: NEMO_EVENTS.read_bytes(), _nemo, RunLogError),
    "nemo-rl hparams file": ("nemo/" + NEMO_HPARAMS.parent.name + "/" + NEMO_HPARAMS.name,
                             lambda: NEMO_HPARAMS.read_bytes(), lambda p: _nemo(p.parent), RunLogError),
    "tell --metrics": ("m.json", lambda: json.dumps({"targets": {"pass@1": 0.42}, "breakdown": {
        "search_flops": 3e17, "learning_flops": 5e17, "reward_flops": 0}}).encode(), _tell, ConfigError),
    "study file": ("s.toml", lambda: SPEC.encode(), _spec, ConfigError),
    "throughput JSON": ("p.json", lambda: json.dumps(PROFILE).encode(), _profile, ConfigError),
    "throughput TOML": ("p.toml", lambda: "".join(f"{k} = {json.dumps(v)}\n" for k, v in PROFILE.items()).encode(),
                        _profile, ConfigError),
    "lengths CSV": ("l.csv", lambda: b"prompt_tokens,completion_tokens,count\n" + b"103,304,8\n" * 8,
                    _lengths, ConfigError),
    "lengths JSON lines": ("l.jsonl", lambda: b'{"prompt_tokens": 103, "completion_tokens": 304, "count": 8}\n' * 8,
                           _lengths, ConfigError),
    "tiny-table table": ("t.csv", lambda: TABLE.encode(), _tiny_table, ConfigError),
    "command metrics file": ("metrics.json", lambda: json.dumps({"pass@1": 0.5, "search_flops": 1e16,
                                                               "learning_flops": 1e16, "reward_flops": 0}).encode(),
                             _command_metrics, TrialFailed),
    "model config.json": ("model/config.json", lambda: (DATA / "trl_reuse_aligned" / "base" / "config.json").read_bytes(),
                          _model, ConfigError),
}


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A folder with a TRL run folder (the aligned reuse run), the NeMo-RL fixture's
    TensorBoard folder and room for the other files."""
    tmp = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(DATA / "trl_reuse_aligned", tmp / "trl")
    shutil.copytree(DATA / "nemo_rl_tb" / "tensorboard", tmp / "nemo")
    (tmp / "model").mkdir()
    return tmp


def _read(reader: str, place: Path, data: bytes) -> None:
    """Write ``data`` as the reader's file and call the reader: it returns or raises its one
    error type with a one-line message."""
    target, seed, call, error = READERS[reader]
    path = place / target
    original = path.read_bytes() if path.exists() else None
    path.write_bytes(data)
    try:
        with _address_space_grows_at_most(MEMORY_LIMIT):
            call(path)
    except error as e:
        assert "\n" not in str(e) and str(e), (reader, str(e)[:500])
    finally:
        if original is not None:
            path.write_bytes(original)


def _test(reader: str, examples: int) -> Callable[..., None]:

    @settings(max_examples=examples, derandomize=True, deadline=DEADLINE, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(data=st.data())
    def run(place: Path, data: Any) -> None:
        _read(reader, place, data.draw(contents(READERS[reader][1]())))

    return run


@pytest.mark.parametrize("reader", list(READERS))
def test_the_seed_files_are_read(reader, place):
    """The unfuzzed files are valid (else the fuzz would only ever see a refusal)."""
    target, seed, call, _ = READERS[reader]
    (place / target).write_bytes(seed())
    call(place / target)


@pytest.mark.parametrize("reader", list(READERS))
def test_fuzzed_files_are_read_or_refused_in_one_line(reader, place):
    _test(reader, FUZZ_EXAMPLES)(place)


@pytest.mark.slow
@pytest.mark.parametrize("reader", list(READERS))
def test_fuzzed_files_are_read_or_refused_in_one_line_many(reader, place):
    _test(reader, SLOW_EXAMPLES)(place)
