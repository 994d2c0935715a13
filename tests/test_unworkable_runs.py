"""Runs that cannot work are refused before anything is recorded; a study where nothing
finished exits 1; MLflow faults give one line and leave no Optuna study behind."""

import math
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.plan.allocation import Allocation, min_budget
from allocopt.flops import ConfigError
from allocopt.spec import StudySpec

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "allocopt.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})})


def test_space_feasibility_names_the_smallest_plan():
    from allocopt.cli.common import check_space_feasible
    from objectives.synthetic import SyntheticObjective

    w = SyntheticObjective().workload()
    spec = StudySpec(objective="synthetic", budget_flops=1e18, space={"rho": [0.3, 0.7], "group_sizes": [4, 8],
                                                                      "rewards": ["dense", "prm"]})
    # by hand: every allocation at both ends of the rho range; the cheapest is the bound
    need = min(min_budget(Allocation(rho=r, group_size=g, reward=w_), w)
               for r in (0.3, 0.7) for g in (4, 8) for w_ in ("dense", "prm"))
    enough = float(need) if float(need) >= need else math.nextafter(float(need), math.inf)
    check_space_feasible(spec.with_overrides(budget_flops=enough), w)  # just enough: fine
    with pytest.raises(ConfigError, match=re.escape(f"needs {need:.3g} FLOPs")):
        check_space_feasible(spec.with_overrides(budget_flops=need * 0.999), w)
    with pytest.raises(ConfigError, match=r"pilot_fraction=0.1: .*budget_flops >= "):
        check_space_feasible(spec.with_overrides(budget_flops=need * 5.0), w, 0.1)
    check_space_feasible(spec.with_overrides(budget_flops=need * 10.0), w, 0.1)


