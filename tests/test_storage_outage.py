"""Optuna's storage going away mid-study: a PostgreSQL server of the test's own (its data in a
temp folder, 127.0.0.1) stopped and started again under a running ``allocopt study``.

A short restart is waited for (every storage call retried, :mod:`allocopt.store.reconnect`)
and the study ends as if nothing happened; an outage longer than the wait is one line, exit 1,
and the same command, once the server is back, resumes with no trial lost and the one that
was running re-run once.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent

import pgserver  # noqa: E402
from conftest import postgres_lack  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("ALLOCOPT_REQUIRE_POSTGRES") != "1" and postgres_lack() is not None,
                                reason=f"{postgres_lack()}")


class Server:
    """A PostgreSQL server that can be stopped and started again on the same port."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="allocopt-pg-"))  # not under pytest's 0700 root
        self.url = pgserver.start(self.folder).replace("postgresql://", "postgresql+psycopg://")

    def stop(self) -> None:
        pgserver.stop(self.folder)

    def start(self) -> None:
        port = (self.folder / "port").read_text()
        opts = f"-h 127.0.0.1 -p {port} -k {self.folder / 'sock'} -c fsync=off"
        subprocess.run(pgserver._as_server_user([str(pgserver.find_bin_dir() / "pg_ctl"), "-D",
                                                 str(self.folder / "data"), "-l", str(self.folder / "server.log"),
                                                 "-o", opts, "-w", "start"]), check=True, capture_output=True,
                       timeout=120)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _study(tmp, url, trials, wait_s="120", **settings):
    from test_faults import RUN, spec

    f = spec(tmp, trials, **settings)
    return subprocess.Popen([sys.executable, "-c", RUN, "study", "--spec", str(f), "--storage", url, "--no-mlflow"],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200",
                                 "ALLOCOPT_STORAGE_WAIT_S": wait_s})


def _trials(url):
    import optuna

    return optuna.load_study(study_name="f", storage=url).get_trials()


@pytest.mark.slow  # a server of its own and a study of 6 trials: ~40 s on 2 loaded cores
def test_a_short_restart_is_waited_for(tmp_path, server):
    from test_faults import ran, wait_for_start

    p = _study(tmp_path, server.url, 6, sleep_s=1.0)
    wait_for_start(tmp_path, 3, p, timeout=180)
    t0 = time.monotonic()
    server.stop()
    time.sleep(3)
    server.start()
    away = time.monotonic() - t0
    out, err = p.communicate(timeout=300)
    print(f"\nserver away {away:.1f} s; stderr:\n{err}")
    assert p.returncode == 0 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("storage ")]
    assert len(lines) == 2 and "connection lost" in lines[0] and "answers again after" in lines[1], err
    assert "retrying for up to 120 s" in lines[0]
    ts = _trials(server.url)
    assert [t.state.name for t in ts] == ["COMPLETE"] * 6  # none lost, none twice
    done = [(r["rho"], r["group_size"], r["reward"]) for r in ran(tmp_path) if r["event"] == "end"]
    assert len(done) == 6 == len(set(done))


@pytest.mark.slow  # a server of its own, two studies: ~60 s on 2 loaded cores
def test_a_long_outage_is_one_line_and_the_same_command_resumes(tmp_path, server):
    from test_faults import ran, wait_for_start

    p = _study(tmp_path, server.url, 5, wait_s="4", sleep_s=1.0)
    wait_for_start(tmp_path, 3, p, timeout=180)
    server.stop()
    t0 = time.monotonic()
    out, err = p.communicate(timeout=120)
    took = time.monotonic() - t0
    print(f"\nstorage away: exit {p.returncode} after {took:.1f} s; stderr:\n{err}")
    assert p.returncode == 1 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: storage postgresql+psycopg://") and "no answer for" in last \
        and "run the same command again once it answers to resume" in last, err
    assert took < 30  # the wait (4 s) and the trial in flight (1 s)
    server.start()
    ended = [r["seed"] for r in ran(tmp_path) if r["event"] == "end"]
    before = {t.number: t.params for t in _trials(server.url) if t.state.name == "COMPLETE"}
    assert len(before) >= 2
    p = _study(tmp_path, server.url, 5)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    ts = _trials(server.url)
    assert {t.number: t.params for t in ts if t.number in before} == before  # kept as they were
    assert sum(t.state.name == "COMPLETE" for t in ts) == 5 and all(t.state.name != "RUNNING" for t in ts)
    done = [(r["rho"], r["group_size"], r["reward"]) for r in ran(tmp_path) if r["event"] == "end"]
    assert len(set(done)) == len(done) - (len(ended) - len(before)), (done, ended, before)


