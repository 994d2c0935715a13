"""MLflow tracking: a fake study logged through StudyTracker, read back with MlflowClient (SQLite
store) and with plain urllib from a real ``mlflow server`` (REST API).

A fresh MLflow SQLite store runs its schema migrations (~7-9 s on 2 cores); the tests make one
migrated store per module and copy it, for the server too. The server starts with
``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` and one worker: MLflow 3.x otherwise also starts a
huey job runner, which took the start from ~5 s to ~30 s and the stop from ~1 s to ~15 s here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from allocopt.plan.allocation import Allocation, InfeasiblePlan, Workload, make_plan
from allocopt.flops import ComputeBreakdown, FlopAccount, ModelShape
from allocopt.plan.meter import IterationRecord
from allocopt.tracking import (StudyTracker, TrackingError, mlflow_key, result_metrics)
from allocopt.tracking.layout import trial_run_name
from allocopt.objective import TrialResult

BUDGET = 10**19
PHASE_KEYS = ("search_flops", "learning_flops", "reward_flops", "total_flops", "rho")
BREAKDOWN_KEYS = PHASE_KEYS + tuple(f"useful_{k}" for k in PHASE_KEYS) + (
    "budget_flops", "budget_utilization", "eval_flops", "search_wall_seconds",
    "learning_wall_seconds", "reward_wall_seconds")
LONG_ERROR = "Traceback (most recent call last):\n" + "  File x, line 1\n" * 900 + \
    "RuntimeError: CUDA out of memory at the end"


# ============================================================================ fixtures
@pytest.fixture(scope="module")
def template_db(mlflow_template) -> Path:
    """An empty, migrated MLflow SQLite store, copied by each test (migrations take seconds):
    the session's (conftest)."""
    return mlflow_template


