"""The tiny world's policies of three sizes (objectives/tiny/sizes.py) and model size as a
search variable: each size priced from its own shape, the shipped builds intact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.allocation import Allocation, Workload, make_plan
from objectives.tiny import sizes
from objectives.tiny.manifest import SHIPPED_DIR, sha256

SHIPPED = ("small", "medium")


def test_every_size_runs_the_sft_steps_the_shipped_tiny_policy_ran():
    shipped = json.loads((SHIPPED_DIR / "manifest.json").read_text())
    assert shipped["metrics"]["policy"]["steps_run"] == sizes.SFT_STEPS
    for size in sizes.SIZES:
        r = sizes.recipe(size)
        assert (r.policy_size, r.sft_steps, r.sft_stop_accuracy) == (size, sizes.SFT_STEPS, None)
        # the learning rate: the world's own, or a smaller one (a larger model's), never larger
        lr, base = r.sft_lr, shipped["settings"]["sft_lr"]
        assert lr == sizes.SFT_LR[size] and 0 < lr <= base
        # everything else is the default recipe's: same data, same optimizer
        own = ("policy_size", "sft_steps", "sft_stop_accuracy", "sft_lr")
        assert {k: v for k, v in r.to_json().items() if k not in own} \
            == {k: v for k, v in shipped["settings"].items() if k not in own}
    assert sizes.SFT_LR["tiny"] == shipped["settings"]["sft_lr"]  # the shipped tiny policy's own


def test_an_unknown_size_is_one_line():
    with pytest.raises(ValueError, match=r"model='huge': not a tiny policy size; known: tiny, small, medium"):
        sizes.recipe("huge")


@pytest.mark.parametrize("size", SHIPPED)
def test_shipped_sizes_are_intact_and_bigger_policies_start_stronger(size):
    folder = sizes.SHIPPED_SIZES_DIR / size
    m = json.loads((folder / "manifest.json").read_text())
    assert {f: sha256(folder / f) for f in sizes.FILES} == m["checksums"]
    assert sizes.sized_policy(size) == folder
    config = json.loads((folder / "config.json").read_text())
    from objectives.tiny.models import POLICY_SIZES

    assert {k: config[k] for k in POLICY_SIZES[size]} == POLICY_SIZES[size]
    tiny = json.loads((SHIPPED_DIR / "manifest.json").read_text())["metrics"]["policy"]
    mine = m["metrics"]["policy"]
    assert mine["steps_run"] == sizes.SFT_STEPS
    # stronger at the start than the tiny policy, and still short of solving the task
    assert mine["native_greedy_accuracy"] > tiny["native_greedy_accuracy"]
    assert mine["downstream_pass_at_1_greedy"] < 0.95


@pytest.mark.parametrize("size", SHIPPED)
def test_a_changed_file_is_not_taken_for_the_build(size, tmp_path):
    copy = tmp_path / size
    shutil.copytree(sizes.SHIPPED_SIZES_DIR / size, copy)
    assert sizes._manifest_ok(copy, size)
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert not sizes._manifest_ok(copy, size)
    assert not sizes._manifest_ok(sizes.SHIPPED_SIZES_DIR / size, "tiny" if size != "tiny" else "small")


def _shape(size: str) -> ModelShape:
    from objectives.tiny.models import policy_config

    return ModelShape.from_config(policy_config(size).to_dict())


@pytest.mark.parametrize("size", ["small", "medium"])
def test_a_named_policy_is_priced_from_its_own_shape(size):
    # second method: a workload whose own policy is that shape, allocation without a model
    from objectives.tiny.objective import TinyObjective

    w = TinyObjective().workload()
    by_name = make_plan(3e11, Allocation(0.5, 4, "sparse", size), w)
    direct = make_plan(3e11, Allocation(0.5, 4, "sparse"), Workload(_shape(size), w.setup, w.reward_models))
    assert by_name.iterations == direct.iterations
    assert by_name.expected.executed.total_flops == direct.expected.executed.total_flops
    assert by_name.setup_fingerprint == direct.setup_fingerprint
    assert by_name.policy == size


def test_a_bigger_policy_buys_fewer_iterations_at_the_same_budget():
    from objectives.tiny.objective import TinyObjective

    w = TinyObjective().workload()
    its = [make_plan(3e11, Allocation(0.5, 4, "sparse", s), w).iterations for s in sizes.SIZES]
    assert its[0] > its[1] > its[2] >= 1
    params = [w.policies[s].num_params() for s in sizes.SIZES]
    assert params == sorted(params) and params[2] / params[0] >= 3.9


def test_the_objective_refuses_an_unknown_model_in_one_line():
    from objectives.tiny.objective import TinyObjective

    with pytest.raises(ValueError, match="model='xl'"):
        TinyObjective().policy_path("xl")
    assert TinyObjective().policy_path(None) == TinyObjective().policy_path("tiny")


@pytest.mark.slow
@pytest.mark.parametrize("size", SHIPPED)
def test_a_real_trial_at_each_size_stays_within_its_budget(size):
    from objectives.tiny.objective import TinyObjective, TinySettings

    obj = TinyObjective(TinySettings(eval_problems=50))
    plan = make_plan(3e10, Allocation(0.5, 4, "sparse", size), obj.workload())
    res = obj.run(plan, seed=0)
    assert 0 < res.spent.executed.total_flops <= 3e10
    assert 0 <= res.targets["pass_at_1"] <= 1


def test_the_model_size_study_file_plans_every_size(cli):
    """`allocopt study --spec studies/tiny-sizes.toml --dry-run` lists a plan of every (size,
    reward system, G, rho level) with its size in its own column, and a size's plan is the
    one `allocopt plan` makes for it (iterations match make_plan at that size)."""
    from allocopt.plan.allocation import Allocation, make_plan
    from allocopt.spec import StudySpec
    from objectives.tiny import make

    spec = StudySpec.from_toml("studies/tiny-sizes.toml")
    r = cli("study", "--spec", "studies/tiny-sizes.toml", "--dry-run")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] in ([m] for m in sizes.SIZES)]
    n = len(spec.space.rewards) * len(spec.space.group_sizes) * 8
    assert spec.space.models == sizes.SIZES
    assert all([x[0] for x in rows].count(m) == n for m in sizes.SIZES)
    w = make().workload()
    for size in spec.space.models:
        row = next(x for x in rows if x[:4] == [size, "sparse", "4", "0.50"])
        assert int(row[7]) == make_plan(3e11, Allocation(0.5, 4, "sparse", model=size), w).iterations
    # it ends with each size's parameter count and its ratio to the first (the counts
    # sum(p.numel()) gives: tests/test_tiny_tasks.py checks the shapes)
    assert (w.policies["tiny"].num_params(), w.policies["small"].num_params(),
            w.policies["medium"].num_params()) == (556_704, 988_032, 2_219_392)
    assert (f"models: tiny 556,704 parameters; small 988,032 ({988_032 / 556_704:.2f}x); "
            f"medium 2,219,392 ({2_219_392 / 556_704:.2f}x)") in " ".join(r.stdout.split())


def test_trial_names_a_policy_size_and_refuses_an_unknown_one(cli):
    """`allocopt trial --model` with a size the objective lacks: one line, exit 2, naming the
    sizes there are (a real trial at each shipped size: the slow test above)."""
    r = cli("trial", "--objective", "tiny", "--budget", "3e11", "--rho", "0.5", "--model", "huge")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "model='huge': not one of this objective's policies (tiny, small, medium)" in r.stderr


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_study_naming_a_size_the_objective_lacks_is_refused_in_one_line(cli, tmp_path, dry_run):
    """``space.models`` with an unknown size: one line naming the field and the sizes there
    are, exit 2, before any plan is printed or any trial recorded."""
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\nobjective = "tiny"\nbudget_flops = 3e11\ntrials = 2\n'
                    '[space]\nmodels = ["tiny", "large"]\n')
    db = tmp_path / "optuna.db"
    args = ["--dry-run"] if dry_run else ["--storage", f"sqlite:///{db}", "--no-mlflow"]
    r = cli("study", "--spec", str(spec), *args)
    assert r.returncode == 2 and r.stdout.strip() == ""
    assert r.stderr.strip().splitlines() == [
        "error: space.models='large': not one of this objective's policies (tiny, small, medium), "
        "nor a preset or a local folder with a config.json"]
    assert not db.exists()


def test_a_wrong_model_is_named_before_the_machine_is_checked(cli):
    """``trial --objective qwen --model medium`` on a machine without a GPU: the model is what
    is wrong with the command, so it is what the one line names (not the missing GPU)."""
    import torch

    r = cli("trial", "--objective", "qwen", "--budget", "1e17", "--rho", "0.5", "--model", "medium")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error: --model: model='medium': unknown model; known presets:")
    if not torch.cuda.is_available():  # the same command with the default model: the machine
        r = cli("trial", "--objective", "qwen", "--budget", "1e17", "--rho", "0.5")
        assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


@pytest.mark.parametrize("models, line", [
    ("small", "space.models='small': must be a list, e.g. [\"tiny\", \"small\"]"),
    ([3], "space.models=3: must be a model name, a string (the objective's policy sizes, a preset or a "
          "folder with a config.json)"),
])
def test_a_models_entry_of_the_wrong_type_is_one_line(models, line):
    from allocopt.flops import ConfigError
    from allocopt.spec import SearchSpace

    with pytest.raises(ConfigError) as e:
        SearchSpace(models=models)
    assert str(e.value) == line


def test_an_unknown_model_of_an_objective_without_sizes_is_named_once():
    """An objective with no policies of its own (the synthetic one): the field is named once,
    with the presets allowed (it once read ``space.models: model='large': ...``)."""
    from allocopt.plan.allocation import policy_named
    from objectives.synthetic import SyntheticObjective

    with pytest.raises(ConfigError) as e:
        policy_named(SyntheticObjective().workload(), "large", "space.models")
    assert str(e.value).startswith("space.models='large': unknown model; known presets: Qwen/Qwen2.5-0.5B")
    assert "model='large'" not in str(e.value)[len("space.models='large'"):]
