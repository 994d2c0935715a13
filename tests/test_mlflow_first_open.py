"""Two workers opening one fresh MLflow SQLite file at once: each probe holds the lock beside
it, so one creates the schema and the other finds it made (found by a new user: two
`allocopt workers` starting in a fresh folder left `table _alembic_tmp_... already exists` in
mlflow.db, and every later study there was refused)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import sys, time
    from allocopt.tracking.lifecycle import probe_tracking
    start = float(sys.argv[2])
    while time.time() < start:
        time.sleep(0.005)
    probe_tracking("s" + sys.argv[3], "sqlite:///" + sys.argv[1])
    print("ok")
""")


@pytest.mark.slow  # two interpreters importing MLflow: ~30 s on 2 busy cores
def test_probes_of_one_fresh_store_at_once_both_succeed_and_leave_it_usable(tmp_path):
    import time

    db = tmp_path / "mlflow.db"
    start = time.time() + 4.0  # both interpreters up and imported before either opens the file
    procs = [subprocess.Popen([sys.executable, "-c", PROBE, str(db), str(start), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-400:] for o in outs]
    assert (tmp_path / "mlflow.db.lock").exists()  # the lock was taken beside the store
    from mlflow import MlflowClient

    names = {e.name for e in MlflowClient(f"sqlite:///{db}").search_experiments()}
    assert {"allocopt/s0", "allocopt/s1"} <= names
