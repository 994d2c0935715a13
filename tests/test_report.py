"""The visual report: valid PNGs, one self-contained HTML page, the regime table with RACE's
regimes and the recommendation, ρ* by RACE's estimator, the study's Pareto pair and budgets,
MLflow artifacts."""

import math
import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from allocopt.cli import main
from allocopt.query.pareto import best
from allocopt.record import TrialRow
from allocopt.query.sources import load_rows_from_study, rows_of_study
from allocopt.query.report import write_report
from allocopt.query.report_data import best_table, default_pareto_pair, estimates, rho_estimate, study_context
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.study.open import open_study
from objectives.synthetic import SyntheticObjective

DATA_URI = "data:image/png;base64,"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished synthetic study: 9 full trials over three reward systems and 2 pilots."""
    d = tmp_path_factory.mktemp("report-study")
    storage = f"sqlite:///{d}/optuna.db"
    spec = StudySpec(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=9,
                     sampler="random", seed=0, tuner="bo",
                     space=SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "dense", "prm")))
    st = open_study(spec, storage)
    for rho, reward in ((0.45, "prm"), (0.7, "sparse")):
        st.enqueue_trial({"rho": rho, "reward": reward, "group_size": 8},
                         user_attrs={"fidelity": "pilot", "budget_flops": 1e17})
    obj = SyntheticObjective()
    run_study(spec, objective=obj, workload=obj.workload(), storage=storage)
    return {"storage": storage, "rows": load_rows_from_study(storage, "r")}


def check_page(files):
    pngs = [p for p in files if p.suffix == ".png"]
    for p in pngs:
        assert p.stat().st_size > 0
        with Image.open(p) as im:
            im.verify()
        with Image.open(p) as im:
            assert im.format == "PNG" and min(im.size) > 100
    page = files[-1].read_text(encoding="utf-8")
    assert files[-1].name == "report.html" and page.count(DATA_URI) == len(pngs)
    # self-contained: nothing fetched (no URL, script, style sheet or image file)
    assert not re.search(r"https?://|<script|<link|src=['\"](?!data:)|url\(", page)
    return pngs, page


def test_best_table_matches_best_per_reward(study):
    rows = study["rows"]
    table = best_table(rows, ["judge"])
    assert [t["reward"] for t in table] == ["sparse", "dense", "prm"]
    for t in table:
        full = [r for r in rows if r.fidelity == "full" and r.params["reward"] == t["reward"]]
        b = best(full, "judge")
        assert t["best"]["number"] == b.number and t["best"]["rho"] == b.params["rho"]
        assert t["full_trials"] == sum(r.state == "COMPLETE" for r in full)
        shares = [t["best"][k] for k in ("search_share", "learning_share", "reward_share")]
        assert sum(shares) == pytest.approx(1.0)
    assert sum(t["pilot_trials"] for t in table) == 2


# ------------------------------------------------------------------ a small RACE study
PILOT_RHOS = (0.2, 0.35, 0.5, 0.65, 0.8)
FULL_RHOS = {"sparse": (0.5, 0.6, 0.7), "prm": (0.3, 0.4, 0.5)}


@pytest.fixture(scope="module")
def race_study():
    """In memory (fast): 10 pilots at 0.1 x budget, 6 full-budget trials, and the answer RACE
    stores (allocopt.answer.recommendation_dict of a Recommendation)."""
    return _race_study(store_answer=True)


def _race_study(store_answer):
    from dataclasses import asdict

    from allocopt.plan.allocation import Allocation
    from allocopt.answer import recommendation_dict
    from allocopt.race import RaceSettings, Recommendation

    spec = StudySpec(name="rr", objective="synthetic", budget_flops=1e18, target="pass@1", trials=6,
                     sampler="random", seed=0, tuner="bo",
                     space=SearchSpace(rho=(0.2, 0.8), group_sizes=(4, 8), rewards=("sparse", "prm")))
    st = open_study(spec, None)
    for reward in ("sparse", "prm"):
        for rho in PILOT_RHOS:
            st.enqueue_trial({"rho": rho, "reward": reward, "group_size": 8},
                             user_attrs={"fidelity": "pilot", "budget_flops": 1e17})
    for reward, rhos in FULL_RHOS.items():
        for rho in rhos:
            st.enqueue_trial({"rho": rho, "reward": reward, "group_size": 8})
    obj = SyntheticObjective()
    run_study(spec, objective=obj, workload=obj.workload(), storage=None, study=st)
    rec = Recommendation(allocation=Allocation(0.45, 8, "prm"), mean=0.5512, interval=(0.5234, 0.5801),
                         prob_best=0.83, within_noise=(Allocation(0.45, 8, "prm"), Allocation(0.62, 8, "sparse")),
                         noise_sd=0.0112, cell_prob_best=(("prm", None, 0.83), ("sparse", None, 0.17)), full_runs=6)
    st.set_user_attr("race", {"pilot_fraction": 0.1, "settings": asdict(RaceSettings())})
    if store_answer:
        st.set_user_attr("recommendation", recommendation_dict(rec, "pass@1"))
    return {"study": st, "spec": spec, "rows": rows_of_study(st)}


@pytest.mark.slow
def test_a_race_study_without_a_stored_answer_gets_one(tmp_path):
    """A RACE study run through the Python API stores no answer: the report computes RACE's
    recommendation (a GP fit) and says so."""
    from allocopt.race import RaceSettings

    d = _race_study(store_answer=False)
    ctx = study_context(d["study"])
    rec = ctx.recommendation
    assert ctx.recommendation_source.startswith("computed by the report")
    a = rec["allocation"]
    # RACE recommends only what full runs support: a reward system with a full run, rho near one
    assert a["reward"] in FULL_RHOS and a["group_size"] == 8
    assert min(abs(a["rho"] - r) for r in FULL_RHOS[a["reward"]]) <= RaceSettings().rho_trust + 1e-9
    assert rec["lower"] <= rec["mean"] <= rec["upper"] and rec["full_runs"] == 6
    assert sum(c["prob_best"] for c in rec["cell_prob_best"]) == pytest.approx(1.0)
    _, page = check_page(write_report(d["rows"], tmp_path, title="computed", targets=["pass@1"], context=ctx))
    assert "computed by the report" in page and f"recommended: rho={a['rho']:.3f} G=8 {a['reward']}" in page


def test_race_report_shows_regimes_and_the_recommendation(race_study, tmp_path):
    """The page of a finished RACE study: figures, RACE's regimes, the one answer, the budgets."""
    from allocopt.race import RaceSettings, diagnose
    from allocopt.study.observe import study_observations as observations

    st, spec = race_study["study"], race_study["spec"]
    files = write_report(race_study["rows"], tmp_path, title="RACE", targets=["pass@1", "native_reward"],
                         context=study_context(st))
    pngs, page = check_page(files)
    # the default Pareto pair: the study's target, then the next target asked for
    assert sorted(p.name for p in pngs) == ["breakdown.png", "frontier_native_reward.png", "frontier_pass_at_1.png",
                                           "pareto_pass_at_1__native_reward.png"]
    assert "Regime table" in page and "Pareto trials: pass@1 and native_reward" in page
    # the regime rows are RACE's diagnosis of the same pilots (as run_race computes it)
    pilots = [o for o in observations(st, spec) if o.fidelity == "pilot"]
    assert len(pilots) == 10
    diags = {d.reward: d for d in diagnose(pilots, spec.space, RaceSettings(), 0)}
    d = diags["prm"]
    lo, hi = d.rho_interval
    assert f"{d.rho:.2f} ± {d.rho_sd:.2f}</td><td>{lo:.2f}–{hi:.2f}</td>" in page
    assert f"{d.regime} ({d.probability:.0%})" in page
    # sparse's 5 pilots leave its fit (vertex ~0.65) 3.8 effective pilots for 3 coefficients
    assert "<td>unknown</td><td>0.20–0.80</td><td>–</td>" in page and "too few pilots: rho* unknown" in page
    assert math.isnan(diags["sparse"].rho) and diags["sparse"].regime == "unknown"
    # the recommendation: the line the study prints, its interval, P(best) per reward system
    assert "recommended: rho=0.450 G=8 prm" in page
    assert "pass@1 = 0.551, 90% CI 0.523-0.580; P(prm is best) = 83%" in page
    assert "0.5234 – 0.5801" in page and "ρ=0.620, G=8, sparse" in page
    assert "<td class='l'>prm</td><td>83%</td>" in page and "<td class='l'>sparse</td><td>17%</td>" in page
    # header: the full budget, and the pilots apart with their fraction
    assert "Full budget 1.000e+18 FLOPs per trial (6 full-budget trials)" in page
    assert "pilots: 10 at 1.000e+17 FLOPs (0.1 of the full budget)" in page


