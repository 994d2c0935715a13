"""Study mechanics on the synthetic test function: budget as a constraint, failures, resume."""

import math
import signal
import subprocess
import sys
import time

import optuna
import pytest

from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.study.open import StudyError, open_study
from allocopt.record import rows
from objectives.synthetic import SyntheticObjective, response, rho_star


class Counting(SyntheticObjective):
    """The synthetic objective, counting its runs and failing on chosen trial seeds."""

    def __init__(self, fail_seeds=(), **kw):
        super().__init__(**kw)
        self.calls = []
        self.fail_seeds = set(fail_seeds)

    def run(self, plan, *, seed=0, progress=None):
        self.calls.append(plan.allocation)
        if seed in self.fail_seeds:
            raise RuntimeError("boom: objective crashed")
        return super().run(plan, seed=seed)


def spec(**kw):
    base = dict(name="t", objective="synthetic", budget_flops=1e18, target="pass@1", trials=6,
                sampler="random", tuner="bo", space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 8), rewards=("sparse", "prm")))
    return StudySpec(**{**base, **kw})


def test_synthetic_optima_by_dense_grid():
    for reward, expected in (("sparse", 0.72), ("prm", 0.45)):
        grid = [i / 2000 for i in range(1, 2000)]
        best = max(grid, key=lambda r: response(r, 8, reward))
        assert abs(best - expected) < 1e-3 and abs(rho_star(reward) - expected) < 1e-12
    assert max((response(r / 100, g, w), w, g) for r in range(1, 100) for g in (2, 4, 8, 16)
               for w in ("sparse", "dense", "prm"))[1:] == ("prm", 8)


def test_study_records_breakdowns_within_budget(tmp_path):
    s = spec()
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/a.db")
    done = [r for r in rows(st) if r.state == "COMPLETE"]
    assert len(done) == 6 and len(obj.calls) == 6
    for r in done:
        m = r.metrics
        assert m["search_flops"] + m["learning_flops"] + m["reward_flops"] == m["total_flops"] <= 1e18
        assert r.value == r.targets["pass_at_1"]


def test_infeasible_proposals_are_never_run(tmp_path):
    # budget that buys one iteration at G=2 but not the PRM's reward pass on 64 rollouts
    obj = Counting()
    w = obj.workload()
    from allocopt.plan.allocation import Allocation, min_budget

    grid = [(r / 20, g) for r in range(4, 11) for g in (2, 8)]  # rho in [0.2, 0.5]
    cheap = max(min_budget(Allocation(r, g, "sparse"), w) for r, g in grid)
    dear = min(min_budget(Allocation(r, g, "prm"), w) for r, g in grid)
    assert dear > 1.2 * cheap  # every sparse plan fits, no prm plan does
    s = spec(budget_flops=1.1 * cheap, trials=8,
             space=SearchSpace(rho=(0.2, 0.5), group_sizes=(2, 8), rewards=("sparse", "prm")))
    st = run_study(s, objective=obj, workload=w, storage=f"sqlite:///{tmp_path}/b.db")
    rs = rows(st)
    infeasible = [r for r in rs if r.state == "INFEASIBLE"]
    assert infeasible, "expected some prm proposals to be infeasible"
    # prm: below one iteration; sparse: one or two iterations cannot realize a fractional
    # rows-trained schedule within 0.01 of the asked rho
    assert all(r.params["reward"] == "prm" or "not realizable" in r.error for r in infeasible)
    assert any(r.params["reward"] == "prm" and "smallest feasible plan" in r.error for r in infeasible)
    assert len(obj.calls) == len(rs) - len(infeasible)  # infeasible ones cost nothing
    assert len(obj.calls) == 8  # and do not count: --trials 8 is 8 runs paid for
    for t in st.get_trials():
        c = t.system_attrs.get("constraints:budget")
        assert (c > 0) == (t.user_attrs["state"] == "INFEASIBLE")


