"""A dead worker's trial is failed and its retry queued by a living worker within Optuna's
heartbeat grace period, also while every living worker is busy with a long trial of its own
(not only when one of them next asks, or at the next resume). PostgreSQL (the many-hosts
storage; skipped where no server can be started, required in CI) and SQLite (one host)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S, GRACE_S, TRIAL_S = 1, 4, 60


def _workers_and_kill(url: str, tmp_path: Path) -> dict:
    """Two ``allocopt study`` workers on one study whose trials each sleep :data:`TRIAL_S`;
    once both run a trial, the first is SIGKILLed. Returns what was seen: the seconds from the
    kill until its trial was FAIL with a retry WAITING, and the survivor's trial state then."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALLOCOPT_HEARTBEAT_S": str(INTERVAL_S),
           "ALLOCOPT_GRACE_S": str(GRACE_S)}
    args = [sys.executable, "-m", "allocopt.cli", "study", "--objective", "synthetic", "--budget", "1e18",
            "--target", "pass@1", "--tuner", "bo", "--sampler", "random", "--trials", "4", "--no-mlflow",
            "--no-report", "--study-name", "busy", "--storage", url, "--set", f"sleep_s={TRIAL_S}"]
    procs = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / f"w{i}.txt", "w")) for i in range(2)]
    try:
        running = _wait_both_running(url, procs, tmp_path)
        victim, survivor = procs
        killed = running[victim.pid]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            trials = optuna.load_study(study_name="busy", storage=url).trials
            retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
            if trials[killed].state.name == "FAIL" and retries:
                return {"seconds": time.monotonic() - t0, "retry": retries[0].state.name,
                        "survivor": trials[running[survivor.pid]].state.name}
            time.sleep(0.2)
        raise AssertionError(f"trial {killed} still {trials[killed].state.name} 30 s after its worker died")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)


def _wait_both_running(url: str, procs: list, tmp_path: Path) -> dict[int, int]:
    """Worker pid -> the number of the trial it runs, once both run one."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for i, p in enumerate(procs):
            assert p.poll() is None, (tmp_path / f"w{i}.txt").read_text()[-2000:]
        try:
            trials = optuna.load_study(study_name="busy", storage=url).trials
        except KeyError:  # not created yet
            trials = []
        running = {int(t.system_attrs["allocopt.worker"].rsplit(":", 1)[1]): t.number for t in trials
                   if t.state.name == "RUNNING" and "allocopt.worker" in t.system_attrs}
        if all(p.pid in running for p in procs):
            return running
        time.sleep(0.2)
    raise AssertionError("the two workers did not both start a trial within 120 s")


def _check(seen: dict) -> None:
    # the survivor is still in its own trial: its heartbeat, not its next ask, did it
    assert seen["survivor"] == "RUNNING" and seen["retry"] == "WAITING", seen
    # within the grace period, plus a heartbeat interval to notice, plus a loaded machine's slack
    assert seen["seconds"] <= GRACE_S + 2 * INTERVAL_S + 3, seen


def test_postgresql(pg_database, tmp_path):
    _check(_workers_and_kill(pg_database, tmp_path))


def test_sqlite(tmp_path):
    _check(_workers_and_kill(f"sqlite:///{tmp_path}/busy.db", tmp_path))