def test_rho_star_is_races_estimate_or_the_recommendation(race_study):
    from allocopt.race import RaceSettings, diagnose_group
    from allocopt.study.observe import study_observations as observations

    st, spec, rows = race_study["study"], race_study["spec"], race_study["rows"]
    stars = estimates(rows, ["judge", "pass@1"], study_context(st))
    for reward, rhos in FULL_RHOS.items():
        obs = [o for o in observations(st, spec, "judge") if o.fidelity == "full" and o.allocation.reward == reward]
        assert sorted(o.allocation.rho for o in obs) == list(rhos)
        # 3 full-budget trials cannot fit a quadratic with anything left for its noise: unknown
        assert math.isnan(diagnose_group(obs, (min(rhos), max(rhos)), RaceSettings(), seed=0).rho)
        pilots = [o for o in observations(st, spec, "judge") if o.fidelity == "pilot" and o.allocation.reward == reward]
        want = diagnose_group(pilots, (min(PILOT_RHOS), max(PILOT_RHOS)), RaceSettings(), seed=0)
        got = stars.get((reward, "judge"))
        if math.isnan(want.rho):  # the pilots too few as well: no estimate
            assert got is None
        else:
            assert got.source == "pilots" and got.num_trials == 5
            assert got.rho == pytest.approx(want.rho, abs=1e-12) and got.interval == pytest.approx(want.rho_interval)
            assert got.interval[0] <= got.rho <= got.interval[1]
    assert ("sparse", "judge") in stars and ("prm", "judge") not in stars  # both branches above ran
    # for the study's target, the recommended reward system's rho is the recommendation's
    assert stars[("prm", "pass_at_1")].source == "recommendation" and stars[("prm", "pass_at_1")].rho == 0.45
    assert ("sparse", "pass_at_1") not in stars


