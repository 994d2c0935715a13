"""``allocopt workers``: one study worker per GPU on a host (allocopt.store.launch); the many-workers storage tests are tests/test_workers.py."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from allocopt.flops import ConfigError
from allocopt.store.launch import parse_gpus, run_workers, worst_exit_code

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, groups", [
    ("0,1,2,3", ["0", "1", "2", "3"]), ("0-3", ["0", "1", "2", "3"]), ("2", ["2"]),
    ("0+1,2+3", ["0,1", "2,3"]), (" 4 , 6-7", ["4", "6", "7"]),
])
def test_parse_gpus(text, groups):
    assert parse_gpus(text) == groups


@pytest.mark.parametrize("text, needle", [
    ("", "give GPU indices"), ("0,,1", "give GPU indices"), ("a", "'a' is not a GPU index"),
    ("3-1", "'3-1' is not a range"), ("0,0", "GPU 0 is named twice"), ("0-2,1+3", "GPU 1 is named twice"),
])
def test_bad_gpus_are_one_line(text, needle):
    with pytest.raises(ConfigError) as e:
        parse_gpus(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_worst_exit_code():
    assert worst_exit_code([0, 0]) == 0
    assert worst_exit_code([0, 2, 1]) == 2
    assert worst_exit_code([0, -signal.SIGINT]) == 130  # killed by SIGINT, as a shell says


def test_each_worker_gets_its_gpus_prefix_and_the_worst_code():
    """Workers that print their environment and exit with 3 × their index."""
    code = "import os, sys; print('cvd', os.environ['CUDA_VISIBLE_DEVICES'], 'w', os.environ['ALLOCOPT_WORKER'], sys.argv[1:]); sys.exit(3 * int(os.environ['ALLOCOPT_WORKER']))"
    out = io.StringIO()
    rc = run_workers(["0", "1,2", "3"], ["--x", "y"], out=out, command=[sys.executable, "-c", code])
    lines = sorted(out.getvalue().splitlines())
    assert lines == ["[gpu   0] cvd 0 w 0 ['--x', 'y']", "[gpu   3] cvd 3 w 2 ['--x', 'y']",
                     "[gpu 1,2] cvd 1,2 w 1 ['--x', 'y']"]
    assert rc == 6


def test_an_error_every_worker_prints_alike_is_printed_once():
    """Workers that refuse the same argument print one ``error:`` line between them; their
    other lines, and an error of their own, stay."""
    code = ("import os, sys; w = os.environ['ALLOCOPT_WORKER']; print('worker', w); "
            "print('error: budget_flops=abc: not a number'); print('error: only', w); sys.exit(2)")
    out = io.StringIO()
    assert run_workers(["0", "1"], [], out=out, command=[sys.executable, "-c", code]) == 2
    lines = [ln.split("] ", 1)[1] for ln in out.getvalue().splitlines()]
    assert sorted(lines) == ["error: budget_flops=abc: not a number", "error: only 0", "error: only 1",
                             "worker 0", "worker 1"]


def test_launcher_refuses_bad_input(cli):
    r = cli("workers", "--gpus", "0,x", "--", "--objective", "synthetic")
    assert r.returncode == 2 and "gpus='0,x'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("workers", "--gpus", "0,1")
    assert r.returncode == 2 and "after --" in r.stderr
    r = cli("workers", "--gpus", "0,1", "--", "--dry-run", "--objective", "synthetic")
    assert r.returncode == 2 and "--dry-run" in r.stderr


@pytest.mark.parametrize("args, stray", [
    (("study", "--budget", "1e19"), "'study' is before --"),  # the study command named, no --
    (("--budget", "1e19", "--objective", "synthetic"), "'--budget' is before --"),  # no --
    (("--budget", "1e19", "--", "--trials", "2"), "'--budget' is before --"),  # some before, some after
    (("--", "study", "--budget", "1e19"), "'study' after --"),
])
def test_study_args_only_after_dashes(cli, args, stray):
    """Study arguments before ``--`` (or the word ``study``) are refused in one line that says
    how to pass them, and no worker starts (none could: ``--gpus 0`` with a bad spec would)."""
    r = cli("workers", "--gpus", "0", *args)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and r.stdout == "", r.stdout + r.stderr
    assert stray in err[0] and "pass" in err[0] and "after --, e.g. allocopt workers --gpus 0,1 -- --budget" in err[0]


def test_ctrl_c_is_forwarded_to_every_worker(tmp_path):
    """SIGINT to the launcher reaches each worker (in its own process group); the launcher exits
    with the workers' worst code."""
    worker = ("import os, signal, sys, time\n"
              "def stop(*a):\n"
              "    open(os.environ['ALLOCOPT_WORKER'] + '.stopped', 'w').close(); sys.exit(130)\n"
              "signal.signal(signal.SIGINT, stop)\n"
              "open(os.environ['ALLOCOPT_WORKER'] + '.up', 'w').close()\n"
              "time.sleep(60)\n")
    (tmp_path / "worker.py").write_text(worker)
    launcher = ("import sys; from allocopt.store.launch import run_workers\n"
                "sys.exit(run_workers(['0', '1'], [], command=[sys.executable, 'worker.py']))\n")
    p = subprocess.Popen([sys.executable, "-c", launcher], cwd=tmp_path, stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not ((tmp_path / "0.up").exists() and (tmp_path / "1.up").exists()):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.1)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 20
    assert (tmp_path / "0.stopped").exists() and (tmp_path / "1.stopped").exists()


