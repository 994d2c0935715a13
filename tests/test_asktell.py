"""ask / tell: reserved trials, the configs that realize their plans, recording what came back."""

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from allocopt.plan.allocation import Allocation, iteration_flops, make_plan
from allocopt.plan.handoff import trl_config, verl_overrides, whole_pass_run
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from objectives.synthetic import SyntheticObjective

ROOT = Path(__file__).resolve().parents[1]


class Done:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys, monkeypatch):
    """The allocopt command run in this process (``main(argv)``; a subprocess per call costs
    5-10 s of imports on 2 loaded cores); one CLI smoke run in a subprocess is below."""
    from allocopt.cli import main

    def run(*args, cwd):
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        o = capsys.readouterr()
        return Done(code, o.out, o.err)
    return run


def test_whole_pass_run_fits_budget_and_nearest_rho():
    w = SyntheticObjective().workload()
    a = Allocation(0.6, 8, "sparse")
    plan = make_plan(1e18, a, w)
    run = whole_pass_run(plan, w)
    N = 64  # the workload's rollouts per iteration; 64 // 8 = 8 prompts x G = 8
    import math

    by_hand = {}
    for mu in {max(1, math.floor(plan.update_passes)), max(1, math.ceil(plan.update_passes))}:
        per = iteration_flops(w, a, mu * N).executed
        by_hand[mu] = (abs(per.rho - 0.6), int(1e18 // per.total_flops), per.total_flops)
    mu = min(by_hand, key=lambda m: by_hand[m][0])
    assert run.passes == mu and run.iterations == by_hand[mu][1]
    spent = run.expected.executed.total_flops
    assert spent <= 1e18 < spent + by_hand[mu][2]  # one more iteration would not fit
    assert run.expected_rho == pytest.approx(spent and run.expected.executed.learning_flops / spent)


def test_trl_config_realizes_the_plan(tmp_path):
    """GRPOConfig accepts the fields, and TRL's derived sizes are the plan's: one generation
    batch of N rollouts, one optimizer step per pass, max_steps = iterations x passes, the
    learning rate not divided by the passes."""
    from trl import GRPOConfig

    w = SyntheticObjective().workload()
    plan = make_plan(1e18, Allocation(0.9, 4, "dense"), w)
    run = whole_pass_run(plan, w)
    assert run.passes >= 2  # a case where dividing the lr would show
    cfg = trl_config(run, learning_rate=2e-5, max_completion_length=512, micro_batch=8)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **cfg)
    assert args.num_generations == 4 and args.generation_batch_size == 64  # 16 prompts x 4
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64
    assert args.steps_per_generation == args.gradient_accumulation_steps  # a pass = an optimizer step
    assert args.num_iterations == run.passes and args.max_steps == run.iterations * run.passes
    assert args.learning_rate == 2e-5
    assert args.vllm_importance_sampling_correction is w.setup.importance_sampling_correction is False
    # checkpointing as the plan priced it (TRL's own default, on, would run recompute unpriced)
    assert args.gradient_checkpointing is w.setup.gradient_checkpointing is False
    assert trl_config(run, learning_rate=2e-5, max_completion_length=512,
                      gradient_checkpointing=True)["gradient_checkpointing"] is True
    on = trl_config(run, learning_rate=2e-5, max_completion_length=512, importance_sampling_correction=True)
    assert on["vllm_importance_sampling_correction"] is True
    two = trl_config(run, learning_rate=2e-5, max_completion_length=512, micro_batch=8, num_processes=2)
    assert two["per_device_train_batch_size"] * 2 * two["gradient_accumulation_steps"] == 64


def test_verl_overrides_realize_the_plan():
    w = SyntheticObjective().workload()
    plan = make_plan(1e18, Allocation(0.5, 8, "prm"), w)
    run = whole_pass_run(plan, w)
    ov = dict(o.split("=", 1) for o in verl_overrides(run, learning_rate=1e-6, max_completion_length=1024))
    assert ov["data.train_batch_size"] == "8" and ov["actor_rollout_ref.rollout.n"] == "8"
    assert ov["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"  # one optimizer step per epoch
    assert ov["actor_rollout_ref.actor.ppo_epochs"] == str(run.passes)
    assert ov["trainer.total_training_steps"] == str(run.iterations)
    assert ov["actor_rollout_ref.actor.optim.lr"] == "1e-06"
    assert ov["reward_model.enable"] == "True" and ov["reward_model.model.path"] == plan.reward_model
    assert ov["actor_rollout_ref.model.enable_gradient_checkpointing"] == str(w.setup.gradient_checkpointing)


def _study(tmp_path):
    """A study with two trials run by a worker (the reference for what a trial records)."""
    s = StudySpec(name="at", objective="synthetic", budget_flops=1e18, target="pass@1", trials=2,
                  sampler="random", tuner="bo", space=SearchSpace(rho=(0.3, 0.8), group_sizes=(4, 8),
                                                                rewards=("sparse", "dense")))
    obj = SyntheticObjective()
    run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/a.db")


def test_separate_asks_reserve_different_random_points(tmp_path, cli):
    """One `ask` per job (a new process each) must not draw the first start-up point again: each
    is seeded by the trials already in the study, as a resumed study is."""
    _study(tmp_path)
    url = f"sqlite:///{tmp_path}/a.db"
    for _ in range(3):
        r = cli("ask", "--study", "at", "--storage", url, "--out", "asked", "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    st = optuna.load_study(study_name="at", storage=url)
    asked = [t.params["rho"] for t in st.trials if t.state.name == "RUNNING"]
    assert len(asked) == 3 and len(set(asked)) == 3


def test_ask_then_tell_round_trip(tmp_path, cli):
    _study(tmp_path)
    url = f"sqlite:///{tmp_path}/a.db"
    r = cli("ask", "--study", "at", "--storage", url, "-n", "2", "--out", "asked", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    st = optuna.load_study(study_name="at", storage=url)
    running = [t for t in st.trials if t.state.name == "RUNNING"]
    assert len(running) == 2
    for t in running:
        info = json.loads((tmp_path / "asked" / f"trial-{t.number}" / "ask.json").read_text())
        cfg = json.loads((tmp_path / "asked" / f"trial-{t.number}" / "grpo_config.json").read_text())
        assert info["trial"] == t.number and info["budget_flops"] == 1e18 and info["rho"] == t.params["rho"]
        assert cfg["num_generations"] == t.params["group_size"] and cfg["learning_rate"] == 1e-5  # TrainingSetup's
        assert cfg["num_iterations"] == info["update_passes"]
    told = running[0]
    (tmp_path / "m.json").write_text(json.dumps(
        {"targets": {"pass@1": 0.42}, "breakdown": {"search_flops": 3e17, "learning_flops": 5e17,
                                                     "reward_flops": 0}}))
    r = cli("tell", "--study", "at", "--storage", url, "--trial", str(told.number), "--metrics", "m.json",
            "--mlflow-uri", f"sqlite:///{tmp_path}/mlflow.db", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "80.0% of" in r.stdout and "rho=0.625" in r.stdout  # 8e17 of 1e18; 5/8
    st = optuna.load_study(study_name="at", storage=url)
    t = st.trials[told.number]
    assert t.state.name == "COMPLETE" and t.values == [0.42]
    worker_trial = st.trials[0]  # recorded exactly like a trial a worker ran
    assert set(worker_trial.user_attrs) <= set(t.user_attrs)
    assert t.constraints == worker_trial.constraints == {"budget": -1.0, "0": -1.0}
    assert t.user_attrs["metrics"]["learning_flops"] == 5e17 and t.user_attrs["metrics"]["rho"] == 0.625
    assert t.user_attrs["over_budget"] is False
    # the surrogate learns from where the run was: the spent rho (5/8), not the asked one
    from allocopt.study.asktell import spec_of
    from allocopt.study.observe import study_observations

    obs = {o.number: o for o in study_observations(st, spec_of(st))}
    assert t.params["rho"] != pytest.approx(0.625)
    assert obs[told.number].allocation.rho == 0.625
    assert obs[worker_trial.number].allocation.rho == worker_trial.params["rho"]  # run by allocopt
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = c.get_experiment_by_name("allocopt/at")
    [run] = c.search_runs([exp.experiment_id], filter_string="tags.`allocopt.role` = 'trial'")
    assert run.info.status == "FINISHED" and run.data.tags["allocopt.trial_number"] == str(told.number)
    assert run.data.metrics["pass_at_1"] == 0.42 and run.data.metrics["total_flops"] == 8e17

    # the same tell again, an unknown trial, a worker's trial: one line, exit 2, nothing changed
    before = [(x.number, x.state.name, x.values, x.user_attrs) for x in st.trials]
    for trial, needle in ((told.number, "already finished (COMPLETE)"), (99, "no such trial"),
                          (0, "already finished")):
        r = cli("tell", "--study", "at", "--storage", url, "--trial", str(trial), "--metrics", "m.json",
                "--no-mlflow", cwd=tmp_path)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a target missing from the metrics: one line naming it
    (tmp_path / "bad.json").write_text(json.dumps({"judge": 0.3, "search_flops": 1, "learning_flops": 1,
                                                   "reward_flops": 0}))
    r = cli("tell", "--study", "at", "--storage", url, "--trial", str(running[1].number), "--metrics",
            "bad.json", "--no-mlflow", cwd=tmp_path)
    assert r.returncode == 2 and "target pass@1 missing" in r.stderr, r.stderr
    after = [(x.number, x.state.name, x.values, x.user_attrs)
             for x in optuna.load_study(study_name="at", storage=url).trials]
    assert after == before


def test_tell_flags_a_run_over_its_budget(tmp_path, cli):
    _study(tmp_path)
    url = f"sqlite:///{tmp_path}/a.db"
    assert cli("ask", "--study", "at", "--storage", url, "--out", "asked", cwd=tmp_path).returncode == 0
    n = [t for t in optuna.load_study(study_name="at", storage=url).trials if t.state.name == "RUNNING"][0].number
    (tmp_path / "m.json").write_text(json.dumps({"pass@1": 0.5, "search_flops": 6e17,
                                                 "learning_flops": 6e17, "reward_flops": 0}))
    r = cli("tell", "--study", "at", "--storage", url, "--trial", str(n), "--metrics", "m.json",
            "--no-mlflow", cwd=tmp_path)
    assert r.returncode == 0 and "20.0% over its budget" in r.stderr, r.stderr
    t = optuna.load_study(study_name="at", storage=url).trials[n]
    assert t.user_attrs["over_budget"] is True and t.state.name == "COMPLETE"
    assert t.constraints["budget"] == pytest.approx(__import__("math").log10(1.2))


def test_ask_reserved_trials_are_left_to_tell(tmp_path, monkeypatch, cli):
    """A reserved trial has no heartbeat: a worker never fails it as stale."""
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "1")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "2")
    _study(tmp_path)
    url = f"sqlite:///{tmp_path}/a.db"
    assert cli("ask", "--study", "at", "--storage", url, "--out", "asked", cwd=tmp_path).returncode == 0
    import time

    from allocopt.store.heartbeat import fail_stale
    from allocopt.study.open import open_study

    time.sleep(3.5)
    st = open_study(StudySpec(name="at", objective="synthetic", budget_flops=1e18, target="pass@1", trials=2,
                              sampler="random", tuner="bo", space=SearchSpace(rho=(0.3, 0.8), group_sizes=(4, 8),
                                                                            rewards=("sparse", "dense"))), url)
    fail_stale(st)
    assert [t.state.name for t in st.trials].count("RUNNING") == 1


@pytest.mark.slow  # an end-to-end run of several seconds (CI runs -m slow)
def test_race_pilots_reserved_by_ask_outlive_the_grace_period(tmp_path, monkeypatch, cli):
    """RACE's sampler claims each pilot it hands out; a claim written for ``ask`` carries no
    heartbeat, so the pilot is still RUNNING (and told) after the grace period has passed."""
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "1")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "2")
    url = f"sqlite:///{tmp_path}/r.db"
    (tmp_path / "race.toml").write_text('objective = "synthetic"\nbudget_flops = 1e18\ntarget = "pass@1"\n'
                                        'tuner = "race"\n')
    assert cli("ask", "--study", "rt", "--storage", url, "--spec", "race.toml", "--out", "asked",
               cwd=tmp_path).returncode == 0
    info = json.loads((tmp_path / "asked" / "trial-0" / "ask.json").read_text())
    assert info["fidelity"] == "pilot"
    import time

    time.sleep(3.5)
    (tmp_path / "m.json").write_text(json.dumps({"pass@1": 0.5, "search_flops": 1e15,
                                                 "learning_flops": 1e15, "reward_flops": 0}))
    r = cli("tell", "--study", "rt", "--storage", url, "--trial", "0", "--metrics", "m.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    import optuna

    st = optuna.load_study(study_name="rt", storage=url)
    assert st.trials[0].state.name == "COMPLETE" and st.trials[0].value == 0.5


def test_cli_ask_and_bad_tell_in_a_subprocess(tmp_path):
    """The real command line: ask makes the study from flags; tell of a missing file: one line, 2."""
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "allocopt.cli", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=180, cwd=tmp_path, env=env)
    r = run("ask", "--study", "fresh", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1",
            "--format", "verl", "--out", "asked")
    assert r.returncode == 0, r.stderr
    [folder] = list((tmp_path / "asked").iterdir())
    assert "actor_rollout_ref.rollout.n=" in (folder / "verl_overrides.txt").read_text()
    r = run("tell", "--study", "fresh", "--trial", folder.name.split("-")[1], "--metrics", "nope.json")
    assert r.returncode == 2 and r.stderr.strip() == "error: --metrics: metrics='nope.json': file not found", r.stderr


def test_a_sampler_that_raises_leaves_no_trial_running(tmp_path):
    """The sampler raising while ``ask`` reserves: the trial is given back (failed as
    interrupted, nothing to repeat), not left RUNNING for ever, and the next ask reserves."""
    from optuna.trial import TrialState

    from allocopt.study.asktell import reserve_and_write
    from allocopt.study.open import distributions

    s = StudySpec(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=4,
                  tuner="bo", sampler="random", space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 8)))
    obj = SyntheticObjective()
    w = obj.workload()
    st = optuna.create_study(study_name="r", storage=f"sqlite:///{tmp_path}/r.db",
                             sampler=optuna.samplers.RandomSampler(seed=0))

    class Broken(optuna.samplers.RandomSampler):
        def sample_independent(self, *a, **k):
            raise RuntimeError("the sampler broke")

    kw = dict(study="r", storage="", learning_rate=1e-5, micro_batch=1, num_processes=1)
    st.sampler = Broken(seed=0)
    with pytest.raises(RuntimeError, match="the sampler broke"):
        reserve_and_write(st, s, w, 2, "trl", distributions(s), tmp_path / "asked", **kw)
    assert [t.state for t in st.trials] == [TrialState.FAIL]
    st.sampler = optuna.samplers.RandomSampler(seed=1)
    runs, _, _ = reserve_and_write(st, s, w, 2, "trl", distributions(s), tmp_path / "asked", **kw)
    assert [r.trial_number for r in runs] == [1, 2]
    assert [t.state for t in st.trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]


