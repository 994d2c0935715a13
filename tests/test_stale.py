"""Trials that stopped workers left: settled whenever a study is opened (issue: nothing stays
RUNNING). A trial whose worker is gone is finished from its whole record or failed and its work
run again exactly once; a Ctrl-C'd trial is enqueued again once; a failed ``ask`` gives back
what it reserved; a finished study says so in one line. The subprocess test SIGKILLs a worker
during the study's last trial (tests/test_faults.py's helpers)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.spec import SearchSpace, StudySpec

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _spec(**kw) -> StudySpec:
    return StudySpec(name="st", objective="synthetic", budget_flops=1e18, target="pass@1", trials=2,
                     tuner="bo", sampler="random", space=SearchSpace(rho=(0.2, 0.8), group_sizes=(4,),
                                                                  rewards=("sparse",)), **kw)


def _killed_trial(study, *, whole: bool, owner: str):
    """A trial left RUNNING by a worker: its decision written, its result whole or half-way
    (``state`` COMPLETE written, then the disk filled before the targets and the plan)."""
    import optuna

    from allocopt.record import write_complete, write_start
    from allocopt.study.open import distributions
    from allocopt.store.handles import trial_handle
    from allocopt.store.heartbeat import WORKER_ATTR

    t = study.ask(distributions(_spec()))
    write_start(t, budget_flops=1e18, fidelity="full")
    storage, tid = trial_handle(study, t.number)
    storage.set_trial_system_attr(tid, WORKER_ATTR, owner)
    storage.record_heartbeat(tid)
    if whole:
        write_complete(t, {"pass_at_1": 0.41}, {"total_flops": 1e18}, plan={"budget_flops": 1e18})
    else:
        t.set_user_attr("state", "COMPLETE")
    return t


def test_a_gone_workers_trial_is_settled_when_the_study_is_opened(tmp_path, monkeypatch, capfd):
    """Owner gone (same host, no such process): a half-written trial is failed and its work
    enqueued once (decision only, not the half result); a whole one is finished from its record;
    a live owner's trial and an ``ask`` reservation (no worker) are left alone; opening again
    adds nothing."""
    import socket

    from allocopt.study.asktell import reserve  # noqa: F401 (ask's reservations: no worker attr)
    from allocopt.study.open import distributions, open_study

    monkeypatch.setenv("ALLOCOPT_GRACE_S", "3600")  # only the owner check may settle them
    url = f"sqlite:///{tmp_path}/o.db"
    st = open_study(_spec(), url)
    host = socket.gethostname()
    half = _killed_trial(st, whole=False, owner=f"{host}:{_dead_pid()}")
    whole = _killed_trial(st, whole=True, owner=f"{host}:{_dead_pid()}")
    live = _killed_trial(st, whole=False, owner=f"{host}:{1}")  # pid 1 is alive
    asked = st.ask(distributions(_spec()))
    capfd.readouterr()
    st2 = open_study(_spec(), url)
    assert capfd.readouterr().err == (
        f"study 'st': settled 2 stale trial(s) a stopped worker left: 1 finished from its record "
        f"(trial {whole.number}), 1 failed (trial {half.number}); re-queued 1 to run again\n")
    ts = st2.get_trials(deepcopy=False)
    states = {t.number: t.state.name for t in ts}
    assert states[half.number] == "FAIL" and states[whole.number] == "COMPLETE"
    assert states[live.number] == "RUNNING" and states[asked.number] == "RUNNING"
    assert ts[whole.number].values == [0.41]
    again = [t for t in ts if t.system_attrs.get("failed_trial") == half.number]
    assert len(again) == 1 and again[0].state.name == "WAITING"
    assert again[0].params == ts[half.number].params
    assert "state" not in again[0].user_attrs and again[0].user_attrs["fidelity"] == "full"
    open_study(_spec(), url)
    assert len(open_study(_spec(), url).get_trials(deepcopy=False)) == len(ts)  # nothing added twice
    assert capfd.readouterr().err == ""  # nothing settled: no line


def test_an_interrupted_trial_runs_again_before_new_proposals(tmp_path, mlflow_store, capfd):
    """A Ctrl-C'd trial (FAIL, error ``interrupted``) is enqueued once when the study is opened;
    the resumed study runs that allocation first, and the study still ends with its count."""
    from allocopt.objective import get_objective
    from allocopt.record import write_interrupted
    from allocopt.study.loop import run_study
    from allocopt.study.open import distributions, open_study

    url = f"sqlite:///{tmp_path}/o.db"
    st = open_study(_spec(), url)
    t = st.ask(distributions(_spec()))
    t.set_user_attr("fidelity", "full")
    write_interrupted(t)
    st.tell(t, state=__import__("optuna").trial.TrialState.FAIL)
    params = st.get_trials(deepcopy=False)[0].params
    obj = get_objective("synthetic")
    capfd.readouterr()
    st = run_study(_spec(), objective=obj, workload=obj.workload(), storage=url)
    ts = st.get_trials(deepcopy=False)
    assert [t.state.name for t in ts] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert "study 'st': settled: 1 interrupted (trial 0); re-queued 1 to run again\n" in capfd.readouterr().err
    assert ts[1].params == params and ts[1].system_attrs["failed_trial"] == 0
    assert len({tuple(sorted(t.params.items())) for t in ts[1:]}) == 2


def test_whole_record_killed_before_mlflow_ends_finished(tmp_path, mlflow_store):
    """Optuna RUNNING with a whole COMPLETE record, MLflow KILLED (a full disk failed the tell,
    the tracker closed): the next open tells it COMPLETE and the run becomes FINISHED."""
    import socket

    from mlflow import MlflowClient

    from allocopt.study.open import open_study
    from allocopt.tracking import StudyTracker

    url = f"sqlite:///{tmp_path}/o.db"
    st = open_study(_spec(), url)
    t = _killed_trial(st, whole=True, owner=f"{socket.gethostname()}:{_dead_pid()}")
    dead = StudyTracker("st", tracking_uri=mlflow_store)
    run = dead.start_trial(t.number, {"rho": 0.5})
    dead.close("FAILED")  # its open trial run ends KILLED
    c = MlflowClient(mlflow_store)
    assert c.get_run(run).info.status == "KILLED"
    st = open_study(_spec(), url)
    assert st.get_trials(deepcopy=False)[t.number].state.name == "COMPLETE"
    assert StudyTracker("st", tracking_uri=mlflow_store).reconcile(st) == [t.number]
    assert c.get_run(run).info.status == "FINISHED" and c.get_run(run).data.metrics["pass_at_1"] == 0.41


def test_a_failed_ask_gives_its_trials_back(tmp_path, cli, monkeypatch):
    """``ask`` that fails after reserving (a full disk writing ``--out``) leaves nothing RUNNING:
    one line, exit 2; the next ``ask`` gets the same allocation again. An ``--out`` under a
    file is refused before anything is reserved."""
    import errno

    import optuna

    import allocopt.study.asktell as at

    url = f"sqlite:///{tmp_path}/o.db"
    (tmp_path / "f").write_text("")
    r = cli("ask", "--study", "a", "--storage", url, "--budget", "1e18", "--objective", "synthetic",
            "--out", tmp_path / "f" / "x", cwd=tmp_path)
    assert r.returncode == 2 and "not a writable folder" in r.stderr and not (tmp_path / "o.db").exists()

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(at, "write_asked_folder", full_disk)
    r = cli("ask", "--study", "a", "--storage", url, "--budget", "1e18", "--objective", "synthetic",
            "-n", "2", "--out", tmp_path / "asked", cwd=tmp_path)
    assert r.returncode == 2 and "No space left" in r.stderr and "2 reserved trial(s) given back" in r.stderr
    ts = optuna.load_study(study_name="a", storage=url).get_trials()
    assert [t.state.name for t in ts] == ["FAIL", "FAIL"], [(t.number, t.state) for t in ts]
    monkeypatch.undo()
    r = cli("ask", "--study", "a", "--storage", url, "-n", "2", "--out", tmp_path / "asked", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ts = optuna.load_study(study_name="a", storage=url).get_trials()
    assert [t.state.name for t in ts] == ["FAIL", "FAIL", "RUNNING", "RUNNING"]
    assert [t.params for t in ts[2:]] == [t.params for t in ts[:2]]


def test_a_finished_study_says_so_in_one_line(tmp_path, cli):
    args = ("study", "--objective", "synthetic", "--budget", "1e18", "--trials", "2", "--pilots", "0",
            "--study-name", "s", "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/o.db")
    assert cli(*args, cwd=tmp_path).returncode == 0
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "study 's' is finished (2 of 2 full runs done)" in r.stderr
    assert "estimated wall time" not in r.stderr and "0/2" not in r.stderr
    assert "recommended:" in r.stdout


@pytest.mark.slow  # two study processes, ~25 s on 2 loaded cores
def test_sigkill_during_the_last_trial_then_resume_at_once(tmp_path):
    """SIGKILL during the study's last trial, the same study run again at once (no grace period
    waited: the worker is gone): nothing RUNNING in Optuna or MLflow, the killed allocation run
    again exactly once, nothing finished lost."""
    from test_faults import check_consistent, completed, ran, spec, start, wait_for_start

    f = spec(tmp_path, trials=2, sleep_s=2.0)
    p = start(tmp_path, f)
    wait_for_start(tmp_path, 2, p)
    p.kill()
    p.communicate(timeout=30)
    kept = completed(tmp_path)
    assert list(kept) == [0]
    killed = [r for r in ran(tmp_path) if r["event"] == "start"][-1]
    t0 = time.time()
    p = start(tmp_path, spec(tmp_path, trials=2, sleep_s=0.0))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "study 'f': settled 1 stale trial(s) a stopped worker left: 1 failed (trial 1); re-queued 1 to run " \
        "again\n" in err, err
    ts = check_consistent(tmp_path, 2, kept)
    assert [t.state.name for t in ts] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert ts[2].system_attrs["failed_trial"] == 1 and ts[2].params == ts[1].params
    key = lambda r: (r["rho"], r["group_size"], r["reward"])  # noqa: E731
    assert [key(r) for r in ran(tmp_path) if r["event"] == "start"].count(key(killed)) == 2  # killed + once
    # the re-queued run is the one full run missing, not one more: the bar counts it once
    assert " 1/1 " in err and " 1/2 " not in err, err
    print(f"sigkill during last trial: resumed in {time.time() - t0:.1f} s")


def test_disk_full_is_found_in_an_error_chain():
    """What the study command turns into its one disk-full line (tests/test_disk_full.py runs it
    on a real tmpfs): ENOSPC / EDQUOT, or SQLite's message wrapped by SQLAlchemy and Optuna."""
    import errno
    import sqlite3

    from allocopt.errors import disk_full

    def chained(inner: BaseException, outer: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as e:
                raise outer from e
        except BaseException as e:
            return e

    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert disk_full(chained(sqlite3.OperationalError("database or disk is full"),
                             RuntimeError("An exception is raised during the commit.")))
    assert not disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not disk_full(chained(sqlite3.OperationalError("database is locked"), RuntimeError("commit")))


def test_the_settled_line_counts_interrupted_trials_apart_from_stale_ones():
    """A failed stale trial and a Ctrl-C'd one: '1 stale', then the interrupted one on its own,
    so the count matches the trials it lists."""
    from allocopt.store.settle import settled_line

    assert settled_line("ck", {"finished": [], "failed": [1], "requeued": [2]}, 2) == (
        "study 'ck': settled 1 stale trial(s) a stopped worker left: 1 failed (trial 1); "
        "1 interrupted (trial 2); re-queued 2 to run again")