BARRIER_JOB = r"""
# a trial's command: note this worker's GPU, wait (at most 60 s) until both workers have a trial
# running, then leave metrics. Neither worker can take every trial before the other has started.
dir=$1
touch "started.$CUDA_VISIBLE_DEVICES"
i=0
while [ ! -f started.0 ] || [ ! -f started.1 ]; do
  i=$((i + 1)); [ $i -gt 600 ] && exit 7
  sleep 0.1
done
echo '{"targets": {"pass@1": 0.5}, "search_flops": 1e18, "learning_flops": 1e18, "reward_flops": 0}' > "$dir/metrics.json"
"""


@pytest.mark.slow  # a fresh process end to end (CI runs -m slow)
def test_workers_share_a_study_each_with_its_gpu(tmp_path):
    """Two workers on one SQLite study (the ``command`` objective, whose job waits until both
    workers run a trial): every trial records the CUDA_VISIBLE_DEVICES of the worker process that
    ran it, each worker keeps its own, both run trials."""
    (tmp_path / "job.sh").write_text(BARRIER_JOB)
    url = f"sqlite:///{tmp_path}/w.db"
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "workers", "--gpus", "0,1", "--",
                        "--objective", "command", "--set", "command=sh job.sh {trial_dir}", "--set", "log=metrics",
                        "--budget", "1e19", "--trials", "6", "--tuner", "bo",
                        "--sampler", "random", "--no-mlflow", "--no-report", "--storage", url,
                        "--study-name", "w"], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert lines and all(x.startswith(("[gpu 0] ", "[gpu 1] ")) for x in lines)
    trials = optuna.load_study(study_name="w", storage=url).trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) >= 6, [(t.state.name, t.user_attrs.get("error")) for t in trials]
    by_worker: dict[str, set[str]] = {}
    for t in done:
        by_worker.setdefault(t.system_attrs["allocopt.worker"], set()).add(
            t.system_attrs["allocopt.cuda_visible_devices"])
    assert len(by_worker) == 2 and sorted(d for s in by_worker.values() for d in s) == ["0", "1"]
    # the two workers' random start-up proposals differ (seeded spec seed + worker index)
    first = {t.system_attrs["allocopt.cuda_visible_devices"]: t.params for t in sorted(done, key=lambda t: t.number)[::-1]}
    assert first["0"] != first["1"]


