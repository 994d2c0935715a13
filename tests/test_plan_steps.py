"""The batch follows the budget (``target_steps``), and every plan knows its epochs over the
training set and warns beyond MAX_EPOCHS."""

import math

import pytest

from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.allocation import (
    MAX_EPOCHS,
    Allocation,
    Workload,
    batch_workload,
    iteration_flops,
    make_plan,
    rows_for_rho,
)
from allocopt.plan.setup import TrainingSetup

POLICY = ModelShape.preset("Qwen/Qwen2.5-1.5B")
POLARIS_TRAIN = 53_291 - 500  # the qwen objective's training prompts (Polaris-53K less its held-out slice)
W = Workload(POLICY, TrainingSetup(train_prompts=POLARIS_TRAIN))
OFF = W.with_setup(target_steps=0)


def mean_iteration(w, alloc):
    """Mean executed FLOPs of one iteration at ``w``'s batch, summed row by row over 64
    iterations of the schedule (a second way: no closed form)."""
    k = rows_for_rho(w, alloc)
    return sum(iteration_flops(w, alloc, math.floor((i + 1) * k + 1e-9) - math.floor(i * k + 1e-9))
               .executed.total_flops for i in range(64)) / 64


def test_target_steps_zero_is_off_and_bad_values_are_one_line():
    assert TrainingSetup(target_steps=0).target_steps is None
    assert TrainingSetup().largest_rollouts_per_iteration == 8192
    assert TrainingSetup(target_steps=None).largest_rollouts_per_iteration == 64
    assert TrainingSetup(rollouts_per_iteration=16384).largest_rollouts_per_iteration == 16384
    for kw, field in (({"target_steps": -1}, "target_steps"), ({"target_steps": 2.5}, "target_steps"),
                      ({"target_steps": True}, "target_steps"), ({"max_rollouts_per_iteration": 1},
                      "max_rollouts_per_iteration"), ({"max_rollouts_per_iteration": 10**6},
                      "max_rollouts_per_iteration"), ({"train_prompts": 0}, "train_prompts")):
        with pytest.raises(ConfigError) as e:
            TrainingSetup(**kw)
        assert str(e.value).startswith(f"{field}=") and "\n" not in str(e.value)


def test_a_budget_that_buys_few_iterations_keeps_the_setups_batch():
    """At 1e16 FLOPs the set-up's 64 rollouts buy fewer than 500 iterations: the plan is the
    one target_steps=off makes, field for field."""
    for alloc in (Allocation(0.2, 2, "sparse"), Allocation(0.6, 8, "prm")):
        assert 1e16 / mean_iteration(W, alloc) < 500
        on, off = make_plan(1e16, alloc, W), make_plan(1e16, alloc, OFF)
        assert on.to_dict() == off.to_dict()
        assert on.rollouts_per_iteration <= 64


@pytest.mark.parametrize("alloc", [Allocation(0.8, 2, "sparse"), Allocation(0.8, 4, "dense"),
                                   Allocation(0.7, 8, "prm")], ids=str)
