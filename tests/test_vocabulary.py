"""A study's own vocabulary: declared targets (names, directions, ranges) and reward systems
(rule-based, or model-based priced from a config.json or a shape) end to end: the study file,
planning, the `command` objective, ask/tell, best/pareto/report and MLflow."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from allocopt.errors import ConfigError
from allocopt.flops import ModelShape
from allocopt.plan.allocation import Allocation, Workload, make_plan
from allocopt.plan.setup import TrainingSetup
from allocopt.spec import StudySpec
from allocopt.vocabulary import TargetDef, Vocabulary, metric_key

ROOT = Path(__file__).resolve().parents[1]
ORM = ROOT / "tests" / "data" / "configs" / "Qwen2.5-7B-ORM" / "config.json"

STUDY = """
name = "own"
objective = "command"
budget_flops = 1e19
target = ["aime24", "cost_usd"]
trials = 4
sampler = "random"
pilots = 0

[targets]
aime24 = {{ direction = "maximize", range = [0, 1] }}
cost_usd = {{ direction = "minimize" }}

[rewards]
rule = {{ kind = "rule" }}
orm8b = {{ kind = "model", model = "{orm}" }}

[space]
rho = [0.3, 0.8]
rewards = ["rule", "orm8b"]
group_sizes = [4]

[objective_settings]
command = "sh job.sh {{trial_dir}}"
log = "metrics"
model = "Qwen/Qwen2.5-7B"
"""

# A stand-in for a user's training job (no training: it writes what a real job would
# report): aime24 rises with rho, cost_usd rises with rho, the compute splits by rho.
JOB = r"""#!/bin/sh
python3 - "$1" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1]); a = json.loads((d / "ask.json").read_text())
rho, b = a["rho"], a["budget_flops"]
json.dump({"targets": {"aime24": round(0.3 + 0.2 * rho, 4), "cost_usd": round(100 + 50 * rho, 2)},
           "search_flops": b * (1 - rho) * 0.9, "learning_flops": b * rho * 0.9, "reward_flops": b * 0.05},
          open(d / "metrics.json", "w"))