@pytest.fixture
def store(tmp_path, template_db) -> str:
    shutil.copy(template_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _plan(rho: float, reward: str, budget: int = BUDGET, group_size: int = 8):
    workload = Workload(ModelShape.preset("Qwen/Qwen2.5-1.5B"))
    return make_plan(budget, Allocation(rho, group_size, reward), workload)


def _curves(total: int, n: int = 5) -> list[IterationRecord]:
    """``n`` iterations ending at ``total`` executed FLOPs (last cumulative > 2**63 for 1e19)."""
    cum = [total * (i + 1) // n for i in range(n)]
    return [IterationRecord(i, 60, cum[i] - (cum[i - 1] if i else 0), cum[i], 0.1 + 0.05 * i, 2.5)
            for i in range(n)]


def _complete_trial(tracker: StudyTracker, number: int, rho: float, reward: str,
                    fidelity: str = "full") -> tuple[str, dict]:
    plan = _plan(rho, reward)
    run_id = tracker.start_trial(number, plan.to_dict(), {"objective": "pass@1", "fidelity": fidelity})
    result = TrialResult(
        targets={"native_reward": 0.61, "pass@1": 0.42, "pass@1:gsm8k": 0.5, "judge": 0.3},
        spent=plan.expected, budget_flops=BUDGET, curves=_curves(plan.expected.executed.total_flops),
        wall_seconds={"search": 120.0, "learning": 80.5, "reward": 3.25}, eval_flops=7 * 10**15)
    tracker.finish_trial(run_id, state="COMPLETE", metrics=result_metrics(result),
                         curves=result.curves, plan=plan.to_dict())
    return run_id, {"plan": plan, "result": result}


def _fake_study(tracker: StudyTracker) -> dict[str, str]:
    """Trial 0 COMPLETE, 1 FAIL (crashed mid-run, long traceback), 2 INFEASIBLE (no plan)."""
    runs = {}
    runs["complete"], _ = _complete_trial(tracker, 0, 0.72, "sparse")

    plan = _plan(0.45, "prm")
    run_id = tracker.start_trial(1, plan.to_dict(), {"objective": "pass@1", "fidelity": "pilot"})
    spent = plan.expected * 0.25
    partial = TrialResult(targets={"native_reward": math.nan, "pass@1": math.nan},
                          spent=spent, budget_flops=BUDGET,
                          curves=_curves(spent.executed.total_flops, 2),
                          wall_seconds={"search": 30.0}, status="failed", error=LONG_ERROR)
    tracker.finish_trial(run_id, state="FAIL", metrics=result_metrics(partial),
                         curves=partial.curves, plan=plan.to_dict(), error=LONG_ERROR)
    runs["fail"] = run_id

    try:
        _plan(0.45, "prm", budget=10**12, group_size=16)
    except InfeasiblePlan as e:
        msg = str(e)
    run_id = tracker.start_trial(2, {"rho": 0.45, "group_size": 16, "reward": "prm",
                                     "budget_flops": 10**12, "model": "Qwen/Qwen2.5-1.5B"},
                                 {"objective": "pass@1"})
    tracker.finish_trial(run_id, state="INFEASIBLE", metrics={"budget_flops": 10**12},
                         curves=[], plan=None, error=msg)
    runs["infeasible"] = run_id
    tracker.log_study_summary({"pass@1": {"trial": 0, "rho": 0.72, "value": 0.42}},
                              {"n_complete": 1, "n_failed": 1, "best_pass@1": 0.42})
    return runs


def _download(client, run_id: str, path: str, dst: Path) -> str:
    return Path(client.download_artifacts(run_id, path, str(dst))).read_text()


# ============================================================================ keys
def test_trial_run_name_says_the_allocation():
    assert trial_run_name(41, {"reward": "dense", "rho": 0.5611, "group_size": 4}) == "trial-41 dense ρ0.56 G4"
    assert trial_run_name(3, {"reward": "sparse", "rho": "0.2", "group_size": "2"},
                          "pilot") == "trial-3 pilot sparse ρ0.20 G2"
    assert trial_run_name(7, {}) == "trial-7"
    assert trial_run_name(8, {"rho": "n/a", "group_size": 16}) == "trial-8 G16"


def test_mlflow_key_sanitizes_names_mlflow_rejects():
    assert mlflow_key("pass@1") == "pass_at_1"
    assert mlflow_key("pass@1:gsm8k") == "pass_at_1_gsm8k"
    assert mlflow_key("search_flops") == "search_flops"
    assert mlflow_key("curve/reward_mean") == "curve/reward_mean"
    assert mlflow_key("/a//../b c/") == "a/_/b_c"
    assert mlflow_key("ρ") == "_"
    assert len(mlflow_key("x" * 400)) == 250
    from mlflow.utils.validation import _validate_metric_name, _validate_param_name
    for raw in ("pass@1:math500", "a b/c", "..", "/x/", "é@ü", "k=v;{}"):
        _validate_metric_name(mlflow_key(raw))
        _validate_param_name(mlflow_key(raw))


# ============================================================================ (a) SQLite store
def test_fake_study_reads_back(store, tmp_path):
    tracker = StudyTracker("fake", tracking_uri=store)
    runs = _fake_study(tracker)
    tracker.close()
    c = tracker.client

    exp = c.get_experiment_by_name("allocopt/fake")
    assert exp.experiment_id == tracker.experiment_id
    all_runs = c.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in all_runs if r.data.tags.get("allocopt.role") == "study"]
    trials = {r.info.run_id: r for r in all_runs if r.data.tags.get("allocopt.role") == "trial"}
    assert len(parents) == 1 and parents[0].info.run_id == tracker.parent_run_id
    assert parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["allocopt.study"] == "fake"
    # artifacts beside the database, not in the working folder
    assert exp.artifact_location.startswith((tmp_path / "mlruns").as_uri() + "/allocopt-fake-")
    assert set(trials) == set(runs.values())
    for r in trials.values():  # nested under the study's run
        assert r.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
        assert r.data.tags["allocopt.study"] == "fake"
        assert r.data.tags["allocopt.objective"] == "pass@1"  # a tag *value* may hold '@'
        assert f"trial-{r.data.tags['allocopt.trial_number']}" in r.info.run_name.split()
        for key in [*r.data.params, *r.data.metrics, *r.data.tags]:
            assert "@" not in key and ":" not in key, key

    ok, fail, inf = trials[runs["complete"]], trials[runs["fail"]], trials[runs["infeasible"]]
    # states and statuses
    assert [(r.data.tags["allocopt.trial_number"], r.data.tags["allocopt.state"], r.info.status,
             r.data.tags["allocopt.fidelity"]) for r in (ok, fail, inf)] == [
        ("0", "COMPLETE", "FINISHED", "full"), ("1", "FAIL", "FAILED", "pilot"),
        ("2", "INFEASIBLE", "FINISHED", "full")]
    # the runs table tells them apart by name (every ended run shows the same green check)
    # and by allocation, readable as the table opens with no param columns
    assert [r.info.run_name for r in (ok, fail, inf)] == [
        "trial-0 sparse ρ0.72 G8", "trial-1 pilot prm ρ0.45 G8", "infeasible trial-2 prm ρ0.45 G16"]
    # params: allocation and plan, strings
    plan = _plan(0.72, "sparse")
    p = ok.data.params
    assert (p["rho"], p["group_size"], p["reward"], p["model"], p["budget_flops"]) == (
        "0.72", "8", "sparse", "Qwen/Qwen2.5-1.5B", "1e+19")
    assert float(p["update_passes"]) == plan.update_passes and int(p["iterations"]) == plan.iterations
    assert "reward_model" not in p  # None is not logged
    assert inf.data.params["budget_flops"] == str(10**12)
    # metrics: targets (sanitized), breakdown, useful_*, eval, wall time
    m = ok.data.metrics
    assert (m["native_reward"], m["pass_at_1"], m["pass_at_1_gsm8k"], m["judge"]) == (0.61, 0.42, 0.5, 0.3)
    for k in BREAKDOWN_KEYS:
        assert k in m, k
    ex = plan.expected.executed
    assert m["search_flops"] == float(ex.search_flops) and m["total_flops"] == float(ex.total_flops)
    assert m["total_flops"] <= m["budget_flops"] == BUDGET
    assert m["budget_utilization"] == pytest.approx(ex.total_flops / BUDGET)
    assert m["rho"] == pytest.approx(0.72, abs=1e-6)
    assert m["learning_backward_flops"] == float(ex.learning["backward"])
    assert (m["eval_flops"], m["search_wall_seconds"]) == (7e15, 120.0)
    # curves: step = iteration; FLOPs as values (1e19 > 2**63 - 1, the largest step)
    hist = sorted(c.get_metric_history(ok.info.run_id, "curve/cumulative_flops"), key=lambda x: x.step)
    curves = _curves(ex.total_flops)
    assert [h.step for h in hist] == [0, 1, 2, 3, 4]
    assert [h.value for h in hist] == [float(r.cumulative_flops) for r in curves]
    assert hist[-1].value > 2**63
    for name in ("executed_flops", "reward_mean", "rows_trained", "wall_seconds", "budget_fraction"):
        assert len(c.get_metric_history(ok.info.run_id, f"curve/{name}")) == 5, name
    frac = c.get_metric_history(ok.info.run_id, "curve/budget_fraction")
    assert max(h.value for h in frac) == pytest.approx(ex.total_flops / BUDGET)
    # artifacts: plan.json equals the plan; errors as tag (cut) and error.txt (whole)
    assert json.loads(_download(c, ok.info.run_id, "plan.json", tmp_path / "a")) == \
        json.loads(json.dumps(plan.to_dict()))
    assert "error.txt" not in [f.path for f in c.list_artifacts(ok.info.run_id)]
    assert "allocopt.error" not in ok.data.tags and "allocopt.skipped_metrics" not in ok.data.tags
    err = fail.data.tags["allocopt.error"]
    assert len(LONG_ERROR) > 8000 >= len(err)
    assert err.startswith("Traceback") and err.endswith("CUDA out of memory at the end")
    assert "truncated" in err
    assert _download(c, fail.info.run_id, "error.txt", tmp_path / "b") == LONG_ERROR
    # a failed trial keeps what it spent; unmeasured targets are absent, not NaN
    assert "native_reward" not in fail.data.metrics and "pass_at_1" not in fail.data.metrics
    assert fail.data.tags["allocopt.skipped_metrics"] == "native_reward,pass_at_1"
    assert fail.data.metrics["total_flops"] > 0
    assert len(c.get_metric_history(fail.info.run_id, "curve/cumulative_flops")) == 2
    assert inf.data.tags["allocopt.error"].startswith("budget_flops=1e+12: too small")
    assert "smallest feasible plan" in _download(c, inf.info.run_id, "error.txt", tmp_path / "c")
    assert [f.path for f in c.list_artifacts(inf.info.run_id)] == ["error.txt"]
    assert inf.data.metrics == {"budget_flops": 1e12}
    # study summary on the parent run
    pt = parents[0].data
    assert pt.tags["allocopt.best.pass_at_1.rho"] == "0.72"
    assert pt.metrics["best_pass_at_1"] == 0.42 and pt.metrics["n_complete"] == 1
    assert json.loads(_download(c, tracker.parent_run_id, "best.json", tmp_path / "d")) == \
        {"pass@1": {"trial": 0, "rho": 0.72, "value": 0.42}}


def test_resume_reuses_experiment_and_parent_run(store, monkeypatch):
    from mlflow.entities import ViewType

    with StudyTracker("resumed", tracking_uri=store) as first:
        _complete_trial(first, 0, 0.72, "sparse")
        first.log_study_summary({}, {"n_complete": 1})
    with StudyTracker("resumed", tracking_uri=store) as again:
        assert again.experiment_id == first.experiment_id
        assert again.parent_run_id == first.parent_run_id
        assert again.client.get_run(again.parent_run_id).info.status == "RUNNING"
        _complete_trial(again, 1, 0.44, "prm")
        again.log_study_summary({}, {"n_complete": 2})
    c = again.client
    runs = c.search_runs([again.experiment_id])
    assert sum(r.data.tags.get("allocopt.role") == "study" for r in runs) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.parent_run_id]
    assert sorted(r.data.tags["allocopt.trial_number"] for r in children) == ["0", "1"]
    assert c.get_run(first.parent_run_id).info.status == "FINISHED"
    hist = c.get_metric_history(first.parent_run_id, "n_complete")
    assert sorted((h.step, h.value) for h in hist) == [(0, 1.0), (1, 2.0)]  # steps go on
    # a second parent run (two workers opened the study at once): the older one is kept
    stray = c.create_run(again.experiment_id, run_name="resumed",
                         tags={"allocopt.study": "resumed", "allocopt.role": "study"})
    with StudyTracker("resumed", tracking_uri=store) as third:
        assert third.parent_run_id == first.parent_run_id != stray.info.run_id
    # the race itself: this worker saw no parent, created one, then found an older one
    real, calls = StudyTracker._study_runs, []

    def late(self):
        calls.append(1)
        return [] if len(calls) == 1 else real(self)

    monkeypatch.setattr(StudyTracker, "_study_runs", late)
    with StudyTracker("resumed", tracking_uri=store) as racer:
        assert racer.parent_run_id == first.parent_run_id
    monkeypatch.undo()
    deleted = c.search_runs([again.experiment_id], run_view_type=ViewType.DELETED_ONLY)
    assert len(deleted) == 1 and deleted[0].data.tags["allocopt.role"] == "study"
    # another study in the same store: its own experiment and parent
    with StudyTracker("other", tracking_uri=store) as other:
        assert other.experiment_id != first.experiment_id
        assert other.parent_run_id != first.parent_run_id


