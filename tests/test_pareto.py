"""Pareto and best-per-target queries: brute-force checks, filters, tables, loading, the CLI."""

import json
import math
import os
import random
import shutil
import subprocess
import sys

import optuna
import pytest

from allocopt.cli import main
from allocopt.query.pareto import QueryError, best, best_per, filter_rows, pareto_front, to_dataframe
from allocopt.record import TrialRow
from allocopt.query.sources import load_rows_from_mlflow, load_rows_from_study
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.study.open import open_study
from objectives.synthetic import SyntheticObjective

TARGETS = ("native_reward", "pass_at_1", "judge")


# ============================================================================ pure queries
def row(number, state="COMPLETE", fidelity="full", **values):
    params = {k: values.pop(k) for k in ("rho", "group_size", "reward", "model") if k in values}
    targets = {k: values.pop(k) for k in list(values) if k in TARGETS}
    return TrialRow(number, state, params, targets, dict(values), fidelity=fidelity)


def brute_force(rows, keys, directions):
    """Indices of complete rows with finite values that no other such row dominates."""
    sign = [1 if d == "maximize" else -1 for d in directions]
    pts = {}
    for i, r in enumerate(rows):
        v = [s * (r.targets.get(k, r.metrics.get(k, math.nan))) for s, k in zip(sign, keys)]
        if r.state == "COMPLETE" and all(math.isfinite(x) for x in v):
            pts[i] = v
    return {i for i, p in pts.items()
            if not any(all(a >= b for a, b in zip(q, p)) and any(a > b for a, b in zip(q, p))
                       for j, q in pts.items() if j != i)}


@pytest.mark.parametrize("seed", range(40))
def test_pareto_front_equals_brute_force(seed):
    rnd = random.Random(seed)
    k = rnd.choice([1, 2, 2, 3, 4])
    keys = rnd.sample(TARGETS + ("total_flops",), k)
    directions = [rnd.choice(["maximize", "minimize"]) for _ in keys]
    levels = rnd.choice([3, 5, 1000])  # few levels: many ties and duplicates
    rows = []
    for n in range(rnd.randint(0, 60)):
        vals = {key: rnd.randrange(levels) / levels for key in keys}
        if rnd.random() < 0.15:
            vals[rnd.choice(keys)] = math.nan  # a target the trial never measured
        if rnd.random() < 0.1:
            del vals[rnd.choice(keys)]
        state = rnd.choices(["COMPLETE", "FAIL", "INFEASIBLE"], [8, 1, 1])[0]
        rows.append(row(n, state, **vals))
    front = pareto_front(rows, keys, directions)
    assert {id(r) for r in front} == {id(rows[i]) for i in brute_force(rows, keys, directions)}
    assert front == [r for r in rows if r in front]  # the order given is kept


def test_pareto_ties_and_nan():
    rows = [row(0, pass_at_1=0.5, judge=0.5), row(1, pass_at_1=0.5, judge=0.5),  # identical: both kept
            row(2, pass_at_1=0.5, judge=0.4),  # equal in one, worse in the other: dominated
            row(3, pass_at_1=0.9, judge=math.nan),  # NaN: excluded, dominates nothing
            row(4, "FAIL", pass_at_1=1.0, judge=1.0),  # not complete: excluded
            row(5, pass_at_1=0.2, judge=0.8)]
    assert [r.number for r in pareto_front(rows, ["pass@1", "judge"], ["maximize", "maximize"])] == [0, 1, 5]
    assert [r.number for r in pareto_front(rows, ["pass@1", "judge"], ["minimize", "minimize"])] == [2, 5]
    assert pareto_front([], ["judge"], ["maximize"]) == []
    with pytest.raises(QueryError, match="one per objective"):
        pareto_front(rows, ["pass@1", "judge"], ["maximize"])
    with pytest.raises(QueryError, match="direction='up'"):
        pareto_front(rows, ["judge"], ["up"])


