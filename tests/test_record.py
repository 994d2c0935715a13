"""The trial record (allocopt.record): what the writers write, TrialRecord.of reads back, on a
real in-memory Optuna study; the fidelity rule and its fallbacks; the interruption rule."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from allocopt.record import (TrialRecord, TrialRow, decision_attrs, fidelity_of, is_interrupted, is_released, params_of,
                             records, rows, write_asked, write_complete, write_failed, write_infeasible,
                             write_interrupted, write_missing, write_start)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study() -> optuna.Study:
    return optuna.create_study(direction="maximize")


def _frozen(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return study.get_trials(deepcopy=False)[number]


def test_complete_round_trip():
    study = _study()
    trial = study.ask({"rho": FloatDistribution(0.1, 0.9)})
    write_start(trial, budget_flops=1e15, fidelity="pilot")
    write_complete(trial, {"pass_at_1": 0.4}, {"total_flops": 9e14, "rho": 0.5},
                   plan={"budget_flops": 1e15, "iterations": 3})
    study.tell(trial, [0.4])
    r = TrialRecord.of(_frozen(study, 0))
    assert (r.number, r.state, r.optuna_state, r.fidelity, r.has_fidelity) == (0, "COMPLETE", "COMPLETE", "pilot", True)
    assert r.budget_flops == 1e15 and r.budget(2e15) == 1e15
    assert r.targets == {"pass_at_1": 0.4} and r.metrics == {"total_flops": 9e14, "rho": 0.5}
    assert r.plan == {"budget_flops": 1e15, "iterations": 3}
    assert r.error is None and not r.interrupted and r.source is None and r.over_budget is None
    assert r.values == (0.4,)
    row = r.row(study="s")
    assert isinstance(row, TrialRow) and row.value == 0.4 and row.fidelity == "pilot" and row.study == "s"
    assert "rho" in row.params and row.metrics["total_flops"] == 9e14
    assert rows(study)[0].value == 0.4 and [x.number for x in records(study)] == [0]


def test_told_run_and_asked_round_trip():
    study = _study()
    trial = study.ask()
    write_start(trial, budget_flops=2e15, fidelity="full")
    write_asked(trial, {"realized_rho": 0.3}, {"format": "trl", "expected_rho": 0.31})
    r = TrialRecord.of(_frozen(study, 0))
    assert r.asked == {"format": "trl", "expected_rho": 0.31} and r.plan == {"realized_rho": 0.3}
    assert r.optuna_state == r.state == "RUNNING"
    write_complete(trial, {"judge": 0.7}, {"total_flops": 3e15}, over_budget=True, source="tell")
    study.tell(trial, [0.7])
    r = TrialRecord.of(_frozen(study, 0))
    assert (r.state, r.source, r.over_budget, r.targets) == ("COMPLETE", "tell", True, {"judge": 0.7})
    assert r.plan_with_budget == {"realized_rho": 0.3, "budget_flops": 2e15}


def test_infeasible_and_failed_round_trip():
    study = _study()
    t0, t1 = study.ask(), study.ask()
    write_start(t0, budget_flops=1e12, fidelity="full")
    write_infeasible(t0, "too small")
    study.tell(t0, [0.0])
    write_start(t1, budget_flops=1e12, fidelity="full")
    write_failed(t1, "RuntimeError: boom", {"total_flops": 5.0})
    study.tell(t1, state=TrialState.FAIL)
    r0, r1 = records(study)
    assert (r0.state, r0.optuna_state, r0.error) == ("INFEASIBLE", "COMPLETE", "too small")
    assert (r1.state, r1.error, r1.metrics, r1.interrupted) == ("FAIL", "RuntimeError: boom", {"total_flops": 5.0}, False)
    assert math.isnan(r1.row().value)


def test_fidelity_rule_and_fallbacks():
    study = _study()
    # the parameter wins over the user attribute
    t = study.ask()
    t.suggest_categorical("fidelity", ["full", "pilot"])
    t.set_user_attr("fidelity", "full")
    # a user attribute alone
    u = study.ask()
    u.set_user_attr("fidelity", "pilot")
    study.ask()  # neither: full
    # an enqueued trial waiting with its parameters (Optuna's fixed_params)
    study.enqueue_trial({"fidelity": "pilot"})
    frozen = study.get_trials(deepcopy=False)
    want_t = frozen[0].params["fidelity"]
    assert fidelity_of(frozen[0]) == want_t
    assert fidelity_of(frozen[1]) == "pilot"
    assert fidelity_of(frozen[2]) == "full"
    assert frozen[3].state == TrialState.WAITING and params_of(frozen[3]) == {"fidelity": "pilot"}
    assert fidelity_of(frozen[3]) == "pilot"
    assert TrialRecord.of(frozen[3]).row().params == {}  # a row shows the trial's own parameters
    assert [r.fidelity for r in records(study)] == [want_t, "pilot", "full", "pilot"]


def test_a_live_trial_reads_too():
    study = _study()
    trial = study.ask()
    trial.set_user_attr("budget_flops", 5.0)
    r = TrialRecord.of(trial)  # an optuna.Trial: no state, no system attributes
    assert (r.optuna_state, r.fidelity, r.budget_flops, r.interrupted) == ("RUNNING", "full", 5.0, False)


@pytest.mark.parametrize("how, want", [
    ("error", True),          # Ctrl-C during the run: error "interrupted"
    ("asked_only", True),     # failed before the decision (no fidelity, no parameters)
    ("failed", False),        # a real failure
    ("running", False),       # not finished
    ("complete", False),
])
def test_interruption_rule(how, want):
    study = _study()
    trial = study.ask()
    if how == "error":
        write_start(trial, budget_flops=1.0, fidelity="full")
        trial.suggest_float("rho", 0.1, 0.9)
        write_interrupted(trial)
        study.tell(trial, state=TrialState.FAIL)
    elif how == "asked_only":
        study.tell(trial, state=TrialState.FAIL)
    elif how == "failed":
        write_start(trial, budget_flops=1.0, fidelity="full")
        write_failed(trial, "ValueError: x", {})
        study.tell(trial, state=TrialState.FAIL)
    elif how == "complete":
        study.tell(trial, [1.0])
    frozen = _frozen(study, 0)
    assert is_interrupted(frozen) is want
    assert TrialRecord.of(frozen).interrupted is want


def test_decision_attrs_and_write_missing():
    assert decision_attrs("pilot", 2.0, race_pilot="k") == {"fidelity": "pilot", "budget_flops": 2.0, "race_pilot": "k"}
    assert decision_attrs("full", 3.0, race_validation=True) == {"fidelity": "full", "budget_flops": 3.0,
                                                                 "race_validation": True}
    assert decision_attrs("full", 3.0) == {"fidelity": "full", "budget_flops": 3.0}
    study = _study()
    trial = study.ask()
    trial.set_user_attr("budget_flops", 1.0)  # as enqueued: it wins
    write_missing(trial, decision_attrs("pilot", 9.0, race_pilot="k"))
    r = TrialRecord.of(_frozen(study, 0))
    assert (r.budget_flops, r.fidelity, r.race_pilot, r.race_validation) == (1.0, "pilot", "k", False)


def test_retried_from():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    study.tell(study.ask(), state=TrialState.FAIL)
    study.ask()
    tid = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), 1)
    storage.set_trial_system_attr(tid, "failed_trial", 0)  # as Optuna's RetryFailedTrialCallback writes it
    assert records(study)[1].retried_from == 0 and records(study)[0].retried_from is None


def test_a_released_trial_is_no_record():
    """A trial a worker gave back unsampled (two workers asked for the last run at once) ran
    nothing: it is in no record, row or count, so no MLflow run or metric says it ran; a PRUNED
    trial without the reason stays a record."""
    from allocopt.store.heartbeat import release
    from allocopt.study.trial import counts

    study = _study()
    trial = study.ask({"rho": FloatDistribution(0.1, 0.9)})
    write_start(trial, budget_flops=1e15, fidelity="full")
    write_complete(trial, {"pass_at_1": 0.4}, {"total_flops": 9e14}, plan={"budget_flops": 1e15})
    study.tell(trial, [0.4])
    release(study, study.ask(), "another worker asked first")
    study.tell(study.ask(), state=TrialState.PRUNED)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert [is_released(t) for t in study.trials] == [False, True, False]
    assert [r.number for r in records(study)] == [0, 2] and [r.number for r in rows(study)] == [0, 2]
    assert counts(study) == {"full_complete": 1, "full_pruned": 1}


def test_record_imports_the_standard_library_only():
    import subprocess
    import sys

    code = ("import sys, allocopt.record; bad = [m for m in ('optuna', 'mlflow', 'torch', 'numpy') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