def test_ask_refuses_a_size_the_objective_lacks_before_reserving(tmp_path, cli):
    """``ask`` with a study file whose ``space.models`` names a size the tiny objective lacks:
    one line naming the field, exit 2, no trial reserved and no out folder written."""
    (tmp_path / "bad.toml").write_text('name = "bm"\nobjective = "tiny"\nbudget_flops = 3e11\n'
                                       '[space]\nmodels = ["small", "huge"]\n')
    url = f"sqlite:///{tmp_path / 'a.db'}"
    r = cli("ask", "--study", "bm", "--storage", url, "--spec", "bad.toml", "--out", "asked", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: space.models='huge': not one of this objective's policies (tiny, small, medium), "
        "nor a preset or a local folder with a config.json"]
    assert not (tmp_path / "asked").exists()
    if (tmp_path / "a.db").exists():  # no study made: the corrected file makes it
        assert optuna.get_all_study_names(url) == []
    (tmp_path / "bad.toml").write_text('name = "bm"\nobjective = "synthetic"\nbudget_flops = 1e19\n')
    r = cli("ask", "--study", "bm", "--storage", url, "--spec", "bad.toml", "--out", "asked", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert optuna.get_all_study_names(url) == ["bm"]


def test_ask_and_tell_of_a_study_where_no_database_is_leave_no_file(tmp_path, cli):
    """Without --spec there is nothing to make: a SQLite file that is not there is refused in one
    line, and not created empty (Optuna would create it on opening)."""
    (tmp_path / "m.json").write_text('{"pass@1": 0.5}')
    for args in (["ask", "--study", "nosuch"], ["tell", "--study", "nosuch", "--trial", "0", "--metrics", "m.json"]):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "study='nosuch': not found" in r.stderr and str(tmp_path / "allocopt.db") in r.stderr
        assert "allocopt study --study-name nosuch --trials 0" in r.stderr  # the hint makes this study
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
