"""The allocopt command: tables, JSON, one-line errors with exit code 2 (in this process, through
the ``cli`` fixture; the import check and ``--help`` run in a fresh Python process)."""

import json
import os
import subprocess
import sys

import pytest

from allocopt.plan.allocation import Allocation, Workload, make_plan
from allocopt.flops import ModelShape
from allocopt.plan.recipe import price
from allocopt.plan.setup import TrainingSetup


@pytest.fixture
def run(cli):
    """The command in this process (conftest's ``cli``)."""
    return cli


def test_import_and_help_load_no_torch():
    code = ("import sys, allocopt, allocopt.flops, allocopt.plan.allocation, allocopt.plan.allocation, allocopt.cli, allocopt.plan.meter;"
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'optuna', 'mlflow', 'botorch')"
            " if m in sys.modules]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr
    h = subprocess.run([sys.executable, "-m", "allocopt.cli", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert h.returncode == 0 and "account" in h.stdout and "plan" in h.stdout


def test_account_json_matches_library(run):
    r = run("account", "--model", "Qwen/Qwen2.5-3B-Instruct", "--lora-rank", "32", "--prompts", "64",
            "-G", "5", "--prompt-tokens", "103", "--completion-tokens", "304", "--beta", "0.04", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    acct = price(model="Qwen/Qwen2.5-3B", lora_rank=32, prompts=64, group_size=5, beta=0.04)
    assert data["total_flops"] == acct.executed.total_flops
    assert data["search_flops"] + data["learning_flops"] + data["reward_flops"] == data["total_flops"]
    assert data["learning_ref_logprobs_flops"] > 0  # beta > 0 runs the reference pass
    assert data["reward_flops"] == 0


def test_plan_json_matches_library(run):
    r = run("plan", "--budget", "1e19", "--model", "Qwen/Qwen2.5-1.5B", "--reward", "prm",
            "--group-size", "8", "--rho", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    # plan's defaults are the set-up's (runner allocopt: no checkpointing, no IS correction),
    # written out here by hand
    p = make_plan(1e19, Allocation(0.5, 8, "prm"),
                  Workload(ModelShape.preset("Qwen/Qwen2.5-1.5B"), TrainingSetup(
                      lora_rank=32, lora_targets="all-linear", gradient_checkpointing=False,
                      importance_sampling_correction=False, engine="trl-vllm",
                      rollouts_per_iteration=64, prompt_tokens=103, completion_tokens=304,
                      max_completion_length=1024)))
    assert data["iterations"] == p.iterations and data["setup_fingerprint"] == p.setup_fingerprint

    assert data["expected_total_flops"] <= 1e19
    assert abs(data["realized_rho"] - 0.5) <= 0.01


def test_the_plan_says_why_its_useful_prefill_exceeds_the_executed(run):
    """The plan's JSON has the prefill useful above executed (G completions share a prompt's
    prefill); the table says why under it, and only where that holds: not in the account of
    PPO's one completion per prompt (G 1 with a critic), where the two are equal."""
    plan = json.loads(run("plan", "--budget", "1e19", "--rho", "0.5", "--json").stdout)
    assert plan["expected_useful_search_prefill_flops"] > plan["expected_search_prefill_flops"]
    text = run("plan", "--budget", "1e19", "--rho", "0.5", env={"COLUMNS": "100"}).stdout
    assert "useful prefill: a prompt per completion; executed: once for its G" in text
    args = ("account", "--model", "Qwen/Qwen2.5-1.5B", "--group-size", "1", "--critic", "Qwen/Qwen2.5-0.5B")
    one = json.loads(run(*args, "--json").stdout)
    assert one["useful_search_prefill_flops"] == one["search_prefill_flops"] > 0
    table = run(*args, env={"COLUMNS": "100"})
    assert table.returncode == 0 and "prefill" in table.stdout and "useful prefill" not in table.stdout


@pytest.mark.parametrize("args,needle", [
    (["plan", "--budget", "-1", "--rho", "0.5"], "budget_flops"),
    (["plan", "--budget", "0", "--rho", "0.5"], "budget_flops"),
    (["plan", "--budget", "nan", "--rho", "0.5"], "budget_flops"),
    (["plan", "--budget", "lots", "--rho", "0.5"], "budget_flops"),
    (["plan", "--budget", "1e19", "--rho", "1"], "rho"),
    (["plan", "--budget", "1e19", "--rho", "0"], "rho"),
    (["plan", "--budget", "1e19", "--rho", "0.5", "-G", "1"], "group_size"),
    (["plan", "--budget", "1e19", "--rho", "0.5", "--reward", "llm"], "reward"),
    (["plan", "--budget", "1e19", "--rho", "0.5", "--model", "gpt-9"], "model"),
    (["plan", "--budget", "1e10", "--rho", "0.5"], "smallest feasible plan needs"),
    (["plan", "--budget", "1e19", "--rho", "0.5", "-G", "x"], "group-size"),
    (["account", "--prompts", "0"], "prompts"),
    (["account", "--engine", "tpu"], "engine"),
    (["trial", "--budget", "1e9", "--rho", "0.5", "--objective", "nope"], "objective"),
    (["trial", "--budget", "1e19", "--rho", "0.5", "--objective", "qwen"], "needs a CUDA GPU"),
    (["trial", "--budget", "3e11", "--rho", "0.5", "--seed", "-1"], "seed"),
    (["plan", "--budget", "1e19", "--rho", "0.5", "--beta", "-1"], "beta"),
    (["account", "-G", "1"], "group_size"),
    (["study", "--objective", "synthetic", "--budget", "1e18", "--target", "judge", "--pilots", "0",
      "--mlflow-uri", "foo://bar", "--storage", "sqlite:////tmp/allocopt-test-cli-mlflow-uri.db"], "mlflow_uri"),
])
def test_bad_input_one_line_exit_2(args, needle, run):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_config_json_missing_field(tmp_path, run):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    r = run("account", "--model", str(tmp_path))
    assert r.returncode == 2 and "num_attention_heads" in r.stderr


def test_recipe_toml(tmp_path, run):
    f = tmp_path / "r.toml"
    f.write_text('[recipe]\nmodel = "Qwen/Qwen2.5-0.5B"\nprompts = 8\ngroup_size = 4\n')
    r = run("account", "--recipe", str(f), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_flops"] == price(model="Qwen/Qwen2.5-0.5B", prompts=8,
                                                         group_size=4).executed.total_flops
    f.write_text("prompts = [")
    bad = run("account", "--recipe", str(f))
    assert bad.returncode == 2 and "malformed TOML" in bad.stderr


@pytest.mark.slow  # a whole RACE study with 12 pilots: ~19-24 s on 2 loaded cores
def test_study_with_race_pilots_passes_set_to_the_objective(tmp_path, run):
    """``--set`` reaches the objective of a RACE study (pilots on): with the synthetic
    objective's ``variant=flat`` and ``noise=0`` every recorded pilot value is that variant's
    noiseless response at the pilot's allocation and budget (and differs from ``paper``'s)."""
    import optuna

    from objectives.synthetic import observe

    db = f"sqlite:///{tmp_path}/s.db"
    spec = tmp_path / "small.toml"
    spec.write_text('objective = "synthetic"\nbudget_flops = 1e19\ntarget = "pass@1"\ntuner = "race"\n'
                    '[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4, 8]\nrewards = ["sparse", "prm"]\n')
    r = run("study", "--spec", str(spec), "--trials", "1", "--pilots", "12", "--study-name", "set",
            "--storage", db, "--no-mlflow", "--set", "variant=flat", "--set", "noise=0")
    assert r.returncode == 0, r.stderr[-2000:]
    st = optuna.load_study(study_name="set", storage=db)
    pilots = [t for t in st.trials if t.user_attrs.get("fidelity") == "pilot" and t.state.name == "COMPLETE"]
    assert len(pilots) >= 6
    for t in pilots:
        p, b = t.params, t.user_attrs["budget_flops"]
        flat = observe(p["rho"], p["group_size"], p["reward"], b, variant="flat", noise=0)["pass_at_1"]
        paper = observe(p["rho"], p["group_size"], p["reward"], b, variant="paper", noise=0)["pass_at_1"]
        assert t.value == pytest.approx(flat, abs=1e-12) and abs(flat - paper) > 1e-6


@pytest.mark.parametrize("columns", ["80", "120"])
def test_every_help_shows_each_option_whole_and_no_type_for_a_flag(cli, columns):
    """``--help`` of every command, at 80 and 120 columns: each visible option's long name is
    shown whole (typer's table once cut ``--importance-sampling-correction`` to
    ``--importance-sampling-cor…`` at 80), and a flag shows no ``<bool>`` type (it takes no value)."""
    import re

    import typer.main

    from allocopt.cli import app

    for name, cmd in typer.main.get_command(app).commands.items():
        r = cli(name, "--help", env={"COLUMNS": columns})
        assert r.returncode == 0, (name, r.stderr)
        # the name column; a flag's other names follow its first, after a comma
        shown = {o for names in re.findall(r"^│\s{1,5}(?:\*\s+)?(--[\w-]+…?(?:,--[\w-]+…?)*)", r.stdout, re.M)
                 for o in names.split(",")}
        wanted = {o for p in cmd.params if not getattr(p, "hidden", False) for o in p.opts
                  if o.startswith("--")} | {"--help"}
        assert shown == wanted, (name, columns, sorted(shown ^ wanted))
        assert "<bool>" not in r.stdout, (name, columns)


def test_version_prints_the_installed_version_and_the_root_help_lists_it(cli):
    from importlib.metadata import version

    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"allocopt {version('allocopt')}", r.stdout
    h = cli("--help", env={"COLUMNS": "80"})
    assert "--version" in h.stdout and "<bool>" not in h.stdout


def test_the_root_help_names_a_first_command_that_runs(cli, tmp_path):
    """``allocopt --help`` says what to run first; that line, as printed, is a command that works
    here (its plans, without running the minute of trials)."""
    import re
    import shlex

    from allocopt.cli import app

    said = " ".join(app.info.epilog.split())
    first = re.search(r"(allocopt study --objective synthetic [^.]*?)\. ", said).group(1)
    assert first in " ".join(cli("--help", env={"COLUMNS": "200"}).stdout.split())
    r = cli(*shlex.split(first)[1:], "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and "rho" in r.stdout, r.stderr


def test_short_model_names_keep_the_part_that_tells_them_apart():
    from allocopt.cli.model_labels import legend, short_names

    qwen = ["Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct"]
    assert short_names(qwen) == dict(zip(qwen, ["1.5B", "3B", "7B"]))
    assert legend(short_names(qwen)).startswith("model: 1.5B = Qwen/Qwen2.5-1.5B-Instruct, 3B = ")
    sizes = ["tiny", "small", "medium"]  # nothing shared: the names as they are, no legend
    assert short_names(sizes) == dict(zip(sizes, sizes)) and legend(short_names(sizes)) == ""
    assert short_names(["Qwen/Qwen2.5-3B"]) == {"Qwen/Qwen2.5-3B": "Qwen2.5-3B"}
    # different families: only the shared owner goes; names stay apart
    assert short_names(["org/a-7B", "org/b-7B"]) == {"org/a-7B": "a", "org/b-7B": "b"}
    assert short_names(["m-1", "m-1", "m-2"]) == {"m-1": "1", "m-2": "2"}


def test_a_model_size_dry_run_fits_80_columns_with_the_full_names_beside(cli):
    # rich cut each hub name to `Qwen/Qwen…` at 80 columns, so the table's model column
    # told nothing; now the table shows the distinguishing part and the line below the names
    r = cli("study", "--spec", "studies/paper-model-size.toml", "--dry-run", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    table = lines[:lines.index(next(x for x in lines if x.strip().startswith("got:")))]
    assert max(map(len, table)) <= 80 and "…" not in r.stdout
    firsts = [x.split()[0] for x in table if x.split() and x.split()[1:2] == ["sparse"]]
    assert [firsts.count(m) for m in ("1.5B", "3B", "7B")] == [8, 8, 8]
    assert "models: 1.5B = Qwen/Qwen2.5-1.5B-Instruct 1,543,714,304 parameters; 3B = " \
        "Qwen/Qwen2.5-3B-Instruct" in r.stdout


def test_a_model_size_studys_top_trials_fit_80_columns(cli, tmp_path):
    # the boxed table cut the model to `Qwen2…` and the total to `1.000e…` at 80 columns
    spec = tmp_path / "ms.toml"
    spec.write_text('name = "ms"\nobjective = "synthetic"\nbudget_flops = 1e19\ntarget = "pass@1"\n'
                    'trials = 3\ntuner = "bo"\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4]\n'
                    'rewards = ["sparse"]\nmodels = ["Qwen/Qwen2.5-1.5B-Instruct", '
                    '"Qwen/Qwen2.5-7B-Instruct"]\n[objective_settings]\nvariant = "model-size"\n')
    r = cli("study", "--spec", spec, "--storage", f"sqlite:///{tmp_path}/ms.db", "--no-mlflow",
            env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["trial", "rho"])
    rows = [x.split() for x in lines[head + 2:head + 5]]
    assert max(len(x) for x in lines[head - 1:head + 5]) <= 80 and "…" not in r.stdout
    assert len(rows) == 3 and {x[5] for x in rows} <= {"1.5B", "7B"}  # after rho asked, got, G, reward
    assert all(len(x[1].split(".")[1]) == 2 and len(x[2].split(".")[1]) == 3 for x in rows)
    assert {x[-1] for x in rows} == {"1.000e+19"}
    assert "model: 1.5B = Qwen/Qwen2.5-1.5B-Instruct, 7B = Qwen/Qwen2.5-7B-Instruct" \
        in " ".join(r.stdout.split())


def test_best_per_reward_with_a_model_column_fits_80_columns():
    # with a model column the per-reward table was 84 wide, so a terminal cut reward names;
    # trials of one budget now say their total once, in the caption
    from rich.console import Console

    from allocopt.cli.query import _rows_table
    from allocopt.record import TrialRow

    flops = {"search_flops": 2.4e18, "learning_flops": 5.1e18, "reward_flops": 2.5e18, "total_flops": 1e19}
    targets = {"pass@1": 0.6276, "native_reward": 0.5389, "judge": 0.6417}
    models = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
    rows = [TrialRow(n, "COMPLETE", {"rho": 0.506, "group_size": 4, "reward": w, "model": m}, targets, dict(flops))
            for n, w, m in ((1, "proxy_prm", models[0]), (2, "structured", models[1]))]
    con = Console(width=80, record=True)
    con.print(_rows_table(rows, "Best observed trial per reward system for pass@1", ["pass@1"], rows))
    lines = con.export_text().splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["trial", "rho"])
    cells = [x.split() for x in lines[head + 2:head + 4]]
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines)
    assert [x[3:5] for x in cells] == [["proxy_prm", "1.5B"], ["structured", "7B"]]
    assert lines[head].split()[-1] == "rwd" and "each executed 1.000e+19 FLOPs" in " ".join(" ".join(lines).split())
    con = Console(width=80, record=True)  # a front of one model's trial, of a study that searched two
    con.print(_rows_table(rows[:1], "front", ["pass@1"], rows))
    text = con.export_text()
    assert text.splitlines()[1].split()[4] == "model" and "1.5B = Qwen/Qwen2.5-1.5B-Instruct" in " ".join(text.split())
    assert max(map(len, text.splitlines())) <= 80 and "it executed 1.000e+19 FLOPs" in " ".join(text.split())
    rows[1].metrics["total_flops"] = 9.9e18  # totals that differ keep their column
    con = Console(width=200, record=True)
    con.print(_rows_table(rows, "t", ["pass@1"], rows))
    text = " ".join(con.export_text().split())
    assert "9.900e+18" in text and "1.000e+19" in text and "FLOPs: the total executed" in text


def test_an_imported_logs_sources_fit_80_columns_with_field_names_whole_where_they_fit(cli):
    # the field column was folded at 31 characters (`actor_rollout_ref.actor.ppo_epo` / `chs`)
    # while the value column had room; now it takes what the value's longest word leaves
    from allocopt.runlogs import import_verl

    log = "tests/data/runlogs/verl_r1_qwen25_3b_lora.log"
    r = cli("account", "--from-verl", log, "--peak-tflops", "989", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if "Where each number came from" in x)
    table = lines[start:next(i for i in range(start, len(lines)) if lines[i].startswith("└")) + 1]
    assert max(map(len, table)) <= 80
    run = import_verl(log)
    hows = [x.rstrip(" │").rsplit("│", 1)[-1].strip() for x in table if x.startswith("│ ")]
    assert hows.count("read") == len(run.fields_read) and hows.count("assumed") == len(run.fields_assumed)
    # 80 - 17 (borders, `assumed`) - 26 ('Qwen/Qwen2.5-3B-Instruct' quoted) = 37 for a name
    whole = [k for k in run.fields_read if len(k) <= 37]
    assert len(whole) >= 12 and all(f"│ {k} " in r.stdout for k in whole)
    # a longer name breaks after a dot, so its last part stands whole on its own line
    long = [k for k in run.fields_read if len(k) > 37]
    assert len(long) >= 5 and all(f"│ {k.rsplit('.', 1)[1]} " in r.stdout for k in long), r.stdout


def test_an_error_names_the_flag_the_user_typed():
    from allocopt.cli.common import with_flag

    msg = "budget_flops='-5': must be a positive finite number of FLOPs, e.g. 1e19"
    assert with_flag(msg, ["plan", "--budget", "-5"]) == "--budget: " + msg
    assert with_flag(msg, ["plan", "--budget=-5"]) == "--budget: " + msg
    assert with_flag(msg, ["study", "--spec", "s.toml"]) == msg  # the file says budget_flops
    assert with_flag(msg, ["study", "--budget-gpu-hours", "3"]) == msg  # another flag
    assert with_flag("trials=0: must be an integer >= 1", ["study", "--trials", "0"]) == \
        "--trials: trials=0: must be an integer >= 1"
    assert with_flag("pilot_fraction=2.0: must be in (0, 1)", ["study", "--pilot-fraction", "2"]) == \
        "--pilot-fraction: pilot_fraction=2.0: must be in (0, 1)"
    assert with_flag("trials=0: must be an integer >= 1", ["study", "--spec", "s.toml"]) == "trials=0: must be an integer >= 1"


@pytest.mark.parametrize("command, hint", [("study", True), ("race", True), ("best", False)])
def test_a_study_file_given_without_spec_says_how_to_give_it(command, hint, run):
    """``allocopt study s.toml`` (a first guess) is refused in one line that shows ``--spec
    s.toml`` where the command takes a study file, and no such hint where it takes none."""
    r = run(command, "s.toml")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "unexpected extra argument" in lines[0], r.stderr
    assert ("a study file is given as --spec s.toml" in lines[0]) is hint, lines[0]


def test_a_trials_heading_and_closing_lines_stand_whole_at_80_columns(capsys, monkeypatch):
    """``allocopt trial``'s heading, wall times and evaluation FLOPs each print as one whole
    line at 80 columns (as the narrow table's title the heading wrapped mid-phrase, and the
    two closing parts joined wrapped "evaluation / 1.4e+11 FLOPs")."""
    from types import SimpleNamespace

    from allocopt.cli import trial
    from allocopt.flops.account import ComputeBreakdown, FlopAccount

    from rich.console import Console

    monkeypatch.setattr(trial, "out", Console(width=80, highlight=False))
    spent = ComputeBreakdown(search={"prefill": 4 * 10**10}, learning={"forward": 6 * 10**10})
    p = SimpleNamespace(allocation=SimpleNamespace(rho=0.5, group_size=4, reward="sparse", model=None),
                        budget_flops=1e11, realized_rho=0.6)
    res = SimpleNamespace(targets={"pass_at_1": 0.5}, curves=[1, 2], spent=FlopAccount(spent, spent),
                          wall_seconds={"learning": 11.3, "search+reward": 3.2}, eval_flops=1.439e11)
    trial.print_trial(p, res)
    lines = [ln.rstrip() for ln in capsys.readouterr().out.splitlines()]
    assert lines[0] == "Trial: rho=0.5, G=4, reward=sparse, budget 1.000e+11 FLOPs", lines
    assert "wall time: learning 11.3 s, search+reward 3.2 s" in lines, lines
    assert "evaluation: 1.439e+11 FLOPs (outside the budget)" in lines, lines


def test_a_dry_runs_epochs_never_read_zero_for_a_plan_that_trains(run):
    """The tiny study's dry run: a plan that trains a few iterations passes over a sliver of
    the training set; its ``ep`` cell says ``<0.1``, not ``0.0`` (which reads as no training),
    and every other cell is at least 0.1."""
    r = run("study", "--spec", "studies/tiny.toml", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.split()[:2] == ["reward", "G"])
    cols = lines[head].split()
    rows = [x.split() for x in lines[head + 2:] if x.split() and x.split()[0] in ("sparse", "dense", "prm")]
    eps = [row[cols.index("ep")] for row in rows]
    assert eps and "0.0" not in eps and "<0.1" in eps, eps
    assert all(e == "<0.1" or float(e) >= 0.1 for e in eps)


@pytest.mark.parametrize("args", [
    ["study", "--budget", "1e19", "--target", "pass@1", "--dry-run"],  # rich's console
    ["account", "--model", "Qwen/Qwen2.5-3B-Instruct", "--json"],  # a plain write of JSON
])
def test_closed_output_exits_141_without_a_message(args, tmp_path):
    # the reader is gone before the command writes (what `| head` does once it has its lines):
    # the shell's code for a closed pipe, not rich's 1 (a study in which no trial finished)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "allocopt.cli", *args], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (141, "")


def test_race_without_a_target_races_pass_at_1_as_study_does(cli, tmp_path):
    r = cli("race", "--objective", "synthetic", "--budget", "1e18", "--validations", "0", "--no-mlflow",
            "--storage", f"sqlite:///{tmp_path}/r.db", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["target"] == "pass@1"
