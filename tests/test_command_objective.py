"""The ``command`` objective: a study that launches the user's own training command per trial.

Fast tests drive a small shell script as the command (each failure kind, a success with its
compute in the metrics file, an overrun); the slow one runs the real TRL job
``examples/trl_tiny_grpo.py`` as the command of a 2-trial study in a subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from allocopt.objective import register_objective

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> str:
    """``objectives.command:make`` as pyproject.toml declares it (entry-point group ``allocopt.objectives``)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    return eps["allocopt.objectives"]["command"]


@pytest.fixture
def command_objective():
    """Register ``command`` in this process from pyproject's declaration (the installed
    metadata may predate it)."""
    import importlib

    module, _, attr = _declared().partition(":")
    make = getattr(importlib.import_module(module), attr)
    register_objective("command", make, targets=getattr(make, "targets", None), replace=True)
    return make


def entry_point_path(tmp_path: Path) -> str:
    """A folder holding a distribution whose only entry point is pyproject's ``command`` line,
    for subprocesses (importlib.metadata finds it on ``PYTHONPATH``)."""
    d = tmp_path / "eps" / "allocopt_command_ep-0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: allocopt-command-ep\nVersion: 0\n")
    (d / "entry_points.txt").write_text(f"[allocopt.objectives]\ncommand = {_declared()}\n")
    return str(tmp_path / "eps")


@pytest.mark.parametrize("settings, needle", [
    ({"command": "echo hi"}, "must contain {trial_dir}"),
    ({"command": ""}, "command=''"),
    ({"command": "run {trial_dir} {gpu}"}, "unknown placeholder {gpu}"),
    ({"command": "run {trial_dir", }, "not a valid template"),
    ({"command": "run {trial_dir}", "format": "megatron"}, "format='megatron'"),
    ({"command": "run {trial_dir}", "timeout_s": 0.0}, "timeout_s=0.0"),
    ({"command": "run {trial_dir}", "timeout_s": "1h"}, "timeout_s='1h'"),
    ({"command": "run {trial_dir}", "num_gpus": 2}, "'num_gpus': unknown"),
])
def test_bad_settings_are_one_line(command_objective, settings, needle):
    with pytest.raises(ValueError) as e:
        command_objective(**settings)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_template_without_trial_dir_exits_2_before_anything_runs(cli, command_objective, tmp_path):
    r = cli("study", "--objective", "command", "--set", "command=bash train.sh", "--budget", "1e16",
            "--trials", "1", "--pilots", "0", "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/s.db",
            cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "{trial_dir}" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "trials").exists()


JOB = r"""#!/bin/sh
# one behaviour per run of this script, in order (runs.txt counts them)
dir=$1
echo x >> runs.txt
n=$(wc -l < runs.txt)
echo "run $n trial $2 seed $3"
test -f "$dir/grpo_config.json" || { echo "no config"; exit 9; }
case $n in
1) echo boom >&2; exit 3;;
2) sleep 60 & echo $! > sleep.pid; wait;;
3) exit 0;;
4) echo '{"targets": {"judge": 0.5}}' > "$dir/metrics.json";;
5) echo '{"targets": {"pass@1": 0.25}, "search_flops": 1e13, "learning_flops": 2e13, "reward_flops": 0}' > "$dir/metrics.json";;
*) echo '{"pass_at_1": 0.5, "search_flops": 1e16, "learning_flops": 1e16, "reward_flops": 0}' > "$dir/metrics.json";;
esac
"""