@pytest.mark.slow  # an end-to-end run of several seconds (CI runs -m slow)
def test_workers_run_exactly_the_trials_asked(tmp_path):
    """Three workers (the launcher, one subprocess each) on one SQLite study with ``--trials 5``
    and 1 s trials: exactly 5 trials complete. (Each worker counted only the finished trials
    before: all three finished their first trial together, saw 3 < 5 and started one more each,
    6 in all; with N workers up to N - 1 too many.) A worker that asked at the same moment as
    another for the last trial gives it back unsampled (PRUNED, ``released``)."""
    url = f"sqlite:///{tmp_path}/t.db"
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "workers", "--gpus", "0,1,2", "--",
                        "--objective", "synthetic", "--set", "sleep_s=1", "--budget", "1e19", "--trials", "5",
                        "--tuner", "bo", "--sampler", "random", "--no-mlflow", "--no-report",
                        "--storage", url, "--study-name", "t"], capture_output=True, text=True, timeout=600,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "ALLOCOPT_HEARTBEAT_S": "1",
                                          "ALLOCOPT_GRACE_S": "8"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trials = optuna.load_study(study_name="t", storage=url).trials
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") == 5, states
    assert set(states) <= {"COMPLETE", "PRUNED"}, states
    assert all(t.user_attrs.get("released") and not t.params for t in trials if t.state.name == "PRUNED")
    assert len({t.system_attrs["allocopt.worker"] for t in trials if t.state.name == "COMPLETE"}) >= 2
    print(f"three workers, --trials 5: {states.count('COMPLETE')} complete, {states.count('PRUNED')} released")


def test_running_full_counts_live_workers_only(tmp_path, monkeypatch):
    """What a worker counts as running: a trial named by a live worker, and one just asked (not
    named yet); not a trial whose worker process is gone, nor one reserved by ``allocopt ask``
    (no name, asked longer than a heartbeat interval ago)."""
    import datetime
    import socket

    from allocopt.spec import SearchSpace, StudySpec
    from allocopt.study.loop import running_full
    from allocopt.study.open import open_study
    from allocopt.store.handles import storage_of
    from allocopt.store.heartbeat import WORKER_ATTR

    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "2")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "600")
    spec = StudySpec(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4,
                     sampler="random", tuner="bo", space=SearchSpace(rho=(0.2, 0.9)))
    st = open_study(spec, f"sqlite:///{tmp_path}/r.db")
    storage = storage_of(st)
    sid = storage.get_study_id_from_name("r")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a process that has exited
    live, gone, reserved, fresh = (st.ask() for _ in range(4))
    for t, who in ((live, f"{socket.gethostname()}:{os.getpid()}"), (gone, f"{socket.gethostname()}:{dead}")):
        tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
        storage.set_trial_system_attr(tid, WORKER_ATTR, who)
        storage.record_heartbeat(tid)
    assert running_full(st) == 4 - 1  # the gone worker's trial is not running
    time.sleep(2.2)  # `reserved` and `fresh` are now older than the interval: reservations
    assert running_full(st) == 1
    assert running_full(st, below=live.number) == 0
    tid = storage.get_trial_id_from_study_id_trial_number(sid, fresh.number)
    storage.set_trial_system_attr(tid, WORKER_ATTR, f"{socket.gethostname()}:{os.getpid()}")
    assert running_full(st) == 2 and running_full(st, below=fresh.number) == 1
    assert datetime.datetime.now() > reserved.datetime_start


def test_worker_seeds_differ_in_any_start_order(monkeypatch):
    """Random start-up proposals of two workers differ however they start: fresh (seed +
    worker index), or one resuming a study the other has begun (its seed drawn from the seed and
    the trial count; ``seed + trials`` collided: worker 0 resuming after 1 trial drew worker
    1's seed + 1 = the fresh worker 1's)."""
    from allocopt.spec import SearchSpace, StudySpec
    from allocopt.study.loop import resumed_seed
    from allocopt.study.open import make_sampler

    from dataclasses import replace

    spec = StudySpec(name="s", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4,
                     sampler="random", tuner="bo", seed=7, space=SearchSpace(rho=(0.2, 0.9)))
    dist = {"rho": optuna.distributions.FloatDistribution(0.2, 0.9)}

    def first(worker: int, n: int) -> float:
        monkeypatch.setenv("ALLOCOPT_WORKER", str(worker))
        s = spec if n == 0 else replace(spec, seed=resumed_seed(spec.seed, n))
        return optuna.create_study(sampler=make_sampler(s)).ask(dist).params["rho"]

    draws = [first(w, n) for w in (0, 1) for n in (0, 1, 2)]
    assert len(set(draws)) == len(draws), draws
    assert first(1, 0) == first(1, 0)  # and each is reproducible