def test_rho_star_at_the_edge_of_the_data_is_said(tmp_path):
    """A target rising over the whole range: rho* sits at the highest rho tried, and says so
    (7 trials: 4 would leave the kernel-weighted quadratic at rho 0.6 under 1 degree of freedom)."""
    def rows_at(rhos):
        return [TrialRow(i, "COMPLETE", {"rho": r, "group_size": 8, "reward": "dense", "model": None},
                    {"judge": 0.2 + 0.5 * r}, {"total_flops": 1e18, "reward_flops": 0.0}, None,
                    plan={"budget_flops": 1e18}) for i, r in enumerate(rhos)]

    assert rho_estimate(rows_at((0.3, 0.4, 0.5, 0.6)), "dense", "judge") is None
    rows = rows_at((0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6))
    e = rho_estimate(rows, "dense", "judge")
    assert e.rho == pytest.approx(0.6) and e.at_edge and e.data_range == (0.3, 0.6)
    assert e.interval[0] <= e.rho <= e.interval[1]
    assert "at the edge of the data" in e.edge_note()
    _, page = check_page(write_report(rows, tmp_path, title="edge", targets=["judge"]))
    assert "at the edge of the data (ρ 0.30-0.60)" in page


def test_pareto_pair_is_the_studys_targets():
    import optuna

    st = optuna.create_study(directions=["maximize", "maximize"])
    st.set_user_attr("spec", StudySpec(name="m", objective="synthetic", budget_flops=1e18,
                                       target=("judge", "pass@1")).to_dict())
    ctx = study_context(st)
    assert ctx.targets == ("judge", "pass_at_1") and ctx.budget_flops == 1e18
    assert default_pareto_pair([], ["native_reward", "pass@1", "judge"], ctx) == ["judge", "pass_at_1"]
    named = optuna.create_study(directions=["maximize", "maximize"])
    named.set_metric_names(["native_reward", "judge"])  # no stored spec: its metric names
    assert default_pareto_pair([], ["pass@1", "judge"], study_context(named)) == ["native_reward", "judge"]
    assert default_pareto_pair([], ["pass@1", "judge"], None) == ["pass_at_1", "judge"]


def test_report_without_trials_still_renders(tmp_path):
    files = write_report([], tmp_path, title="empty", targets=["pass@1", "judge"])
    check_page(files)


