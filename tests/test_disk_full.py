"""A REAL full disk mid-study (issue: nothing stays RUNNING): the study's Optuna SQLite file,
MLflow store and spool on a small tmpfs that fills up while a trial runs; then space is freed
and the same command resumes. Needs ``mount -t tmpfs`` (root, or a container allowed to mount):
skipped at collection where a probe mount is refused.

The disk is filled at a chosen moment (a ballast file written until ENOSPC while trial 2 holds,
tests/fault_objective.py's ``hold``) rather than by sizing the tmpfs to the byte: MLflow's
store grows by amounts that differ between versions, and the moment decides what is cut short.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from test_faults import mlflow_runs

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent
RUN = ("import sys; sys.path.insert(0, {!r}); import fault_objective; from allocopt.cli import main; "
       "main()").format(str(TESTS))


def _mount(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``where``; the reason it could not, or ``None``."""
    if shutil.which("mount") is None:
        return "no mount command"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exit {r.returncode}")


def _probe() -> str | None:
    d = tempfile.mkdtemp(prefix="allocopt-tmpfs-probe-")
    try:
        why = _mount(Path(d), "64k")
        if why is None:
            subprocess.run(["umount", d], check=False)
        return why
    finally:
        os.rmdir(d)


_WHY = _probe()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"cannot mount a tmpfs here ({_WHY})")


@pytest.fixture
def disk(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    assert _mount(d, "8m") is None
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def _spec(tmp: Path, trials: int, hold_from: int) -> Path:
    f = tmp / "f.toml"  # on the big disk, like the objective's log: only the records fill up
    f.write_text(f'name = "f"\nobjective = "faulty"\nbudget_flops = 1e18\ntarget = "pass@1"\ntrials = {trials}\n'
                 'seed = 0\nsampler = "random"\npilots = 0\n'
                 '[space]\nrho = [0.6, 0.9]\ngroup_sizes = [4, 8]\nrewards = ["sparse", "dense"]\n'
                 f'[objective_settings]\nlog = {json.dumps(str(tmp / "ran.jsonl"))}\n'
                 f'hold = {json.dumps(str(tmp / "hold"))}\nhold_from = {hold_from}\n')
    return f


def _start(tmp: Path, disk: Path, f: Path, optuna_dir: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN, "study", "--spec", str(f),
                             "--storage", f"sqlite:///{optuna_dir or disk}/o.db", "--mlflow-uri", f"sqlite:///{disk}/m.db"],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "TMPDIR": str(disk),
                                 "ALLOCOPT_HEARTBEAT_S": "1", "ALLOCOPT_GRACE_S": "3"})