PY
"""


def _study(tmp_path: Path, text: str = STUDY) -> Path:
    p = tmp_path / "own.toml"
    p.write_text(text.format(orm=ORM))
    (tmp_path / "job.sh").write_text(JOB)
    return p


# ------------------------------------------------------------------------- unit
def test_keys_are_mlflows_and_invert():
    v = Vocabulary.declare({"eval/aime 24": {}, "acc@k:hard": {"direction": "minimize"}})
    assert metric_key("pass@1:gsm8k") == "pass_at_1_gsm8k"
    assert v.key("eval/aime 24") == "eval/aime_24" and v.key("acc@k:hard") == "acc_at_k_hard"
    assert v.label("acc_at_k_hard") == "acc@k:hard" and v.label("pass_at_1") == "pass@1"
    from allocopt.tracking.layout import mlflow_key

    for t in v.targets:  # the tracker stores every target under the same key
        assert mlflow_key(t.name) == t.key


@pytest.mark.parametrize("targets, rewards, needle", [
    ({"pass_at_1": {}}, None, "the key of target 'pass@1' too"),
    ({"a b": {}, "a_b": {}}, None, "the key of target 'a b' too"),
    ({"x": {"direction": "up"}}, None, "targets.x.direction='up': allowed: maximize, minimize"),
    ({"x": {"range": [1, 0]}}, None, "targets.x.range=[1, 0]"),
    ({"x": {"colour": 1}}, None, "targets.x: unknown key 'colour'"),
    ({"/x": {}}, None, "a '/' must sit between two names"),
    (None, {"orm": {"kind": "model"}}, "rewards.orm: a model-based reward system needs its price"),
    (None, {"orm": {"kind": "rule", "model": "x"}}, "a rule-based system costs no FLOPs"),
    (None, {"orm": {"kind": "magic"}}, "rewards.orm.kind='magic': allowed: rule, model"),
    (None, {"orm": {"kind": "model", "model": "m", "scoring": "vibes"}}, "scoring='vibes': allowed: forward, steps, outcome"),
    (None, {"orm": "rule"}, "rewards.orm='rule': must be a table"),
])
def test_bad_declarations_are_one_line(targets, rewards, needle):
    with pytest.raises(ConfigError, match=None) as e:
        Vocabulary.declare(targets, rewards)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_range_and_a_direction():
    t = TargetDef("cost_usd", "minimize", (0, 1e6))
    assert t.sign == -1.0 and t.check_value(12) == 12.0
    with pytest.raises(ConfigError, match=r"cost_usd=-1: must be in \[0, 1e\+06\]"):
        t.check_value(-1)
    with pytest.raises(ConfigError, match="pass@1=52: must be a share in"):
        Vocabulary().target("pass@1").check_value(52)


def test_spec_round_trips_its_vocabulary_through_storage(tmp_path):
    s = StudySpec.from_toml(_study(tmp_path))
    assert s.target_keys == ("aime24", "cost_usd") and s.directions == ("maximize", "minimize")
    stored = json.loads(json.dumps(s.to_dict()))  # what Optuna's user attribute keeps
    assert StudySpec(**stored) == s
    assert StudySpec(**stored).vocabulary.reward("orm8b").model == str(ORM)


def test_spec_refuses_undeclared_names(tmp_path):
    with pytest.raises(ConfigError, match="target='aime25': unknown target; allowed: .*aime24.*declare it"):
        StudySpec.from_toml(_study(tmp_path, STUDY.replace('target = ["aime24", "cost_usd"]', 'target = "aime25"')))
    with pytest.raises(ConfigError, match="reward='orm9b': unknown reward system.*orm8b"):
        StudySpec.from_toml(_study(tmp_path, STUDY.replace('rewards = ["rule", "orm8b"]', 'rewards = ["orm9b"]')))


# ---------------------------------------------------------------------- pricing
def _workload() -> Workload:
    return Workload(ModelShape.preset("Qwen/Qwen2.5-7B"), TrainingSetup(completion_tokens=400,
                                                                        steps_per_completion=6))


def _reward_flops(workload: Workload, reward: str) -> int:
    return make_plan(1e19, Allocation(0.5, 4, reward), workload).per_iteration.executed.reward_flops


def test_a_declared_prm_prices_as_the_built_in_one():
    """A model-based system declared with the PRM's preset and step scoring costs what the
    built-in ``prm`` costs (itself checked against FlopCounterMode in the FLOP tests)."""
    w = _workload()
    v = Vocabulary.declare(None, {"myprm": {"kind": "model", "model": "Qwen/Qwen2.5-Math-PRM-7B",
                                            "scoring": "steps"}})
    assert _reward_flops(v.price(w), "myprm") == _reward_flops(w, "prm") > 0


def test_forward_scoring_reads_no_step_markers():
    """``forward`` prices the forward alone: the same model scored with ``steps`` at zero steps
    per completion costs the same; at six steps it costs more."""
    w = _workload()
    fwd = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM)}})
    steps = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM), "scoring": "steps"}})
    no_steps = replace(w, setup=replace(w.setup, steps_per_completion=0))
    assert _reward_flops(fwd.price(w), "orm") == _reward_flops(steps.price(no_steps), "orm")
    assert _reward_flops(steps.price(w), "orm") > _reward_flops(fwd.price(w), "orm")


def test_an_outcome_head_reads_one_position():
    """Hand count: the ORM's score head is ``Linear(d, 1)``, 2·d FLOPs per position it runs at;
    ``outcome`` runs it at the last position only, so per completion it costs 2·d·(n - 1)
    less than ``forward`` (n: prompt + completion tokens), everything else equal."""
    w = _workload()
    fwd = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM)}}).price(w)
    out = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM), "scoring": "outcome"}}).price(w)
    plan = make_plan(1e19, Allocation(0.5, 4, "orm"), fwd)
    n = round(w.setup.prompt_tokens) + 400
    d = json.loads(ORM.read_text())["hidden_size"]
    rows = plan.rollouts_per_iteration
    assert _reward_flops(fwd, "orm") - _reward_flops(out, "orm") == rows * 2 * d * (n - 1)


def test_config_json_and_shape_table_price_alike():
    cfg = json.loads(ORM.read_text())
    shape = {"hidden_size": cfg["hidden_size"], "num_layers": cfg["num_hidden_layers"],
             "num_heads": cfg["num_attention_heads"], "num_kv_heads": cfg["num_key_value_heads"],
             "head_dim": cfg["hidden_size"] // cfg["num_attention_heads"],
             "intermediate_size": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
             "tie_word_embeddings": False, "head": "score", "num_labels": 1}
    w = _workload()
    a = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM)}}).price(w)
    b = Vocabulary.declare(None, {"orm": {"kind": "model", "shape": shape}}).price(w)
    assert _reward_flops(a, "orm") == _reward_flops(b, "orm") > 0


def test_the_orm_costs_two_flops_per_parameter_and_token_to_within_attention():
    """Hand count: a forward reads each of the 7B's non-embedding weights once per token (2
    FLOPs each), plus attention; the score head is 1 label wide. The priced reward FLOPs of one
    iteration lie between 2·N·tokens and that plus the attention's share at these lengths."""
    cfg = json.loads(ORM.read_text())
    d, L, f = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * d // cfg["num_attention_heads"]
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f  # q, o; k, v; gate, up, down
    n_weights = L * per_layer + d * 1
    w = _workload()
    priced = Vocabulary.declare(None, {"orm": {"kind": "model", "model": str(ORM)}}).price(w)
    plan = make_plan(1e19, Allocation(0.5, 4, "orm"), priced)
    rows = plan.rollouts_per_iteration
    tokens = rows * (round(w.setup.prompt_tokens) + 400)
    got = plan.per_iteration.executed.reward_flops
    assert 2 * n_weights * tokens <= got <= 2 * n_weights * tokens * 1.15