def test_cli_report_and_mlflow_artifacts(study, tmp_path, tmp_path_factory, capsys):
    from mlflow import MlflowClient

    template = tmp_path_factory.getbasetemp() / "mlflow-template.db"  # shared with test_pareto
    if not template.exists():
        MlflowClient(f"sqlite:///{template}").search_experiments()
    shutil.copy(template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("allocopt/r", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(exp).info.run_id
    with pytest.raises(SystemExit) as e:
        main(["report", "--study", "r", "--storage", study["storage"], "--out", str(tmp_path / "out"),
              "--where", "reward!=dense", "--mlflow-run", run_id, "--mlflow-uri", uri])
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    files = sorted((tmp_path / "out").iterdir())
    _, page = check_page(sorted(files, key=lambda p: p.suffix == ".html"))
    assert "dense" not in re.sub(r"data:image/png;base64,[^'\"]+", "", page)
    logged = {os.path.basename(a.path) for a in client.list_artifacts(run_id, "report")}
    assert logged == {p.name for p in files} and "report.html" in out
    assert (tmp_path / "artifacts" / run_id / "artifacts" / "report" / "report.html").exists()


def test_the_answer_paragraph_reads_as_one_sentence():
    """The page's answer is the study's lines with their 80-column wraps undone (no break
    mid-sentence) and no pointer to `allocopt report` on the report itself."""
    from types import SimpleNamespace

    from allocopt.plan.allocation import Allocation
    from allocopt.answer import recommendation_dict, recommendation_lines
    from allocopt.query.report import recommendation_html

    close = [Allocation(0.58, 4, "dense"), Allocation(0.57, 4, "dense"), Allocation(0.62, 4, "structured")]
    rec = SimpleNamespace(allocation=close[0], mean=0.526, interval=(0.511, 0.543), level=0.9,
                          prob_best=0.8, within_noise=close, noise_sd=0.013)
    lines = recommendation_lines(rec, "pass@1")
    assert any(line.startswith("    ") for line in lines)  # the study wraps the noise line
    ctx = SimpleNamespace(recommendation=recommendation_dict(rec, "pass@1"), recommendation_source="stored by the study")
    page = "".join(recommendation_html([], ctx))
    answer = page[page.index("<p class='answer'>"):page.index("</p>", page.index("<p class='answer'>"))]
    assert answer.count("<br>") == 2 and "`" not in answer  # three sentences, no backticks
    assert "3 allocations at rho 0.57-0.62, 2 reward systems (dense, structured): not one winner; listed below" in answer


def test_report_writes_into_a_report_folder_by_default(study, tmp_path, monkeypatch):
    """`allocopt report --study S` without --out (as `best` suggests it): ./report/."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["report", "--study", "r", "--storage", study["storage"]])
    assert e.value.code == 0
    assert (tmp_path / "report" / "report.html").is_file()


def test_told_runs_are_plotted_and_fitted_at_the_rho_they_spent():
    """A told run's whole passes land off the asked ρ (asked 0.33, spent 0.40 here): the
    figure's points and the ρ* fit read the spent ρ (the metric ``rho``), as the tuner does."""
    from allocopt.query.report_figures import frontier_figure

    asked = (0.33, 0.38, 0.43, 0.48, 0.53, 0.58, 0.63)
    spent = (0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60)
    rows = [TrialRow(i, "COMPLETE", {"rho": a, "group_size": 8, "reward": "dense", "model": None},
                     {"judge": 0.2 + 0.5 * s}, {"total_flops": 1e18, "reward_flops": 0.0, "rho": s}, None,
                     plan={"budget_flops": 1e18}, source="tell") for i, (a, s) in enumerate(zip(asked, spent))]
    e = rho_estimate(rows, "dense", "judge")
    assert e.data_range == (0.3, 0.6) and e.rho == pytest.approx(0.6)
    fig = frontier_figure(rows, "judge", title="told")
    xs = sorted(float(x) for c in fig.axes[0].collections for x, _ in c.get_offsets())
    assert xs[:7] == pytest.approx(sorted(spent)) and max(xs) == pytest.approx(0.6)
    study_run = [r.__class__(**{**r.__dict__, "source": None}) for r in rows]  # a study's own: the asked ρ
    assert rho_estimate(study_run, "dense", "judge").data_range == (0.33, 0.63)