def _ran(tmp: Path) -> list[dict]:
    p = tmp / "ran.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def _fill(disk: Path, how: str):
    """Leave nothing free on ``disk`` and return what frees it again: ``ballast``, a file written
    until the disk refuses (ENOSPC), deleted afterwards; ``remount``, the tmpfs shrunk to what it
    holds (``mount -o remount,size=``), enlarged afterwards."""
    if how == "remount":
        used_k = -(-(shutil.disk_usage(disk).used) // 1024)
        subprocess.run(["mount", "-o", f"remount,size={used_k}k", str(disk)], check=True)
        assert shutil.disk_usage(disk).free < 4096
        return lambda: subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == 28, e
    assert shutil.disk_usage(disk).free < 4096
    return ballast.unlink


@pytest.mark.slow  # two study processes, ~40 s on 2 loaded cores
@pytest.mark.parametrize("how", ["ballast", "remount"])
def test_a_real_full_disk_mid_trial_then_free_space_and_resume(tmp_path, disk, how):
    """The disk fills while trial 2 runs (a ballast file, or the tmpfs shrunk to what it holds):
    its recording fails. One line naming the files and what
    to do, no traceback, exit 1. Space freed, the same command: trials 0 and 1 kept as they were,
    trial 2 settled (failed) and its allocation run again once, nothing RUNNING, one MLflow run
    per trial matching Optuna."""
    import optuna
    from mlflow import MlflowClient

    f = _spec(tmp_path, trials=4, hold_from=2)
    (tmp_path / "hold").write_text("")
    p = _start(tmp_path, disk, f)
    t = time.time()
    while sum(r["event"] == "start" for r in _ran(tmp_path)) < 3:  # trial 2 holds mid-run
        assert p.poll() is None, p.communicate()
        assert time.time() - t < 180
        time.sleep(0.1)
    time.sleep(0.5)
    free_space = _fill(disk, how)
    t0 = time.time()
    (tmp_path / "hold").unlink()
    out, err = p.communicate(timeout=120)
    first_line_s = time.time() - t0
    assert p.returncode == 1, (p.returncode, err)
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if "disk full" in ln]
    assert len(lines) == 1, err
    assert f"{disk}/o.db" in lines[0] and f"{disk}/m.db" in lines[0] and "run the same command" in lines[0]
    storage = f"sqlite:///{disk}/o.db"
    before = optuna.load_study(study_name="f", storage=storage).get_trials(deepcopy=False)
    kept = {t.number: (t.params, t.values) for t in before if t.state.name == "COMPLETE"}
    assert sorted(kept) == [0, 1], [(t.number, t.state.name) for t in before]
    cut = next(t for t in before if t.number == 2)
    c = MlflowClient(f"sqlite:///{disk}/m.db")
    exp = c.get_experiment_by_name("allocopt/f")
    left = {r.data.tags.get("allocopt.trial_number", "parent"): r.info.status
            for r in c.search_runs([exp.experiment_id], max_results=1000)}
    print(f"\ndisk full ({how}): exit {p.returncode} after {first_line_s:.1f} s; before resume: "
          f"{[(t.number, t.state.name, t.user_attrs.get('state')) for t in before]}; mlflow {left}")

    free_space()
    p = _start(tmp_path, disk, f)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert "Traceback" not in err
    ts = optuna.load_study(study_name="f", storage=storage).get_trials(deepcopy=False)
    states = [(t.number, t.state.name) for t in ts]
    assert all(s in ("COMPLETE", "FAIL") for _, s in states), states  # nothing left RUNNING
    for n, (params, values) in kept.items():  # finished before: kept as it was
        assert ts[n].state.name == "COMPLETE" and ts[n].params == params and ts[n].values == values
    assert ts[2].state.name == "FAIL"  # the cut-short trial, settled
    again = [t for t in ts if t.system_attrs.get("failed_trial") == 2]
    assert len(again) == 1 and again[0].params == cut.params and again[0].state.name == "COMPLETE"
    complete = [t for t in ts if t.state.name == "COMPLETE" and t.user_attrs.get("state") == "COMPLETE"]
    assert len(complete) == 4, states
    key = lambda r: (r["rho"], r["group_size"], r["reward"])  # noqa: E731
    starts = [key(r) for r in _ran(tmp_path) if r["event"] == "start"]
    cut_key = (cut.params["rho"], cut.params["group_size"], cut.params["reward"])
    assert starts.count(cut_key) == 2, starts  # the cut-short run and its one re-run
    assert len(starts) == len(ts), (starts, states)  # nothing else ran twice

    by_trial, parents = mlflow_runs(disk)
    want = {"COMPLETE": {"FINISHED"}, "FAIL": {"FAILED", "KILLED"}}
    for t in ts:
        assert len(by_trial.get(t.number, [])) == 1 and by_trial[t.number][0] in want[t.state.name], \
            (t.number, t.state.name, by_trial)
    assert parents == ["FINISHED"], parents
    print(f"after resume: optuna {states}; mlflow {dict(sorted(by_trial.items()))}; parents {parents}")


