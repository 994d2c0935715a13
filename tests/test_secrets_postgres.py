"""A password never leaks, against a live password-protected PostgreSQL (a server of the
test's own with a role that logs in by SCRAM password, ``pg_hba.conf``: ``scram-sha-256`` on
127.0.0.1): ``study``, ``ask``, ``tell``, ``best`` and ``report`` with the password in the
storage URL; then the password is in no stdout or stderr, no file written (the MLflow SQLite
store, its artifacts and every file of the working folder, byte by byte), no Optuna user or
system attribute, no MLflow param, tag or experiment tag. ``ask.json``'s ``tell`` command
carries no password and works with ``PGPASSWORD``. Two ``tell`` s of one trial at once: one
records it, the other gets the one line "already finished". (``trial`` takes no storage or
tracking URL: nothing to leak.)
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent

from test_storage_outage import Server, pytestmark  # noqa: E402,F401 (skipped where no PostgreSQL)

SECRET = f"Pw-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def guarded():
    """A server whose role ``alice`` logs in with :data:`SECRET` only; its URL (with it)."""
    import psycopg

    s = Server()
    try:
        admin = s.url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"CREATE ROLE alice LOGIN PASSWORD '{SECRET}'")
            c.execute("CREATE DATABASE sec OWNER alice")
        hba = s.folder / "data" / "pg_hba.conf"
        hba.write_text("local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
                       "host all all 127.0.0.1/32 scram-sha-256\n")
        subprocess.run(["runuser", "-u", "postgres", "--"] * (os.geteuid() == 0)
                       + [str(__import__("pgserver").find_bin_dir() / "pg_ctl"), "-D", str(s.folder / "data"),
                          "reload"], check=True, capture_output=True)
        port = (s.folder / "port").read_text()
        url = f"postgresql+psycopg://alice:{SECRET}@127.0.0.1:{port}/sec"
        import time

        for _ in range(50):  # the reload is applied by the server shortly after
            try:
                psycopg.connect(f"postgresql://alice:wrong@127.0.0.1:{port}/sec", connect_timeout=3).close()
                time.sleep(0.1)
            except psycopg.OperationalError as e:
                assert "password authentication failed" in str(e)
                break
        psycopg.connect(url.replace("+psycopg", ""), connect_timeout=3).close()  # the right one works
        yield url
    finally:
        s.close()


@pytest.mark.slow  # a server of its own, a study and five commands: ~60 s on 2 loaded cores
def test_a_password_never_leaks_from_any_command(tmp_path, guarded, cli, mlflow_template):
    import optuna
    from mlflow import MlflowClient

    shutil.copy(mlflow_template, tmp_path / "m.db")
    mlflow = f"sqlite:///{tmp_path}/m.db"
    seen = []

    def run(*args, env=None, code=0):
        r = cli(*args, cwd=tmp_path, env=env)
        seen.append(r.stdout + r.stderr)
        assert r.returncode == code and "Traceback" not in r.stderr, r
        return r

    run("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
        "--trials", "2", "--study-name", "sec", "--storage", guarded, "--mlflow-uri", mlflow)
    run("ask", "--study", "sec", "--storage", guarded, "-n", "2", "--out", "asked")
    asks = [json.loads(p.read_text()) for p in sorted((tmp_path / "asked").glob("trial-*/ask.json"))]
    assert len(asks) == 2 and all(SECRET not in json.dumps(a) for a in asks)
    (tmp_path / "m.json").write_text(json.dumps({"pass@1": 0.5, "search_flops": 3e17, "learning_flops": 5e17,
                                                 "reward_flops": 0}))
    tell = shlex.split(asks[0]["tell"])
    assert tell[:2] == ["allocopt", "tell"] and "alice@127.0.0.1" in asks[0]["storage"]
    tell = tell[1:]  # the command after "allocopt"
    tell = tell[:tell.index("--metrics")] + ["--metrics", "m.json", "--mlflow-uri", mlflow]
    without = run(*tell, code=2)  # no password anywhere: the server refuses, one line
    assert "password" in without.stderr.lower() and len(without.stderr.strip().splitlines()) == 1
    run(*tell, env={"PGPASSWORD": SECRET})  # the written command, the password from the environment
    run("best", "--study", "sec", "--storage", guarded, "--target", "pass@1")
    run("report", "--study", "sec", "--storage", guarded, "--out", "rep")

    # two tells of one trial at once (processes): one records it, the other one line
    n = asks[1]["trial"]
    procs = [subprocess.Popen([sys.executable, "-m", "allocopt.cli", "tell", "--study", "sec", "--storage",
                               asks[1]["storage"], "--trial", str(n), "--metrics", "m.json", "--no-mlflow"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "PGPASSWORD": SECRET}) for _ in range(2)]
    done = [(p.wait(120), *p.communicate()) for p in procs]
    seen += [o + e for _, o, e in done]
    assert sorted(rc for rc, _, _ in done) == [0, 2], done
    loser = next(e for rc, _, e in done if rc == 2)
    print(f"\nwithout PGPASSWORD: {without.stderr.strip()}\nthe second tell at once: {loser.strip()}")
    assert loser.startswith(f"error: --trial: trial={n}: already finished") and loser.count("\n") == 1, loser

    # nothing printed, written or recorded holds the password
    assert not [s for s in seen if SECRET in s]
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, leaked
    storage = optuna.storages.RDBStorage(guarded)
    sid = storage.get_study_id_from_name("sec")
    st = optuna.load_study(study_name="sec", storage=storage)
    assert SECRET not in json.dumps([storage.get_study_user_attrs(sid), storage.get_study_system_attrs(sid)],
                                    default=str)
    for t in st.trials:
        assert SECRET not in json.dumps([t.user_attrs, t.system_attrs, t.params], default=str), t.number
    assert sorted(t.state.name for t in st.trials) == ["COMPLETE"] * 4
    c = MlflowClient(mlflow)
    exp = c.get_experiment_by_name("allocopt/sec")
    assert SECRET not in json.dumps(exp.tags)
    runs = c.search_runs([exp.experiment_id], max_results=100)
    assert len(runs) >= 4  # the parent, two trials, the told one
    for r in runs:
        assert SECRET not in json.dumps([r.data.params, r.data.tags, r.info.run_name]), r.info.run_id
