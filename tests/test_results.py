"""What a user reads: the MLflow parent run, Optuna's view of infeasible plans, the study's lines."""

import json
from types import SimpleNamespace

import pytest

from allocopt.plan.allocation import Allocation, min_budget
from allocopt.answer import recommendation_dict, recommendation_lines, short_error, trial_line
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.record import TrialRow, rows
from objectives.synthetic import SyntheticObjective


def _spec(**kw):
    base = dict(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4, tuner="bo",
                sampler="random", space=SearchSpace(rho=(0.2, 0.5), group_sizes=(2, 8),
                                                    rewards=("sparse", "prm")))
    return StudySpec(**{**base, **kw})


def _tight_spec():
    """rho in [0.6, 0.9]: a budget just below every prm plan's first iteration, in which most
    sparse plans are realizable (checked here with make_plan)."""
    from allocopt.plan.allocation import make_plan

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
    # and its trial page (which marks every told trial Complete) carries a note saying so
    from optuna_dashboard._note import get_note_from_system_attrs

    attrs = st._storage.get_study_system_attrs(st._study_id)
    for t in st.get_trials():
        body = get_note_from_system_attrs(attrs, t._trial_id)["body"]
        if states[t.number] == "INFEASIBLE":
            assert body.startswith("**Infeasible, never run**") and t.user_attrs["error"] in body
        else:
            assert body == ""
    assert optuna.load_study(study_name=s.name, storage=f"sqlite:///{tmp_path}/o.db").metric_names == ["pass@1"]


def test_parent_run_holds_the_spec_counts_and_recommendation(tmp_path, capsys, mlflow_store):
    from mlflow import MlflowClient

    from allocopt.tracking import EXPERIMENT_KIND, StudyTracker

    s, w = _tight_spec()
    uri = mlflow_store
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
    # the run's description (its page's first block) is the answer as the study prints it
    assert run.data.tags["mlflow.note.content"] == "\n\n".join(recommendation_lines(rec, s.target))
    assert run.data.tags["mlflow.note.content"].startswith("recommended: rho=0.420 G=8 sparse")
    # `allocopt best` gives the recommendation first, the best observed trial as its evidence,
    # from the Optuna study (where `allocopt race` stores it) and from MLflow's parent run
    st.set_user_attr("recommendation", recommendation_dict(rec, s.target))
    best_value = max(r.value for r in rs if r.state == "COMPLETE")
    for source in (["--study", s.name, "--storage", f"sqlite:///{tmp_path}/o.db"],
                   ["--from-mlflow", s.name, "--mlflow-uri", uri]):
        code, out = _cli_out(capsys, "best", "--target", "pass@1", *source)
        lines = out.splitlines()
        assert code == 0 and lines[:2] == recommendation_lines(rec, "pass@1"), out
        assert "Best observed trial for pass@1" in out and "(evidence)" in out and f"{best_value:.4f}" in out
        assert "Best allocation" not in out
    code, out = _cli_out(capsys, "best", "--target", "pass@1", "--json", *source)
    assert json.loads(out)["recommendation"] == recommendation_dict(rec, "pass@1")


def _cli_out(capsys, *args):
    from allocopt.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(list(args))
    return done.value.code, capsys.readouterr().out


def test_train_curves_are_logged_per_iteration_against_flops(tmp_path, mlflow_store):
    from mlflow import MlflowClient

    from allocopt.plan.meter import IterationRecord
    from allocopt.tracking import StudyTracker

    recs = [IterationRecord(i, 8, 100, 100 * (i + 1), 0.1 * i, 1.0,
                            {"loss": 0.5 - 0.1 * i, "kl": 0.01 * i, "frac_reward_zero_std": 0.25})
            for i in range(3)]
    uri = mlflow_store
    with StudyTracker("c", uri) as tr:
        rid = tr.start_trial(0, {"budget_flops": 1000})
        tr.finish_trial(rid, state="COMPLETE", metrics={}, curves=recs)
    c = MlflowClient(uri)
    loss = {m.step: m.value for m in c.get_metric_history(rid, "train/loss")}
    flops = {m.step: m.value for m in c.get_metric_history(rid, "curve/cumulative_flops")}
    assert loss == pytest.approx({0: 0.5, 1: 0.4, 2: 0.3}) and flops == {0: 100, 1: 200, 2: 300}
    assert [m.value for m in c.get_metric_history(rid, "train/frac_reward_zero_std")] == [0.25] * 3


