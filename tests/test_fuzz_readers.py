"""Fuzz the readers of files from other people's jobs (hypothesis): random bytes, truncations
of real files, deep nesting and huge or wrong numbers spliced into them. Whatever the file
holds, the command ends with exit code 0 (a file that is still valid) or 2 with exactly one
line ``error: ...`` naming the file or field, never a traceback, within 10 s and 2 GB more
address space (``allocopt.limits``).

Readers: ``account --from-trl`` (``trainer_state.json``, ``training_args.bin``,
``adapter_config.json``), ``account --from-verl``, ``tell --metrics``, ``study --spec``
(``--dry-run``: nothing runs) and ``account --lengths``. Run in this process through the
``cli`` fixture, derandomized (the same examples every run); ``FUZZ_EXAMPLES`` per reader by
default, ``-m slow`` runs ten times as many.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_bad_inputs import MEMORY_LIMIT, TIMEOUT_S, _address_space_grows_at_most

VALID_TIMEOUT_S = 120
"""Seconds a still-valid fuzzed file may take: the command does its real work (a dry run)."""

DATA = Path(__file__).resolve().parent / "data" / "runlogs"
FUZZ_EXAMPLES = 12
SLOW_EXAMPLES = 120

NUMBERS = ["1e400", "-1e400", "1" * 5000, "-3", "0", "52", "NaN", "Infinity", '"8"', '"abc"', "true",
           "null", "1e300", "-0.0", "[]", "{}"]
"""Values spliced in where a number was: out of range, out of float range, too many digits,
zero, negative, strings, wrong types."""


DEPTHS = [1, 2, 63, 65, 1000, 5000, 100_000, 200_000]
"""Nesting depths tried: around :data:`allocopt.limits.MAX_DEPTH` and past Python's recursion limit."""


