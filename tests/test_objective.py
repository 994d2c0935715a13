"""The objective contract (allocopt.objective) over every built-in objective: tiny, synthetic, qwen.

Each objective is checked for what it can do on this machine: conformance to the protocol, a
workload plans can be made for, availability, and a real run where one is cheap (synthetic).
The tiny objective's one real trial lives in tests/test_tiny_objective.py (it checks the same
contract: targets declared here, spent <= budget); it is not run twice.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from allocopt.plan.allocation import Allocation, TrialPlan, Workload, make_plan
from allocopt.flops import ModelShape
from allocopt.objective import (InfeasiblePlan, Objective, ObjectiveUnavailable, TrialFailed, TrialResult,
                                get_objective, objective_names, objective_targets, register_objective)
from objectives.synthetic import response

BUILTIN = ("tiny", "synthetic", "qwen")
# a budget each objective's workload can buy (tiny: 4 iterations of 64 rollouts)
BUDGET = {"tiny": 6e10, "synthetic": 1e19, "qwen": 1e19}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_objective_conforms_and_plans(name):
    obj = get_objective(name)
    assert isinstance(obj, Objective)
    assert obj.name == name
    targets = objective_targets(name)
    assert targets and "pass_at_1" in targets and "native_reward" in targets
    w = obj.workload()
    assert isinstance(w, Workload) and isinstance(w.policy, ModelShape)
    assert w.policy.num_params() > 0
    plan = make_plan(BUDGET[name], Allocation(0.5, 4, "sparse"), w)
    assert isinstance(plan, TrialPlan)
    e = plan.expected.executed
    assert 0 < e.total_flops <= BUDGET[name]
    assert e.search_flops + e.learning_flops + e.reward_flops == pytest.approx(e.total_flops)


def test_builtins_are_registered_and_unknown_names_are_one_line():
    assert set(BUILTIN) <= set(objective_names())
    with pytest.raises(ValueError) as exc:
        get_objective("nope")
    msg = str(exc.value)
    assert "\n" not in msg and "objective='nope'" in msg
    assert all(n in msg for n in BUILTIN)
    with pytest.raises(ValueError, match="objective='nope'"):
        objective_targets("nope")
    with pytest.raises(ValueError, match="setting 'no_such_setting': unknown for objective synthetic; allowed: "):
        get_objective("synthetic", no_such_setting=1)


def test_synthetic_run_keeps_the_contract():
    obj = get_objective("synthetic", noise=0.0)
    obj.check_available()  # always available: returns
    budget = 3e18
    alloc = Allocation(0.6, 8, "prm")
    plan = make_plan(budget, alloc, obj.workload())
    result = obj.run(plan, seed=3)
    assert isinstance(result, TrialResult)
    assert set(result.targets) == set(objective_targets("synthetic"))
    # noise 0: the closed form of the module docstring, target by target
    for key, value in result.targets.items():
        assert value == pytest.approx(response(0.6, 8, "prm", key, budget))
    b = result.breakdown
    assert b.search_flops + b.learning_flops + b.reward_flops == pytest.approx(b.total_flops)
    assert 0 < b.total_flops <= budget
    assert b.reward_flops > 0  # prm: a reward model's forward passes
    assert b.rho == pytest.approx(plan.realized_rho, abs=1e-9)
    assert result.budget_flops == budget
    d = result.to_dict()
    assert d["breakdown"]["total_flops"] == pytest.approx(b.total_flops)


def test_synthetic_noise_is_seeded():
    obj = get_objective("synthetic", noise=0.05)
    plan = make_plan(1e19, Allocation(0.5, 4, "dense"), obj.workload())
    a = obj.run(plan, seed=1).targets
    assert obj.run(plan, seed=1).targets == a
    b = obj.run(plan, seed=2).targets
    assert any(abs(a[k] - b[k]) > 1e-6 for k in a)


@pytest.mark.parametrize("name", ["tiny", "synthetic"])
def test_cpu_objectives_are_available_here(name):
    assert get_objective(name).check_available() is None


@pytest.mark.skipif("_cuda()", reason="checks the CPU-only refusal; this machine has CUDA")
def test_qwen_refuses_on_cpu_before_spending():
    obj = get_objective("qwen")
    with pytest.raises(ObjectiveUnavailable) as exc:
        obj.check_available()
    assert "\n" not in str(exc.value) and "objective=qwen" in str(exc.value)
    plan = make_plan(1e19, Allocation(0.5, 4, "sparse"), obj.workload())
    t0 = time.perf_counter()
    with pytest.raises(ObjectiveUnavailable):
        obj.run(plan, seed=0)
    assert time.perf_counter() - t0 < 5


class _Counting:
    """A user's objective: registered by name, built from settings."""

    name = "counting"

    def __init__(self, scale: float = 1.0):
        self.scale = scale
        self.runs = 0

    def workload(self) -> Workload:
        return Workload(ModelShape.from_pretrained("Qwen/Qwen2.5-1.5B"))

    def check_available(self) -> None:
        return None

    def run(self, plan, *, seed=0, progress=None) -> TrialResult:
        self.runs += 1
        if plan.allocation.rho > 0.8:
            raise TrialFailed("diverged", TrialResult({}, plan.expected, plan.budget_flops, [], {}))
        return TrialResult({"pass_at_1": self.scale * plan.allocation.rho}, plan.expected,
                           plan.budget_flops, [], {})