@pytest.mark.parametrize("cmd", [["study", "--pilots", "0"], ["race"], ["study"]])
def test_budget_below_one_iteration_is_refused_before_storage(tmp_path, cmd):
    r = cli(*cmd, "--objective", "synthetic", "--budget", "1e12", "--target", "pass@1",
            "--storage", f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", f"sqlite:///{tmp_path}/m.db", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    from objectives.synthetic import SyntheticObjective

    w, space = SyntheticObjective().workload(), StudySpec().space  # the CLI's default space, by hand
    need = min(min_budget(Allocation(rho=r, group_size=g, reward=x), w)
               for r in space.rho for g in space.group_sizes for x in space.rewards)
    assert r.stderr.count("\n") == 1 and "smallest feasible plan" in r.stderr
    assert f"needs {need:.3g} FLOPs" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no Optuna, no MLflow file


def test_trial_estimates_wall_time_and_refuses_years(tmp_path):
    from objectives.tiny.objective import TinyObjective

    r = cli("trial", "--objective", "tiny", "--budget", "1e19", "--rho", "0.5", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    years = 1e19 / TinyObjective.flops_per_second / (365.25 * 86400)  # ~31.7 at 1e10 FLOP/s
    assert f"about {years:.1f} years" in r.stderr and "--yes" in r.stderr


@pytest.mark.parametrize("cmd", [["study"], ["study", "--tuner", "race"], ["race", "--target", "pass@1"]])
def test_study_of_years_on_the_cpu_is_refused_before_storage(tmp_path, cmd):
    from objectives.tiny.objective import TinyObjective

    r = cli(*cmd, "--objective", "tiny", "--budget", "1e19", "--storage", f"sqlite:///{tmp_path}/o.db",
            "--mlflow-uri", f"sqlite:///{tmp_path}/m.db", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    one = (TinyObjective.overhead_seconds + 1e19 / TinyObjective.flops_per_second) / (365.25 * 86400)
    assert f"one full run of the tiny objective would take about {one:.1f} years" in r.stderr
    assert "at most 1.0 h a run" in r.stderr and "--yes" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no Optuna, no MLflow file


def test_run_time_check_passes_an_hour_a_yes_and_a_time_budget():
    from allocopt.cli.common import check_run_time
    from allocopt.plan.throughput import ThroughputProfile
    from objectives.tiny.objective import TinyObjective

    obj = TinyObjective()
    hour = (3600.0 - obj.overhead_seconds) * obj.flops_per_second  # the FLOPs one hour buys, by hand
    check_run_time(StudySpec(objective="tiny", budget_flops=hour * 0.999), obj, yes=False)
    with pytest.raises(ConfigError, match=r"budget=.*: one full run of the tiny objective would take about "
                                          r"1\.0 h here \(3 of them about 3\.0 h"):
        check_run_time(StudySpec(objective="tiny", budget_flops=hour * 1.001), obj, yes=False, num_full=3)
    check_run_time(StudySpec(objective="tiny", budget_flops=1e19), obj, yes=True)
    p = ThroughputProfile(gpu="x", setup_fingerprint="*", search_prefill=4e14, search_decode=2e13, learning=2e14)
    hours = StudySpec(objective="tiny", budget_gpu_hours=1e6, throughput=p.to_dict())  # hours the user gave
    assert hours.time_budget is not None and hours.budget_flops > hour
    check_run_time(hours, obj, yes=False)


def test_study_where_every_trial_failed_exits_1(tmp_path, monkeypatch, capsys):
    from objectives.synthetic import SyntheticObjective

    def broken(self, plan, *, seed=0, progress=None):
        raise RuntimeError("objective broke")

    monkeypatch.setattr(SyntheticObjective, "run", broken)
    monkeypatch.chdir(tmp_path)
    from allocopt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
              "--trials", "2", "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/o.db"])
    assert e.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    import optuna

    from allocopt.record import rows

    states = [r.state for r in rows(optuna.load_study(study_name="allocopt", storage=f"sqlite:///{tmp_path}/o.db"))]
    assert len(states) == 2 and "COMPLETE" not in states and "FAIL" in states
    assert last.startswith("error: no trial of study") and \
        f"{states.count('FAIL')} failed, {states.count('INFEASIBLE')} infeasible" in last


@pytest.mark.slow  # a fresh process end to end (CI runs -m slow)
def test_unreachable_mlflow_is_one_line_in_seconds_and_leaves_no_study(tmp_path):
    silent = socket.socket()  # accepts connections in the kernel and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    for uri in ("http://127.0.0.1:9", f"http://127.0.0.1:{silent.getsockname()[1]}"):
        t = time.perf_counter()
        r = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
                "--storage", f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", uri, cwd=tmp_path, timeout=90)
        took = time.perf_counter() - t
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert uri in r.stderr and ("Connection refused" in r.stderr or "Read timed out" in r.stderr)
        assert took < 60  # 5 s probe timeout, no retries (was 4+ minutes); the rest is start-up
        assert not (tmp_path / "o.db").exists()
    silent.close()


def _chattr_works() -> bool:
    """Whether ``chattr +i`` (immutable file) works here: root and a filesystem with attributes."""
    import tempfile

    with tempfile.NamedTemporaryFile(dir=tempfile.gettempdir()) as f:
        try:
            ok = subprocess.run(["chattr", "+i", f.name], capture_output=True).returncode == 0
        except OSError:  # no chattr at all
            return False
        subprocess.run(["chattr", "-i", f.name], capture_output=True)
        return ok


@pytest.mark.slow
@pytest.mark.skipif(not _chattr_works(), reason="chattr +i is not available here (needs root and a "
                    "filesystem with attributes)")
def test_read_only_mlflow_store_is_one_line_and_leaves_no_study(tmp_path):
    """A store MLflow can read but not write (``chattr +i``: read-only even for root)."""
    db = tmp_path / "m.db"
    subprocess.run([sys.executable, "-c", f"import mlflow; mlflow.MlflowClient('sqlite:///{db}').search_experiments()"],
                   check=True, capture_output=True, timeout=120)
    assert subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode == 0
    try:
        r = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
                "--storage", f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", f"sqlite:///{db}", cwd=tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(db)], capture_output=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{db} is not writable (Operation not permitted)" in r.stderr, r.stderr
    assert not (tmp_path / "o.db").exists()


@pytest.mark.skipif(not _chattr_works(), reason="chattr +i is not available here (needs root and a "
                    "filesystem with attributes)")
@pytest.mark.parametrize("store", ["sqlite:///{ro}/m.db", "sqlite:///{ro}/new/m.db",
                                   pytest.param("file:{ro}", marks=pytest.mark.slow)])  # two commands: ~12 s
def test_a_read_only_mlflow_folder_is_one_line_in_seconds(tmp_path, store):
    """A read-only folder (``chattr +i``: read-only even for root) for a SQLite or file store:
    one line within seconds, exit 2, no Optuna study (MLflow itself retried opening the SQLite
    file ten times with backoff: 118 s of silence measured before this check). The check
    happens before MLflow is imported: its time is the command's start-up."""
    ro = tmp_path / "ro"
    ro.mkdir()
    assert subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0
    uri = store.format(ro=ro)
    try:
        t = time.perf_counter()
        r = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
                "--storage", f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", uri, cwd=tmp_path, timeout=60)
        took = time.perf_counter() - t
        allowed = store.startswith("file:") and cli("study", "--objective", "synthetic", "--budget", "1e18", "--pilots", "0", "--storage",
                      f"sqlite:///{tmp_path}/o.db", "--mlflow-uri", uri, cwd=tmp_path, timeout=60,
                      env={"MLFLOW_ALLOW_FILE_STORE": "true"})  # a file store MLflow accepts: its folder checked
    finally:
        subprocess.run(["chattr", "-i", str(ro)], capture_output=True)
    print(f"{uri}: one line after {took:.1f} s")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    if store.startswith("file:"):
        assert "MLflow 3 refuses file stores" in r.stderr and "MLFLOW_ALLOW_FILE_STORE=true" in r.stderr
        r = allowed
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{ro} is not writable (Operation not permitted)" in r.stderr, r.stderr
    assert took < 30  # start-up (imports) only; the check itself takes milliseconds
    assert not (tmp_path / "o.db").exists() and list(ro.iterdir()) == []


def test_query_from_unreachable_mlflow_is_one_line_in_seconds(tmp_path):
    t = time.perf_counter()
    r = cli("best", "--target", "pass@1", "--from-mlflow", "allocopt/x", "--mlflow-uri", "http://127.0.0.1:9",
            cwd=tmp_path, timeout=90)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Connection refused" in r.stderr, r.stderr
    assert time.perf_counter() - t < 60  # no retries with backoff (was minutes)