def test_best_ties_nan_and_direction():
    rows = [row(3, judge=0.7, total_flops=2.0), row(1, judge=0.7, total_flops=3.0), row(2, judge=math.nan),
            row(0, "FAIL", judge=0.9), row(4, judge=0.1, total_flops=1.0)]
    assert best(rows, "judge").number == 1  # tie: lowest trial number
    assert best(rows, "judge", "minimize").number == 4
    assert best(rows, "total_flops").number == 4  # *_flops default to minimize
    assert best(rows, "pass@1") is None and best([], "judge") is None
    per = best_per([row(0, reward="prm", judge=0.3), row(1, reward="prm", judge=0.5),
                    row(2, reward="sparse", judge=0.4)], "judge")
    assert {w: r.number for w, r in per.items()} == {"prm": 1, "sparse": 2}


def test_filters():
    rows = [row(0, rho=0.4, group_size=8, reward="prm", pass_at_1=0.5),
            row(1, rho=0.6, group_size=4, reward="prm", pass_at_1=0.6, fidelity="pilot"),
            row(2, rho=0.7, group_size=8, reward="sparse", pass_at_1=0.7),
            TrialRow(3, "COMPLETE", {"rho": "0.8", "group_size": "8", "reward": "sparse"}, {}, {})]  # MLflow strings
    got = lambda *w: [r.number for r in filter_rows(rows, list(w))]  # noqa: E731
    assert got("reward=prm") == [0, 1] and got("reward==prm") == [0, 1] and got("reward!=prm") == [2, 3]
    assert got("rho>0.5") == [1, 2, 3] and got("rho<=0.7") == [0, 1, 2] and got("rho >= 0.6", "rho<0.8") == [1, 2]
    assert got("group_size=8") == [0, 2, 3] and got("fidelity=full") == [0, 2, 3] and got("fidelity=pilot") == [1]
    assert got("pass@1>=0.6") == [1, 2]  # CLI spelling of a target; row 3 measured none: no match
    assert got() == [0, 1, 2, 3]


@pytest.mark.parametrize("clause,needle", [
    ("rho>>0.5", "needs a number"), ("reward", "malformed"), ("=prm", "malformed"), ("rho>", "malformed"),
    ("reward>prm", "needs a number"), ("rewrd=prm", "unknown field 'rewrd'"), ("rho~0.5", "malformed"),
])
def test_malformed_filters_name_clause_and_forms(clause, needle):
    with pytest.raises(QueryError) as e:
        filter_rows([row(0, rho=0.5, reward="prm", judge=0.5)], [clause])
    msg = str(e.value)
    assert needle in msg and repr(clause) in msg and "\n" not in msg
    assert "KEY=VALUE" in msg or "known:" in msg


def test_dataframe_columns():
    rows = [row(0, rho=0.4, group_size=8, reward="prm", model="m", pass_at_1=0.5, judge=0.4,
                search_flops=1e18, learning_flops=2e18, reward_flops=3e18, total_flops=6e18),
            row(1, "FAIL", rho=0.6, group_size=4, reward="sparse", model="m", search_flops=5.0)]
    rows[0].metrics["rho"] = 1 / 3  # the realized rho of the breakdown
    df = to_dataframe(rows)
    assert list(df.columns[:12]) == ["study", "number", "state", "fidelity", "rho", "group_size", "reward",
                                     "model", "pass_at_1", "judge", "search_flops", "learning_flops"]
    assert list(df.columns[12:15]) == ["reward_flops", "total_flops", "realized_rho"] and df.columns[-1] == "error"
    assert df.loc[0, "rho"] == 0.4 and df.loc[0, "realized_rho"] == pytest.approx(1 / 3)
    assert math.isnan(df.loc[1, "pass_at_1"]) and df.loc[1, "search_flops"] == 5.0
    assert df["total_flops"].dtype.kind == "f"  # 1e19 FLOPs overflow int64
    assert len(df.query("pass_at_1 > 0.1")) == 1


# ============================================================================ real studies
class Failing(SyntheticObjective):
    def run(self, plan, *, seed=0, progress=None):
        if seed == 3:
            raise RuntimeError("boom")
        return super().run(plan, seed=seed)


def study_spec(name, trials):
    return StudySpec(name=name, objective="synthetic", budget_flops=1e18, target="pass@1", trials=trials,
                     sampler="random", seed=0, tuner="bo",
                     space=SearchSpace(rho=(0.2, 0.9), group_sizes=(8,), rewards=("sparse", "dense", "prm")))