def test_driver_averages_trainer_logs_into_the_iteration_record():
    from allocopt.grpo.hooks import TRAIN_LOG_KEYS, _Hooks
    from allocopt.plan.meter import FlopMeter, IterationRecord

    meter = FlopMeter(1e9)
    hooks = _Hooks(plan=None, meter=meter, policy=None, setup=None, reward=None,
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

    from allocopt.grpo.hooks import TRAIN_LOG_KEYS

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


def test_a_model_size_studys_trial_lines_name_the_policy():
    from dataclasses import replace

    s = _spec()
    sized = replace(s, space=replace(s.space, models=("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct")))
    line = trial_line(_row("COMPLETE", model="Qwen/Qwen2.5-7B-Instruct"), sized)
    assert line == "trial 7 COMPLETE: rho=0.412 G=16 structured Qwen2.5-7B-Instruct -> pass@1=0.5000"
    assert "Qwen" not in trial_line(_row("COMPLETE"), s)  # no model in the space: none named


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


def test_recommendation_lines_name_the_set_within_noise():
    """A tiny-study answer (issue 16: name the set, not one winner): 3 allocations within one
    evaluation's noise over 2 reward systems, and another reward system likelier to be best."""
    from allocopt.answer import from_dict

    rec = {"target": "pass@1", "allocation": {"rho": 0.55, "group_size": 8, "reward": "dense"},
           "mean": 0.5045, "level": 0.9, "prob_best": 0.31, "lower": 0.4936, "upper": 0.5151,
           "noise_sd": 0.012, "within_noise": [{"rho": 0.55, "group_size": 8, "reward": "dense"},
                                               {"rho": 0.55, "group_size": 4, "reward": "prm"},
                                               {"rho": 0.56, "group_size": 8, "reward": "prm"}],
           "cell_prob_best": [{"reward": "prm", "prob_best": 0.39}, {"reward": "dense", "prob_best": 0.31}]}
    lines = recommendation_lines(from_dict(rec), "pass@1")
    text = " ".join(x.strip() for x in lines[2:])
    assert "(sd 0.012): 3 allocations at rho 0.55-0.56, 2 reward systems (dense, prm)" in text
    assert lines[-1] == "  the reward system most likely to hold the best allocation: prm (P = 39%)"
    assert all(len(x) <= 80 for x in lines)
    rec["within_noise"] = rec["within_noise"][:1]  # alone within noise, and the likeliest best
    rec["cell_prob_best"] = [{"reward": "dense", "prob_best": 0.6}]
    assert len(recommendation_lines(from_dict(rec), "pass@1")) == 2


def test_study_help_shows_defaults_within_80_columns(cli):
    out = cli("study", "--help", env={"COLUMNS": "80"}).stdout
    assert all(len(line) <= 80 for line in out.splitlines())
    flat = " ".join(w for w in out.split() if w != "│")  # the help text, re-joined across lines
    d = StudySpec()  # the defaults the help must state
    # the budget has no default on the command line (a study without --spec or --budget is
    # refused: tests/test_bad_inputs.py), whatever StudySpec's own default
    for expected in ("the spec's; required without --spec", f"else {d.target}", f"else {d.trials}",
                     f"else {d.name}", f"else {d.seed}", f"else {d.objective}", "[objective_settings]",
                     "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db"):
        assert expected in flat, expected
    _paragraphs_reflowed(out, 80)


def _paragraphs_reflowed(out, width):
    """The description above the options box: every line of a paragraph but its last is filled
    to within a word of ``width`` (no line broken where the docstring's source broke it)."""
    desc = out.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[1:]
    paragraphs = "\n".join(line.strip() for line in desc).strip().split("\n\n")
    assert len(paragraphs) >= 2  # the summary and the exit codes
    for para in paragraphs:
        for line in para.splitlines()[:-1]:
            assert len(line) > width - 16, (line, para)


def test_help_paragraphs_reflow_at_120_columns(monkeypatch, capsys):
    from allocopt.cli import main

    monkeypatch.setenv("COLUMNS", "120")
    for command in ("study", "race"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) <= 120
        if command == "study":
            _paragraphs_reflowed(out, 120)
        assert "\n" not in next(c for c in __import__("allocopt.cli", fromlist=["app"]).app.registered_commands
                                if c.callback.__name__ == command).help.split("\n\n")[0]


def _regime_rows():
    from allocopt.race.diagnose import RegimeDiagnosis

    nan = float("nan")
    return [RegimeDiagnosis("structured", "Qwen/Qwen2.5-0.5B-Instruct", 12, 0.6234, 0.0812, (0.4812, 0.7711),
                            16, 0.41, 0.052, -0.031, 0.123, "update-heavy", 0.83, {}, ""),
            RegimeDiagnosis("proxy_prm", "Qwen/Qwen2.5-0.5B-Instruct", 7, nan, nan, (nan, nan), 4, nan, nan,
                            nan, nan, "unknown", 0.0, {}, "2 distinct rho value(s) completed; the fit needs 3"),
            RegimeDiagnosis("sparse", "Qwen/Qwen2.5-1.5B-Instruct", 9, 0.2111, 0.1512, (0.1049, 0.4523), 8,
                            0.3, -0.123, -0.5, 0.0, "search-heavy", 0.61, {}, "")]


@pytest.mark.parametrize("how", ["COLUMNS=80", "file"])
def test_regime_table_fits_80_columns_with_its_numbers(how, monkeypatch, tmp_path):
    """What `allocopt race` prints: at COLUMNS=80 on a terminal-less console, and into a file
    (rich's default width there is 80), every line <= 80 with rho*, sd, interval and regime."""
    from rich.console import Console

    from allocopt.cli.race_tables import regime_table

    if how == "COLUMNS=80":
        monkeypatch.setenv("COLUMNS", "80")
        con = Console(record=True, file=__import__("io").StringIO())
        con.print(regime_table(_regime_rows(), 1.234e17, "pass@1:gsm8k", True))
        text = con.export_text()
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
        path = tmp_path / "out.txt"
        with open(path, "w") as f:
            Console(file=f).print(regime_table(_regime_rows(), 1.234e17, "pass@1:gsm8k", True))
        text = path.read_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    flat = " ".join(text.split())
    for needed in ("0.62±0.08", "0.48-0.77", "update-heavy (83%)", "0.21±0.15", "0.10-0.45",
                   "search-heavy (61%)", "+0.05/-0.03", "12%", "model Qwen2.5-0.5B-Instruct",
                   "model Qwen2.5-1.5B-Instruct", "the fit needs 3", "1.23e+17"):
        assert needed in flat, needed
    row = next(line for line in text.splitlines() if line.lstrip().startswith("structured"))
    assert row.split() == ["structured", "12", "0.62±0.08", "0.48-0.77", "16", "+0.05/-0.03", "12%",
                           "update-heavy", "(83%)"]


def test_study_estimate_counts_pilots_and_full_runs():
    from allocopt.cli.live import study_estimate

    obj = SimpleNamespace(flops_per_second=1e10, overhead_seconds=15.0)  # the tiny objective's figures
    # by hand: 30 pilots x (15 + 0.25 x 3e11 / 1e10) + 12 full x (15 + 3e11 / 1e10) = 675 + 540 s
    text = study_estimate(obj, 3e11, 12, 30, 0.25)
    assert text.startswith(f"estimated wall time: about {1215 / 60:.1f} min for 30 pilot(s) of 7.5e+10 FLOPs "
                           "and 12 full run(s) of 3e+11 FLOPs"), text
    assert study_estimate(SimpleNamespace(), 3e11, 12) is None  # no measured throughput: no estimate


class _Timed(SyntheticObjective):
    flops_per_second = 1e17
    overhead_seconds = 1.0


def test_study_shows_its_estimate_before_the_first_trial(tmp_path, monkeypatch, capsys):
    from allocopt import objective as registry
    from allocopt.cli import main

    monkeypatch.setitem(registry._REGISTRY, "timed", registry._Entry(_Timed, ("native_reward", "pass_at_1", "judge")))
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as done:
        main(["study", "--objective", "timed", "--budget", "1e18", "--pilots", "0", "--trials", "1",
              "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/t.db"])
    err = capsys.readouterr().err
    assert done.value.code == 0, err
    flat = " ".join(err.split())
    # 1 full run x (1 s + 1e18 / 1e17 FLOP/s) = 11 s
    assert "estimated wall time: about 11 s for 1 full run(s) of 1e+18 FLOPs" in flat
    assert flat.index("estimated wall time") < flat.index("trial 0 ")
    assert all(len(line) <= 80 for line in err.splitlines())


def test_study_ends_with_the_mlflow_runs_link(tmp_path, monkeypatch):
    """The study's last lines open MLflow on the runs table (MLflow 3.17 otherwise opens on its
    GenAI overview): the command for the local store, relative when under the working folder."""
    from types import SimpleNamespace

    from allocopt.cli.study import mlflow_lines

    monkeypatch.chdir(tmp_path)
    local = SimpleNamespace(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment_id="3")
    assert mlflow_lines(local) == ["MLflow: mlflow ui --backend-store-uri sqlite:///mlflow.db",
                                   "  then open http://127.0.0.1:5000/#/experiments/3?workflowType=machine_learning"]
    assert all(len(line) <= 80 for line in mlflow_lines(local))
    elsewhere = SimpleNamespace(tracking_uri="sqlite:////srv/runs/mlflow.db", experiment_id="3")
    assert mlflow_lines(elsewhere)[0] == "MLflow: mlflow ui --backend-store-uri sqlite:////srv/runs/mlflow.db"
    server = SimpleNamespace(tracking_uri="http://mlflow.lab:5000/", experiment_id="7")
    assert mlflow_lines(server) == ["MLflow runs: http://mlflow.lab:5000/#/experiments/7?workflowType=machine_learning"]
    assert mlflow_lines(None) == []


@pytest.mark.parametrize("command", ["study", "race", "trial", "plan", "account", "best", "pareto", "report",
                                     "ask", "tell"])
def test_help_at_80_columns_cuts_no_help_text(command, cli):
    """At COLUMNS=80 no option's help is cut short with rich's ellipsis (typer's --X/--no-X form
    used to squeeze plan's and account's help to a sliver: 'use_remove_paddin…'), nor an option's
    name (the 32-character --importance-sampling-correction stands in a panel of its own)."""
    out = cli(command, "--help", env={"COLUMNS": "80"}).stdout
    assert "--help" in out  # the help was printed (here, in this process)
    assert all(len(line) <= 80 for line in out.splitlines())
    for line in out.splitlines():
        # the help column is what follows the type column (<int>, <str>, ...); "sqlite:///…" is
        # the help's own text
        help_part = line.split(">", 1)[1] if ">" in line else line
        cut = [w for w in help_part.replace("│", " ").split() if w.endswith("…") and w not in ("sqlite:///…,", "postgresql://…).")]
        assert not cut, line  # names: test_cli.py::test_every_help_shows_each_option_whole_and_no_type_for_a_flag


def test_no_forms_still_switch_off(capsys):
    """--no-gradient-checkpointing (hidden twin of --gradient-checkpointing) still turns it off
    (the runner trl's default is on); both at once: one line, exit 2."""
    from allocopt.cli import main

    base = ["plan", "--budget", "1e19", "--rho", "0.5", "--runner", "trl"]
    for extra, want in (([], "on"), (["--no-gradient-checkpointing"], "off"), (["--gradient-checkpointing"], "on"),
                        (["--no-importance-sampling-correction"], "on")):
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        flat = " ".join(w for w in capsys.readouterr().out.split() if w != "│")
        assert e.value.code in (0, None) and f"checkpointing {want}," in flat, (extra, flat[:400])
    with pytest.raises(SystemExit) as e:
        main(base + ["--no-importance-sampling-correction"])
    assert "IS correction off" in " ".join(w for w in capsys.readouterr().out.split() if w != "│")
    with pytest.raises(SystemExit) as e:
        main(base + ["--gradient-checkpointing", "--no-gradient-checkpointing"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "both given" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # a whole study or build end to end, several seconds (CI runs -m slow)
def test_study_logs_its_report_into_the_parent_run(tmp_path, monkeypatch, capsys, mlflow_store):
    """At its end a study logs `allocopt report`'s page and figures into its MLflow parent run
    (artifacts report/); a report that fails costs one line, never the finished study."""
    from mlflow import MlflowClient

    from allocopt import objective as registry
    from allocopt.cli import main

    monkeypatch.setitem(registry._REGISTRY, "timed", registry._Entry(_Timed, ("native_reward", "pass_at_1", "judge")))
    monkeypatch.chdir(tmp_path)
    uri = mlflow_store
    args = ["study", "--objective", "timed", "--budget", "1e18", "--pilots", "0", "--trials", "2",
            "--mlflow-uri", uri, "--storage", f"sqlite:///{tmp_path}/t.db"]

    def parent_artifacts(name: str) -> list[str]:
        c = MlflowClient(uri)
        exp = c.get_experiment_by_name(f"allocopt/{name}")
        (run,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("allocopt.role") == "study"]
        return sorted(a.path for a in c.list_artifacts(run.info.run_id, "report")), run

    with pytest.raises(SystemExit) as done:
        main([*args, "--study-name", "a"])
    out = capsys.readouterr().out
    line = "MLflow: report.html and its figures are in the study's parent run (report/)"
    assert done.value.code == 0 and line in out.splitlines()  # whole, on one line
    files, run = parent_artifacts("a")
    assert "report/report.html" in files and "report/frontier_pass_at_1.png" in files
    page = open(MlflowClient(uri).download_artifacts(run.info.run_id, "report/report.html", str(tmp_path))).read()
    # the best trial's value, on the page as its evidence line writes it (4 decimals: a 3-decimal
    # form is no substring of it when the 4th digit rounds up, 0.6047 -> 0.605)
    assert f"pass@1 = {run.data.metrics['best_pass_at_1']:.4f} at" in page

    def broken(*a, **k):
        raise RuntimeError("no figure backend")
    monkeypatch.setattr("allocopt.query.report.write_report", broken)
    with pytest.raises(SystemExit) as done:
        main([*args, "--study-name", "b"])
    captured = capsys.readouterr()
    assert done.value.code == 0
    assert "note: the report was not logged to MLflow (no figure backend)" in " ".join(captured.err.split())
    assert parent_artifacts("b")[0] == []
    with pytest.raises(SystemExit) as done:  # --no-report: not even tried
        main([*args, "--study-name", "c", "--no-report"])
    assert done.value.code == 0 and "report" not in capsys.readouterr().err


def test_best_shows_the_answer_only_for_the_query_it_answers(tmp_path, capsys):
    """The study's answer (its target, full runs) heads `best` with the best trial as its
    evidence only when the query is the same; another target, a filter or pilots get their
    best trial alone (a fresh user saw a pilot labelled evidence for the full-budget answer)."""
    s, w = _tight_spec()
    url = f"sqlite:///{tmp_path}/o.db"
    st = run_study(s, objective=SyntheticObjective(), workload=w, storage=url)
    rec = SimpleNamespace(allocation=Allocation(0.62, 8, "sparse"), mean=0.61,
                          interval=(0.55, 0.66), level=0.9, prob_best=0.7)
    st.set_user_attr("recommendation", recommendation_dict(rec, s.target))
    src = ["--study", s.name, "--storage", url]
    code, out = _cli_out(capsys, "best", *src)
    assert code == 0 and out.startswith("recommended: rho=0.620 G=8 sparse") and "(evidence)" in " ".join(out.split())
    for extra in (["--target", "judge"], ["--where", "reward=sparse"], ["--fidelity", "all"]):
        code, out = _cli_out(capsys, "best", *src, *extra)
        assert code == 0 and "recommended:" not in out and "(evidence)" not in out, (extra, out)
        assert "Best observed trial for" in out


def test_the_live_bar_counts_the_full_runs_of_every_worker(monkeypatch):
    """With ``done_full`` (the study's full runs finished since this worker started, read from
    the storage) the bar counts the study's runs, so two workers of an 8-run study each end at
    8/8, not 4/8; without it, this process's own."""
    import io

    from rich.console import Console

    import allocopt.answer
    from allocopt.cli.live import StudyDisplay

    monkeypatch.setattr(allocopt.answer, "trial_line", lambda row, spec: f"trial {row.number}")
    s = StudySpec(name="w", objective="synthetic", budget_flops=1e19)

    def counts(display, n):
        out = []
        for k in range(n):
            display.on_end(SimpleNamespace(number=k, state="COMPLETE", fidelity="full", value=0.5), None)
            out.append(next(t for t in display.bar.tasks if t.id == display.full).fields["count"])
        return out

    study = iter([2, 5, 8])  # the other worker's runs end between this one's
    assert counts(StudyDisplay(Console(file=io.StringIO()), s, num_full=8, done_full=lambda: next(study)), 3) \
        == ["2/8", "5/8", "8/8"]
    assert counts(StudyDisplay(Console(file=io.StringIO()), s, num_full=8), 3) == ["1/8", "2/8", "3/8"]
    # this worker's last run ends at 7 of 8; the other's ends while it waits: sync() at the end
    seen = iter([7, 8])
    last = StudyDisplay(Console(file=io.StringIO()), s, num_full=8, done_full=lambda: next(seen))
    assert counts(last, 1) == ["7/8"]
    last.sync()
    assert next(t for t in last.bar.tasks if t.id == last.full).fields["count"] == "8/8"
    # a worker that ran none of them: after its steps, sync() names the bar by what it counts
    idle = StudyDisplay(Console(file=io.StringIO()), s, num_full=8, done_full=lambda: 8)
    idle.step("opening the study and its sampler")
    idle.sync()
    task = next(t for t in idle.bar.tasks if t.id == idle.full)
    assert (task.description, task.fields["count"]) == ("full runs", "8/8")


def test_a_workers_bar_shows_the_studys_best(monkeypatch, tmp_path, cli):
    """The bar counts the study's full runs, every worker's (``done_full``), and shows the best
    of them beside it (``study_best``): a worker once showed the best of its own 4 runs beside
    the study's count of 8, below the study's best."""
    import io

    import optuna
    from rich.console import Console

    import allocopt.answer
    from allocopt.cli.live import StudyDisplay

    monkeypatch.setattr(allocopt.answer, "trial_line", lambda row, spec: f"trial {row.number}")
    s = StudySpec(name="w", objective="synthetic", budget_flops=1e19)

    def info(display):
        for k, v in enumerate((0.4, 0.6, 0.5)):
            display.on_end(SimpleNamespace(number=k, state="COMPLETE", fidelity="full", value=v), None)
        return next(t for t in display.bar.tasks if t.id == display.full).fields["info"]

    console = lambda: Console(file=io.StringIO())  # noqa: E731
    assert info(StudyDisplay(console(), s, num_full=8)) == "best pass@1=0.600"  # its own
    assert info(StudyDisplay(console(), s, num_full=8, study_best=lambda: 0.7)) == "best pass@1=0.700"
    assert info(StudyDisplay(console(), s, num_full=8, study_best=lambda: 0.55)) == "best pass@1=0.600"
    assert info(StudyDisplay(console(), s, num_full=8, study_best=lambda: None)) == "best pass@1=0.600"
    # the study's best after this worker's last run (another worker's, ended later): sync()
    late = {"best": 0.55}
    d = StudyDisplay(console(), s, num_full=8, done_full=lambda: 8, study_best=lambda: late["best"])
    assert info(d) == "best pass@1=0.600"
    late["best"] = 0.8
    d.sync()
    assert next(t for t in d.bar.tasks if t.id == d.full).fields["info"] == "best pass@1=0.800"
    # a second process on the study (as a second worker would be): its bar's best is the
    # study's, the first process's runs included
    url = f"sqlite:///{tmp_path}/w.db"
    args = ("study", "--objective", "synthetic", "--budget", "1e19", "--no-mlflow", "--storage", url,
            "--study-name", "w", "--tuner", "bo")
    assert cli(*args, "--trials", "3", cwd=tmp_path).returncode == 0
    r = cli(*args, "--trials", "4", cwd=tmp_path, env={"ALLOCOPT_WORKER": "1", "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-500:]
    values = [t.value for t in optuna.load_study(study_name="w", storage=url).trials]
    assert len(values) == 4 and f"best pass@1={max(values):.3f}" in r.stderr, (values, r.stderr[-800:])
    assert values[3] < max(values[:3])  # the best is the first process's: not its own run


def test_what_one_more_run_is_worth_is_wrapped_not_cut_when_the_allocation_names_a_model():
    """A model study's gain line (a reward system and a model name after the value) runs past
    80 columns: every word of it stays, on lines of at most 80 columns."""
    from types import SimpleNamespace

    from allocopt.answer import gain_lines
    from allocopt.plan.allocation import Allocation

    rec = SimpleNamespace(gain_of_one_more_run=0.0042,
                          best_next=Allocation(0.5, 8, "proxy_prm", "Qwen/Qwen2.5-1.5B-Instruct"))
    lines = gain_lines(rec, "pass@1")
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines)
    text = " ".join(x.strip() for x in lines)
    assert text == "one more full run is worth +0.0042 pass@1 (at rho=0.500 G=8 proxy_prm Qwen2.5-1.5B-Instruct)"