@pytest.mark.slow  # two study processes, ~35 s on 2 loaded cores
def test_only_mlflows_disk_full_after_optuna_complete(tmp_path, disk):
    """Optuna's file on a disk with room, MLflow's store on the one that fills while trial 2
    runs: Optuna records trial 2 COMPLETE, MLflow cannot end its run. One line naming MLflow's
    file, exit 1; after freeing space the same command keeps trial 2 (not run again), ends its
    run FINISHED with its target, and finishes the study."""
    import optuna

    f = _spec(tmp_path, trials=4, hold_from=2)
    (tmp_path / "hold").write_text("")
    p = _start(tmp_path, disk, f, optuna_dir=tmp_path)
    t = time.time()
    while sum(r["event"] == "start" for r in _ran(tmp_path)) < 3:
        assert p.poll() is None, p.communicate()
        assert time.time() - t < 180
        time.sleep(0.1)
    time.sleep(0.5)
    free_space = _fill(disk, "ballast")
    t0 = time.time()
    (tmp_path / "hold").unlink()
    out, err = p.communicate(timeout=120)
    first_line_s = time.time() - t0
    assert p.returncode == 1 and "Traceback" not in err, (p.returncode, err)
    lines = [ln for ln in err.splitlines() if "disk full" in ln]
    assert len(lines) == 1 and f"{disk}/m.db" in lines[0] and "o.db" not in lines[0], err
    storage = f"sqlite:///{tmp_path}/o.db"
    before = optuna.load_study(study_name="f", storage=storage).get_trials(deepcopy=False)
    left = mlflow_runs(disk)
    print(f"\nmlflow-only disk full: exit {p.returncode} after {first_line_s:.1f} s; before resume: "
          f"{[(t.number, t.state.name) for t in before]}; mlflow {left}")
    assert [(t.number, t.state.name) for t in before] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    assert left[0][2] == ["RUNNING"], left

    free_space()
    p = _start(tmp_path, disk, f, optuna_dir=tmp_path)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0 and "Traceback" not in err, err
    ts = optuna.load_study(study_name="f", storage=storage).get_trials(deepcopy=False)
    assert [(t.number, t.state.name) for t in ts] == [(n, "COMPLETE") for n in range(4)]  # trial 2 kept
    assert [t.values for t in ts[:3]] == [t.values for t in before]
    assert len([r for r in _ran(tmp_path) if r["event"] == "start"]) == 4  # nothing ran twice
    by_trial, parents = mlflow_runs(disk)
    assert by_trial == {n: ["FINISHED"] for n in range(4)} and parents == ["FINISHED"], (by_trial, parents)
    print(f"after resume: mlflow {by_trial}; parents {parents}")


def _two_trial_study(disk: Path) -> str:
    """A finished 2-trial synthetic study (random sampler) in ``<disk>/o.db``; its URL."""
    from allocopt.spec import SearchSpace, StudySpec
    from allocopt.study.loop import run_study
    from objectives.synthetic import SyntheticObjective

    url = f"sqlite:///{disk}/o.db"
    s = StudySpec(name="at", objective="synthetic", budget_flops=1e18, target="pass@1", trials=2,
                  sampler="random", tuner="bo", space=SearchSpace(rho=(0.3, 0.8), group_sizes=(4, 8),
                                                                rewards=("sparse", "dense")))
    obj = SyntheticObjective()
    run_study(s, objective=obj, workload=obj.workload(), storage=url)
    return url