def _splice_number(text: str, which: int, value: str) -> str:
    """``text`` with its ``which``-th run of digits (mod their count) replaced by ``value``."""
    import re

    spans = [m.span() for m in re.finditer(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]
    if not spans:
        return text + value
    a, b = spans[which % len(spans)]
    return text[:a] + value + text[b:]


def contents(seed: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes; ``seed`` cut short; ``seed`` with a number replaced; nesting :data:`DEPTHS`
    deep (JSON/TOML brackets, alone or as a value in ``seed``)."""
    text = seed.decode("utf-8", errors="replace")
    return st.one_of(
        st.binary(max_size=2000),
        st.integers(0, max(0, len(seed) - 1)).map(lambda n: seed[:n]),
        st.tuples(st.integers(0, 10_000), st.sampled_from(NUMBERS)).map(
            lambda t: _splice_number(text, *t).encode()),
        st.tuples(st.sampled_from(DEPTHS), st.sampled_from(["[", "{\"a\":", "{a="]), st.booleans()).map(
            lambda t: (t[1] * t[0]).encode() if not t[2] else
            _splice_number(text, t[0], t[1] * t[0]).encode()),
    )


def _check(r, elapsed: float, what: str) -> None:
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr, (what, r.stderr[-3000:])
    assert r.returncode in (0, 2), (what, r.returncode, lines[-5:])
    # a refusal comes at once; a file that is still valid does the command's work (a truncated
    # spec can fall back to the default space: a dry run over it prices its pilot grid)
    assert elapsed < (TIMEOUT_S if r.returncode == 2 else VALID_TIMEOUT_S), (what, elapsed)
    if r.returncode == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), (what, lines[:5])


def _run(cli, args, cwd, what):
    t0 = time.perf_counter()
    with _address_space_grows_at_most(MEMORY_LIMIT):
        r = cli(*args, cwd=cwd, env={"COLUMNS": "200"})
    _check(r, time.perf_counter() - t0, what)
    return r


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder with a copy of the real TRL run, the verl log, a lengths file, a spec, and a
    study ``t`` whose trial 0 is reserved by ``ask`` (for ``tell``)."""
    import os

    from allocopt.cli import main

    tmp = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(DATA / "trl_tiny", tmp / "trl")
    (tmp / "lengths.csv").write_text("prompt_tokens,completion_tokens,count\n" + "103,304,8\n" * 64)
    (tmp / "spec.toml").write_text('name = "f"\nobjective = "synthetic"\ntarget = "pass@1"\nbudget_flops = 1e18\n'
                                   'trials = 2\npilots = 0\n[space]\nrho = [0.3, 0.8]\ngroup_sizes = [4, 8]\n'
                                   'rewards = ["sparse", "dense"]\n')
    (tmp / "metrics.json").write_text(json.dumps({"targets": {"pass@1": 0.42}, "breakdown": {
        "search_flops": 3e17, "learning_flops": 5e17, "reward_flops": 0}}))
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        main(["ask", "--study", "t", "--storage", f"sqlite:///{tmp}/t.db", "--objective", "synthetic",
              "--budget", "1e18", "--target", "pass@1", "--out", str(tmp / "asked"), "--json"])
    except SystemExit as e:
        assert e.code in (0, None), e.code
    finally:
        os.chdir(cwd)
    return tmp


READERS = {
    # reader: (the file written, the seed it is fuzzed from, the command)
    "trl trainer_state.json": ("trl/trainer_state.json", DATA / "trl_tiny" / "trainer_state.json",
                               ["account", "--from-trl", "trl", "--model", "trl/base"]),
    "trl training_args.bin": ("trl/training_args.bin", DATA / "trl_tiny" / "training_args.bin",
                              ["account", "--from-trl", "trl", "--model", "trl/base"]),
    "trl adapter_config.json": ("trl/adapter_config.json", DATA / "trl_tiny" / "adapter_config.json",
                                ["account", "--from-trl", "trl", "--model", "trl/base"]),
    "verl log": ("verl.log", DATA / "verl_r1_qwen25_3b_lora.log", ["account", "--from-verl", "verl.log"]),
    "tell --metrics": ("m.json", None, ["tell", "--study", "t", "--storage", "sqlite:///{tmp}/t.db", "--trial", "0",
                                        "--metrics", "m.json", "--no-mlflow"]),
    "study --spec": ("s.toml", None, ["study", "--spec", "s.toml", "--dry-run", "--storage", "sqlite:///{tmp}/s.db"]),
    "account --lengths": ("l.csv", None, ["account", "--lengths", "l.csv", "--prompts", "8"]),
}
SEEDS = {"tell --metrics": "metrics.json", "study --spec": "spec.toml", "account --lengths": "lengths.csv"}


def _fuzz(reader: str, place: Path, cli, data: bytes) -> None:
    target, _, args = READERS[reader]
    path = place / target
    original = path.read_bytes() if path.exists() else None
    path.write_bytes(data)
    try:
        _run(cli, [a.replace("{tmp}", str(place)) for a in args], place, reader)
    finally:
        if original is not None:
            path.write_bytes(original)


def _seed(reader: str, place: Path) -> bytes:
    _, seed, _ = READERS[reader]
    return (seed if seed is not None else place / SEEDS[reader]).read_bytes()


def _test(reader: str, examples: int):

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(data=st.data())
    def run(place, cli, data):
        _fuzz(reader, place, cli, data.draw(contents(_seed(reader, place))))

    return run


@pytest.mark.parametrize("reader", [r for r in READERS if r != "tell --metrics"])  # tell would record trial 0
def test_the_seed_files_are_read(reader, place, cli):
    """The unfuzzed files are valid (else the fuzz would only ever see a refusal)."""
    target, _, args = READERS[reader]
    (place / target).write_bytes(_seed(reader, place))
    r = _run(cli, [a.replace("{tmp}", str(place)) for a in args], place, reader)
    assert r.returncode == 0, (reader, r.stdout[-500:], r.stderr[-500:])


@pytest.mark.parametrize("reader", list(READERS))
def test_fuzzed_files_are_one_line_or_read(reader, place, cli):
    _test(reader, FUZZ_EXAMPLES)(place, cli)


@pytest.mark.slow
@pytest.mark.parametrize("reader", list(READERS))
def test_fuzzed_files_are_one_line_or_read_many(reader, place, cli):
    _test(reader, SLOW_EXAMPLES)(place, cli)
