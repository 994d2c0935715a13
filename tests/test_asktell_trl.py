"""The round trip of a run launched elsewhere: allocopt ask -> TRL GRPOTrainer on the tiny world
(examples/trl_tiny_grpo.py, no allocopt in the loop) -> allocopt tell --from-trl."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ask_trl_tell_round_trip(tmp_path):
    runlogs = pytest.importorskip("allocopt.runlogs", reason="the TRL run-log importer (allocopt.runlogs) is not in this checkout")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *a: subprocess.run([sys.executable, *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, cwd=tmp_path, env=env)
    (tmp_path / "s.toml").write_text(
        'objective = "tiny"\nbudget_flops = 1e11\ntarget = "pass@1"\nseed = 0\n'
        '[space]\nrho = [0.3, 0.8]\ngroup_sizes = [4]\nrewards = ["sparse"]\n'
        '[objective_settings]\neval_problems = 100\n')
    url = f"sqlite:///{tmp_path}/a.db"
    r = run("-m", "allocopt.cli", "ask", "--study", "rt", "--spec", "s.toml", "--storage", url, "--out", "asked")
    assert r.returncode == 0, r.stderr
    [folder] = list((tmp_path / "asked").iterdir())
    info = json.loads((folder / "ask.json").read_text())
    r = run(str(ROOT / "examples" / "trl_tiny_grpo.py"), str(folder), "--out", "out", "--eval-problems", "100")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    r = run("-m", "allocopt.cli", "tell", "--study", "rt", "--storage", url, "--trial", str(info["trial"]),
            "--metrics", "out/metrics.json", "--from-trl", "out", "--mlflow-uri", f"sqlite:///{tmp_path}/m.db")
    assert r.returncode == 0, r.stderr
    t = optuna.load_study(study_name="rt", storage=url).trials[info["trial"]]
    assert t.state.name == "COMPLETE" and t.values == [metrics["targets"]["pass_at_1"]]
    spent = runlogs.import_trl(tmp_path / "out").account.executed
    m = t.user_attrs["metrics"]
    assert m["total_flops"] == spent.total_flops and m["learning_flops"] == spent.learning_flops
    # TRL ran the planned iterations, at lengths near the workload's means: the spend is near
    # what ask expected (no budget meter in this loop: TRL can run over)
    assert 0.5 < spent.total_flops / info["expected_total_flops"] < 1.5
    assert t.user_attrs["over_budget"] == (spent.total_flops > info["budget_flops"])
    assert m["budget_utilization"] == pytest.approx(spent.total_flops / info["budget_flops"])  # the trial's budget (a pilot: a share of 1e11)