def test_a_sampler_that_only_proposes_infeasible_plans_is_stopped(tmp_path, monkeypatch):
    """Infeasible proposals do not count towards ``trials``; a sampler that proposes nothing
    else stops after ``MAX_INFEASIBLE`` of them, the reason stored, nothing run."""
    from allocopt.plan.allocation import Allocation, min_budget
    from allocopt.study import loop

    monkeypatch.setattr(loop, "MAX_INFEASIBLE", 7)
    obj = Counting()
    w = obj.workload()
    cheapest = min(min_budget(Allocation(r / 10, g, "sparse"), w) for r in range(2, 10) for g in (2, 8))
    st = run_study(spec(budget_flops=0.5 * cheapest, trials=4,
                        space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 8), rewards=("sparse",))),
                   objective=obj, workload=w, storage=f"sqlite:///{tmp_path}/n.db")
    assert [t.user_attrs["state"] for t in st.trials] == ["INFEASIBLE"] * 7 and obj.calls == []
    assert loop.finished_full(st) == 0
    assert "proposed 7 allocations the budget cannot buy" in st.user_attrs[loop.STOPPED_ATTR]


def test_failed_trial_is_recorded_and_study_goes_on(tmp_path):
    obj = Counting(fail_seeds={2})  # trial 2 runs with seed 0 + 2
    st = run_study(spec(trials=5), objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/c.db")
    rs = {r.number: r for r in rows(st)}
    assert rs[2].state == "FAIL" and "boom" in rs[2].error
    assert st.trials[2].state == optuna.trial.TrialState.FAIL
    assert sum(r.state == "COMPLETE" for r in rs.values()) == 4


@pytest.mark.slow  # a whole study or build end to end, several seconds (CI runs -m slow)
def test_resume_runs_only_missing_trials(tmp_path, monkeypatch):
    """Resume: a killed worker's trial (stale heartbeat) is failed and run again once with the
    same allocation; a trial reserved by `allocopt ask` (RUNNING, no heartbeat) is left alone."""
    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "1")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "2")
    from allocopt.store.heartbeat import heartbeat

    url = f"sqlite:///{tmp_path}/d.db"
    obj = Counting()
    run_study(spec(trials=3), objective=obj, workload=obj.workload(), storage=url)
    st = open_study(spec(trials=3), url)
    reserved = st.ask({"rho": optuna.distributions.FloatDistribution(0.2, 0.9)})
    killed = st.ask({"rho": optuna.distributions.FloatDistribution(0.2, 0.9)})
    with heartbeat(st, killed):  # one heartbeat, then the "worker" is gone
        pass
    time.sleep(3.5)  # past the grace period (SQLite's clock has whole seconds)
    obj2 = Counting()
    st = run_study(spec(trials=5), objective=obj2, workload=obj2.workload(), storage=url)
    by_number = {t.number: t for t in st.trials}
    assert [by_number[i].state.name for i in range(3)] == ["COMPLETE"] * 3
    assert by_number[reserved.number].state.name == "RUNNING"  # not touched
    assert by_number[killed.number].state.name == "FAIL"
    retries = [t for t in st.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].params["rho"] == killed.params["rho"]
    # the killed one does not count (issue 18): 3 complete + its retry + 1 new = 5 finished
    assert len(obj2.calls) == 2 and obj2.calls[0].rho == pytest.approx(killed.params["rho"])


@pytest.mark.slow  # BoTorch fits over a whole study: ~26 s on 2 loaded cores
def test_botorch_sampler_proposes_in_space(tmp_path):
    s = spec(sampler="botorch", trials=7, startup_trials=3)
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/e.db")
    for t in st.trials:
        assert 0.2 <= t.params["rho"] <= 0.9 and t.params["group_size"] in (2, 8)


def test_bad_storage_url():
    with pytest.raises(StudyError, match="storage"):
        open_study(spec(), "notadb://x")


