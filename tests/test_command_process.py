"""A killed study leaves no training behind (:mod:`objectives.command_process`).

The command of these studies is a Python script that sleeps on its first run (the training
left running) and writes its metrics on later runs; every run appends its pid to ``runs.txt``
and whether a run before it was still alive when it started (two trainings at once). The study
is a real ``allocopt study`` process, killed with SIGKILL or SIGTERM; its resume runs in this
process (conftest's ``cli``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent

from test_command_objective import _gone, command_objective, entry_point_path  # noqa: E402,F401

from objectives.command_process import RECORD, TOKEN_VAR, end_orphans, start_ticks  # noqa: E402

SLEEPER = r"""
import json, os, sys, time
folder = sys.argv[1]
def alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
before = [int(x.split()[0]) for x in open("runs.txt").read().splitlines()] if os.path.exists("runs.txt") else []
overlap = [p for p in before if alive(p)]
with open("runs.txt", "a") as f:
    f.write(f"{os.getpid()} {os.getpgrp()} overlap={overlap}\n")
with open(os.path.join(folder, "sleeper.pid"), "w") as f:
    f.write(str(os.getpid()))
if not before:
    time.sleep(600)
with open(os.path.join(folder, "metrics.json"), "w") as f:
    json.dump({"pass@1": 0.5, "search_flops": 1e15, "learning_flops": 1e15, "reward_flops": 0}, f)
"""
ARGS = ["study", "--objective", "command", "--set", "log=metrics", "--budget", "1e16", "--target", "pass@1",
        "--trials", "1", "--tuner", "bo", "--sampler", "random", "--no-mlflow", "--no-report",
        "--study-name", "s"]


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int, dict]:
    """A study process whose trial 0 runs the sleeper; returns it, the sleeper's pid and the
    command's record, once the sleeper runs."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), entry_point_path(tmp_path)])}
    study = subprocess.Popen([sys.executable, "-m", "allocopt.cli", *ARGS, "--storage", "sqlite:///s.db",
                              "--set", f"command={sys.executable} sleeper.py {{trial_dir}}"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "err.txt", "w"))
    folder = tmp_path / "trials" / "s" / "trial-0"
    deadline = time.monotonic() + 120
    while not (folder / "sleeper.pid").exists():
        assert study.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()[-2000:]
        time.sleep(0.1)
    return study, int((folder / "sleeper.pid").read_text()), json.loads((folder / RECORD).read_text())


def _seconds_until_gone(pid: int, most: float = 15.0) -> float:
    t0 = time.monotonic()
    while not _gone(pid) and time.monotonic() - t0 < most:
        time.sleep(0.02)
    return time.monotonic() - t0


def _resume_and_check(tmp_path: Path, cli) -> list[str]:
    """Resume the study here: it runs the killed trial's work once more, alone. Returns
    ``runs.txt``'s lines."""
    r = cli(*ARGS, "--storage", "sqlite:///s.db", "--set", f"command={sys.executable} sleeper.py {{trial_dir}}",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = (tmp_path / "runs.txt").read_text().splitlines()
    assert len(runs) == 2 and runs[1].endswith("overlap=[]"), runs  # one run more, never two at once
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].system_attrs.get("failed_trial") == 0 and trials[1].values == [0.5]
    assert not list((tmp_path / "trials" / "s").glob(f"trial-*/{RECORD}"))
    return runs


def test_a_sigkilled_study_leaves_no_training_and_resumes_it_once(tmp_path, cli, command_objective):
    """SIGKILL of the study: its guard gets SIGTERM from Linux (PR_SET_PDEATHSIG) and ends the
    command's process group at once; the resumed study runs the trial's work once."""
    study, pid, record = _start(tmp_path)
    assert os.getpgid(pid) == record["pgid"] != os.getpgid(study.pid)  # the command's own group
    study.send_signal(signal.SIGKILL)
    study.wait(timeout=10)
    took = _seconds_until_gone(pid)
    print(f"the command was gone {took:.2f} s after its study was SIGKILLed")
    assert took < 5.0, f"the training outlived its study by {took:.1f} s"
    _resume_and_check(tmp_path, cli)


