"""A REAL SIGKILL between Optuna's COMPLETE and the end of the trial's MLflow run (issue:
nothing stays RUNNING). The study runs in a subprocess through a wrapper that makes the function
allocopt calls to end a trial's run (:meth:`allocopt.tracking.trials.TrialRuns.finish_trial`,
or its last step ``_end``, which sets the run's status) SIGKILL its own process on trial N; the
same command then resumes: Optuna's COMPLETE is kept, the run is reconciled to FINISHED with the
trial's targets, the trial is not run again, and the study ends with its count. One case kills
a step earlier, after the trial's record is written whole but before Optuna's ``tell``: the
resume finishes it from its record (one line says so), also without running it again.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent

WRAPPER = '''
import os, signal, sys
sys.path.insert(0, {tests!r})
import fault_objective  # noqa: F401  (registers "faulty")
from allocopt.tracking import trials

KILL_AT, WHERE = {kill_at!r}, {where!r}
orig_finish, orig_end = trials.TrialRuns.finish_trial, trials.TrialRuns._end

def finish_trial(self, run_id, *, state, **kw):
    if WHERE == "finish_trial" and state == "COMPLETE" and self._open.get(run_id, {{}}).get("number") == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)  # Optuna has the trial COMPLETE; MLflow has nothing of it yet
    return orig_finish(self, run_id, state=state, **kw)

def _end(self, run_id, status):
    if WHERE == "_end" and status == "FINISHED" and self._open.get(run_id, {{}}).get("number") == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)  # metrics and plan logged, the run not ended
    return orig_end(self, run_id, status)

trials.TrialRuns.finish_trial, trials.TrialRuns._end = finish_trial, _end

import allocopt.study.trial as st
orig_write_complete = st.write_complete

def write_complete(trial, *a, **kw):
    orig_write_complete(trial, *a, **kw)
    if WHERE == "tell" and trial.number == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)  # the record whole, Optuna not yet told

st.write_complete = write_complete
from allocopt.cli import main
main()
'''


def _start(tmp: Path, f: Path, kill_at: int, where: str) -> subprocess.Popen:
    w = tmp / "wrapper.py"
    w.write_text(WRAPPER.format(tests=str(TESTS), kill_at=kill_at, where=where))
    return subprocess.Popen([sys.executable, str(w), "study", "--spec", str(f),
                             "--storage", f"sqlite:///{tmp}/o.db", "--mlflow-uri", f"sqlite:///{tmp}/m.db"],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                                 "ALLOCOPT_HEARTBEAT_S": "1", "ALLOCOPT_GRACE_S": "3"})


@pytest.mark.slow  # two study processes per case, ~25 s each on 2 loaded cores
@pytest.mark.parametrize("kill_at,where", [(1, "finish_trial"), (2, "finish_trial"), (2, "_end"), (2, "tell")],
                         ids=["mid-study-before-finish", "last-trial-before-finish", "last-trial-before-end",
                              "last-trial-before-tell"])
def test_sigkill_between_optuna_complete_and_mlflow_end(tmp_path, kill_at, where):
    from mlflow import MlflowClient

    from test_faults import check_consistent, completed, mlflow_runs, optuna_trials, ran, spec

    f = spec(tmp_path, trials=3)
    p = _start(tmp_path, f, kill_at, where)
    out, err = p.communicate(timeout=180)
    assert p.returncode == -9, (p.returncode, err)  # killed by its own SIGKILL
    ts = optuna_trials(tmp_path)
    told = "RUNNING" if where == "tell" else "COMPLETE"  # before tell: the record whole, the trial RUNNING
    assert [(t.number, t.state.name) for t in ts] == [(n, "COMPLETE") for n in range(kill_at)] + [(kill_at, told)]
    by_trial, _ = mlflow_runs(tmp_path)
    assert by_trial[kill_at] == ["RUNNING"], by_trial  # what the kill left
    before = [(t.number, t.state.name) for t in ts]
    kept = completed(tmp_path)
    value = ts[kill_at].values[0] if where != "tell" else ts[kill_at].user_attrs["targets"]["pass_at_1"]

    t0 = time.time()
    p = _start(tmp_path, f, -1, where)  # the same command, nothing killed
    out, err = p.communicate(timeout=180)
    resumed_s = time.time() - t0
    assert p.returncode == 0, err
    assert "Traceback" not in err
    if where == "tell":
        assert f"1 finished from its record (trial {kill_at})" in err, err
    ts = check_consistent(tmp_path, 3, kept)  # nothing RUNNING, runs match, no allocation twice
    assert [(t.number, t.state.name) for t in ts] == [(n, "COMPLETE") for n in range(3)]  # no re-run
    assert len([r for r in ran(tmp_path) if r["event"] == "start"]) == 3
    c = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    exp = c.get_experiment_by_name("allocopt/f")
    run = next(r for r in c.search_runs([exp.experiment_id], max_results=100)
               if r.data.tags.get("allocopt.trial_number") == str(kill_at))
    assert run.info.status == "FINISHED" and run.data.tags["allocopt.state"] == "COMPLETE"
    assert run.data.metrics["pass_at_1"] == value  # the trial's targets, from Optuna's record
    by_trial, parents = mlflow_runs(tmp_path)
    print(f"\nSIGKILL before {where} at trial {kill_at}: killed state optuna {before}; resumed in {resumed_s:.1f} s; optuna "
          f"{[(t.number, t.state.name) for t in ts]}; mlflow {dict(sorted(by_trial.items()))}; parents {parents}")