@pytest.mark.parametrize("toml,needle", [
    ("trials = [", "malformed TOML"),
    ("[space]\ngroup_sizes = []", "empty search space"),
    ("[space]\nrewards = []", "empty search space"),
    ("target = 'bleu'", "target"),
    ("objective = 'nope'", "objective"),
    ("colour = 'red'", "unknown key"),
    ("[race]\nbandwidth = -1", "race.bandwidth=-1: must be a number from 0.01 to 10"),
    ("[race]\nbandwidth = 0.001", "race.bandwidth=0.001: must be a number from 0.01 to 10"),
    ("[race]\nbandwidth = nan", "race.bandwidth=nan: must be a number from 0.01 to 10"),
    ("[race]\nbootstrap = 1000000000", "race.bootstrap=1000000000: must be an integer >= 10 and <= 20000"),
    ("[race]\nrho_grid = 100000000", "race.rho_grid=100000000: must be an integer >= 5 and <= 1001"),
    ("[race]\nthompson_samples = 0", "race.thompson_samples=0: must be an integer >= 1 and <= 4096"),
    ("[race]\nposterior_samples = 1e9", "race.posterior_samples=1000000000.0: must be an integer >= 16"),
    ("[race]\nrepeats = 100000", "race.repeats=100000: must be an integer >= 1 and <= 100"),
    ("[race]\nrho_levels = 2", "race.rho_levels=2: must be an integer >= 3 and <= 1000"),
    ("[race]\nextra_pilot_budget = inf", "race.extra_pilot_budget=inf: must be a number from 0 to 1000"),
    ("[race]\nrho_match = 0", "race.rho_match=0: must be a number from 1e-06 to 0.5"),
    ("[race]\nrho_trust = 2.0", "race.rho_trust=2.0: must be a number from 0.001 to 1"),
    ("[race]\nexplore_cells_after = -1", "race.explore_cells_after=-1: must be an integer >= 0 and <= 10000, or left unset"),
    ("[race]\nreplicates = 1000", "race.replicates=1000: must be an integer >= 0 and <= 100"),
    ("[race]\nfit_pilots = 1", "race.fit_pilots=1: must be true or false"),
    ("[race]\nbatch_size = 2", "race.batch_size: no longer a RACE setting: every trial gets its own proposal"),
    ("[race]\nseed = 3", "race.seed: set by the study's 'seed', not in [race]"),
    ("[race]\nbandwith = 0.3", "race.bandwith: unknown RACE setting; allowed: bandwidth"),
    ("[race]\nmax_pilots = 12", "race.max_pilots: set by the study's 'pilots', not in [race]"),
    ("race = 3", "race=3: must be a table"),
])
def test_cli_bad_spec_exit_2(tmp_path, toml, needle, cli):
    f = tmp_path / "s.toml"
    f.write_text("budget_flops = 1e12\n" + toml)  # a spec without a budget is refused first
    r = cli("study", "--spec", str(f), "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/x.db")
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "s.toml" in r.stderr  # the line names the file that holds the bad value
    assert not (tmp_path / "x.db").exists()  # no trial started