def test_default_store_is_mlflow_db_in_working_folder(tmp_path, template_db, monkeypatch):
    shutil.copy(template_db, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with StudyTracker("default") as tracker:
        assert tracker.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
        assert tracker.client.get_experiment_by_name("allocopt/default") is not None
        run_id = tracker.start_trial(0, {"rho": 0.5}, {"objective": "judge"})
        tracker.finish_trial(run_id, state="COMPLETE", metrics={}, plan={"rho": 0.5})
    assert not (tmp_path / "allocopt.db").exists()
    assert [p.name for p in (tmp_path / "mlruns").glob("allocopt-default-*/*/artifacts/*")] == \
        ["plan.json"]


def test_failing_part_keeps_the_rest_and_ends_the_run(store, monkeypatch):
    tracker = StudyTracker("faults", tracking_uri=store)
    c = tracker.client
    run_id = tracker.start_trial(0, {"rho": 0.5}, {"objective": "judge"})

    def broken(*a, **k):
        raise OSError("artifact store unreachable")

    monkeypatch.setattr(c, "log_dict", broken)
    with pytest.raises(TrackingError, match="plan.json: OSError: artifact store unreachable"):
        tracker.finish_trial(run_id, state="COMPLETE", metrics={"total_flops": 5.0, "judge": 0.7},
                             curves=[{"iteration": 0, "cumulative_flops": 5, "executed_flops": 5,
                                      "reward_mean": 0.1, "rows_trained": 4, "wall_seconds": 1.0}],
                             plan={"rho": 0.5, "iterations": 1})
    r = c.get_run(run_id)
    assert r.info.status == "FINISHED" and r.data.tags["allocopt.state"] == "COMPLETE"
    assert r.data.metrics["judge"] == 0.7 and r.data.params["iterations"] == "1"
    assert len(c.get_metric_history(run_id, "curve/reward_mean")) == 1

    run_id = tracker.start_trial(1, {"rho": 0.5}, {})
    with pytest.raises(ValueError, match="state='PRUNED'"):
        tracker.finish_trial(run_id, state="PRUNED", metrics={})
    r = c.get_run(run_id)
    assert r.info.status == "FAILED" and r.data.tags["allocopt.objective"] == "unspecified"

    with pytest.raises(ValueError, match="fidelity='half'"):
        tracker.start_trial(2, {}, {"fidelity": "half"})
    left_open = tracker.start_trial(3, {"rho": 0.5}, {})
    tracker.close()
    tracker.close()  # idempotent
    r = c.get_run(left_open)
    assert r.info.status == "KILLED" and r.data.tags["allocopt.state"] == "KILLED"


def test_no_torch_on_import():
    code = "import sys, allocopt.tracking; assert 'torch' not in sys.modules; " \
           "assert 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ============================================================================ (b) real server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, template_db, request):
    """``mlflow server`` on a free loopback port; yields its URL; always stopped."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    shutil.copy(template_db, tmp / "m.db")
    port = _free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(tmp / "server.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp / 'm.db'}",
         "--artifacts-destination", str(tmp / "art"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()

    request.addfinalizer(stop)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 60:
            pytest.fail(f"mlflow server did not answer /health within 60 s (exit code "
                        f"{proc.poll()}):\n{(tmp / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)
    started = time.monotonic() - t0
    print(f"\nmlflow server answered /health after {started:.1f} s")
    return url


@pytest.mark.slow  # starts a real mlflow server process: ~27 s on 2 loaded cores
def test_server_rest_api_reads_back_the_study(mlflow_server, record_property):
    t0 = time.monotonic()
    with StudyTracker("served", tracking_uri=mlflow_server) as tracker:
        runs = _fake_study(tracker)
        _complete_trial(tracker, 3, 0.44, "prm", fidelity="pilot")
    record_property("log_seconds", time.monotonic() - t0)

    api = f"{mlflow_server}/api/2.0/mlflow"
    exp = _get(f"{api}/experiments/get-by-name?"
               + urllib.parse.urlencode({"experiment_name": "allocopt/served"}))["experiment"]
    found = _post(f"{api}/runs/search", {"experiment_ids": [exp["experiment_id"]],
                                         "filter": "tags.`allocopt.role` = 'trial'",
                                         "max_results": 100})["runs"]
    assert len(found) == 4
    by_state: dict[str, list[dict]] = {}
    for run in found:
        tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
        metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
        params = {p["key"]: p["value"] for p in run["data"].get("params", [])}
        assert tags["mlflow.parentRunId"] == tracker.parent_run_id
        for key in [*tags, *metrics, *params]:
            assert "@" not in key, key
        by_state.setdefault(tags["allocopt.state"], []).append(
            {"info": run["info"], "tags": tags, "metrics": metrics, "params": params})
    assert sorted((k, len(v)) for k, v in by_state.items()) == [
        ("COMPLETE", 2), ("FAIL", 1), ("INFEASIBLE", 1)]
    assert by_state["FAIL"][0]["info"]["status"] == "FAILED"

    for run in by_state["COMPLETE"]:
        m, p = run["metrics"], run["params"]
        assert run["info"]["status"] == "FINISHED"
        missing = [k for k in BREAKDOWN_KEYS + ("native_reward", "pass_at_1", "judge") if k not in m]
        assert not missing, missing
        # doubles: the exact integer sum is rounded once per term (relative error ~1e-16)
        assert math.isclose(m["search_flops"] + m["learning_flops"] + m["reward_flops"],
                            m["total_flops"], rel_tol=1e-14)
        assert m["total_flops"] <= float(p["budget_flops"]) == m["budget_flops"] == BUDGET
        assert m["reward_flops"] > 0 if p["reward"] == "prm" else m["reward_flops"] == 0
        # plan.json through the server's artifact proxy
        art = run["info"]["artifact_uri"]
        assert art.startswith("mlflow-artifacts:/")
        plan = _get(f"{mlflow_server}/api/2.0/mlflow-artifacts/artifacts/"
                    f"{art.removeprefix('mlflow-artifacts:/').strip('/')}/plan.json")
        assert plan["budget_flops"] == BUDGET and str(plan["rho"]) == p["rho"]

    parent = _get(f"{api}/runs/get?run_id={tracker.parent_run_id}")["run"]
    assert parent["info"]["status"] == "FINISHED"
    assert {t["key"]: t["value"] for t in parent["data"]["tags"]}["allocopt.role"] == "study"
    assert runs["fail"] in {r["info"]["run_id"] for r in by_state["FAIL"]}


def test_probe_retries_a_tag_insert_that_lost_a_race(tmp_path, monkeypatch):
    """Two workers probing one fresh MLflow store insert the same ``allocopt.checked_at`` tag at
    once; PostgreSQL refuses the second insert (UniqueViolation on ``experiment_tag_pk``, seen in
    CI). The probe writes again (now an update) instead of refusing the study; any other error
    still refuses it."""
    from mlflow import MlflowClient

    from allocopt.tracking.lifecycle import probe_tracking
    from allocopt.flops import ConfigError

    real = MlflowClient.set_experiment_tag
    calls = []

    def lose_once(self, exp_id, key, value):
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError('(psycopg.errors.UniqueViolation) duplicate key value violates unique '
                               'constraint "experiment_tag_pk"')
        return real(self, exp_id, key, value)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setattr(MlflowClient, "set_experiment_tag", lose_once)
    probe_tracking("race", uri)
    assert calls == ["allocopt.checked_at", "allocopt.checked_at"]
    tags = MlflowClient(tracking_uri=uri).get_experiment_by_name("allocopt/race").tags
    assert "allocopt.checked_at" in tags

    def read_only(self, exp_id, key, value):
        raise RuntimeError("attempt to write a readonly database")

    monkeypatch.setattr(MlflowClient, "set_experiment_tag", read_only)
    with pytest.raises(ConfigError, match="readonly"):
        probe_tracking("race", uri)


def test_ctrl_c_during_the_probe_is_raised_by_the_library_and_one_line_on_the_command_line(tmp_path, monkeypatch,
                                                                                           capsys):
    """A Python caller gets a KeyboardInterrupt that says nothing was recorded; the command line
    prints that line and exits 130."""
    from mlflow import MlflowClient

    from allocopt.cli.common import probe_interrupt_exits
    from allocopt.errors import ProbeInterrupted
    from allocopt.tracking.lifecycle import probe_tracking

    def interrupt(self, name):
        raise KeyboardInterrupt

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", interrupt)
    with pytest.raises(ProbeInterrupted, match="nothing was recorded") as caught:
        probe_tracking("s", uri)
    assert isinstance(caught.value, KeyboardInterrupt)
    with pytest.raises(SystemExit) as ended, probe_interrupt_exits():
        probe_tracking("s", uri)
    assert ended.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted while connecting to MLflow at sqlite:") and err.endswith(
        "; nothing was recorded\n") and err.count("\n") == 1