def test_register_a_user_objective():
    register_objective("counting", _Counting, targets=["pass_at_1"], replace=True)
    try:
        obj = get_objective("counting", scale=0.5)
        assert isinstance(obj, Objective) and obj.scale == 0.5
        assert objective_targets("counting") == ("pass_at_1",)
        with pytest.raises(ValueError, match="already registered"):
            register_objective("counting", _Counting)
        plan = make_plan(1e19, Allocation(0.9, 4, "sparse"), obj.workload())
        with pytest.raises(TrialFailed) as exc:
            obj.run(plan)
        assert exc.value.result.spent.executed.total_flops == plan.expected.executed.total_flops
        with pytest.raises(ValueError, match="non-empty"):
            register_objective(" ", _Counting)
    finally:
        from allocopt import objective as mod

        mod._REGISTRY.pop("counting", None)


def test_an_object_without_run_is_not_an_objective():
    class NoRun:
        name = "x"

        def workload(self):
            return None

        def check_available(self):
            return None

    assert not isinstance(NoRun(), Objective)


def test_the_plugin_api_raises_the_planning_error_itself():
    from allocopt.plan.allocation import InfeasiblePlan as IP

    assert InfeasiblePlan is IP


def test_the_contract_module_loads_no_heavy_library():
    code = ("import sys, allocopt.objective as o; o.get_objective('synthetic'); "
            "print(sorted(m for m in ('torch', 'optuna', 'trl', 'mlflow', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name,settings,needle", [
    ("tiny", {"divide_lr_by_passes": "false"}, "setting divide_lr_by_passes='false': must be true or false"),
    ("tiny", {"lora_rank": "abc"}, "setting lora_rank='abc': must be an integer"),
    ("tiny", {"lora_rank": 8.5}, "setting lora_rank=8.5: must be an integer"),
    ("tiny", {"nosuch": 3}, "setting 'nosuch': unknown for objective tiny; allowed: "),
    ("synthetic", {"noise": "abc"}, "setting noise='abc': must be a number"),
    ("qwen", {"gradient_checkpointing": "yes"}, "setting gradient_checkpointing='yes': must be true or false"),
])
def test_objective_settings_of_the_wrong_type_are_refused(name, settings, needle):
    """A quoted boolean is not read as true (Python's truth of "false"), and a setting of the
    wrong type or name is one line naming it, before the objective is built."""
    from allocopt.objective import get_objective

    with pytest.raises(ValueError) as e:
        get_objective(name, **settings)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)


def test_an_installed_package_registers_an_objective_by_entry_point(tmp_path, monkeypatch):
    """A user's package declares ``[project.entry-points."allocopt.objectives"]``; installed, it
    is an entry point of that group (here a dist-info folder written by hand on ``sys.path``):
    found by name, loaded on first use, its factory's ``targets`` are the objective's."""
    from allocopt import objective as mod

    (tmp_path / "my_objectives.py").write_text(
        "from objectives.synthetic import SyntheticObjective\n"
        "def make(**settings):\n"
        "    return SyntheticObjective(name='mine', **settings)\n"
        "make.targets = ('pass_at_1',)\n")
    info = tmp_path / "my_objectives-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-objectives\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[allocopt.objectives]\nmine = my_objectives:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_objectives", raising=False)
    try:
        assert "mine" in objective_names() and set(BUILTIN) <= set(objective_names())
        assert "my_objectives" not in sys.modules  # listed by name, not imported
        obj = get_objective("mine", noise=0.0)
        assert obj.name == "mine" and isinstance(obj, Objective)
        assert objective_targets("mine") == ("pass_at_1",)
    finally:
        mod._REGISTRY.pop("mine", None)