@pytest.mark.slow  # a study process stopped by SIGINT, then resumed: ~24 s on 2 loaded cores
def test_cli_sigint_then_resume(tmp_path):
    """SIGINT to a running study: finished trials are kept, none is run twice on resume."""
    args = [sys.executable, "-m", "allocopt.cli", "study", "--objective", "synthetic", "--budget", "1e18",
            "--target", "pass@1", "--trials", "400", "--sampler", "random", "--tuner", "bo", "--no-mlflow",
            "--study-name", "sig", "--storage", f"sqlite:///{tmp_path}/s.db"]
    # Ctrl-C inside a database call may leave the trial to its stale heartbeat: short times here
    env = {**__import__("os").environ, "ALLOCOPT_HEARTBEAT_S": "1", "ALLOCOPT_GRACE_S": "2"}
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    url = f"sqlite:///{tmp_path}/s.db"
    deadline = time.time() + 90
    while time.time() < deadline:
        time.sleep(0.5)
        try:
            if len(optuna.load_study(study_name="sig", storage=url).trials) >= 5:
                break
        except Exception:
            pass
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    st = optuna.load_study(study_name="sig", storage=url)
    before = [(t.number, t.state.name, t.params) for t in st.trials]
    n_complete = sum(s == "COMPLETE" for _, s, _ in before)
    assert n_complete >= 4
    resume = args.copy()
    resume[resume.index("400")] = str(len(before) + 2)
    time.sleep(3.5)  # past the grace period (SQLite's clock has whole seconds)
    r = subprocess.run(resume, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    after = optuna.load_study(study_name="sig", storage=url).trials
    for number, state, params in before:  # finished trials kept as they were
        if state == "COMPLETE":
            assert after[number].state.name == "COMPLETE" and after[number].params == params
        else:
            assert after[number].state.name == "FAIL"  # the interrupted one
    assert not any(t.state.name == "RUNNING" for t in after)
    assert math.isfinite(max(t.value for t in after if t.state.name == "COMPLETE"))


@pytest.mark.slow  # 64-74 s on 2 idle cores (BoTorch's multi-objective fits); two-target studies
def test_multi_objective_study_pareto(tmp_path):  # with the random sampler stay in tests/test_pareto.py
    """Two targets: Optuna keeps both values; its Pareto set equals a brute-force filter."""
    s = spec(target=("pass@1", "judge"), trials=5, sampler="botorch", startup_trials=3)
    assert s.multi_objective and s.target_keys == ("pass_at_1", "judge")
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/m.db")
    done = [t for t in st.trials if t.state.name == "COMPLETE"]
    assert len(done) == 5 and all(len(t.values) == 2 for t in done)
    for t in done:
        assert t.values == [t.user_attrs["targets"]["pass_at_1"], t.user_attrs["targets"]["judge"]]

    def dominated(a, b):  # b dominates a
        return all(y >= x for x, y in zip(a, b)) and any(y > x for x, y in zip(a, b))
    front = {t.number for t in done if not any(dominated(t.values, u.values) for u in done)}
    assert {t.number for t in st.best_trials} == front


def test_resume_with_other_targets_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    obj = Counting()
    run_study(spec(trials=1), objective=obj, workload=obj.workload(), storage=url)
    with pytest.raises(StudyError, match="created with 1 target"):
        open_study(spec(target=("pass@1", "judge")), url)


def test_resume_under_another_budget_is_refused(tmp_path):
    """Resuming must not mix trials of another budget (a fresh user got a table labelled
    judge showing pass@1 values of trials run at 10x the budget)."""
    url = f"sqlite:///{tmp_path}/b.db"
    obj = Counting()
    run_study(spec(trials=1), objective=obj, workload=obj.workload(), storage=url)
    with pytest.raises(StudyError, match="budget"):
        open_study(spec(budget_flops=1e17), url)
    open_study(spec(trials=9), url)  # more trials under the same terms is a resume


def test_cli_study_leaves_the_pilot_count_to_race(tmp_path, monkeypatch):
    # without --pilots (and none in the spec) the study hands RACE max_pilots=None, which sizes
    # the grid to the space; --pilots N is passed on as it is
    from typer.testing import CliRunner

    import allocopt.cli.race as cr
    from allocopt.cli import app

    from types import SimpleNamespace

    seen = []

    def race_live(s, settings, **kw):  # what the study hands RACE: the settings it runs under
        seen.append(settings.max_pilots)
        return SimpleNamespace(study=SimpleNamespace(user_attrs={})), None

    monkeypatch.setattr(cr, "race_live", race_live)
    monkeypatch.setattr(cr, "print_race", lambda *a, **k: None)
    monkeypatch.setattr("allocopt.cli.study.print_study_summary", lambda *a, **k: None)
    for extra, want in (([], None), (["--pilots", "30"], 30)):  # 30: 6 for each of the 5 reward systems
        res = CliRunner().invoke(app, ["study", "--objective", "synthetic", "--budget", "1e19",
                                       "--target", "pass@1", "--tuner", "race", "--no-mlflow",
                                       "--storage", f"sqlite:///{tmp_path}/w.db", *extra])
        assert res.exit_code == 0, res.output
        assert seen[-1] == want


def test_the_study_files_race_table_reaches_race_and_flags_go_over_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    import allocopt.cli.race as cr
    from allocopt.cli import app

    seen = []

    def race_live(s, settings, **kw):
        seen.append(settings)
        return SimpleNamespace(study=SimpleNamespace(user_attrs={}), answer=None), None

    monkeypatch.setattr(cr, "race_live", race_live)
    monkeypatch.setattr(cr, "print_race", lambda *a, **k: None)
    monkeypatch.setattr("allocopt.cli.study.print_study_summary", lambda *a, **k: None)
    f = tmp_path / "s.toml"
    f.write_text('objective = "synthetic"\nbudget_flops = 1e19\ntarget = "pass@1"\ntuner = "race"\npilots = 20\n'
                 '[space]\ngroup_sizes = [4]\nrewards = ["sparse", "prm"]\n'
                 '[race]\nbandwidth = 0.35\nrho_levels = 4\nrepeats = 2\n')
    url = f"sqlite:///{tmp_path}/w.db"
    for cmd in (["study"], ["race"], ["race", "--repeats", "3", "--max-pilots", "8"]):
        res = CliRunner().invoke(app, [*cmd, "--spec", str(f), "--no-mlflow", "--storage", url])
        assert res.exit_code == 0, res.output
    st, ra, flags = seen
    assert (st.bandwidth, st.rho_levels, st.repeats, st.max_pilots) == (0.35, 4, 2, 20)
    assert ra == st  # race --spec runs the study file's settings and pilot count too
    assert (flags.bandwidth, flags.rho_levels, flags.repeats, flags.max_pilots) == (0.35, 4, 3, 8)
    # the dry run prices the pilots of that grid: 4 rho levels x G 4 x 2 reward systems, twice each
    res = CliRunner().invoke(app, ["study", "--spec", str(f), "--dry-run"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "16 of 16 pilots usable" in res.output, res.output


@pytest.mark.slow
def test_cli_study_sizes_its_pilots_to_a_large_space(tmp_path):
    # 4 reward systems x 3 models x 3 G: RACE's local fits need (3 + 3) x 12 = 72 pilots, more
    # than the old fixed default of 60 (which refused this space); no --pilots given
    assert StudySpec().pilots is None
    toml = tmp_path / "big.toml"
    toml.write_text('name = "big"\nobjective = "synthetic"\nbudget_flops = 1e19\ntarget = "pass@1"\n'
                    'tuner = "race"\ntrials = 1\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [2, 4, 8]\n'
                    'rewards = ["sparse", "structured", "dense", "prm"]\n'
                    'models = ["Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B"]\n'
                    '[objective_settings]\nvariant = "model-size"\n')  # the variant that scores the model
    url = f"sqlite:///{tmp_path}/big.db"
    proc = subprocess.run([sys.executable, "-m", "allocopt.cli", "study", "--spec", str(toml),
                           "--storage", url, "--no-mlflow"], capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    st = optuna.load_study(study_name="big", storage=url)
    pilots = [t for t in st.trials if t.user_attrs.get("fidelity") == "pilot"]
    assert len(pilots) == 72
    assert " model " in proc.stdout and "Qwen2.5-" in proc.stdout  # the model column of the table


def test_a_run_that_cannot_start_is_recorded_infeasible(tmp_path):
    from allocopt.plan.allocation import InfeasiblePlan

    class Refusing(Counting):
        def run(self, plan, *, seed=0, progress=None):
            if plan.allocation.reward == "prm":
                raise InfeasiblePlan("the first iteration's worst case does not fit",
                                     min_budget_flops=int(10 * plan.budget_flops))
            return super().run(plan, seed=seed, progress=progress)

    obj = Refusing()
    st = run_study(spec(trials=8), objective=obj, workload=obj.workload(),
                   storage=f"sqlite:///{tmp_path}/i.db")
    got = {t.number: (t.params["reward"], t.user_attrs["state"]) for t in st.trials}
    assert {s for r, s in got.values() if r == "prm"} <= {"INFEASIBLE"}
    assert {s for r, s in got.values() if r == "sparse"} <= {"COMPLETE"}
    for t in st.trials:
        if t.params["reward"] == "prm":
            assert t.system_attrs["constraints:budget"] == pytest.approx(1.0)  # log10(10x budget)
            assert "metrics" not in t.user_attrs


def test_summary_says_when_other_workers_still_run_trials(tmp_path, capsys):
    """A worker that finishes while another worker's trial runs says its answer covers only the
    finished trials (two workers once printed two different final answers without a word)."""
    from allocopt.cli.study import print_study_summary

    url = f"sqlite:///{tmp_path}/w.db"
    s = spec(trials=2)
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=url)
    print_study_summary(st, s, url)
    assert "still running" not in capsys.readouterr().out
    st.ask()  # another worker's trial, running
    st.ask()
    print_study_summary(st, s, url)
    out = " ".join(capsys.readouterr().out.split())
    assert "note: 2 trial(s) still running" in out and f"allocopt best --study {s.name}" in out
    assert "full-budget trials: 2 complete" in out  # the running ones are not counted as done



def test_a_worker_that_ends_before_others_prints_one_line_not_the_answer(tmp_path, capsys, monkeypatch):
    """Under ``allocopt workers`` (``ALLOCOPT_WORKER``) each worker printed the whole summary;
    one that ends while others still run prints one line, the last to end prints the answer."""
    from allocopt.cli.study import print_study_summary

    url = f"sqlite:///{tmp_path}/w.db"
    s = spec(trials=2)
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=url)
    monkeypatch.setenv("ALLOCOPT_WORKER", "1")
    print_study_summary(st, s, url)
    last = capsys.readouterr().out
    assert "full-budget trials: 2 complete" in last and "still running" not in last  # the last
    st.ask()  # another worker's trial, running
    print_study_summary(st, s, url)
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and "full-budget trials" not in out
    assert out.startswith("this worker is done; 1 trial(s) still running")
    assert f"`allocopt best --study {s.name} --storage {url}`" in out  # the command as it reads the study

    # workers that wait for each other end together: only the one that ran the last trial prints
    from allocopt.store.heartbeat import WORKER_ATTR, worker_name

    storage = optuna.storages.RDBStorage(url)
    sid = storage.get_study_id_from_name(s.name)

    def end_last(worker):  # the running trial ends, run by `worker`: the study's last to end
        (t,) = st.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        storage.set_trial_system_attr(storage.get_trial_id_from_study_id_trial_number(sid, t.number),
                                      WORKER_ATTR, worker)
        st.tell(t.number, state=optuna.trial.TrialState.FAIL)
        return t.number

    number = end_last("elsewhere:1")
    print_study_summary(st, s, url)
    assert capsys.readouterr().out.strip().splitlines() == [
        f"this worker is done; the study's answer is printed by the worker that ran its last trial "
        f"(trial {number}, worker elsewhere:1) (`allocopt best --study {s.name} --storage {url}` shows it at "
        "any time)"]
    st.ask()
    end_last(worker_name())  # this worker's: it prints the answer
    print_study_summary(st, s, url)
    assert "full-budget trials: 2 complete" in capsys.readouterr().out


def test_interrupted_trials_are_not_failures(tmp_path, capsys):
    """A Ctrl-C'd trial (error 'interrupted', or failed before the sampler gave it a fidelity)
    is run again on resume: the summary and the MLflow counts list it as interrupted, not as a
    failed full-budget trial (a fresh user's resumed study said '1 failed' for a pilot), and it
    does not count towards --trials."""
    from optuna.trial import TrialState

    from allocopt.cli.study import print_study_summary
    from allocopt.record import is_interrupted as was_interrupted
    from allocopt.study.trial import counts

    url = f"sqlite:///{tmp_path}/i.db"
    s = spec(trials=2)
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=url)
    bare = st.ask()  # failed before it got a fidelity: a second Ctrl-C right after the ask
    st.tell(bare, state=TrialState.FAIL)
    stopped = st.ask()
    stopped.set_user_attr("fidelity", "full")
    stopped.set_user_attr("error", "interrupted")
    st.tell(stopped, state=TrialState.FAIL)
    broken = st.ask()  # a real failure stays one
    broken.set_user_attr("fidelity", "full")
    broken.set_user_attr("error", "RuntimeError: boom")
    st.tell(broken, state=TrialState.FAIL)
    trials = st.get_trials(deepcopy=False)
    assert [was_interrupted(t) for t in trials[-3:]] == [True, True, False]
    c = counts(st)
    assert c["interrupted"] == 2 and c["full_fail"] == 1 and c["full_complete"] == 2
    print_study_summary(st, s, url)
    out = " ".join(capsys.readouterr().out.split())
    assert "full-budget trials: 2 complete, 0 infeasible (never run), 1 failed" in out
    assert "interrupted (Ctrl-C; each run again): 2 trial(s)" in out


@pytest.mark.slow  # a whole study or build end to end, several seconds (CI runs -m slow)
def test_run_study_from_python_stores_the_final_answer(tmp_path):
    """A Python caller of run_study (RACE sampler: pilots, then full runs) gets the one answer
    stored as the command line stores it: in the Optuna study and on the MLflow parent run."""
    import json

    from mlflow import MlflowClient

    from allocopt.race import RaceSettings
    from allocopt.answer import recommendation_dict
    from allocopt.study.open import make_sampler
    from allocopt.tracking import StudyTracker

    s = spec(name="answer", trials=2, tuner="race", pilots=12, space=SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8),
                                                                    rewards=("sparse", "prm")))
    obj, url, uri = Counting(), f"sqlite:///{tmp_path}/o.db", f"sqlite:///{tmp_path}/m.db"
    w = obj.workload()
    answers = []
    with StudyTracker(s.name, tracking_uri=uri) as tr:
        run_study(s, objective=obj, workload=w, storage=url, tracker=tr,
                  sampler=make_sampler(s, workload=w, race_settings=RaceSettings(max_pilots=12)),
                  on_answer=lambda rec, sur: answers.append(rec))
        parent = tr.parent_run_id
    assert len(answers) == 1
    stored = optuna.load_study(study_name="answer", storage=url).user_attrs["recommendation"]
    assert stored == json.loads(json.dumps(recommendation_dict(answers[0], s.target)))
    assert stored["allocation"]["reward"] in ("sparse", "prm") and stored["lower"] <= stored["upper"]
    run = MlflowClient(uri).get_run(parent)
    assert run.data.tags["allocopt.recommended.reward"] == stored["allocation"]["reward"]
    assert run.data.metrics["recommended_mean"] == stored["mean"]
    doc = json.loads(open(MlflowClient(uri).download_artifacts(parent, "recommendation.json", str(tmp_path))).read())
    assert doc == stored