def _lines_until(p: subprocess.Popen, seen: list[str], text: str, timeout: float) -> None:
    """Until a line of ``p``'s stderr (read into ``seen`` by a thread) contains ``text``."""
    t = time.monotonic()
    while not any(text in ln for ln in seen):
        assert p.poll() is None, (p.returncode, seen)
        assert time.monotonic() - t < timeout, seen
        time.sleep(0.05)


@pytest.mark.slow  # a server of its own, two studies: ~60 s on 2 loaded cores
def test_ctrl_c_during_the_storage_wait_exits_at_once_and_the_same_command_resumes(tmp_path, server):
    """Server stopped mid-study, the study says "connection lost" and waits (up to 120 s):
    Ctrl-C then ends it within seconds, exit 130, one line, no traceback; once the server is
    back the same command finishes the study with the finished trials kept and nothing RUNNING."""
    import signal
    import threading

    from test_faults import ran, wait_for_start

    p = _study(tmp_path, server.url, 5, sleep_s=1.0)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(p.stderr.readline, "")), daemon=True)
    reader.start()
    wait_for_start(tmp_path, 3, p, timeout=180)
    server.stop()
    _lines_until(p, seen, "connection lost", timeout=60)
    time.sleep(1.0)  # inside the wait's backoff
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=60)
    finally:
        took = time.monotonic() - t0
        if p.poll() is None:
            p.kill()
    reader.join(timeout=10)
    err = "".join(seen)
    print(f"\nCtrl-C in the storage wait: exit {p.returncode} after {took:.1f} s; stderr:\n{err}")
    assert p.returncode == 130 and "Traceback" not in err, err
    assert took < 10, took  # not the 120 s wait
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted") and "run the same command" in last, err
    assert sum(ln.startswith(("interrupted", "error")) for ln in err.splitlines()) == 1, err

    server.start()
    ended = [r["seed"] for r in ran(tmp_path) if r["event"] == "end"]
    ts = _trials(server.url)
    before = {t.number: t.params for t in ts if t.state.name == "COMPLETE"}
    running = {t.number for t in ts if t.state.name == "RUNNING"}
    print(f"after Ctrl-C, server back: {[(t.number, t.state.name) for t in ts]}; ended {ended}")
    assert len(before) >= 2
    p = _study(tmp_path, server.url, 5)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and "Traceback" not in err, err
    ts = _trials(server.url)
    print(f"after resume: {[(t.number, t.state.name) for t in ts]}")
    assert {t.number: t.params for t in ts if t.number in before} == before  # kept as they were
    assert sum(t.state.name == "COMPLETE" for t in ts) == 5 and all(t.state.name != "RUNNING" for t in ts)
    cut = [t for t in ts if t.state.name == "FAIL"]  # the trial the Ctrl-C cut short: run again once
    assert {c.number for c in cut} == running, (running, [(t.number, t.state.name) for t in ts])
    for c in cut:
        again = [t for t in ts if t.system_attrs.get("failed_trial") == c.number]
        assert len(again) == 1 and again[0].params == c.params and again[0].state.name == "COMPLETE", \
            [(t.number, t.state.name, t.system_attrs) for t in ts]
