"""Many workers on one study: heartbeats, a killed worker's trial retried once, MLflow agreeing
with Optuna, one parent run, passwords never shown. PostgreSQL tests use the ``postgres_url``
fixture (tests/conftest.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from allocopt.spec import SearchSpace, StudySpec
from allocopt.store.heartbeat import heartbeat, heartbeat_settings
from allocopt.errors import StorageError
from allocopt.redact import redact_url
from allocopt.study.open import StudyError, open_study

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("url,shown", [
    ("postgresql://al:s3cret@db.example:5432/optuna", "postgresql://al:***@db.example:5432/optuna"),
    ("postgresql+psycopg://al:p@ss@h/db", "postgresql+psycopg://al:***@h/db"),  # '@' in the password
    ("postgresql://al@h/db?password=s3cret&sslmode=require", "postgresql://al@h/db?password=***&sslmode=require"),
    ("postgresql://h/db", "postgresql://h/db"),
    ("sqlite:///allocopt.db", "sqlite:///allocopt.db"),
    ("http://u:tok@mlflow:5000", "http://u:***@mlflow:5000"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_heartbeat_settings_checked(monkeypatch):
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "5")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "5")
    with pytest.raises(StorageError, match="ALLOCOPT_GRACE_S=5: must be above"):
        heartbeat_settings()
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "soon")
    with pytest.raises(StorageError, match="ALLOCOPT_HEARTBEAT_S='soon'"):
        heartbeat_settings()
    monkeypatch.delenv("ALLOCOPT_HEARTBEAT_S")
    monkeypatch.delenv("ALLOCOPT_GRACE_S")
    assert heartbeat_settings() == (10, 60)


def _spec(**kw):
    base = dict(name="w", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4,
                sampler="random", tuner="bo", space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 8),
                                                              rewards=("sparse", "prm")))
    return StudySpec(**{**base, **kw})


@pytest.mark.slow  # an end-to-end run of several seconds (CI runs -m slow)
def test_opening_never_touches_running_trials_postgres(pg_database, monkeypatch):
    """A second worker opening the study leaves the first worker's live trial RUNNING; a
    stale one (no heartbeat for the grace period) is failed and retried exactly once."""
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "1")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "2")
    from allocopt.store.heartbeat import fail_stale

    a = open_study(_spec(), pg_database)
    dist = {"rho": optuna.distributions.FloatDistribution(0.2, 0.9)}
    live = a.ask(dist)
    with heartbeat(a, live):
        b = open_study(_spec(), pg_database)  # the second worker
        fail_stale(b)
        assert b.trials[live.number].state.name == "RUNNING"
        assert b.trials[live.number].system_attrs["allocopt.worker"].endswith(f":{os.getpid()}")
        time.sleep(2.5)  # the heartbeat goes on: still alive after the grace period
        fail_stale(b)
        assert b.trials[live.number].state.name == "RUNNING"
    time.sleep(3.0)  # the "worker" is gone: no heartbeat for longer than the grace period
    fail_stale(b)
    fail_stale(b)  # a second check (another worker) does not fail or retry it again
    trials = b.get_trials()
    assert trials[live.number].state.name == "FAIL"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == live.number]
    assert len(retries) == 1 and retries[0].state.name == "WAITING"
    assert retries[0].params == live.params
    # the retry dies too: failed, and not retried a second time (max_retry=1)
    again = b.ask(dist)
    assert again.number == retries[0].number and again.params == live.params
    with heartbeat(b, again):
        pass
    time.sleep(3.5)
    fail_stale(b)
    assert b.trials[again.number].state.name == "FAIL"
    assert not [t for t in b.get_trials() if t.state.name == "WAITING"]


def test_bad_postgres_url_is_one_redacted_line():
    with pytest.raises(StudyError) as e:
        open_study(_spec(), "postgresql://al:s3cret@127.0.0.1:1/nodb?connect_timeout=2")
    msg = str(e.value)
    assert "s3cret" not in msg and "al:***@127.0.0.1" in msg and "\n" not in msg


def _mlflow_store(postgres_url: str, name: str) -> str:
    """A fresh MLflow store in its own PostgreSQL database, its tables made once (workers that
    start at once would otherwise all run MLflow's migrations)."""
    import pgserver
    from mlflow import MlflowClient

    uri = pgserver.fresh_database(postgres_url, name)
    MlflowClient(tracking_uri=uri).search_experiments()
    return uri


def test_parent_run_once_when_workers_start_at_once(postgres_url):
    """Four workers (threads, each with its own MLflow client) open a tracker of one study at the
    same moment: one parent run, shared by all."""
    import threading

    from mlflow import MlflowClient

    from allocopt.tracking import StudyTracker

    uri = _mlflow_store(postgres_url, "mlflow_parent")
    MlflowClient(tracking_uri=uri).create_experiment("allocopt/par")  # as a first worker would
    gate = threading.Barrier(4)
    ids, errors = [], []

    def worker():
        try:
            gate.wait(timeout=60)
            ids.append(StudyTracker("par", tracking_uri=uri).parent_run_id)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(ids) == 4
    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("allocopt/par")
    active = c.search_runs([exp.experiment_id], filter_string="tags.`allocopt.role` = 'study'")
    assert len(active) == 1 and set(ids) == {active[0].info.run_id}


def _wait(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow  # three CLI worker processes on PostgreSQL, one killed: ~100 s on 2 loaded cores
def test_three_workers_one_killed(postgres_url, tmp_path):
    """Three `allocopt study` workers with RACE pilots on one PostgreSQL study (a password in
    the URL) and one MLflow store; one is SIGKILLed mid-trial. Every pilot and every proposal
    runs once, parallel proposals differ, the killed trial is failed and retried once by another
    worker, no finished trial is lost, MLflow agrees with Optuna on every trial (a trial given
    back unsampled, when two workers ask for the last run at once, is none), and the
    password is in no printed line and no MLflow param or tag."""
    import pgserver

    from allocopt.race import RaceSettings
    from allocopt.study.sampler import RaceSampler

    db = pgserver.fresh_database(postgres_url, "three_workers")
    url = db.replace("postgresql://postgres@", "postgresql://postgres:Sup3rSecret@")  # trust auth
    mlflow_uri = _mlflow_store(postgres_url, "mlflow_three")
    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    pilots, full = 10, 3  # the fewest pilots RACE accepts for 2 rewards x 2 G
    spec = tmp_path / "s.toml"
    spec.write_text(f'name = "kw"\nobjective = "synthetic"\nbudget_flops = 1e18\ntarget = "pass@1"\n'
                    f'trials = {full}\nseed = 0\ntuner = "race"\npilots = {pilots}\npilot_fraction = 0.1\n'
                    '[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4, 8]\nrewards = ["sparse", "prm"]\n'
                    '[objective_settings]\nsleep_s = 1.0\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ALLOCOPT_HEARTBEAT_S": "1", "ALLOCOPT_GRACE_S": "10"}
    args = [sys.executable, "-m", "allocopt.cli", "study", "--spec", str(spec), "--storage", url,
            "--mlflow-uri", mlflow_uri]
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    ps = [subprocess.Popen(args, stdout=open(f, "w"), stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
          for f in logs]
    victim = ps[0]
    load = lambda: optuna.load_study(study_name="kw", storage=db)  # noqa: E731
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)

    def victim_mid_trial():
        if victim.poll() is not None:
            raise AssertionError("the first worker exited: " + logs[0].read_text()[-2000:])
        try:
            st = load()
        except Exception:  # noqa: BLE001 - not created yet
            return None
        done = [t for t in st.trials if t.state.name == "COMPLETE"]
        mine = [t for t in st.trials if t.state.name == "RUNNING"
                and t.system_attrs.get("allocopt.worker", "").endswith(f":{victim.pid}")]
        if len(done) < 3 or not mine:
            return None
        exp = client.get_experiment_by_name("allocopt/kw")
        runs = client.search_runs([exp.experiment_id], filter_string=(
            f"tags.`allocopt.trial_number` = '{mine[0].number}' and attributes.status = 'RUNNING'"))
        return (done, mine[0]) if runs else None  # its MLflow run is open: the kill lands mid-trial

    try:
        done_before, killed = _wait(victim_mid_trial, 150, "the first worker mid-trial")
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    for p, f in zip(ps[1:], logs[1:]):
        assert p.wait(timeout=240) == 0, f.read_text()[-3000:]
    everything = load().trials
    # two workers asking for the last run at once: the later one gave its trial back unsampled
    # (PRUNED, `released`): it ran nothing and is no trial of the study's, here or in MLflow
    released = [t for t in everything if t.state.name == "PRUNED"]
    assert all(t.user_attrs.get("released") and not t.params for t in released), released
    trials = {t.number: t for t in everything if t.state.name != "PRUNED"}
    # the killed trial: failed, retried exactly once by a survivor, with the same allocation
    assert trials[killed.number].state.name == "FAIL"
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].params == killed.params
    assert not retries[0].system_attrs["allocopt.worker"].endswith(f":{victim.pid}")
    assert [t.number for t in trials.values() if t.state.name == "FAIL"] == [killed.number]
    assert not [t for t in trials.values() if t.state.name in ("RUNNING", "WAITING")]
    for t in done_before:  # nothing finished is lost
        assert trials[t.number].state.name == "COMPLETE" and trials[t.number].values == t.values
    # every pilot exactly once, no allocation run twice (but the killed one's retry)
    design = RaceSampler(space, 1e18, pilot_fraction=0.1,
                         settings=RaceSettings(max_pilots=pilots), seed=0).design
    ran = [t for t in trials.values() if t.number != killed.number]
    keys = sorted(t.user_attrs["race_pilot"] for t in ran if "race_pilot" in t.user_attrs)
    assert keys == sorted(p.key for p in design)
    allocations = [tuple(sorted(t.params.items())) for t in ran]
    assert len(set(allocations)) == len(allocations)
    fulls = [t for t in ran if t.params.get("fidelity") == "full"]
    assert len(fulls) >= full
    overlapping = [(a.number, b.number) for a in fulls for b in fulls if a.number < b.number
                   and a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete]
    assert overlapping, "no two full-budget proposals ran at once: parallel proposals untested"
    # MLflow agrees with Optuna on every trial
    exp = client.get_experiment_by_name("allocopt/kw")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("allocopt.role") == "study"]
    trial_runs = {int(r.data.tags["allocopt.trial_number"]): r for r in runs
                  if r.data.tags.get("allocopt.role") == "trial"}
    assert len(parents) == 1 and set(trial_runs) == set(trials)  # none for a released trial
    assert not [k for k in parents[0].data.metrics if "pruned" in k], parents[0].data.metrics
    status = {"COMPLETE": "FINISHED", "FAIL": "FAILED"}
    for n, t in trials.items():
        r = trial_runs[n]
        assert r.info.status == status[t.state.name], (n, t.state.name, r.info.status)
        assert r.data.tags["allocopt.state"] == t.user_attrs.get("state", t.state.name)
        assert r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert f"retried as trial {retries[0].number}" in trial_runs[killed.number].data.tags["allocopt.error"]
    # the password: in no printed line, no param, no tag
    for f in logs:
        assert "Sup3rSecret" not in f.read_text()
    for r in runs:
        assert not any("Sup3rSecret" in str(v) for v in {**r.data.params, **r.data.tags}.values())
    print(f"three workers: {len(trials)} trials ({len(keys)} pilots, {len(fulls)} full, killed "
          f"trial {killed.number} retried as {retries[0].number}), {len(overlapping)} overlapping full pairs, "
          f"{len(released)} released")


@pytest.mark.parametrize("args", [
    ("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0",
     "--no-mlflow", "--storage"),
    ("best", "--study", "x", "--target", "pass@1", "--storage"),
    ("ask", "--study", "x", "--storage"),
])
def test_cli_never_prints_a_password(args, tmp_path, cli):
    bad = "postgresql://al:Sup3rSecret@127.0.0.1:1/db?connect_timeout=2"
    r = cli(*args, bad, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Sup3rSecret" not in r.stdout + r.stderr and "al:***@127.0.0.1" in r.stderr


@pytest.mark.slow  # two CLI worker processes to the end: ~80 s on 2 loaded cores
def test_two_workers_start_together_on_fresh_sqlite_files(tmp_path):
    """Two `allocopt study` processes started at the same instant on a new SQLite study file
    and a new MLflow SQLite file (the plain one-machine case): both finish (no schema race:
    Optuna's creation is retried, MLflow's is serialized by a lock file), every pilot runs
    once, no full-budget allocation runs twice, at most one full trial more than asked."""
    spec = tmp_path / "small.toml"
    spec.write_text('objective = "synthetic"\nbudget_flops = 1e19\ntarget = "pass@1"\ntrials = 3\n'
                    'tuner = "race"\npilots = 10\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4, 8]\nrewards = ["sparse", "prm"]\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "allocopt.cli", "study", "--spec", str(spec), "--study-name", "two",
           "--storage", "sqlite:///s.db", "--mlflow-uri", "sqlite:///mlflow.db"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    st = optuna.load_study(study_name="two", storage=f"sqlite:///{tmp_path}/s.db")
    pilots = [t for t in st.trials if t.user_attrs.get("fidelity") == "pilot"]
    full = [t for t in st.trials if t.user_attrs.get("fidelity") == "full"]
    assert len(pilots) == 10 and len({t.user_attrs["race_pilot"] for t in pilots}) == 10
    keys = [(t.params["reward"], t.params["group_size"], round(t.params["rho"], 4)) for t in full]
    assert 3 <= len(full) <= 4 and len(set(keys)) == len(keys)
    assert all(t.state.name == "COMPLETE" for t in st.trials)


def _six_complete(study, dists) -> None:
    """Six complete trials, as the loop records them (a satisfied budget constraint), on a
    smooth target with its optimum near rho 0.55, prm and G 8."""
    for rho, g, r in [(0.25, 2, "sparse"), (0.45, 8, "prm"), (0.6, 2, "prm"), (0.75, 8, "sparse"),
                      (0.85, 2, "prm"), (0.35, 8, "sparse")]:
        study.enqueue_trial({"rho": rho, "group_size": g, "reward": r})
        t = study.ask(dists)
        t.set_constraint("budget", -1.0)
        study.tell(t, 0.6 - (rho - 0.55) ** 2 + 0.05 * (r == "prm") + 0.02 * (g == 8))


def _alloc_distance(a: dict, b: dict, rho_range: float) -> float:
    """How far apart two plain-BO proposals are: |Δρ| as a share of the ρ range, plus 1 for a
    different group size and 1 for a different reward system."""
    return (abs(a["rho"] - b["rho"]) / rho_range + float(a["group_size"] != b["group_size"])
            + float(a["reward"] != b["reward"]))


def test_botorch_takes_other_workers_running_trials_as_pending(tmp_path, monkeypatch):
    """Two handles on one SQLite study (two workers), the same sampler seed and the same six
    complete trials: the first worker's proposal x is RUNNING when the second asks, and the
    second proposes elsewhere (distance above 0.05: 5 % of the ρ range, or another G or reward
    system). Control: with x no longer running, a third handle with the same seed proposes x
    again, so the difference comes from x pending in the acquisition (BoTorch's X_pending), not
    from chance."""
    from allocopt.study.open import distributions, make_sampler

    monkeypatch.setenv("ALLOCOPT_WORKER", "0")  # every handle the same seed
    url = f"sqlite:///{tmp_path}/bo.db"
    spec = _spec(name="bo", sampler="botorch", startup_trials=4)
    dists = distributions(spec)
    a = open_study(spec, url)
    _six_complete(a, dists)
    a.sampler = make_sampler(spec)
    x = a.ask(dists)  # worker A: RUNNING at x
    b = open_study(spec, url)  # worker B, another handle on the same file
    b.sampler = make_sampler(spec)
    y = b.ask(dists)
    d = _alloc_distance(x.params, y.params, 0.9 - 0.2)
    assert d > 0.05, (x.params, y.params)
    a.tell(x, state=optuna.trial.TrialState.FAIL)
    b.tell(y, state=optuna.trial.TrialState.FAIL)
    c = open_study(spec, url)
    c.sampler = make_sampler(spec)
    z = c.ask(dists)  # the same data, nothing running: x again
    assert _alloc_distance(x.params, z.params, 0.7) < 1e-3, (x.params, z.params)
    print(f"proposals: x={x.params} y={y.params} (distance {d:.3f}); without x pending: {z.params}")


def test_a_worker_samples_after_the_workers_that_asked_before_it(tmp_path, monkeypatch):
    """Two handles on one SQLite study ask at the same moment (trials n and n+1, both RUNNING,
    neither sampled): the later one waits until the earlier one's allocation is set, then samples
    with it pending and proposes elsewhere. Without the wait both would propose from the same
    data: the same allocation twice (seen with two workers on fast trials)."""
    import threading

    from allocopt.store.heartbeat import _suggest, worker_trial
    from allocopt.study.open import distributions, make_sampler

    monkeypatch.setenv("ALLOCOPT_WORKER", "0")  # the same seed for both handles
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "60")  # A's unnamed trial stays live all along
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "600")
    url = f"sqlite:///{tmp_path}/order.db"
    spec = _spec(name="order", sampler="botorch", startup_trials=4)
    dists = distributions(spec)
    a = open_study(spec, url)
    _six_complete(a, dists)
    a.sampler = make_sampler(spec)
    first = a.ask()  # worker A has asked, not sampled yet (live: asked < one heartbeat ago)
    b = open_study(spec, url)
    b.sampler = make_sampler(spec)
    got: dict = {}

    def worker_b():
        with worker_trial(b, dists) as t:
            got["params"] = dict(t.params)
            got["at"] = time.monotonic()
            b.tell(t, state=optuna.trial.TrialState.FAIL)

    th = threading.Thread(target=worker_b)
    th.start()
    time.sleep(3.0)
    assert "params" not in got  # B waits: A's trial (numbered below) has no allocation yet
    for name, dist in dists.items():  # A samples now
        _suggest(first, name, dist)
    sampled_at = time.monotonic()
    th.join(timeout=120)
    assert got["at"] >= sampled_at
    assert _alloc_distance(first.params, got["params"], 0.9 - 0.2) > 0.05, (first.params, got["params"])
    a.tell(first, state=optuna.trial.TrialState.FAIL)
