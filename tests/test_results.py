"""What a user reads: the MLflow parent run, Optuna's view of infeasible plans, the study's lines."""

import json
from types import SimpleNamespace

import pytest

from allocopt.allocation import Allocation, min_budget
from allocopt.answer import recommendation_dict, recommendation_lines, short_error, trial_line
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study import TrialRow, rows, run_study
from objectives.synthetic import SyntheticObjective


def _spec(**kw):
    base = dict(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4, pilots=0,
                sampler="random", space=SearchSpace(rho=(0.2, 0.5), group_sizes=(2, 8),
                                                    rewards=("sparse", "prm")))
    return StudySpec(**{**base, **kw})


def _tight_spec():
    """rho in [0.6, 0.9]: a budget just below every prm plan's first iteration, in which most
    sparse plans are realizable (checked here with make_plan)."""
    from allocopt.allocation import make_plan

    w = SyntheticObjective().workload()
    grid = [(0.6 + 0.03 * i, g) for i in range(11) for g in (2, 8)]
    budget = 0.95 * min(min_budget(Allocation(r, g, "prm"), w) for r, g in grid)
    # most sparse plans are realizable there (a few fractional schedules over so few iterations
    # are not, and are infeasible too)
    assert sum(make_plan(budget, Allocation(r, g, "sparse"), w).realizable for r, g in grid) >= 15
    return _spec(budget_flops=budget, trials=6, space=SearchSpace(
        rho=(0.6, 0.9), group_sizes=(2, 8), rewards=("sparse", "prm"))), w


def test_infeasible_plans_are_infeasible_for_optuna_and_the_dashboard(tmp_path):
    import optuna

    s, w = _tight_spec()
    st = run_study(s, objective=SyntheticObjective(), workload=w, storage=f"sqlite:///{tmp_path}/o.db")
    states = {r.number: r.state for r in rows(st)}
    assert "INFEASIBLE" in states.values() and "COMPLETE" in states.values()
    # Optuna's own reading: feasible iff every constraint <= 0 (Trial.constraints docstring)
    for t in st.get_trials():
        feasible = all(v <= 0 for v in t.constraints.values())
        assert feasible == (states[t.number] == "COMPLETE"), (t.number, t.constraints)
    best = st.best_trial  # Optuna 5 picks the best among feasible trials only
    assert states[best.number] == "COMPLETE"
    # optuna-dashboard 0.21 serializes the list form; an infeasible trial has a positive entry
    dash = pytest.importorskip("optuna_dashboard._serializer")
    for t in st.get_trials():
        con = dash.serialize_frozen_trial(st._study_id, t, {})["constraints"]
        assert len(con) == 1 and (con[0] > 0) == (states[t.number] == "INFEASIBLE")
    assert optuna.load_study(study_name=s.name, storage=f"sqlite:///{tmp_path}/o.db").metric_names == ["pass@1"]


def test_parent_run_holds_the_spec_counts_and_recommendation(tmp_path):
    from mlflow import MlflowClient

    from allocopt.tracking import EXPERIMENT_KIND, StudyTracker

    s, w = _tight_spec()
    uri = f"sqlite:///{tmp_path}/m.db"
    with StudyTracker(s.name, uri) as tr:
        st = run_study(s, objective=SyntheticObjective(), workload=w,
                       storage=f"sqlite:///{tmp_path}/o.db", tracker=tr)
        rec = SimpleNamespace(allocation=Allocation(0.42, 8, "sparse"), mean=0.61,
                              interval=(0.55, 0.66), level=0.9, prob_best=0.7)
        tr.log_recommendation(recommendation_dict(rec, s.target))
        parent = tr.parent_run_id
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(f"allocopt/{s.name}")
    assert exp.tags[EXPERIMENT_KIND[0]] == "custom_model_development"
    run = c.get_run(parent)
    assert run.data.params["budget_flops"] == repr(s.budget_flops)
    assert json.loads(run.data.params["space.rewards"]) == ["sparse", "prm"]
    spec_doc = json.loads(open(c.download_artifacts(parent, "spec.json", str(tmp_path))).read())
    assert spec_doc == json.loads(json.dumps(s.to_dict()))
    rs = rows(st)
    n_inf = sum(r.state == "INFEASIBLE" for r in rs)
    n_ok = sum(r.state == "COMPLETE" for r in rs)
    m = run.data.metrics
    assert m["num_full_infeasible"] == n_inf > 0 and m["num_full_complete"] == n_ok
    assert m["best_pass_at_1"] == max(r.value for r in rs if r.state == "COMPLETE")
    assert (m["recommended_mean"], m["recommended_lower"], m["recommended_upper"],
            m["recommended_prob_best"]) == (0.61, 0.55, 0.66, 0.7)
    assert run.data.tags["allocopt.recommended.rho"] == "0.42"
    assert run.data.tags["allocopt.recommended.reward"] == "sparse"
    doc = json.loads(open(c.download_artifacts(parent, "recommendation.json", str(tmp_path))).read())
    assert doc["allocation"] == {"rho": 0.42, "group_size": 8, "reward": "sparse"}


