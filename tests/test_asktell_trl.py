"""The round trip of a run launched elsewhere: allocopt ask -> TRL GRPOTrainer on the tiny world
(examples/trl_tiny_grpo.py, no allocopt in the loop) -> allocopt tell --from-trl, with the
built-in names and with a study's declared ones."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]
ORM = ROOT / "tests" / "data" / "configs" / "Qwen2.5-7B-ORM" / "config.json"


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
    assert t.state.name == "COMPLETE" and t.values == [metrics["targets"]["pass@1"]]
    spent = runlogs.import_trl(tmp_path / "out").account.executed
    m = t.user_attrs["metrics"]
    assert m["total_flops"] == spent.total_flops and m["learning_flops"] == spent.learning_flops
    # TRL ran the planned iterations, at lengths near the workload's means: the spend is near
    # what ask expected (no budget meter in this loop: TRL can run over)
    assert 0.5 < spent.total_flops / info["expected_total_flops"] < 1.5
    assert t.user_attrs["over_budget"] == (spent.total_flops > info["budget_flops"])
    assert m["budget_utilization"] == pytest.approx(spent.total_flops / info["budget_flops"])  # the trial's budget (a pilot: a share of 1e11)


DECLARED = """
objective = "tiny"
budget_flops = 6e10
target = "acc"
seed = 0
tuner = "kg"
pilots = 0

[targets]
acc = { direction = "maximize", range = [0, 1] }

[rewards]
rule = { kind = "rule" }

[space]
rho = [0.3, 0.8]
group_sizes = [4]
rewards = ["rule"]
"""


def test_the_example_job_serves_a_studys_declared_names(tmp_path, cli):
    """A study that declares its own target (``acc``) and rule-based reward system (``rule``):
    ``ask`` names both in ``ask.json``, the example job trains with the tiny world's ``sparse``
    where ``rule`` is asked and reports its measured ``pass@1`` as ``acc``, and ``tell`` records
    that value (read back by ``best --target acc`` and from the storage). One short TRL run of
    the tiny world (a 6e10 budget, 20 held-out problems): ~20 s on 2 loaded cores."""
    (tmp_path / "s.toml").write_text(DECLARED)
    url = f"sqlite:///{tmp_path}/d.db"
    r = cli("ask", "--study", "own", "--spec", "s.toml", "--storage", url, "--format", "trl", "--out", "asked",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "asked" / "trial-0"
    info = json.loads((folder / "ask.json").read_text())
    assert info["reward"] == "rule" and info["targets"] == {"acc": "maximize"}
    job = [sys.executable, str(ROOT / "examples" / "trl_tiny_grpo.py"), str(folder), "--out", "out",
           "--eval-problems", "20"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run(job, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "error: reward='rule': the tiny world trains with" in refused.stderr
    ran = subprocess.run(job + ["--reward", "rule=sparse", "--target", "acc=pass@1"], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["targets"] == {"acc": said["measured"]["pass_at_1"]}
    r = cli("tell", "--study", "own", "--storage", url, "--trial", "0", "--metrics", "out/metrics.json",
            "--from-trl", "out", "--no-mlflow", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    t = optuna.load_study(study_name="own", storage=url).trials[0]
    assert t.state.name == "COMPLETE" and t.values == [said["measured"]["pass_at_1"]]
    b = cli("best", "--study", "own", "--storage", url, "--target", "acc", "--json", cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["best"]["targets"] == {"acc": said["measured"]["pass_at_1"]}


BAR = """
objective = "tiny"
budget_flops = 6e10
target = ["aime24", "cost_usd"]
seed = 0
tuner = "kg"
pilots = 0

[targets]
aime24 = { direction = "maximize", range = [0, 1] }
cost_usd = { direction = "minimize" }

[rewards]
rule = { kind = "rule" }
orm8b = { kind = "model", model = "ORM", scoring = "forward" }

[space]
rho = [0.3, 0.8]
group_sizes = [4]
rewards = ["rule", "orm8b"]
""".replace('"ORM"', json.dumps(str(ORM)))
"""Issue 36's study: a rule-based and a 7B model-based reward system, a target to maximize and
a cost to minimize; the budget of the declared-names test above."""


def test_ask_after_tell_in_a_study_with_infeasible_proposals(tmp_path, cli):
    """``ask`` records a proposal the budget cannot buy (``orm8b`` at 6e10) with the ``budget``
    constraint in both forms a worker and ``tell`` write (``{"budget": v, "0": v}``): with one
    form on some trials and two on others the study's BoTorch sampler refused the next ``ask``
    ("Expected the constraints named ['0', 'budget'] but received ['budget']"). No training:
    the told metrics carry their compute."""
    (tmp_path / "s.toml").write_text(BAR)
    url = f"sqlite:///{tmp_path}/d.db"
    (tmp_path / "m.json").write_text(json.dumps({"targets": {"aime24": 0.4, "cost_usd": 0.01},
                                                 "search_flops": 2e10, "learning_flops": 3e10, "reward_flops": 0}))
    for _ in range(2):
        r = cli("ask", "--study", "own", "--spec", "s.toml", "--storage", url, "--out", "asked", "--json",
                cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        [asked] = json.loads(r.stdout)
        r = cli("tell", "--study", "own", "--storage", url, "--trial", asked["trial"], "--metrics", "m.json",
                "--no-mlflow", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    from allocopt.record import TrialRecord

    trials = optuna.load_study(study_name="own", storage=url).trials
    infeasible = [t for t in trials if TrialRecord.of(t).state == "INFEASIBLE"]
    assert infeasible and all(t.params["reward"] == "orm8b" for t in infeasible)
    assert all(set(t.constraints) == {"budget", "0"} and t.constraints["budget"] == t.constraints["0"] > 0
               for t in infeasible)
    assert sum(TrialRecord.of(t).state == "COMPLETE" for t in trials) == 2