def test_plain_bo_run_study_stores_no_race_answer(tmp_path):
    """Plain BO has no posterior answer: its best observed trial goes on the parent run
    (log_final), and no ``recommendation`` is stored."""
    s = spec(trials=3)
    obj = Counting()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=None)
    assert "recommendation" not in st.user_attrs


def test_the_final_table_shows_the_rho_asked_beside_the_rho_realized_in_80_columns():
    """The trial lines and ``best`` show the ρ a trial asked for; the final table shows it
    beside the realized ρ (``got``), so the two never stand alone side by side; with a model
    column and the longest reward names it fits 80 columns with nothing cut."""
    from types import SimpleNamespace

    from rich.console import Console

    from allocopt.cli.study import _top_trials

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 16), rewards=("structured", "proxy_prm"),
                        models=("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"))
    s = SimpleNamespace(name="demo", target="pass@1", budget_flops=1e19, space=space)
    metrics = {"rho": 0.4872, "search_flops": 5e18, "learning_flops": 4.872e18, "reward_flops": 1.28e17,
               "total_flops": 1e19}
    trials = [SimpleNamespace(number=n, params={"rho": 0.5, "group_size": 16, "reward": r, "model": m},
                              metrics=metrics, value=0.5251)
              for n, r, m in ((3, "structured", space.models[1]), (120, "proxy_prm", space.models[0]))]
    console = Console(width=80, record=True)
    console.print(_top_trials(trials, s))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    row = next(line for line in text.splitlines() if line.strip().startswith("3 "))
    assert row.split()[:6] == ["3", "0.50", "0.487", "16", "structured", "1.5B"] and "0.5251" in row
    assert "proxy_prm" in text and "…" not in text and "got: realized" in text