def _gone(pid: int) -> bool:
    """No process ``pid``, or only its zombie (killed; a container's init may not reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow  # a whole study or build end to end, several seconds (CI runs -m slow)
def test_failed_commands_fail_their_trials_and_the_study_goes_on(cli, command_objective, tmp_path):
    (tmp_path / "job.sh").write_text(JOB)
    url = f"sqlite:///{tmp_path}/s.db"
    t0 = time.monotonic()
    r = cli("study", "--objective", "command", "--set", "command=sh job.sh {trial_dir} {trial} {seed}",
            "--set", "timeout_s=2.0", "--set", "log=metrics", "--budget", "1e16", "--trials", "8",
            "--tuner", "bo", "--sampler", "random", "--no-mlflow", "--no-report", "--storage", url,
            "--study-name", "s", cwd=tmp_path)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    study = optuna.load_study(study_name="s", storage=url)
    ran = {}  # run number of the script -> trial
    for t in study.trials:
        log = tmp_path / "trials" / "s" / f"trial-{t.number}" / "command.log"
        if log.exists():
            first = [x for x in log.read_text().splitlines() if x.startswith("run ")][0].split()
            assert first[3] == str(t.number) and first[5] == str(t.number)  # {trial}, {seed} = spec seed 0 + trial
            ran[int(first[1])] = t
    assert len(ran) >= 6, [t.state for t in study.trials]
    for n, phrase in [(1, "exited with code 3"), (2, "past timeout_s=2"), (3, "left no metrics file metrics.json"),
                      (4, "target pass@1 missing")]:
        t = ran[n]
        folder = tmp_path / "trials" / "s" / f"trial-{t.number}"
        assert t.state.name == "FAIL"
        err = t.user_attrs["error"]
        assert phrase in err and f"trial folder {folder}" in err and f"log {folder / 'command.log'}" in err
        assert "\n" not in err
    assert "boom" in (tmp_path / "trials" / "s" / f"trial-{ran[1].number}" / "command.log").read_text()
    # the hung command's whole process group was killed (its background sleep too), at the timeout
    pid = int((tmp_path / "sleep.pid").read_text())
    assert _gone(pid)
    assert took < 55
    # a success: the targets and compute the command left, recorded as tell records them
    ok = ran[5]
    assert ok.state.name == "COMPLETE" and ok.values == [0.25]
    m = ok.user_attrs["metrics"]
    assert (m["search_flops"], m["learning_flops"], m["total_flops"]) == (1e13, 2e13, 3e13)
    assert m["budget_utilization"] == pytest.approx(3e13 / 1e16) and m["rho"] == pytest.approx(2 / 3)
    assert ok.constraints["budget"] == -1.0 and ok.user_attrs.get("over_budget") is None
    # an overrun (2e16 of 1e16) is recorded, flagged, with a violated budget constraint
    over = ran[6]
    assert over.state.name == "COMPLETE" and over.values == [0.5] and over.user_attrs["over_budget"] is True
    assert over.constraints["budget"] == pytest.approx(math.log10(2))
    ask = json.loads((tmp_path / "trials" / "s" / f"trial-{ok.number}" / "ask.json").read_text())
    cfg = json.loads((tmp_path / "trials" / "s" / f"trial-{ok.number}" / "grpo_config.json").read_text())
    assert ask["trial"] == ok.number and ask["config"] == cfg and "tell" not in ask
    assert cfg["num_generations"] == ok.params["group_size"]


@pytest.mark.slow
def test_study_launches_the_tiny_trl_job(tmp_path):
    """``examples/trl_tiny_grpo.py`` (a real TRL GRPOTrainer run on the tiny world) as the
    command of a 2-trial study: targets from its metrics.json, compute from its TRL logs."""
    runlogs = pytest.importorskip("allocopt.runlogs")
    (tmp_path / "s.toml").write_text(
        'objective = "command"\nbudget_flops = 1e11\ntarget = "pass@1"\nseed = 0\npilots = 0\n'
        'sampler = "random"\n[space]\nrho = [0.3, 0.8]\ngroup_sizes = [4]\nrewards = ["sparse"]\n'
        '[objective_settings]\nplan_objective = "tiny"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), entry_point_path(tmp_path)])}
    url = f"sqlite:///{tmp_path}/s.db"
    cmd = f"{sys.executable} {ROOT / 'examples' / 'trl_tiny_grpo.py'} {{trial_dir}} --eval-problems 100"
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "study", "--spec", "s.toml", "--set",
                        f"command={cmd}", "--trials", "2", "--no-mlflow", "--no-report", "--storage", url,
                        "--study-name", "t"], capture_output=True, text=True, timeout=1200, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    trials = optuna.load_study(study_name="t", storage=url).trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 2, [(t.state.name, t.user_attrs.get("error")) for t in trials]
    for t in done:
        folder = tmp_path / "trials" / "t" / f"trial-{t.number}"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert t.values == [metrics["targets"]["pass@1"]]
        spent = runlogs.import_trl(folder).account.executed
        m = t.user_attrs["metrics"]
        assert m["total_flops"] == spent.total_flops and m["learning_flops"] == spent.learning_flops
        info = json.loads((folder / "ask.json").read_text())
        assert 0.5 < spent.total_flops / info["expected_total_flops"] < 1.5
        assert m["eval_flops"] == metrics["eval_flops"]
