"""A tracking server that goes away: trials go on, their runs are spooled and replayed.

Fast tests drive :class:`allocopt.tracking.StudyTracker` with its MLflow client behind a switch
that raises what ``requests`` raises for a refused connection; the slow test stops and restarts
a real ``mlflow server`` on 127.0.0.1 under a running ``allocopt study``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent


class Flaky:
    """An MlflowClient whose calls raise a connection error while :attr:`down`."""

    def __init__(self, client):
        self.client, self.down, self.calls_while_down = client, False, 0

    def __getattr__(self, name):
        fn = getattr(self.client, name)

        def call(*a, **k):
            if self.down:
                import requests

                self.calls_while_down += 1
                raise requests.exceptions.ConnectionError("Failed to establish a new connection: "
                                                          "[Errno 111] Connection refused")
            return fn(*a, **k)
        return call


def _tracker(store, spool, name="s"):
    from allocopt.tracking import StudyTracker

    t = StudyTracker(name, tracking_uri=store, spool_dir=spool)
    flaky = Flaky(t.client._client)
    t.client._client = flaky
    t.client._spool_on = True  # spool as for a server (the store here is SQLite)
    return t, flaky


def _trial_runs(store, name="s"):
    from mlflow import MlflowClient

    c = MlflowClient(store)
    exp = c.get_experiment_by_name(f"allocopt/{name}")
    return {int(r.data.tags["allocopt.trial_number"]): r for r in c.search_runs([exp.experiment_id])
            if r.data.tags.get("allocopt.role") == "trial"}, c


def test_runs_logged_while_away_are_replayed_when_it_answers(mlflow_store, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ALLOCOPT_MLFLOW_RETRY_S", "3600")  # no retry before close (which forces one)
    t, flaky = _tracker(mlflow_store, tmp_path / "spool")
    r0 = t.start_trial(0, {"rho": 0.5}, {"objective": "synthetic"})
    t.finish_trial(r0, state="COMPLETE", metrics={"pass_at_1": 0.25}, plan={"iterations": 3})
    flaky.down = True
    r1 = t.start_trial(1, {"rho": 0.7, "group_size": 8}, {"objective": "synthetic"})
    assert r1.startswith("spooled-")
    t.finish_trial(r1, state="COMPLETE", metrics={"pass_at_1": 0.5, "total_flops": 3e18},
                   curves=[{"iteration": 1, "cumulative_flops": 1e18, "executed_flops": 1e18}],
                   plan={"iterations": 3})
    t.log_study_summary({"pass_at_1": {"trial": 1}}, {"n_complete": 2})
    tried = flaky.calls_while_down
    assert tried == 1  # one failed request, then straight to the spool (no waiting per call)
    spool = t.client.path
    assert spool.exists() and spool.parent == tmp_path / "spool"
    lines = [json.loads(ln) for ln in spool.read_text().splitlines()]
    assert lines[0]["call"] == "create_run" and any(e["call"] == "set_terminated" for e in lines)
    flaky.down = False
    t.close()
    err = capsys.readouterr().err
    assert err.count("MLflow unreachable") == 1 and f"logging to {spool}" in err
    assert "replayed 1 run(s)" in err
    runs, c = _trial_runs(mlflow_store)
    assert sorted(runs) == [0, 1]
    r = runs[1]
    assert r.info.status == "FINISHED" and r.data.tags["allocopt.state"] == "COMPLETE"
    assert r.data.metrics["pass_at_1"] == 0.5 and r.data.metrics["total_flops"] == 3e18
    assert r.data.params["group_size"] == "8" and r.data.params["iterations"] == "3"
    assert r.data.tags["mlflow.parentRunId"] == t.parent_run_id
    assert [m.value for m in c.get_metric_history(r.info.run_id, "curve/cumulative_flops")] == [1e18]
    parent = c.get_run(t.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["n_complete"] == 2
    assert not spool.exists()  # sent: nothing left behind


def test_a_spool_left_while_away_is_replayed_by_the_next_tracker(mlflow_store, tmp_path, capsys):
    t, flaky = _tracker(mlflow_store, tmp_path / "spool")
    flaky.down = True
    r = t.start_trial(0, {"rho": 0.5}, {"objective": "synthetic"})
    t.finish_trial(r, state="FAIL", metrics={}, error="boom")
    t.close()  # still away: the spool stays, one line says where and what to do
    err = capsys.readouterr().err
    assert "MLflow still unreachable" in err and "run the same command again" in err
    left = list((tmp_path / "spool").glob("*.jsonl"))
    assert len(left) == 1
    # the process that wrote it is gone: its lock is free (here: the same process, file closed)
    os.rename(left[0], left[0].with_name(left[0].name.replace(f".{os.getpid()}.", ".1.")))
    from allocopt.tracking import StudyTracker

    t2 = StudyTracker("s", tracking_uri=mlflow_store, spool_dir=tmp_path / "spool")
    t2.close()
    assert "replayed 1 run(s) spooled by an earlier run" in capsys.readouterr().err
    runs, _ = _trial_runs(mlflow_store)
    assert runs[0].info.status == "FAILED" and runs[0].data.tags["allocopt.error"] == "boom"
    assert not list((tmp_path / "spool").glob("*.jsonl"))


def test_a_request_that_is_refused_is_not_spooled(mlflow_store, tmp_path):
    """A bad request (the server answered) raises as before: only 'not answering' spools."""
    from allocopt.tracking.spool import unreachable
    from mlflow.exceptions import MlflowException, RestException

    assert unreachable(MlflowException("API request to http://h/api failed with exception "
                                       "HTTPConnectionPool(host='h', port=1): Max retries exceeded"))
    assert not unreachable(RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad"}))


# ------------------------------------------------------------------ a real server, stopped
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, folder: Path, port: int):
        self.folder, self.port, self.proc = folder, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> float:
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        env.pop("MLFLOW_TRACKING_URI", None)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.folder / 'm.db'}",
             "--artifacts-destination", str(self.folder / "art"), "--workers", "1"],
            stdout=open(self.folder / "server.log", "a"), stderr=subprocess.STDOUT, env=env,
            cwd=self.folder, start_new_session=True)
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            assert self.proc.poll() is None and time.monotonic() - t0 < 120, \
                (self.folder / "server.log").read_text()[-2000:]
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # gone at once, as a crashed server
            self.proc.wait(20)


@pytest.mark.slow  # two mlflow server starts: ~1 min on 2 loaded cores
def test_study_goes_on_while_the_server_is_away(tmp_path, mlflow_template):
    import shutil

    from mlflow import MlflowClient
    from test_faults import RUN, ran, spec, wait_for_start

    (tmp_path / "srv").mkdir()
    shutil.copy(mlflow_template, tmp_path / "srv" / "m.db")
    server = Server(tmp_path / "srv", _free_port())
    hold = tmp_path / "hold"
    hold.touch()
    try:
        server.start()
        f = spec(tmp_path, 8, sleep_s=0.3, hold_from=5, hold=str(hold))
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", RUN, "study", "--spec", str(f), "--storage",
                                 f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", server.url],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                                     "ALLOCOPT_MLFLOW_RETRY_S": "1"})
        wait_for_start(tmp_path, 2, proc)
        server.stop()
        down = time.monotonic()
        wait_for_start(tmp_path, 6, proc)  # trials 2-4 ran while the server was away
        went_on = time.monotonic() - down
        server.start()
        hold.unlink()
        out, err = proc.communicate(timeout=300)
        total = time.monotonic() - t0
    finally:
        server.stop()
    print(f"\nstudy of 8 trials, server down after 2 for {went_on:.1f} s+restart: {total:.1f} s; stderr:\n{err}")
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    assert err.count("MLflow unreachable") == 1 and "logging to" in err
    assert "MLflow answers again: replayed" in err
    assert sum(r["event"] == "end" for r in ran(tmp_path)) == 8 or len(ran(tmp_path)) >= 16
    server.start()
    try:
        c = MlflowClient(server.url)
        exp = c.get_experiment_by_name("allocopt/f")
        runs = c.search_runs([exp.experiment_id], max_results=100)
    finally:
        server.stop()
    trials = sorted(int(r.data.tags["allocopt.trial_number"]) for r in runs
                    if r.data.tags.get("allocopt.role") == "trial")
    assert trials == list(range(8))  # every trial once, none lost, none twice
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert not list(tmp_path.glob("*.mlflow-spool.*.jsonl"))


@pytest.mark.slow  # an mlflow server start and a study: ~40 s on 2 loaded cores
@pytest.mark.parametrize("away", ["closed", "silent"])
def test_ctrl_c_during_an_outage_stops_the_study_at_once(tmp_path, mlflow_template, away):
    """The server killed mid-study, its port then closed (connection refused) or held by a
    socket that accepts and never answers (a hung server, a firewall that drops): a Ctrl-C
    during the outage ends the study within seconds with 130 (it used to do nothing for
    minutes); finished trials stay COMPLETE, the interrupted one FAIL, nothing RUNNING, and
    the runs made while away stay in the spool for the next run of the study."""
    import shutil

    import optuna
    from test_faults import RUN, ran, spec, wait_for_start

    (tmp_path / "srv").mkdir()
    shutil.copy(mlflow_template, tmp_path / "srv" / "m.db")
    server = Server(tmp_path / "srv", _free_port())
    hole = None
    try:
        server.start()
        f = spec(tmp_path, 8, sleep_s=1.0)
        proc = subprocess.Popen([sys.executable, "-c", RUN, "study", "--spec", str(f), "--storage",
                                 f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", server.url],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
        wait_for_start(tmp_path, 2, proc)
        server.stop()
        if away == "silent":
            hole = socket.socket()
            hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            for _ in range(100):  # the killed server's worker processes let go of the port
                try:
                    hole.bind(("127.0.0.1", server.port))
                    break
                except OSError:
                    time.sleep(0.1)
            hole.listen(64)  # the kernel completes the handshakes; nobody reads or answers
        wait_for_start(tmp_path, 4, proc, timeout=180)  # trials 2 and 3 met the outage
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
        took = time.monotonic() - t0
    finally:
        server.stop()
        if hole is not None:
            hole.close()
    print(f"\nCtrl-C during an outage ({away}): exit {proc.returncode} after {took:.1f} s; stderr:\n{err}")
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and "interrupted: finished trials are kept" in err
    ts = optuna.load_study(study_name="f", storage=f"sqlite:///{tmp_path}/o.db").get_trials()
    ended = [r["seed"] for r in ran(tmp_path) if r["event"] == "end"]
    assert [t.number for t in ts if t.state.name == "COMPLETE"] == ended and len(ended) >= 3
    assert [t.state.name for t in ts][len(ended):] == ["FAIL"]  # the interrupted one, nothing RUNNING
    assert ts[-1].user_attrs["error"] == "interrupted"
    spooled = [json.loads(ln) for p in tmp_path.glob("*.mlflow-spool.*.jsonl") for ln in p.read_text().splitlines()]
    assert sum(e["call"] == "create_run" for e in spooled) >= 2  # trial 3's run and the interrupted one's
    assert "MLflow still unreachable" in err
    assert took < 15  # measured 4.1 s (closed) and 5.0 s (silent: one request timeout)


def test_a_long_reason_is_cut_at_a_word():
    from allocopt.tracking.requests import short_reason

    words = " ".join(f"word{i}" for i in range(60))  # through word k (k >= 10): 7k - 4 characters
    got = short_reason(RuntimeError("\n  " + words + "\nsecond line"))
    assert got == " ".join(f"word{i}" for i in range(30)) + "…"  # through word29: 199, then the cut
    assert len(got) <= 200 and short_reason(RuntimeError("short")) == "short"