def test_a_workload_without_the_price_refuses_the_plan():
    with pytest.raises(ConfigError, match="reward='orm8b': no price"):
        make_plan(1e19, Allocation(0.5, 4, "orm8b"), _workload())


# -------------------------------------------------------------------- end to end
@pytest.mark.slow  # a study through the command objective, MLflow on: ~20 s
def test_a_command_study_with_declared_names_end_to_end(cli, tmp_path):
    spec = _study(tmp_path)
    url, ml = f"sqlite:///{tmp_path}/own.db", f"sqlite:///{tmp_path}/mlflow.db"
    dry = cli("study", "--spec", spec, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "orm8b" in dry.stdout and "rule" in dry.stdout
    r = cli("study", "--spec", spec, "--storage", url, "--mlflow-uri", ml, "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import optuna

    st = optuna.load_study(study_name="own", storage=url)
    assert [d.name for d in st.directions] == ["MAXIMIZE", "MINIMIZE"]
    from allocopt.record import TrialRecord

    done = [t for t in st.trials if TrialRecord.of(t).state == "COMPLETE"]  # not the infeasible ones
    assert done and all(set(TrialRecord.of(t).targets) >= {"aime24", "cost_usd"} for t in done)
    cheapest = min(done, key=lambda t: t.values[1])
    b = cli("best", "--study", "own", "--storage", url, "--target", "cost_usd", "--json", cwd=tmp_path)
    assert b.returncode == 0, b.stderr
    out = json.loads(b.stdout)
    assert out["direction"] == "minimize" and out["best"]["number"] == cheapest.number
    p = cli("pareto", "--study", "own", "--storage", url, "--target", "aime24", "--target", "cost_usd",
            "--json", cwd=tmp_path)
    front = json.loads(p.stdout)
    assert front["directions"] == ["maximize", "minimize"]
    # the stand-in job makes both rise with rho: every trial is on the front
    assert len(front["front"]) == len(done)
    rep = cli("report", "--study", "own", "--storage", url, "--out", tmp_path / "rep", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "aime24" in html and "cost_usd" in html
    from mlflow import MlflowClient

    c = MlflowClient(ml)
    exp = c.get_experiment_by_name("allocopt/own")
    runs = [x for x in c.search_runs([exp.experiment_id]) if "aime24" in x.data.metrics]
    assert len(runs) == len(done)
    assert all(math.isfinite(x.data.metrics["cost_usd"]) for x in runs)
    m = cli("best", "--from-mlflow", "own", "--mlflow-uri", ml, "--target", "cost_usd", "--json", cwd=tmp_path)
    assert json.loads(m.stdout)["direction"] == "minimize"
    parent = next(x for x in c.search_runs([exp.experiment_id]) if "best_cost_usd" in x.data.metrics)
    assert parent.data.metrics["best_cost_usd"] == pytest.approx(min(t.values[1] for t in done))
    assert parent.data.metrics["best_aime24"] == pytest.approx(max(t.values[0] for t in done))
    same = cli("pareto", "--study", "own", "--storage", url, "--objectives", "aime24,total_flops", "--directions",
               "maximize,maximize", cwd=tmp_path)  # two objectives may share a direction
    assert same.returncode == 0, same.stderr


@pytest.mark.slow  # a 2-trial study whose command always fails: ~10 s
def test_a_two_target_study_where_nothing_completes_says_so(cli, tmp_path):
    spec = _study(tmp_path, STUDY.replace("trials = 4", "trials = 2").replace('rewards = ["rule", "orm8b"]', 'rewards = ["rule"]'))
    (tmp_path / "job.sh").write_text("exit 3\n")
    r = cli("study", "--spec", spec, "--storage", f"sqlite:///{tmp_path}/f.db", "--no-mlflow", "--no-report", cwd=tmp_path)
    assert r.returncode == 1
    assert "error: no trial of study 'own' finished: " in r.stderr and "unknown; targets measured" not in r.stderr


def test_ask_tell_with_declared_names(cli, tmp_path):
    spec = _study(tmp_path, STUDY.replace('rewards = ["rule", "orm8b"]', 'rewards = ["rule"]'))
    url = f"sqlite:///{tmp_path}/own.db"
    a = cli("ask", "--spec", spec, "--study", "own", "--storage", url, "--format", "trl", "--out",
            tmp_path / "asked", cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    folder = tmp_path / "asked" / "trial-0"
    import subprocess

    subprocess.run(["sh", str(tmp_path / "job.sh"), str(folder)], check=True, cwd=tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"targets": {"aime24": 0.5, "cost_usd": 3, "loss": 0.1},
                               "search_flops": 1e18, "learning_flops": 1e18, "reward_flops": 0}))
    r = cli("tell", "--study", "own", "--storage", url, "--trial", "0", "--metrics", bad, "--no-mlflow")
    assert r.returncode == 2 and "target 'loss' is not declared by the study" in r.stderr
    assert r.stderr.count("\n") == 1
    r = cli("tell", "--study", "own", "--storage", url, "--trial", "0", "--metrics", folder / "metrics.json",
            "--no-mlflow")
    assert r.returncode == 0, r.stderr
    assert "aime24=" in r.stdout and "cost_usd=" in r.stdout
    import optuna

    t = optuna.load_study(study_name="own", storage=url).trials[0]
    rho = json.loads((folder / "ask.json").read_text())["rho"]
    assert t.values == pytest.approx([0.3 + 0.2 * rho, 100 + 50 * rho], abs=0.01)


@pytest.mark.slow  # a 6-run kg study through the command objective: ~10 s
def test_a_minimized_target_is_answered_in_its_own_units(cli, tmp_path):
    """One minimized target and the kg tuner (which maximizes the negated values): the stored
    answer's mean and interval are back in cost units, inside the observed costs, and the
    evidence is the cheapest run."""
    text = (STUDY.replace('target = ["aime24", "cost_usd"]', 'target = "cost_usd"\ntuner = "kg"')
            .replace('sampler = "random"\n', "").replace("trials = 4", "trials = 5")
            .replace('rewards = ["rule", "orm8b"]', 'rewards = ["rule"]'))
    spec = _study(tmp_path, text)
    url = f"sqlite:///{tmp_path}/m.db"
    r = cli("study", "--spec", spec, "--storage", url, "--no-mlflow", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import optuna

    st = optuna.load_study(study_name="own", storage=url)
    costs = [t.values[0] for t in st.trials if t.values]
    rec = st.user_attrs["recommendation"]
    assert min(costs) - 5 <= rec["mean"] <= max(costs) + 5
    assert rec["lower"] <= rec["mean"] <= rec["upper"]
    assert f"cost_usd = {min(costs):.3f}" in r.stdout.split("evidence:")[1].splitlines()[0]


def test_a_missing_config_file_is_named_as_missing():
    v = Vocabulary.declare(None, {"orm": {"kind": "model", "model": "configs/none/config.json"}})
    with pytest.raises(ConfigError, match=r"rewards.orm.model='configs/none/config.json': no such file or folder"):
        v.price(_workload())
    with pytest.raises(ConfigError, match=r"targets.x: unknown key 'directon' \(did you mean 'direction'\?\); allowed: direction, range$"):
        Vocabulary.declare({"x": {"directon": "up"}})


def test_an_objective_that_cannot_score_a_declared_reward_refuses_it_before_any_trial(cli, tmp_path):
    """The synthetic objective scores the built-in reward systems only: a study of it with a
    declared `rule` system is refused in one line, exit 2, nothing run."""
    text = (STUDY.replace('objective = "command"', 'objective = "synthetic"')
            .replace('target = ["aime24", "cost_usd"]', 'target = "pass@1"')
            .replace('rewards = ["rule", "orm8b"]', 'rewards = ["rule", "sparse"]')
            .split("[objective_settings]")[0])
    spec = _study(tmp_path, text)
    url = f"sqlite:///{tmp_path}/r.db"
    r = cli("study", "--spec", spec, "--storage", url, "--no-mlflow", "--no-report", cwd=tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "reward='rule': the synthetic objective scores sparse, structured, dense, proxy_prm, prm only" in r.stderr
    import optuna

    assert optuna.study.get_all_study_summaries(url) == [] or all(
        s.n_trials == 0 for s in optuna.study.get_all_study_summaries(url))


def test_tables_show_a_declared_name_where_its_key_differs(cli, tmp_path):
    """A declared target whose name MLflow would reject (``aime@24``, stored as ``aime_at_24``)
    is shown under its own name in `best`'s and `pareto`'s tables, never as its key."""
    text = STUDY.replace('"aime24"', '"aime@24"').replace("aime24 = {{", '"aime@24" = {{')
    spec = _study(tmp_path, text.replace("trials = 4", "trials = 3"))
    (tmp_path / "job.sh").write_text(JOB.replace('"aime24"', '"aime@24"'))
    url = f"sqlite:///{tmp_path}/own.db"
    r = cli("study", "--spec", spec, "--storage", url, "--no-mlflow", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for cmd in (["best", "--target", "aime@24"], ["best", "--target", "cost_usd"],
                ["pareto", "--target", "aime@24", "--target", "cost_usd"]):
        out = cli(*cmd, "--study", "own", "--storage", url, cwd=tmp_path, env={"COLUMNS": "200"})
        assert out.returncode == 0, out.stderr
        assert "aime@24" in out.stdout and "aime_at_24" not in out.stdout, (cmd, out.stdout)


def test_an_unknown_study_file_key_lists_the_keys_a_file_may_hold(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "x"\nbudget_flops = 1e19\ntrails = 3\n')
    with pytest.raises(ConfigError) as e:
        StudySpec.from_toml(p)
    allowed = str(e.value).split("allowed: ")[1].split(", ")
    assert "unknown key 'trails' (did you mean 'trials'?); allowed: " in str(e.value)
    assert {"targets", "rewards", "trials"} <= set(allowed) and "vocabulary" not in allowed
    p.write_text('name = "x"\nbudget_flops = 1e19\ncolour = 3\n')  # nothing near: no guess
    with pytest.raises(ConfigError, match=r"spec s.toml: unknown key 'colour'; allowed: "):
        StudySpec.from_toml(p)


def test_a_target_the_objective_does_not_report_is_refused_before_anything_is_recorded(cli, tmp_path):
    """The synthetic objective reports no ``pass@1:gsm8k``: the run refuses it in one line naming
    what it reports as a user types them (``pass@1``, not ``pass_at_1``), exit 2, and creates no
    storage (it once left an empty study behind); the dry run prices the plans and says so in a
    note (an ask/tell study's own runs may report it)."""
    want = "target='pass@1:gsm8k': the synthetic objective reports native_reward, pass@1, judge"
    args = ["study", "--objective", "synthetic", "--target", "pass@1", "--target", "pass@1:gsm8k", "--budget", "1e19"]
    r = cli(*args, "--trials", "1", "--no-mlflow", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --target: {want}", r.stderr
    assert not list(tmp_path.iterdir())
    r = cli(*args, "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and "Plans for 1.000e+19 FLOPs" in r.stdout, r.stderr
    assert " ".join(r.stderr.split()) == (f"note: {want}; `allocopt study` refuses it, `allocopt ask`/`tell` "
                                          "record it from your own runs")
    assert not list(tmp_path.iterdir())


def test_a_recipe_and_a_throughput_table_name_the_nearest_key_too(tmp_path):
    """The recipe and throughput tables share the study file's unknown-key line: a typo gets
    the allowed key nearest in spelling, a key near nothing gets none."""
    from allocopt.plan.recipe import read_recipe
    from allocopt.plan.throughput import ThroughputProfile

    p = tmp_path / "r.toml"
    p.write_text("[recipe]\ngroup_sise = 4\n")
    with pytest.raises(ConfigError, match=r"^recipe: unknown key 'group_sise' \(did you mean 'group_size'\?\); allowed: "):
        read_recipe(p)
    with pytest.raises(ConfigError, match=r"^throughput: unknown key 'setup_fingerprnt' \(did you mean 'setup_fingerprint'\?\); "):
        ThroughputProfile.from_mapping({"gpu": "H100", "setup_fingerprnt": "x"})
    with pytest.raises(ConfigError, match=r"^throughput: unknown key 'colour'; allowed: "):
        ThroughputProfile.from_mapping({"colour": 1})


def test_a_bad_value_in_a_study_files_table_names_the_file(tmp_path):
    """A wrong key or value inside ``[space]`` is refused with the file's name, as a wrong
    top-level key is: a user with several study files sees which one to mend."""
    from allocopt.errors import ConfigError
    from allocopt.spec import StudySpec

    for body, line in (('[space]\nrho = [0.2, 1.9]\n', r"^space\.rho=\[0\.2, 1\.9\]: must be .* \(in spec bad\.toml\)$"),
                       ('[space]\ngroup_size = [2, 4]\n', r"^space: unknown key 'group_size' \(did you mean 'group_sizes'\?\).*\(in spec bad\.toml\)$")):
        p = tmp_path / "bad.toml"
        p.write_text('budget_flops = 1e19\n' + body)
        with pytest.raises(ConfigError, match=line):
            StudySpec.from_toml(p)