@pytest.mark.slow  # a study process and its resume, ~10 s
def test_a_study_killed_with_its_guard_has_the_orphan_ended_by_the_resume(tmp_path, cli, command_objective):
    """Study and guard SIGKILLed at once: nothing of theirs ends the command, which runs on; the
    resumed study finds it through the trial's record and ends it before running the trial's
    work again, and says so in one warning line."""
    study, pid, record = _start(tmp_path)
    os.kill(record["pgid"], signal.SIGKILL)
    study.send_signal(signal.SIGKILL)
    study.wait(timeout=10)
    time.sleep(1.0)
    assert not _gone(pid), "the command ended without the resume: this test tests nothing"
    with pytest.warns(UserWarning, match=r"^ended the command a stopped worker left running \(2 process"):
        runs = _resume_and_check(tmp_path, cli)  # the shell and the sleeper
    assert _gone(pid) and runs[0].startswith(f"{pid} ")


@pytest.mark.slow  # a study process, ~6 s
def test_sigterm_ends_the_commands_group_and_the_study_exits_143(tmp_path):
    study, pid, _ = _start(tmp_path)
    study.send_signal(signal.SIGTERM)
    assert study.wait(timeout=30) == 143
    assert _gone(pid)
    trial = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db").trials[0]
    assert trial.state.name == "FAIL" and "interrupted" in trial.user_attrs["error"]
    assert not (tmp_path / "trials" / "s" / "trial-0" / RECORD).exists()


def _sleeping(tmp_path: Path, token: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                            env={**os.environ, TOKEN_VAR: token})


def test_end_orphans_ends_only_what_a_gone_worker_left(tmp_path):
    """Three records: a gone worker's (its command is ended, its record removed), a live
    worker's (this process: left alone), another host's (left alone)."""
    import socket

    gone_worker = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_worker.wait()
    cases = {"gone": (gone_worker.pid, socket.gethostname()), "live": (os.getpid(), socket.gethostname()),
             "other-host": (gone_worker.pid, "not-" + socket.gethostname())}
    procs = {}
    for name, (worker, host) in cases.items():
        folder = tmp_path / f"trial-{name}"
        folder.mkdir()
        procs[name] = _sleeping(tmp_path, f"token-{name}")
        (folder / RECORD).write_text(json.dumps({"host": host, "pgid": procs[name].pid, "token": f"token-{name}",
                                                 "worker_pid": worker, "worker_start": start_ticks(worker)}))
    try:
        lines = end_orphans(tmp_path, grace_s=5.0)
        assert procs["gone"].wait(timeout=5) == -signal.SIGTERM
        assert procs["live"].poll() is None and procs["other-host"].poll() is None
        assert lines == [f"ended the command a stopped worker left running (1 process(es), trial folder "
                         f"{tmp_path / 'trial-gone'})"]
        assert sorted(p.parent.name for p in tmp_path.glob(f"*/{RECORD}")) == ["trial-live", "trial-other-host"]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_worker_whose_pid_was_taken_is_gone(tmp_path):
    """A record whose worker pid now belongs to another process (another start time) is a gone
    worker's: its command is ended."""
    folder = tmp_path / "trial-0"
    folder.mkdir()
    proc = _sleeping(tmp_path, "token-reused")
    (folder / RECORD).write_text(json.dumps({"host": __import__("socket").gethostname(), "pgid": proc.pid,
                                             "token": "token-reused", "worker_pid": os.getpid(),
                                             "worker_start": start_ticks(os.getpid()) - 1}))
    try:
        assert len(end_orphans(tmp_path, grace_s=5.0)) == 1
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