def mlflow_db(tmp_path_factory, path):
    """A migrated empty MLflow SQLite store, made once per session (migrations take ~10 s); the
    same template file as conftest's ``mlflow_template``."""
    template = tmp_path_factory.getbasetemp() / "mlflow-template.db"
    if not template.exists():
        from mlflow import MlflowClient

        MlflowClient(f"sqlite:///{template}").search_experiments()
    shutil.copy(template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """Study ``a`` (10 trials incl. 2 pilots and a failure) and ``b`` (3 trials), in Optuna and MLflow."""
    from allocopt.tracking import StudyTracker

    d = tmp_path_factory.mktemp("studies")
    storage = f"sqlite:///{d}/optuna.db"
    uri = mlflow_db(tmp_path_factory, d / "mlflow.db")
    obj = Failing()
    cwd = os.getcwd()
    os.chdir(d)  # MLflow artifacts (plan.json) go to ./mlruns
    try:
        for name, trials in (("a", 8), ("b", 3)):  # full-budget trials (a: + 2 enqueued pilots)
            s = study_spec(name, trials)
            if name == "a":
                st = open_study(s, storage)
                for rho, reward in ((0.5, "prm"), (0.7, "sparse")):
                    st.enqueue_trial({"rho": rho, "reward": reward},
                                     user_attrs={"fidelity": "pilot", "budget_flops": 1e17})
            with StudyTracker(name, tracking_uri=uri) as tr:
                run_study(s, objective=obj, workload=obj.workload(), storage=storage, tracker=tr)
    finally:
        os.chdir(cwd)
    return {"storage": storage, "uri": uri, "dir": d}


def test_load_rows_from_study(studies):
    rows = load_rows_from_study(studies["storage"], "a")
    assert len(rows) == 10 and {r.study for r in rows} == {"a"}
    assert [r.fidelity for r in rows[:2]] == ["pilot", "pilot"] and rows[0].plan["budget_flops"] == 1e17
    assert all(r.params["group_size"] == 8 for r in rows)  # fixed dimension filled from the spec / plan
    assert rows[3].state == "FAIL" and rows[3].targets == {}
    assert all(set(r.targets) == set(TARGETS) for r in rows if r.state == "COMPLETE")
    with pytest.raises(QueryError, match=r"study='x': not found in .*known: a, b"):
        load_rows_from_study(studies["storage"], "x")


def test_mlflow_rows_equal_optuna_rows(studies):
    ml = load_rows_from_mlflow(["allocopt/a", "b"], studies["uri"])  # experiment or study name
    op = load_rows_from_study(studies["storage"], "a") + load_rows_from_study(studies["storage"], "b")
    assert [(r.study, r.number, r.state, r.fidelity) for r in ml] == [(r.study, r.number, r.state, r.fidelity)
                                                                      for r in op]
    for m, o in zip(ml, op):
        assert m.params == o.params and m.targets == pytest.approx(o.targets)
        assert {k: m.metrics.get(k) for k in ("search_flops", "learning_flops", "reward_flops", "total_flops", "rho")} \
            == pytest.approx({k: o.metrics.get(k) for k in ("search_flops", "learning_flops", "reward_flops",
                                                              "total_flops", "rho")})
        assert m.run_id
    with pytest.raises(QueryError, match=r"experiment='zzz': not found .*known: .*allocopt/a"):
        load_rows_from_mlflow(["zzz"], studies["uri"])


# ============================================================================ CLI
def cli(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_cli_pareto_json_equals_library(studies, capsys):
    rc, out, _ = cli(capsys, "pareto", "--study", "a", "--storage", studies["storage"], "--objectives",
                     "pass@1,judge", "--json")
    assert rc == 0
    data = json.loads(out)
    rows = [r for r in load_rows_from_study(studies["storage"], "a") if r.fidelity == "full"]
    want = pareto_front(rows, ["pass@1", "judge"], ["maximize", "maximize"])
    assert sorted(r["number"] for r in data["front"]) == sorted(r.number for r in want)
    assert data["objectives"] == ["pass@1", "judge"] and data["complete_trials"] == 7
    first = data["front"][0]
    assert set(first["allocation"]) == {"rho", "group_size", "reward", "model"}
    assert first["breakdown"]["total_flops"] <= 1e18 and "pass_at_1" in first["targets"]


def test_cli_pareto_table_with_filters(studies, capsys):
    rc, out, _ = cli(capsys, "pareto", "--study", "a", "--storage", studies["storage"], "--objectives",
                     "judge,total_flops", "--where", "reward=prm", "--where", "rho>0.2", "--fidelity", "all")
    assert rc == 0 and "Pareto front of study a" in out and "total_flops (minimize)" in out
    rows = filter_rows(load_rows_from_study(studies["storage"], "a"), ["reward=prm", "rho>0.2"])
    front = pareto_front(rows, ["judge", "total_flops"], ["maximize", "minimize"])
    assert f"{len(front)} non-dominated of" in out and all(r.params["reward"] == "prm" for r in front)


def test_cli_best_from_optuna_and_across_mlflow_studies(studies, capsys):
    rc, out, _ = cli(capsys, "best", "--study", "a", "--storage", studies["storage"], "--target", "judge", "--json")
    assert rc == 0
    data = json.loads(out)
    want = best([r for r in load_rows_from_study(studies["storage"], "a") if r.fidelity == "full"], "judge")
    assert data["best"]["number"] == want.number and data["best"]["targets"]["judge"] == want.targets["judge"]
    assert set(data["per_reward"]) <= {"sparse", "dense", "prm"}
    rc, out, _ = cli(capsys, "best", "--from-mlflow", "a", "--from-mlflow", "b", "--mlflow-uri", studies["uri"],
                     "--target", "pass@1", "--json")
    both = load_rows_from_study(studies["storage"], "a") + load_rows_from_study(studies["storage"], "b")
    want = best([r for r in both if r.fidelity == "full"], "pass@1")
    data = json.loads(out)
    assert rc == 0 and (data["best"]["study"], data["best"]["number"]) == (want.study, want.number)
    rc, out, _ = cli(capsys, "best", "--from-mlflow", "a", "--from-mlflow", "b", "--mlflow-uri", studies["uri"],
                     "--target", "pass@1")
    assert rc == 0 and "Best observed trial for pass@1" in out and f"{want.study} #{want.number}" in out
    # the title breaks between its phrases, not where the narrow table's width falls
    assert "Best observed trial for pass@1 (maximize)" in [ln.strip() for ln in out.splitlines()], out
    n_full = sum(r.state == "COMPLETE" and r.fidelity == "full" for r in both)  # counted here, from the store
    assert out.strip().splitlines()[-1].startswith(f"from {n_full} complete trial(s) of ") and n_full > 1
    assert out.strip().endswith("(full fidelity)")


def test_cli_best_defaults_to_the_studys_target(studies, capsys):
    """Study a stores one target (pass@1): `best` without --target answers for it, from Optuna
    and from its one MLflow experiment (the parent run's target param), as with --target pass@1."""
    rc, out, _ = cli(capsys, "best", "--study", "a", "--storage", studies["storage"], "--json")
    assert rc == 0
    got = json.loads(out)
    want = best([r for r in load_rows_from_study(studies["storage"], "a") if r.fidelity == "full"], "pass@1")
    assert got["target"] == "pass@1" and got["best"]["number"] == want.number
    rc, out, _ = cli(capsys, "best", "--study", "a", "--storage", studies["storage"], "--target", "pass@1", "--json")
    assert rc == 0 and json.loads(out) == got
    rc, out, _ = cli(capsys, "best", "--from-mlflow", "a", "--mlflow-uri", studies["uri"], "--json")
    assert rc == 0 and json.loads(out)["target"] == "pass@1"
    assert json.loads(out)["best"]["number"] == want.number


def test_cli_report_into_the_studys_parent_run(studies, capsys, tmp_path):
    """`report --mlflow-run parent` logs the page and figures into the study's parent run (the
    run tagged role=study of experiment allocopt/a), not into another study's."""
    from mlflow import MlflowClient

    rc, out, err = cli(capsys, "report", "--study", "a", "--storage", studies["storage"], "--out",
                       str(tmp_path / "r"), "--mlflow-uri", studies["uri"], "--mlflow-run", "parent")
    assert rc == 0, err
    c = MlflowClient(studies["uri"])
    parents = {}
    for name in ("a", "b"):
        exp = c.get_experiment_by_name(f"allocopt/{name}")
        (run,) = c.search_runs([exp.experiment_id], filter_string="tags.`allocopt.role` = 'study'")
        parents[name] = run.info.run_id
    assert "logged " in out and parents["a"] in out
    logged = {f.path for f in c.list_artifacts(parents["a"], "report")}
    assert "report/report.html" in logged
    assert not c.list_artifacts(parents["b"], "report")
    rc, out, err = cli(capsys, "report", "--from-mlflow", "a", "--mlflow-uri", studies["uri"], "--out",
                       str(tmp_path / "r2"), "--mlflow-run", "parent")
    assert rc == 2 and "needs --study" in err


def _two_target_study(storage: str, name: str, trials: int) -> None:
    """A synthetic study run for pass@1 and judge (random sampler, no pilots) in ``storage``."""
    s = StudySpec(name=name, objective="synthetic", budget_flops=1e18, target=("pass@1", "judge"),
                  trials=trials, sampler="random", seed=0, tuner="bo",
                  space=SearchSpace(rho=(0.2, 0.9), group_sizes=(8,), rewards=("sparse", "prm")))
    obj = SyntheticObjective()
    run_study(s, objective=obj, workload=obj.workload(), storage=storage)


def test_cli_best_and_pareto_default_to_the_one_study_the_storage_holds(tmp_path, capsys):
    """A storage with one study: `best` / `pareto` without --study read it (as the README's
    first study leaves `allocopt.db` with the study `allocopt`), the same answer as with it."""
    storage = f"sqlite:///{tmp_path}/one.db"
    _two_target_study(storage, "only", 3)
    for cmd in (["best", "--target", "judge"], ["pareto"]):
        rc, out, err = cli(capsys, *cmd, "--storage", storage, "--json")
        assert rc == 0, err
        rc2, named, _ = cli(capsys, *cmd, "--study", "only", "--storage", storage, "--json")
        assert rc2 == 0 and json.loads(out) == json.loads(named)


@pytest.fixture(scope="module")
def two_targets(tmp_path_factory):
    """Study ``mo`` run for pass@1 and judge (4 synthetic trials), and ``bare``: an Optuna study
    made elsewhere, one trial, no stored spec or objective names."""
    d = tmp_path_factory.mktemp("mo")
    storage = f"sqlite:///{d}/optuna.db"
    _two_target_study(storage, "mo", 4)
    bare = optuna.create_study(study_name="bare", storage=storage)
    bare.add_trial(optuna.trial.create_trial(params={"rho": 0.5}, distributions={
        "rho": optuna.distributions.FloatDistribution(0.2, 0.9)}, value=0.4))
    return storage


def test_cli_pareto_defaults_to_the_studys_targets(two_targets, capsys):
    rc, out, _ = cli(capsys, "pareto", "--study", "mo", "--storage", two_targets, "--json")
    assert rc == 0
    got = json.loads(out)
    rc, out, _ = cli(capsys, "pareto", "--study", "mo", "--storage", two_targets, "--objectives", "pass@1,judge", "--json")
    assert rc == 0 and got == json.loads(out) and got["objectives"] == ["pass@1", "judge"]


@pytest.mark.parametrize("args,needle", [
    (["best", "--study", "mo"], "--target: not given, and study mo has 2 targets (pass@1, judge); give --target"),
    (["best", "--study", "bare"], "--target: not given, and study bare stores no target; give --target"),
    (["pareto", "--study", "bare"], "objectives: not given, and study bare stores no target; give --objectives"),
])
def test_cli_no_single_stored_target_exits_2_with_one_line(two_targets, capsys, args, needle):
    rc, out, err = cli(capsys, *args, "--storage", two_targets)
    assert rc == 2 and err.startswith("error: ") and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow  # a fresh process end to end (CI runs -m slow)
def test_cli_best_without_target_in_a_subprocess(studies):
    """The installed command line: `allocopt best --study a` answers for pass@1; across two
    MLflow experiments nothing names one target: one line, exit 2."""
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "best", "--study", "a", "--storage",
                        studies["storage"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Best observed trial for pass@1 (maximize) in study a" in " ".join(r.stdout.split())
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "best", "--from-mlflow", "a", "--from-mlflow", "b",
                        "--mlflow-uri", studies["uri"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--target: not given, and MLflow a, b stores no target; give --target" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["pareto", "--study", "nope", "--objectives", "pass@1,judge"], "study='nope': not found"),
    (["best", "--study", "a", "--target", "bleu"], "target='bleu': unknown"),
    (["best", "--study", "a", "--target", "pass@1:gsm8k"], "no complete trial measured it"),
    (["pareto", "--study", "a", "--objectives", "pass@1,judge", "--where", "rho>>0.5"], "where='rho>>0.5'"),
    (["pareto", "--study", "a", "--objectives", "pass@1,judge", "--where", "reward"], "allowed forms"),
    (["pareto", "--study", "a"], "objectives: not given, and study a stores one target (pass@1); give --objectives"),
    (["best", "--study", "a", "--target", "judge", "--where", "reward=dnse"], "matches no complete trial"),
    (["pareto", "--study", "a", "--objectives", "pass@1,judge", "--directions", "up,down"], "direction='up'"),
    (["best", "--study", "a", "--target", "judge", "--fidelity", "half"], "fidelity='half'"),
    (["best", "--target", "judge"], "holds a, b) or --from-mlflow"),
    (["report", "--study", "a", "--out", "x", "--pareto", "judge"], "exactly two"),
])
def test_cli_bad_queries_exit_2_with_one_line(studies, capsys, args, needle):
    rc, out, err = cli(capsys, *args, "--storage", studies["storage"])
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


def test_cli_bad_mlflow_experiment(studies, capsys):
    """(In this process: the command line's subprocess smoke test is the one above.)"""
    rc, _, err = cli(capsys, "best", "--from-mlflow", "nope", "--mlflow-uri", studies["uri"], "--target", "judge")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "experiment='nope': not found" in err and "allocopt/a" in err


def test_cli_import_stays_light():
    code = ("import sys, allocopt.cli; print([m for m in ('torch', 'optuna', 'mlflow', 'pandas', 'matplotlib')"
            " if m in sys.modules]); print(sorted(c.name or c.callback.__name__ for c in"
            " allocopt.cli.app.registered_commands))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    heavy, commands = r.stdout.strip().splitlines()
    assert heavy == "[]", r.stderr
    assert {"pareto", "best", "report"} <= set(eval(commands))


def test_optuna_study_untouched_by_queries(studies):
    before = len(optuna.load_study(study_name="a", storage=studies["storage"]).trials)
    load_rows_from_study(studies["storage"], "a")
    assert len(optuna.load_study(study_name="a", storage=studies["storage"]).trials) == before


def test_cli_tables_fit_80_columns_with_their_numbers(two_targets, capsys):
    """`best`'s per-reward table and `pareto`'s front (three targets and the breakdown) fit 80
    columns even when piped (a file gets 160), and every row keeps its numbers whole (a total
    that every row shares is said once, in the caption)."""
    rows = [r for r in load_rows_from_study(two_targets, "mo") if r.fidelity == "full"]
    for cmd in (["best", "--target", "pass@1"], ["pareto"]):
        rc, out, _ = cli(capsys, *cmd, "--study", "mo", "--storage", two_targets)
        assert rc == 0
        lines = out.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= 80, out
        shown = [r for r in rows if any(line.split()[:1] == [str(r.number)] for line in lines)]
        assert shown, out
        for r in shown:
            line = next(line for line in lines if line.split()[:1] == [str(r.number)])
            cells = line.split()
            assert f"{r.metrics['rho']:.3f}" in cells  # the realized rho
            assert f"{r.targets['pass_at_1']:.4f}" in cells and f"{r.targets['judge']:.4f}" in cells
            total = f"{r.metrics['total_flops']:.3e}"  # in its row, or said once when every row's is the same
            assert total in cells or f"executed {total} FLOPs" in " ".join(out.split())


def test_a_front_over_flops_prints_flops_that_differ_apart():
    """Two trials of one budget differ in their fifth significant digit of FLOPs: at 4 digits
    both print 1.000e+19 and the front looks wrong, so the column widens until they differ."""
    from allocopt.cli.query import _spec

    values = [1.0e19, 1.0e19 - 3e13, 9.99e18]
    assert format(values[0], _spec("total_flops")) == format(values[1], _spec("total_flops")) == "1.000e+19"
    spec = _spec("total_flops", values)
    assert spec == ".5e" and len({format(v, spec) for v in values}) == 3
    assert _spec("total_flops", [1e19, 2e19]) == ".3e" and _spec("judge", values) == ".4f"
