"""The visual report: valid PNGs, one self-contained HTML page, the regime table, MLflow artifacts."""

import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from allocopt.cli import main
from allocopt.pareto import best, load_rows_from_study
from allocopt.report import kernel_smoother, regime_table, write_report
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study import open_study, run_study
from objectives.synthetic import SyntheticObjective

DATA_URI = "data:image/png;base64,"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished synthetic study: 9 full trials over three reward systems and 2 pilots."""
    d = tmp_path_factory.mktemp("report-study")
    storage = f"sqlite:///{d}/optuna.db"
    spec = StudySpec(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=9,
                     sampler="random", seed=0, pilots=0,
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


def test_report_renders_for_a_finished_study(study, tmp_path):
    files = write_report(study["rows"], tmp_path / "rep", title="Study r", targets=["pass@1", "judge", "native_reward"])
    pngs, page = check_page(files)
    assert sorted(p.name for p in pngs) == ["breakdown.png", "frontier_judge.png", "frontier_native_reward.png",
                                           "frontier_pass_at_1.png", "pareto_pass_at_1__judge.png"]
    assert "Regime table" in page and "Pareto trials: pass@1 and judge" in page
    for reward in ("sparse", "dense", "prm"):
        assert f"<td class='l'>{reward}</td>" in page


def test_regime_table_matches_best_per_reward(study):
    rows = study["rows"]
    table = regime_table(rows, ["judge"])
    assert [t["reward"] for t in table] == ["sparse", "dense", "prm"]
    for t in table:
        full = [r for r in rows if r.fidelity == "full" and r.params["reward"] == t["reward"]]
        b = best(full, "judge")
        assert t["best"]["number"] == b.number and t["best"]["rho"] == b.params["rho"]
        assert t["full_trials"] == sum(r.state == "COMPLETE" for r in full)
        shares = [t["best"][k] for k in ("search_share", "learning_share", "reward_share")]
        assert sum(shares) == pytest.approx(1.0)
    assert sum(t["pilot_trials"] for t in table) == 2


def test_surrogate_replaces_the_smoother(study, tmp_path):
    calls = []

    def surrogate(rho):
        calls.append(len(rho))
        return 0.5 - (rho - 0.6) ** 2, np.full_like(rho, 0.02)

    files = write_report(study["rows"], tmp_path, title="with surrogate", targets=["judge"], surrogate=surrogate)
    pngs, _ = check_page(files)
    assert calls and len(pngs) == 2  # one target: frontier and breakdown, no Pareto figure
    peaks = {t["smoothed_rho"] for t in regime_table(study["rows"], ["judge"], surrogate)}
    assert all(abs(p - 0.6) < 0.01 for p in peaks)


def test_kernel_smoother_and_band():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 0.9, 40)
    y = 0.5 - (x - 0.55) ** 2 + rng.normal(0, 0.005, 40)
    grid = np.linspace(0.25, 0.85, 50)
    mean, lo, hi, h = kernel_smoother(x, y, grid)
    assert 0.04 <= h < 0.2 and np.all(lo <= mean + 1e-12) and np.all(mean <= hi + 1e-12)
    assert abs(grid[np.argmax(mean)] - 0.55) < 0.05
    flat, flo, fhi, _ = kernel_smoother([0.3, 0.5, 0.7], [0.4, 0.4, 0.4], grid)
    assert np.allclose(flat, 0.4) and np.allclose(flo, 0.4) and np.allclose(fhi, 0.4)


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
