"""Every command refuses bad input the same way: exit code 2 and exactly one line naming the
field, the value and what is allowed, no traceback, within 10 s and 2 GB of address space,
and nothing recorded. Every row runs in this process (conftest's ``cli``: ``allocopt.cli.main``,
within 10 s and with at most 2 GB more address space than before the call); one row per command
runs in a subprocess (``python -m allocopt.cli``, within 10 s and 2 GB of address space in all).

Each row: (kind, arguments, substrings the line must contain: the field, the value, what is
allowed). ``{tmp}`` is the test's folder, which holds an empty Optuna study ``s`` in
``s.db`` (for the query commands) and a study file without a budget (``nob.toml``).
"""

import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 2 * 1024**3
TIMEOUT_S = 10
SYN = ["--objective", "synthetic", "--target", "pass@1"]
S = ["--study", "s", "--storage", "sqlite:///{tmp}/s.db"]

ROWS = [
    # ---- account
    ("account: huge G", ["account", "-G", "1000000000"], ["group_size", "1000000000", "at most 65536"]),
    ("account: G below 2", ["account", "-G", "1"], ["group_size=1", ">= 2"]),
    ("account: no prompts", ["account", "--prompts", "0"], ["prompts=0", ">= 1"]),
    ("account: NaN prompt length", ["account", "--prompt-tokens", "nan"], ["prompt_tokens=nan", ">= 1"]),
    ("account: negative passes", ["account", "--update-passes", "-1"], ["update_passes=-1.0", "must be a number"]),
    ("account: unknown engine", ["account", "--engine", "foo"], ["engine='foo'", "allowed: trl-cpu"]),
    ("account: negative LoRA rank", ["account", "--lora-rank", "-3"], ["lora_rank=-3", ">= 0"]),
    ("account: missing recipe file", ["account", "--recipe", "{tmp}/none.toml"], ["recipe=", "none.toml", "file not found"]),
    ("account: zero steps", ["account", "--steps", "0"], ["steps=0", ">= 1"]),
    ("account: negative beta", ["account", "--beta", "-1"], ["beta=-1.0", ">= 0"]),
    ("account: G not an integer", ["account", "-G", "abc"], ["'--group-size'", "valid integer"]),
    ("account: unknown LoRA target", ["account", "--lora-targets", "bogus_proj"], ["bogus_proj", "allowed: q_proj"]),
    # ---- plan
    ("plan: negative budget", ["plan", "--budget", "-5", "--rho", "0.5"], ["budget_flops='-5'", "positive finite"]),
    ("plan: budget not a number", ["plan", "--budget", "abc", "--rho", "0.5"], ["budget_flops='abc'", "positive number"]),
    ("plan: infinite budget", ["plan", "--budget", "inf", "--rho", "0.5"], ["budget_flops='inf'", "finite"]),
    ("plan: NaN budget", ["plan", "--budget", "nan", "--rho", "0.5"], ["budget_flops='nan'", "finite"]),
    ("plan: budget below one iteration", ["plan", "--budget", "1", "--rho", "0.5"],
     ["budget_flops=1", "smallest feasible plan needs"]),
    ("plan: rho above 1", ["plan", "--budget", "1e19", "--rho", "1.5"], ["rho=1.5", "strictly between 0 and 1"]),
    ("plan: rho 0", ["plan", "--budget", "1e19", "--rho", "0"], ["rho=0.0", "strictly between 0 and 1"]),
    ("plan: rho not a number", ["plan", "--budget", "1e19", "--rho", "abc"], ["rho='abc'", "a number"]),
    ("plan: huge G", ["plan", "--budget", "1e19", "--rho", "0.5", "-G", "1000000000"],
     ["group_size=1000000000", "at most 65536"]),
    ("plan: unknown reward", ["plan", "--budget", "1e19", "--rho", "0.5", "--reward", "foo"],
     ["reward='foo'", "allowed: sparse"]),
    ("plan: one rollout", ["plan", "--budget", "1e19", "--rho", "0.5", "--rollouts", "1"],
     ["rollouts_per_iteration=1", "from 2 to 65536"]),
    ("plan: huge rollouts", ["plan", "--budget", "1e19", "--rho", "0.5", "--rollouts", "100000000"],
     ["rollouts_per_iteration=100000000", "from 2 to 65536"]),
    ("plan: empty completions", ["plan", "--budget", "1e19", "--rho", "0.5", "--completion-tokens", "0"],
     ["completion_tokens=0.0", ">= 1"]),
    ("plan: unknown engine", ["plan", "--budget", "1e19", "--rho", "0.5", "--engine", "nope"], ["engine='nope'", "allowed"]),
    ("plan: negative beta", ["plan", "--budget", "1e19", "--rho", "0.5", "--beta", "-1"], ["beta=-1.0", ">= 0"]),
    ("plan: negative LoRA rank", ["plan", "--budget", "1e19", "--rho", "0.5", "--lora-rank", "-1"],
     ["lora_rank=-1", "positive integer"]),
    ("plan: budget missing", ["plan", "--rho", "0.5"], ["budget: missing", "--budget FLOPS", "--budget-gpu-hours"]),
    ("plan: unknown flag", ["plan", "--budget", "1e19", "--rho", "0.5", "--bogus-flag", "1"],
     ["No such option", "--bogus-flag"]),
    # ---- trial
    ("trial: years of CPU", ["trial", "--objective", "tiny", "--budget", "1e19", "--rho", "0.5"],
     ["budget=1e+19", "31.7 years", "at most 1.0 h", "--yes"]),
    ("trial: unknown objective", ["trial", "--objective", "nope", "--budget", "1e12", "--rho", "0.5"],
     ["objective='nope'", "allowed: "]),
    ("trial: negative seed", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "0.5", "--seed", "-1"],
     ["seed=-1", "from 0 to 2**32 - 1"]),
    ("trial: rho 2", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "2"], ["rho=2.0", "between 0 and 1"]),
    ("trial: G 1", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "0.5", "-G", "1"], ["group_size=1", ">= 2"]),
    # ---- study
    ("study: missing spec file", ["study", "--spec", "{tmp}/none.toml"], ["spec=", "none.toml", "file not found"]),
    ("study: spec without budget", ["study", "--spec", "{tmp}/nob.toml"], ["budget_flops", "missing", "--budget"]),
    ("study: no budget at all", ["study", *SYN], ["budget", "missing", "--budget FLOPS"]),
    ("study: unknown target", ["study", "--objective", "synthetic", "--budget", "1e18", "--target", "bleu"],
     ["target='bleu'", "allowed: native_reward"]),
    ("study: target twice", ["study", *SYN, "--budget", "1e18", "--target", "pass@1"],
     ["target='pass@1'", "more than once", "each target once"]),
    ("study: zero trials", ["study", *SYN, "--budget", "1e18", "--trials", "0"], ["trials=0", ">= 1"]),
    ("study: negative pilots", ["study", *SYN, "--budget", "1e18", "--pilots", "-1"], ["pilots=-1", ">= 0"]),
    ("study: pilot fraction 1.5", ["study", *SYN, "--budget", "1e18", "--pilot-fraction", "1.5"],
     ["pilot_fraction=1.5", "(0, 1)"]),
    ("study: quoted pilot fraction in the file", ["study", "--spec", "{tmp}/pf.toml"],
     ["pilot_fraction='0.25'", "must be a number"]),
    ("study: too few pilots", ["study", *SYN, "--budget", "1e18", "--pilots", "3"],
     ["--pilots 3", "too few", "needs at least"]),
    ("study: unknown sampler", ["study", *SYN, "--budget", "1e18", "--sampler", "foo"], ["sampler='foo'", "allowed: botorch"]),
    ("study: budget below every allocation", ["study", *SYN, "--budget", "1e12", "--pilots", "0", "--no-mlflow",
                                              "--storage", "sqlite:///{tmp}/o.db"],
     ["budget_flops=1e+12", "any allocation", "smallest feasible plan", "needs"]),
    ("study: storage URL typo", ["study", *SYN, "--budget", "1e18", "--storage", "bogus://x",
                                 "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='bogus://x'", "not a database URL", "allowed: sqlite"]),  # m.db not made either
    ("study: storage URL typo, no pilots", ["study", *SYN, "--budget", "1e18", "--pilots", "0", "--storage",
                                            "postgresq://u@h/db", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='postgresq://u@h/db'", "allowed: sqlite"]),
    ("study: SQLite file in a missing folder", ["study", *SYN, "--budget", "1e18", "--storage",
                                                "sqlite:///{tmp}/no/such/x.db", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage=", "cannot be opened", "does not exist"]),  # m.db not made either
    ("race: PostgreSQL server not there", ["race", *SYN, "--budget", "1e18", "--storage",
                                           "postgresql://u:pw@127.0.0.1:1/x", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='postgresql://u:***@127.0.0.1:1/x'", "cannot be opened", "Connection refused"]),
    ("study: negative seed", ["study", *SYN, "--budget", "1e18", "--seed", "-1"], ["seed=-1", "from 0"]),
    ("study: unknown objective", ["study", "--objective", "nope", "--budget", "1e18", "--target", "pass@1"],
     ["objective='nope'", "allowed: "]),
    # ---- race
    ("race: no target", ["race", "--objective", "synthetic", "--budget", "1e18"], ["target", "missing", "--target"]),
    ("race: pilot fraction 0", ["race", *SYN, "--budget", "1e18", "--pilot-fraction", "0"],
     ["pilot_fraction=0.0", "between 0 and 1"]),
    ("race: negative validations", ["race", *SYN, "--budget", "1e18", "--validations", "-1"], ["validations=-1", ">= 0"]),
    ("race: pilots below every allocation", ["race", *SYN, "--budget", "1e14", "--no-mlflow",
                                             "--storage", "sqlite:///{tmp}/o.db"],
     ["pilot_fraction=0.1", "1e+13", "smallest feasible plan", "budget_flops >= "]),
    ("race: budget below every allocation", ["race", *SYN, "--budget", "1e12", "--no-mlflow",
                                             "--storage", "sqlite:///{tmp}/o.db"],
     ["budget_flops=1e+12", "too small for one GRPO iteration", "smallest feasible plan"]),
    ("race: zero pilots", ["race", *SYN, "--budget", "1e18", "--max-pilots", "0"], ["max_pilots=0", ">= 3"]),
    ("race: negative budget", ["race", *SYN, "--budget", "-1"], ["budget_flops='-1'", "positive"]),
    # ---- best / pareto / report
    ("best: no study named", ["best", "--target", "pass@1"], ["study=None", "--study NAME"]),
    ("best: unknown study", ["best", "--target", "pass@1", "--study", "nope", "--storage", "sqlite:///{tmp}/s.db"],
     ["study='nope'", "known: s"]),
    ("best: missing database", ["best", "--target", "pass@1", "--study", "s", "--storage", "sqlite:///{tmp}/none.db"],
     ["storage=", "none.db", "no such database file"]),
    ("best: unknown target", ["best", "--target", "bleu", *S], ["target='bleu'", "targets measured"]),
    ("best: unknown fidelity", ["best", "--target", "pass@1", "--fidelity", "sideways"],
     ["fidelity='sideways'", "allowed: full, pilot, all"]),
    ("best: malformed filter", ["best", "--target", "pass@1", "--where", "rho"], ["where='rho'", "allowed forms"]),
    ("pareto: target nobody measured", ["pareto", "--objectives", "pass@1,judge", *S],
     ["objective='pass@1'", "no complete trial measured it"]),
    ("report: unknown fidelity", ["report", "--out", "{tmp}/r", "--fidelity", "sideways"],
     ["fidelity='sideways'", "allowed: full, pilot, all"]),
    ("report: unknown target", ["report", "--out", "{tmp}/r", "--targets", "bleu", *S], ["target='bleu'", "targets measured"]),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import optuna

    tmp = tmp_path_factory.mktemp("bad")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(storage=f"sqlite:///{tmp}/s.db", study_name="s")
    (tmp / "nob.toml").write_text('name = "nob"\nobjective = "synthetic"\ntrials = 2\n')
    (tmp / "pf.toml").write_text('name = "pf"\nobjective = "synthetic"\nbudget_flops = 1e18\npilot_fraction = "0.25"\n')
    return tmp


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_at_least_40_kinds_over_every_command():
    commands = {args[0] for _, args, _ in ROWS}
    assert len(ROWS) >= 40 and commands >= {"account", "plan", "trial", "study", "race", "best", "pareto", "report"}


def _check(kind, r, needles):
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2, (kind, r.returncode, lines[-5:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (kind, lines[:5])
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0], (kind, needle, lines[0])


@contextlib.contextmanager
def _address_space_grows_at_most(extra: int):
    """This process may map at most ``extra`` more bytes inside the block (``RLIMIT_AS``'s soft
    limit, restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("kind,args,needles", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2(folder, kind, args, needles, cli):
    before = sorted(p.name for p in folder.iterdir())
    argv = [a.replace("{tmp}", str(folder)) for a in args]
    t0 = time.perf_counter()
    with _address_space_grows_at_most(MEMORY_LIMIT):
        r = cli(*argv, cwd=folder, env={"COLUMNS": "200"})
    assert time.perf_counter() - t0 < TIMEOUT_S, kind
    _check(kind, r, needles)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing recorded, nothing created


FIRST_OF_EACH_COMMAND = [r for i, r in enumerate(ROWS) if r[1][0] not in {x[1][0] for x in ROWS[:i]}]


@pytest.mark.parametrize("kind,args,needles", FIRST_OF_EACH_COMMAND, ids=[r[0] for r in FIRST_OF_EACH_COMMAND])
def test_bad_input_is_one_line_exit_2_in_a_fresh_process(folder, kind, args, needles):
    before = sorted(p.name for p in folder.iterdir())
    argv = [a.replace("{tmp}", str(folder)) for a in args]
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", *argv], cwd=folder, capture_output=True,
                       text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    _check(kind, r, needles)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing recorded, nothing created


def test_a_refused_resume_leaves_the_study_and_its_mlflow_runs_as_they_were(tmp_path, cli, mlflow_store):
    """Resuming a finished study under another budget or target is refused in one line before
    MLflow is touched: its parent run stays FINISHED with the same end time (it was turned
    FAILED), and neither store changes by a byte."""
    from mlflow import MlflowClient

    base = ["study", "--objective", "synthetic", "--pilots", "0",
            "--trials", "1", "--sampler", "random", "--no-report", "--storage", f"sqlite:///{tmp_path}/o.db",
            "--mlflow-uri", mlflow_store]
    env = {"COLUMNS": "200"}
    r = cli(*base, "--budget", "1e18", "--target", "pass@1", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]

    def parent():
        c = MlflowClient(mlflow_store)
        exp = c.get_experiment_by_name("allocopt/allocopt")
        (run,) = [x for x in c.search_runs([exp.experiment_id]) if x.data.tags.get("allocopt.role") == "study"]
        return run.info.status, run.info.end_time
    before = parent(), (tmp_path / "o.db").read_bytes(), (tmp_path / "mlflow.db").read_bytes()
    assert before[0][0] == "FINISHED"
    for args, needle in ((["--budget", "2e18", "--target", "pass@1"], "it was run with budget 1e+18, not 2e+18"),
                         (["--budget", "1e18", "--target", "judge"], "it was run with target 'pass@1', not 'judge'")):
        r = cli(*base, *args, cwd=tmp_path, env=env)
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], lines[:5]
        assert (parent(), (tmp_path / "o.db").read_bytes(), (tmp_path / "mlflow.db").read_bytes()) == before
