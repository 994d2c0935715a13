"""The round trip of a run launched elsewhere: allocopt ask -> TRL GRPOTrainer on the tiny world
(examples/trl_tiny_grpo.py, no allocopt in the loop) -> allocopt tell --from-trl, with the
built-in names and with a study's declared ones (issue 36's study: ``rule`` and a 7B
``orm8b``, ``aime24`` to maximize and ``cost_usd`` to minimize)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[1]
ORM = ROOT / "tests" / "data" / "configs" / "Qwen2.5-7B-ORM" / "config.json"


def run_job(folder: Path, *flags: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``examples/trl_tiny_grpo.py folder --out out --eval-problems 20 *flags`` in a subprocess
    (this checkout first on the path), as a user's job is run between ``ask`` and ``tell``."""
    job = [sys.executable, str(ROOT / "examples" / "trl_tiny_grpo.py"), str(folder), "--out", "out",
           "--eval-problems", "20", *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(job, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


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


@pytest.mark.slow  # trains the tiny policy with TRL: ~20 s
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
    refused = run_job(folder, cwd=tmp_path, timeout=120)
    assert refused.returncode == 1 and "error: reward='rule': the tiny world trains with" in refused.stderr
    ran = run_job(folder, "--reward", "rule=sparse", "--target", "acc=pass@1", cwd=tmp_path)
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


def test_the_example_jobs_price_is_checked_before_training(tmp_path):
    """``--usd-per-gpu-hour`` other than a number > 0: one line, exit 2; a study target mapped to
    ``usd`` without a price: one line (exit 1, as the job's other refusals), before any training."""
    (tmp_path / "ask.json").write_text(json.dumps({"trial": 0, "reward": "rule",
                                                   "targets": {"cost_usd": "minimize"}}))
    (tmp_path / "grpo_config.json").write_text("{}")
    for bad in ("0", "-2.5", "nan", "inf", "two"):
        r = run_job(tmp_path, "--usd-per-gpu-hour", bad, cwd=tmp_path, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"error: --usd-per-gpu-hour {bad!r}: give the price of one device-hour in USD, a number > 0 "
            "(e.g. 2.5)"], r.stderr
    r = run_job(tmp_path, "--reward", "rule=sparse", "--target", "cost_usd=usd", cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: target 'cost_usd' maps to usd: give --usd-per-gpu-hour X, the price of one device-hour in USD"]
    assert not (tmp_path / "out").exists()


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
    form on some trials and two on others the study's Optuna sampler refused the next ``ask``
    ("Expected the constraints named ['0', 'budget'] but received ['budget']"). No training:
    the told metrics carry their compute."""
    # Optuna's hypervolume search (tuner = "bo"): the kg tuner checks feasibility before it proposes
    (tmp_path / "s.toml").write_text(BAR.replace('tuner = "kg"', 'tuner = "bo"'))
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


def _dry_run_shares(stdout: str) -> dict[str, list[str]]:
    """Each reward system's rows of a ``study --dry-run`` table: its ``rwd`` share (``"0%"``)
    or, for a plan the budget cannot buy, the row's text."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        words = line.split()
        if words and words[0] in ("rule", "orm8b"):
            shares = re.findall(r"\b(\d+)%", line)
            rows.setdefault(words[0], []).append(shares[2] + "%" if len(shares) == 3 else line)
    return rows


@pytest.mark.slow  # two TRL runs of the tiny world, tell with MLflow, a report: ~90 s on 2 loaded cores
def test_a_study_of_its_own_names_through_ask_the_example_job_and_tell(tmp_path, cli):
    """Issue 36's bar: the study prices each reward system (``--dry-run``), two rounds of ``ask``
    -> the example job (``rule`` trained as ``sparse``, ``orm8b`` as ``prm``, ``aime24`` = the
    measured pass@1, ``cost_usd`` = the training's device-hours at $2.5) -> ``tell`` record them,
    and ``best``, ``pareto``, ``report`` and MLflow show the declared names. At this budget a
    7B ORM cannot score one iteration's rollouts, so ``orm8b`` proposals are recorded
    INFEASIBLE and the runs are ``rule`` ones; a budget that buys ``orm8b`` gives its plans a
    reward share."""
    (tmp_path / "s.toml").write_text(BAR)
    url, ml = f"sqlite:///{tmp_path}/d.db", f"sqlite:///{tmp_path}/mlflow.db"
    wide = {"COLUMNS": "200"}
    dry = cli("study", "--spec", "s.toml", "--dry-run", cwd=tmp_path, env=wide)
    assert dry.returncode == 0, dry.stderr
    rows = _dry_run_shares(dry.stdout)
    assert rows["rule"] and set(rows["rule"]) == {"0%"}
    assert rows["orm8b"] and all(re.search(r"needs\s+2\.\d+e\+13", r) for r in rows["orm8b"]), rows["orm8b"]
    dry = cli("study", "--spec", "s.toml", "--budget", "2.5e13", "--dry-run", cwd=tmp_path, env=wide)
    assert dry.returncode == 0, dry.stderr
    rows = _dry_run_shares(dry.stdout)
    assert set(rows["rule"]) == {"0%"} and rows["orm8b"] and all(r != "0%" and r.endswith("%") for r in rows["orm8b"])

    told = {}
    for _ in range(2):
        r = cli("ask", "--study", "own", "--spec", "s.toml", "--storage", url, "--format", "trl", "--out", "asked",
                "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        [asked] = json.loads(r.stdout)
        folder = tmp_path / "asked" / f"trial-{asked['trial']}"
        ran = run_job(folder, "--reward", "rule=sparse", "--reward", "orm8b=prm", "--target", "aime24=pass@1",
                      "--target", "cost_usd=usd", "--usd-per-gpu-hour", "2.5", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        (tmp_path / "out").rename(tmp_path / f"out-{asked['trial']}")
        out = f"out-{asked['trial']}"
        r = cli("tell", "--study", "own", "--storage", url, "--trial", asked["trial"], "--metrics",
                f"{out}/metrics.json", "--from-trl", out, "--mlflow-uri", ml, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        told[asked["trial"]] = json.loads((tmp_path / out / "metrics.json").read_text())

    from allocopt.record import TrialRecord

    st = optuna.load_study(study_name="own", storage=url)
    assert [d.name for d in st.directions] == ["MAXIMIZE", "MINIMIZE"]
    for number, metrics in told.items():
        t = st.trials[number]
        assert TrialRecord.of(t).state == "COMPLETE" and t.params["reward"] in ("rule", "orm8b")
        assert t.values == [metrics["targets"]["aime24"], metrics["targets"]["cost_usd"]]
        assert set(metrics["targets"]) == {"aime24", "cost_usd"}
        # the cost, checked against TRL's own clock: the job's timer wraps trainer.train()
        m = metrics["measured"]
        runtime = json.loads((tmp_path / f"out-{number}" / "trainer_state.json").read_text())["log_history"][-1]
        assert runtime["train_runtime"] - 1e-3 <= m["train_seconds"] <= runtime["train_runtime"] + 60
        assert metrics["devices"] == 1 and metrics["usd_per_gpu_hour"] == 2.5
        assert metrics["targets"]["cost_usd"] == pytest.approx(m["train_seconds"] / 3600 * 2.5, rel=1e-12)
        assert metrics["targets"]["aime24"] == m["pass_at_1"]
    for t in st.trials:  # orm8b at this budget: recorded as a plan the budget cannot buy
        if t.number not in told and t.params.get("reward") == "orm8b":
            assert TrialRecord.of(t).state == "INFEASIBLE"

    cheaper = min(told, key=lambda n: told[n]["targets"]["cost_usd"])
    b = cli("best", "--study", "own", "--storage", url, "--target", "cost_usd", "--json", cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    best = json.loads(b.stdout)
    assert best["direction"] == "minimize" and best["best"]["number"] == cheaper
    assert best["best"]["targets"] == told[cheaper]["targets"]
    p = cli("pareto", "--study", "own", "--storage", url, "--target", "aime24", "--target", "cost_usd",
            cwd=tmp_path, env=wide)
    assert p.returncode == 0, p.stderr
    said = " ".join(p.stdout.split())  # the title wraps at the table's width
    assert "Pareto front of study own: aime24 (maximize), cost_usd (minimize)" in said, p.stdout
    p = cli("pareto", "--study", "own", "--storage", url, "--target", "aime24", "--target", "cost_usd",
            "--json", cwd=tmp_path)
    front = json.loads(p.stdout)
    assert front["objectives"] == ["aime24", "cost_usd"] and front["directions"] == ["maximize", "minimize"]

    def dominated(n: int) -> bool:
        a, c = told[n]["targets"]["aime24"], told[n]["targets"]["cost_usd"]
        return any(o["aime24"] >= a and o["cost_usd"] <= c and (o["aime24"], o["cost_usd"]) != (a, c)
                   for o in (told[k]["targets"] for k in told if k != n))
    assert sorted(x["number"] for x in front["front"]) == sorted(n for n in told if not dominated(n))
    rep = cli("report", "--study", "own", "--storage", url, "--out", tmp_path / "rep", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "aime24" in html and "cost_usd" in html

    from mlflow import MlflowClient

    from allocopt.tracking.layout import mlflow_key

    c = MlflowClient(ml)
    exp = c.get_experiment_by_name("allocopt/own")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`allocopt.role` = 'trial'")
    assert sorted(int(x.data.tags["allocopt.trial_number"]) for x in runs) == sorted(told)
    for x in runs:
        metrics = told[int(x.data.tags["allocopt.trial_number"])]["targets"]
        assert {mlflow_key(k): x.data.metrics[mlflow_key(k)] for k in ("aime24", "cost_usd")} == metrics
        assert all(math.isfinite(v) for v in metrics.values())