def test_a_large_budget_buys_about_target_steps_iterations(alloc):
    """Below the batch cap, the plan's iterations land within 1 % of target_steps, and its
    batch is what the budget / (500 x per-prompt cost) says, the per-prompt cost summed row by
    row at the set-up's batch; with target_steps off the same budget buys > 500 iterations."""
    budget = 1e19
    per_prompt = mean_iteration(W, alloc) / (64 // alloc.group_size)
    want = math.ceil(budget / (per_prompt * 500))
    assert want * alloc.group_size < 8192  # below the cap
    p = make_plan(budget, alloc, W)
    assert abs(p.iterations - 500) <= 5, p.iterations
    assert abs(p.prompts_per_iteration - want) <= max(1, 0.01 * want)
    assert p.expected.executed.total_flops <= budget and p.realizable
    assert make_plan(budget, alloc, OFF).iterations > 5000


def test_at_the_cap_the_batch_is_8192_and_epochs_are_prompts_over_the_training_set():
    """The issue's plan (Qwen2.5-1.5B, 1e19, sparse, G 2, rho 0.2): at target_steps off, 64
    rollouts and ~115k iterations; on, the batch is capped at 8,192 and the iterations are
    the budget over one iteration at that batch (row by row); epochs = iterations x 4,096 /
    52,791, the same as with 64 rollouts (the budget decides the prompts, not the batch),
    with a one-line warning naming them."""
    alloc = Allocation(0.2, 2, "sparse")
    off = make_plan(1e19, alloc, OFF)
    assert off.rollouts_per_iteration == 64 and off.iterations > 100_000
    p = make_plan(1e19, alloc, W)
    assert p.rollouts_per_iteration == 8192 and p.prompts_per_iteration == 4096
    one = mean_iteration(batch_workload(W, 8192), alloc)
    assert abs(p.iterations - 1e19 / one) <= 1
    assert p.epochs == pytest.approx(p.iterations * 4096 / POLARIS_TRAIN)
    assert p.epochs == pytest.approx(off.epochs, rel=0.01)  # the same prompts, another batch
    assert p.epochs > MAX_EPOCHS and p.warning.startswith(f"epochs={p.epochs:.1f}: ") and "\n" not in p.warning
    d = p.to_dict()
    assert (d["epochs"], d["train_prompts"], d["plan_warning"]) == (p.epochs, POLARIS_TRAIN, p.warning)


def test_epochs_unknown_without_a_training_set_and_no_warning_at_or_below_the_limit():
    alloc = Allocation(0.5, 8, "sparse")
    assert make_plan(1e17, alloc, Workload(POLICY)).epochs is None
    assert make_plan(1e17, alloc, Workload(POLICY)).to_dict()["plan_warning"] is None
    p = make_plan(1e17, alloc, W)
    sampled = p.iterations * p.prompts_per_iteration
    at_limit = make_plan(1e17, alloc, W.with_setup(train_prompts=math.ceil(sampled / MAX_EPOCHS)))
    assert at_limit.epochs <= MAX_EPOCHS and at_limit.warning is None
    over = make_plan(1e17, alloc, W.with_setup(train_prompts=math.floor(sampled / MAX_EPOCHS) - 1))
    assert over.epochs > MAX_EPOCHS and over.warning is not None


def test_the_driver_runs_a_raised_batch_and_refuses_one_above_the_cap():
    from allocopt.grpo.driver import SetupMismatch, check_setup

    alloc = Allocation(0.8, 2, "sparse")
    p = make_plan(1e19, alloc, W)
    assert p.rollouts_per_iteration > 64
    check_setup(p, W.setup, POLICY)  # the set-up that made it runs it
    small = W.setup.with_lengths(max_rollouts_per_iteration=p.rollouts_per_iteration - 2)
    with pytest.raises(SetupMismatch, match="max_rollouts_per_iteration"):
        check_setup(p, small, POLICY)
    with pytest.raises(SetupMismatch, match="target_steps=None"):
        check_setup(p, OFF.setup, POLICY)


def test_the_tiny_and_synthetic_set_ups_keep_their_batch():
    """The tiny world's and the synthetic objective's set-ups leave target_steps off: their
    plans at any budget keep the batch the set-up gives (the tiny grid runs against them)."""
    from objectives.synthetic import SyntheticObjective
    from objectives.tiny.objective import TinySettings, tiny_setup

    assert tiny_setup().target_steps is None and TinySettings().setup.target_steps is None
    w = SyntheticObjective().workload()
    assert w.setup.target_steps is None
    assert make_plan(1e21, Allocation(0.2, 2, "sparse"), w).rollouts_per_iteration == 64


def test_plan_cli_shows_epochs_the_raised_batch_and_the_warning(cli):
    r = cli("plan", "--budget", "1e19", "--rho", "0.2", "-G", "2", "--train-prompts", POLARIS_TRAIN)
    assert r.returncode == 0, r.stderr
    assert "epochs" in r.stdout and "over 52,791 training prompts" in r.stdout
    assert "(the set-up's 32, raised so that" in r.stdout
    assert "warning: epochs=" in r.stderr
    r = cli("plan", "--budget", "1e19", "--rho", "0.2", "-G", "2", "--target-steps", "0", "--json")
    assert r.returncode == 0 and '"rollouts_per_iteration": 64' in r.stdout
    r = cli("plan", "--budget", "1e19", "--rho", "0.2", "--target-steps", "-3")
    assert r.returncode == 2 and "target_steps=-3" in r.stderr and "Traceback" not in r.stderr


def test_study_prints_each_trials_epochs_warning_once(cli, tmp_path):
    """A synthetic study on a training set of 1,000 prompts at 1e19 FLOPs: every plan passes
    over it hundreds of times; the live display prints each trial's warning once, as one line,
    the same text the trial records (``plan_warning``), with epochs = iterations × prompts per
    iteration / 1,000 (by hand from the recorded plan)."""
    import optuna

    db = f"sqlite:///{tmp_path}/s.db"
    r = cli("study", "--objective", "synthetic", "--target", "pass@1", "--budget", "1e19", "--pilots", "0",
            "--trials", "3", "--no-mlflow", "--storage", db, "--study-name", "e", "--set", "train_prompts=1000",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("warning: trial ")]
    trials = optuna.load_study(study_name="e", storage=db).get_trials()
    assert len(trials) == 3 and len(lines) == 3
    for t in trials:
        p = t.user_attrs["plan"]
        epochs = p["iterations"] * p["prompts_per_iteration"] / 1000
        assert p["epochs"] == pytest.approx(epochs) and epochs > MAX_EPOCHS
        assert p["plan_warning"].startswith(f"epochs={epochs:.1f}: ")
        assert [x for x in lines if x.startswith(f"warning: trial {t.number}: ")] == \
            [f"warning: trial {t.number}: {p['plan_warning']}"]