@pytest.mark.slow  # a study, three asks and two tells on a tmpfs: ~30 s on 2 loaded cores
def test_ask_and_tell_on_a_real_full_disk(tmp_path, disk, cli):
    """``ask`` and ``tell`` with the study's Optuna file on a tmpfs that is full: one line
    naming the file and what to do, exit 1, no traceback, nothing recorded lost. Space freed:
    the same ``tell`` records the trial; no trial the failed ``ask`` reserved is left RUNNING."""
    import optuna

    url = _two_trial_study(disk)
    r = cli("ask", "--study", "at", "--storage", url, "--out", tmp_path / "asked", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    asked = [t.number for t in optuna.load_study(study_name="at", storage=url).trials if t.state.name == "RUNNING"]
    assert len(asked) == 1
    (tmp_path / "m.json").write_text(json.dumps({"pass@1": 0.42, "search_flops": 3e17, "learning_flops": 5e17,
                                                 "reward_flops": 1e17}))
    before = [(t.number, t.state.name, t.params, t.values)
              for t in optuna.load_study(study_name="at", storage=url).trials]
    free_space = _fill(disk, "ballast")

    said = []  # printed at the end: the cli fixture captures what is printed between its calls

    def one_line(r, what, then):
        said.append(f"{what} on a full disk: exit {r.returncode}; stderr: {r.stderr!r}")
        assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "disk full" in lines[0] and f"{disk}/o.db" in lines[0], r.stderr
        assert "free space" in lines[0] and lines[0].endswith(then), r.stderr

    tell = ("tell", "--study", "at", "--storage", url, "--trial", str(asked[0]), "--metrics", "m.json", "--no-mlflow")
    one_line(cli(*tell, cwd=tmp_path), "tell", f"run the same command: it records trial {asked[0]}")
    one_line(cli("ask", "--study", "at", "--storage", url, "-n", "2", "--out", tmp_path / "asked2",
                 cwd=tmp_path), "ask", "run the same command: it reserves anew (a trial cut short is given "
             "back when the study is next opened)")
    free_space()
    after = optuna.load_study(study_name="at", storage=url).trials
    said.append(f"after both, space freed: {[(t.number, t.state.name) for t in after]}")
    assert [(t.number, t.state.name, t.params, t.values) for t in after][:len(before)] == before  # nothing lost

    r = cli(*tell, cwd=tmp_path)  # the failed tell, repeated
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = cli("best", "--study", "at", "--storage", url, cwd=tmp_path)  # the next open
    assert r.returncode == 0, r.stderr
    ts = optuna.load_study(study_name="at", storage=url).trials
    said.append(f"after the tell repeated and the next open: {[(t.number, t.state.name) for t in ts]}")
    print("\n" + "\n".join(said))
    assert ts[asked[0]].state.name == "COMPLETE" and ts[asked[0]].values == [0.42]
    assert all(t.state.name != "RUNNING" for t in ts), [(t.number, t.state.name) for t in ts]
    assert [(t.number, t.state.name, t.params, t.values) for t in ts if t.number != asked[0]][:2] == before[:2]


@pytest.mark.slow  # a study and two asks on a tmpfs: ~25 s on 2 loaded cores
def test_an_ask_cut_short_by_a_full_disk_after_reserving_leaves_nothing_running(tmp_path, disk, cli, monkeypatch):
    """The worst moment for ``ask``: its trial is created (RUNNING) and then the disk fills
    (before its plan is recorded), so giving it back fails too. One line naming the file,
    exit 1; space freed, the next opening of the study (``best``) leaves no trial RUNNING and
    the trials finished before are kept as they were. (The ``ask`` runs in this process, which
    lives on: the reservation is settled for its age, past the grace period; an ``ask`` process
    that is gone has it settled at once.) The next ``ask`` takes its work first."""
    import optuna

    import allocopt.study.asktell as asktell
    url = _two_trial_study(disk)
    before = [(t.number, t.state.name, t.params, t.values)
              for t in optuna.load_study(study_name="at", storage=url).trials]
    real, freed = asktell.write_start, []

    def fill_then_write(trial, **kw):  # the disk fills between the reservation and its record
        if not freed:
            freed.append(_fill(disk, "ballast"))
        return real(trial, **kw)

    monkeypatch.setattr(asktell, "write_start", fill_then_write)
    r = cli("ask", "--study", "at", "--storage", url, "--out", tmp_path / "asked", cwd=tmp_path)
    monkeypatch.setattr(asktell, "write_start", real)
    assert freed, "the disk was not filled"
    freed[0]()
    cut = [(t.number, t.state.name) for t in optuna.load_study(study_name="at", storage=url).trials]
    said = [f"ask cut short: exit {r.returncode}; stderr {r.stderr!r}; trials then {cut}"]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "disk full" in lines[0] and f"{disk}/o.db" in lines[0], r.stderr
    assert not (tmp_path / "asked").exists() or not any((tmp_path / "asked").iterdir())

    time.sleep(2.5)  # the cut reservation's ask (this process: alive) is past the grace period
    r = cli("best", "--study", "at", "--storage", url, cwd=tmp_path,  # the next open
            env={"ALLOCOPT_HEARTBEAT_S": "1", "ALLOCOPT_GRACE_S": "2"})
    assert r.returncode == 0, r.stderr
    ts = optuna.load_study(study_name="at", storage=url).trials
    said.append(f"after the next open: {[(t.number, t.state.name) for t in ts]}; stderr {r.stderr!r}")
    assert all(t.state.name != "RUNNING" for t in ts), [(t.number, t.state.name) for t in ts]
    assert [(t.number, t.state.name, t.params, t.values) for t in ts][:len(before)] == before
    cut_trial = ts[len(before)]
    assert cut_trial.state.name == "FAIL"
    r = cli("ask", "--study", "at", "--storage", url, "--out", tmp_path / "asked", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ts = optuna.load_study(study_name="at", storage=url).trials
    again = [t for t in ts if t.system_attrs.get("failed_trial") == cut_trial.number]
    assert len(again) == 1 and again[0].params == cut_trial.params and again[0].state.name == "RUNNING", \
        [(t.number, t.state.name, t.system_attrs.get("failed_trial")) for t in ts]
    said.append(f"the next ask: {[(t.number, t.state.name, t.system_attrs.get('failed_trial')) for t in ts]}")
    print("\n" + "\n".join(said))