def test_train_curves_are_logged_per_iteration_against_flops(tmp_path):
    from mlflow import MlflowClient

    from allocopt.meter import IterationRecord
    from allocopt.tracking import StudyTracker

    recs = [IterationRecord(i, 8, 100, 100 * (i + 1), 0.1 * i, 1.0,
                            {"loss": 0.5 - 0.1 * i, "kl": 0.01 * i, "frac_reward_zero_std": 0.25})
            for i in range(3)]
    uri = f"sqlite:///{tmp_path}/m.db"
    with StudyTracker("c", uri) as tr:
        rid = tr.start_trial(0, {"budget_flops": 1000})
        tr.finish_trial(rid, state="COMPLETE", metrics={}, curves=recs)
    c = MlflowClient(uri)
    loss = {m.step: m.value for m in c.get_metric_history(rid, "train/loss")}
    flops = {m.step: m.value for m in c.get_metric_history(rid, "curve/cumulative_flops")}
    assert loss == pytest.approx({0: 0.5, 1: 0.4, 2: 0.3}) and flops == {0: 100, 1: 200, 2: 300}
    assert [m.value for m in c.get_metric_history(rid, "train/frac_reward_zero_std")] == [0.25] * 3


def test_driver_averages_trainer_logs_into_the_iteration_record():
    from objectives.grpo_hooks import TRAIN_LOG_KEYS, _Hooks
    from allocopt.meter import FlopMeter, IterationRecord

    meter = FlopMeter(1e9)
    hooks = _Hooks(plan=None, meter=meter, policy=None, lora=None, settings=None, reward=None,
                   tokenizer=None)
    hooks.on_train_log({"loss": 1.0})  # before any iteration: nothing to attach to
    meter.records.append(IterationRecord(0, 4, 1, 1, 0.0, 0.0))
    hooks.on_train_log({"loss": 1.0, "kl": 0.2, "reward": 0.5, "learning_rate": 1e-5})
    hooks.on_train_log({"loss": 3.0, "kl": float("nan")})  # second pass; NaN not averaged
    assert meter.records[0].train == {"loss": 2.0, "kl": 0.2, "reward": 0.5}
    assert {"loss", "kl", "entropy", "reward_std", "frac_reward_zero_std"} <= set(TRAIN_LOG_KEYS)


def test_trl_logs_the_keys_the_driver_keeps():
    """TRL 1.16's GRPOTrainer writes these metric names (its source); fails if TRL renames them."""
    import inspect

    from trl import GRPOTrainer

    from objectives.grpo_hooks import TRAIN_LOG_KEYS

    src = inspect.getsource(GRPOTrainer)
    for key in TRAIN_LOG_KEYS:
        if key not in ("loss", "grad_norm"):  # the Trainer's own
            assert f'["{key}"]' in src, key


def _row(state, error=None, **params):
    return TrialRow(7, state, {"rho": 0.41234, "group_size": 16, "reward": "structured", **params},
                    {"pass_at_1": 0.5}, {"value": 0.5}, error)


@pytest.mark.parametrize("error", [
    "budget_flops=3e+11: too small for one GRPO iteration at rho=0.41234, group_size=16, "
    "reward=structured (64 rollouts); the smallest feasible plan needs 1.23e+12 FLOPs",
    "rho=0.4123 is not realizable (nearest 0.3876)",
    "RuntimeError: " + "a very long message without any semicolon " * 5 + "end",
])
def test_trial_lines_fit_80_columns_and_keep_their_numbers(error):
    s = _spec()
    state = "INFEASIBLE" if "realizable" in error or "feasible" in error else "FAIL"
    line = trial_line(_row(state, error), s)
    assert len(line) <= 80, line
    assert "rho=0.412" in line and "G=16" in line
    if "needs" in error:
        assert line.endswith("(needs 1.23e+12 FLOPs)")
    if "nearest" in error:
        assert line.endswith("(nearest realizable rho=0.3876)")
    if error.startswith("RuntimeError"):
        assert line.endswith("…)") and " a very long" in line and "messa…" not in line
    ok = trial_line(_row("COMPLETE"), s)
    assert ok.endswith("-> pass@1=0.5000") and len(ok) <= 80


def test_short_error_cuts_at_words_and_keeps_the_last_clause():
    text = "alpha beta gamma delta epsilon; the smallest feasible plan needs 9.9e+20 FLOPs"
    assert short_error(text, 200) == text
    out = short_error(text, 60)
    assert out == "alpha beta…; the smallest feasible plan needs 9.9e+20 FLOPs"  # 10 + 3 + 46
    assert len(out) <= 60


def test_recommendation_lines():
    rec = SimpleNamespace(allocation=Allocation(0.62, 8, "structured"), mean=0.4123,
                          interval=(0.3601, 0.4655), level=0.9, prob_best=0.58)
    lines = recommendation_lines(rec, "pass@1")
    assert lines == ["recommended: rho=0.620 G=8 structured",
                     "  pass@1 = 0.412, 90% CI 0.360-0.466; P(structured is best) = 58%"]
    assert all(len(x) <= 80 for x in lines)
    bare = recommendation_lines(Allocation(0.5, 4, "sparse"), "pass@1")
    assert bare[0] == "recommended: rho=0.500 G=4 sparse" and "no interval" in bare[1]
    d = recommendation_dict(rec, "pass@1")
    assert (d["lower"], d["upper"], d["prob_best"]) == (0.3601, 0.4655, 0.58)


def test_study_help_shows_defaults_within_80_columns():
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "allocopt.cli", "study", "--help"], env=env,
                         capture_output=True, text=True, timeout=60).stdout
    assert all(len(line) <= 80 for line in out.splitlines())
    flat = " ".join(w for w in out.split() if w != "│")  # the help text, re-joined across lines
    d = StudySpec()  # the defaults the help must state
    for expected in (f"else {d.budget_flops:.0e}".replace("e+", "e"), f"else {d.target}", f"else {d.trials}",
                     f"else {d.name}", f"else {d.seed}", f"else {d.objective}", "[objective_settings]",
                     "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"):
        assert expected in flat, expected
