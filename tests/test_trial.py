"""One GRPO trial end to end (``allocopt.grpo.driver.run_grpo``, TRL on CPU) in the tiny world.

* the FLOPs measured by ``torch.utils.flop_counter.FlopCounterMode`` over a whole trial agree
  with the meter in total and per phase (search: inside ``generate``; reward: inside the reward
  model's call; learning: everything else);
* the realized total never passes the budget, for every reward system at both ends of ρ, and
  the realized ρ is the plan's;
* bad input: a budget below one iteration, an unknown reward, a reward that crashes mid-run.

Every trial is small (a random-init tiny policy, 8 rollouts of at most 12 tokens, two or three
iterations) and deterministic (fixed seeds, one thread).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from allocopt.plan.allocation import (REWARDS, Allocation, InfeasiblePlan, TrialPlan, Workload,
                                 make_plan, min_budget, min_last_rows, rows_schedule)
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.meter import FlopMeter
from allocopt.plan.setup import TrainingSetup
from allocopt.grpo.driver import run_grpo
from allocopt.objective import TrialFailed, TrialResult
from allocopt.rewards.model_reward import ModelReward, reward_shape
from allocopt.rewards.systems import make_reward
from objectives.tiny.models import build_policy, build_prm, build_tokenizer, policy_config
from allocopt.rewards.verifier import LikelihoodVerifier
from objectives.tiny.tasks import make_split

from flop_utils import register_cpu_sdpa_flops

torch.set_num_threads(1)

C = 12
"""Generation limit (tokens); a random policy rarely stops earlier, so rollouts are ~C long."""
G = 4
N = 8
"""Rollouts per iteration: 2 prompts x G."""
SETUP = TrainingSetup(model="tiny", max_completion_length=C, completion_tokens=C, lora_rank=8,
                      lora_alpha=16, engine="trl-cpu", learning_rate=1e-3, rollouts_per_iteration=N)
"""The set-up the driver runs; the plans below are priced on it (:meth:`World.workload`: the
world's shapes and measured prompt length), and the driver checks the plan's fingerprint."""
BUDGET_FACTOR = 2.5
"""Budgets in units of the smallest feasible one (one iteration): two planned iterations and
half an iteration to spare, so the last admission decision is a close one."""
RHO_AGREEMENT = 0.03
FLOP_AGREEMENT = 0.02


# ------------------------------------------------------------------------------ world
@dataclass
class World:
    tokenizer: Any
    rows: list[dict]
    reward_models: dict[str, Any]
    """Random-init step verifiers (causal LMs): ``proxy_prm`` the proxy size, ``prm`` the full size."""

    def workload(self, reward_models: dict[str, Any] | None = None,
                 min_batch_share: float = 1.0) -> Workload:
        """Plans at the set-up's batch (8 rollouts) unless ``min_batch_share`` allows fewer
        prompts (:func:`allocopt.plan.allocation.make_plan`)."""
        models = self.reward_models if reward_models is None else reward_models
        return Workload(
            ModelShape.from_config(policy_config("tiny").to_dict()),
            # the longest training prompt (1 char = 1 token): the meter admits an iteration on
            # the batch's longest prompt, so planning on it keeps 2 planned iterations runnable
            replace(SETUP.with_lengths(prompt_tokens=max(len(r["prompt"]) for r in self.rows),
                                       padded_completion_tokens=C, steps_per_completion=1),
                    min_batch_share=min_batch_share),
            reward_models={name: reward_shape(m) for name, m in models.items()})

    def reward(self, name: str, models: dict[str, Any] | None = None) -> Any:
        models = self.reward_models if models is None else models
        if name in models:  # the tiny world's PRMs: generative step verifiers
            return LikelihoodVerifier(models[name], self.tokenizer, name=name)
        return make_reward(name)


@pytest.fixture(scope="module")
def world() -> World:
    return World(tokenizer=build_tokenizer(),
                 rows=[{"prompt": p.prompt, "answer": p.answer} for p in make_split("train", 200, 0)],
                 reward_models={"proxy_prm": build_prm("proxy", seed=1),
                                "prm": build_prm("full", seed=2)})


def plan_for(world: World, reward: str, rho: float, factor: float = BUDGET_FACTOR,
             workload: Workload | None = None) -> TrialPlan:
    w = workload or world.workload()
    alloc = Allocation(rho=rho, group_size=G, reward=reward)
    return make_plan(factor * min_budget(alloc, w), alloc, w)


@dataclass
class Trial:
    plan: TrialPlan
    result: TrialResult
    admitted: list[int]
    """The bound every iteration the meter admitted was last admitted with (its exact cost
    once generated, :meth:`FlopMeter.admit_exact`), in order."""
    stages: list[tuple[str, int]]
    """Every admission that passed, in order: ``("worst", bound)`` or ``("exact", bound)``."""


def run_trial(world: World, plan: TrialPlan, reward: Any) -> Trial:
    """``run_grpo`` of ``plan`` on a fresh policy, recording what the meter admitted."""
    stages: list[tuple[str, int]] = []
    admit, admit_exact = FlopMeter.admit, FlopMeter.admit_exact

    def recording_admit(self: FlopMeter, worst_case_flops: int) -> None:
        admit(self, worst_case_flops)  # raises when refused: not recorded
        stages.append(("worst", worst_case_flops))

    def recording_admit_exact(self: FlopMeter, exact_flops: int, **kw: Any) -> None:
        admit_exact(self, exact_flops, **kw)
        stages.append(("exact", exact_flops))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FlopMeter, "admit", recording_admit)
        mp.setattr(FlopMeter, "admit_exact", recording_admit_exact)
        result = run_grpo(plan, model=build_policy("tiny", seed=0), tokenizer=world.tokenizer,
                          train_rows=world.rows, reward=reward, setup=SETUP)
    admitted = [b for kind, b in stages if kind == "exact"]
    return Trial(plan, result, admitted, stages)


# ------------------------------------------------------------- measured FLOPs by phase
def register_flop_formulas() -> None:
    """Ops ``FlopCounterMode`` (torch 2.13) counts as 0 unless registered, with torch's own
    formulas: ``addmm_`` (TRL's chunked LM head accumulates the hidden-state gradient with it
    on CPU) and the CPU SDPA kernels (unused by the eager tiny models; registered so that a
    switch to SDPA is measured, not silently counted as 0). Idempotent."""
    register_cpu_sdpa_flops()  # tests/flop_utils.py: addmm_ and the CPU SDPA kernels


class PhaseCounter:
    """One ``FlopCounterMode`` over a whole trial, split into phases by where the FLOPs happen:
    inside ``GenerationMixin.generate`` (search), inside ``LikelihoodVerifier.__call__`` or
    ``ModelReward.__call__`` (reward: the tiny world's verifiers, token-classifier PRMs), or
    anywhere else (learning: log-prob passes, loss forward and backward). The two methods are
    wrapped at class level, so any path TRL or peft takes to them is seen; a call nested in
    another wrapped call counts once, for the outer one."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        from transformers.generation.utils import GenerationMixin

        register_flop_formulas()
        self.mode = FlopCounterMode(display=False)
        self.inside = {"search": 0, "reward": 0}
        self.calls = {"search": 0, "reward": 0}
        self._active: str | None = None
        mp.setattr(GenerationMixin, "generate", self._wrap(GenerationMixin.generate, "search"))
        # reward models: the tiny world's step verifiers and token-classifier PRMs (the qwen
        # objective's PRM-7B layout and its CPU stand-in)
        mp.setattr(LikelihoodVerifier, "__call__", self._wrap(LikelihoodVerifier.__call__, "reward"))
        mp.setattr(ModelReward, "__call__", self._wrap(ModelReward.__call__, "reward"))

    def _wrap(self, fn: Any, phase: str) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._active is not None:
                return fn(*args, **kwargs)
            self._active, start = phase, self.mode.get_total_flops()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside[phase] += self.mode.get_total_flops() - start
                self.calls[phase] += 1
                self._active = None
        return wrapper

    def __enter__(self) -> "PhaseCounter":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)

    def phases(self) -> dict[str, int]:
        total = self.mode.get_total_flops()
        return {"search": self.inside["search"], "reward": self.inside["reward"],
                "learning": total - self.inside["search"] - self.inside["reward"],
                "total": total}


@pytest.mark.parametrize("rho", [
    0.5,   # a partial pass: 5 of 8 rows trained per iteration, no old-policy pass
    # 3+ passes over the batch: old-policy log-prob pass, TRL num_iterations = 4 (~40 s: slow;
    # the default run still meters such trials, test_realized_total_never_exceeds_the_budget)
    pytest.param(0.85, marks=pytest.mark.slow),
])
def test_measured_flops_agree_with_the_meter_per_phase(world, rho):
    """The PRM here is the proxy-size model under the name ``prm``, so reward FLOPs are
    non-zero but the trial stays small.

    Measured on this setup (torch 2.13, TRL 1.16, transformers 5.24, commit 02091f1): all
    three phases agree to the FLOP. Before the driver charged eager attention as executed
    (``allocopt.grpo.driver.engine_for``), learning was 0.5-0.9 % above the measurement: engine
    ``trl-cpu`` assumes the fused SDPA backward (2.5 x the attention forward, scores
    recomputed) while the tiny models run eager attention (2 x). ``addmm_`` must be registered
    (:func:`register_flop_formulas`), else the LM head's recomputed tile (~0.15 % of learning)
    is measured as 0.
    """
    prm = {"prm": world.reward_models["proxy_prm"]}
    w = world.workload(prm)
    # 4x the smallest budget: the reward model's admission bound (prompt + 2 x completion,
    # padded) is well above its planned cost, so 2.5x can leave room for one iteration only
    plan = plan_for(world, "prm", rho, factor=4.0, workload=w)
    assert plan.iterations >= 2
    with pytest.MonkeyPatch.context() as mp, PhaseCounter(mp) as counter:
        trial = run_trial(world, plan, world.reward("prm", prm))
    measured = counter.phases()
    spent = trial.result.spent.executed
    metered = {"search": spent.search_flops, "reward": spent.reward_flops,
               "learning": spent.learning_flops, "total": spent.total_flops}
    iterations = len(trial.result.curves)
    assert iterations >= 2
    assert counter.calls == {"search": iterations, "reward": iterations}
    assert all(measured[p] > 0 for p in measured), measured
    if rho > 0.8:
        assert spent.learning["old_logprobs"] > 0
    ratios = {p: metered[p] / measured[p] for p in measured}
    print(f"rho={rho}: meter/measured", {p: f"{r:.5f}" for p, r in ratios.items()},
          "measured", measured)
    for p in measured:
        assert metered[p] == pytest.approx(measured[p], rel=FLOP_AGREEMENT), (p, ratios)


# ------------------------------------------------------------------- budget and rho
@pytest.fixture(scope="module")
def trials(world):
    """One trial per (reward, rho), run once and shared by the tests below."""
    cache: dict[tuple[str, float], Trial] = {}

    def get(reward: str, rho: float) -> Trial:
        if (reward, rho) not in cache:
            cache[reward, rho] = run_trial(world, plan_for(world, reward, rho), world.reward(reward))
        return cache[reward, rho]
    return get


RHOS = (0.2, 0.9)


def _cells() -> list:
    """Every (reward, rho) cell; at rho 0.9 only sparse runs by default (the other four, ~20 s
    each, run under ``-m slow``, which CI runs too)."""
    return [pytest.param(r, rho, marks=() if rho < 0.5 or r == "sparse" else pytest.mark.slow)
            for r in REWARDS for rho in RHOS]


# prm at rho 0.2 once spent 1.11x its budget: the reward model was missing from the bound an
# iteration is admitted with (fixed by ModelReward.worst_case_flops)
@pytest.mark.parametrize("reward, rho", _cells())
def test_realized_total_never_exceeds_the_budget(trials, reward, rho):
    trial = trials(reward, rho)
    plan, result = trial.plan, trial.result
    spent = result.spent.executed
    assert result.status == "complete" and result.stopped_reason.startswith("budget")
    assert len(result.curves) >= plan.iterations >= 2
    assert spent.total_flops <= plan.budget_flops, (
        f"{spent.total_flops:.4e} spent > budget {plan.budget_flops:.4e} after "
        f"{len(result.curves)} iterations (plan: {plan.iterations})")
    assert abs(spent.rho - plan.realized_rho) <= RHO_AGREEMENT, (spent.rho, plan.realized_rho)
    assert (spent.reward_flops > 0) == (reward in ("proxy_prm", "prm"))
    assert spent.learning_flops > 0 and spent.search_flops > 0
    # the curves hold every iteration; a generation refused at stage 2 is on the ledger only
    discarded = spent.total_flops - result.curves[-1].cumulative_flops
    assert discarded == 0 or 0 < discarded < spent.search_flops


@pytest.mark.parametrize("reward, rho", _cells())
def test_each_iteration_costs_at_most_what_was_admitted(trials, reward, rho):
    """The invariant behind the budget guarantee, checked per iteration whatever the budget:
    the executed FLOPs charged for an iteration never exceed the bound it was admitted with."""
    trial = trials(reward, rho)
    charged = [r.executed_flops for r in trial.result.curves]
    # every iteration passed both stages, the worst case first (one more may have passed
    # stage 1 and been refused at stage 2: its generation is charged, no record)
    kinds = [k for k, _ in trial.stages]
    assert kinds[: 2 * len(charged)] == ["worst", "exact"] * len(charged), kinds
    assert len(trial.admitted) == len(charged)
    over = [(i, c, b) for i, (c, b) in enumerate(zip(charged, trial.admitted)) if c > b]
    assert not over, f"(iteration, charged, admitted bound): {over}"
    # the exact bound is exact: the reward model's FLOPs are priced before it runs
    assert charged == trial.admitted
    # a generation refused at stage 2 (a trailing "worst" without its "exact") is charged as search
    extra = trial.result.spent.executed.total_flops - sum(charged)
    assert extra == 0 or (kinds[-1] == "worst" and 0 < extra <= trial.stages[-1][1]), (extra, kinds)


# ---------------------------------------------------------------------- bad input
def test_budget_below_one_iteration_names_the_minimum(world):
    w = world.workload()
    for reward in ("sparse", "prm"):
        alloc = Allocation(rho=0.5, group_size=G, reward=reward)
        need = min_budget(alloc, w)
        with pytest.raises(InfeasiblePlan) as exc:
            make_plan(need - 1, alloc, w)
        assert exc.value.min_budget_flops == need
        message = str(exc.value)
        assert "budget_flops=" in message and f"needs {need:.3g} FLOPs" in message
        assert isinstance(exc.value, ValueError)
        assert make_plan(need, alloc, w).iterations == 1  # the minimum is feasible


def test_unknown_reward_is_a_clear_value_error():
    with pytest.raises(ValueError, match=r"reward='rlhf': unknown reward system; allowed: "
                                         r"sparse, structured, dense, proxy_prm, prm"):
        make_reward("rlhf")
    with pytest.raises(ConfigError, match=r"reward='rlhf': no price for this reward system"):
        make_plan(1e12, Allocation(rho=0.5, group_size=G, reward="rlhf"), Workload(ModelShape.preset("qwen2.5-0.5b")))
    with pytest.raises(ValueError, match=r"reward='prm': a model-based reward needs model="):
        make_reward("prm")


class CrashingReward:
    """The sparse reward, which raises on its ``crash_on``-th call (1-based)."""

    def __init__(self, crash_on: int) -> None:
        self.inner, self.crash_on, self.calls = make_reward("sparse"), crash_on, 0
        self.__name__ = "sparse"

    def __call__(self, *args: Any, **kwargs: Any) -> list[float]:
        self.calls += 1
        if self.calls == self.crash_on:
            raise RuntimeError("reward server went away")
        return self.inner(*args, **kwargs)


def test_a_reward_that_crashes_mid_run_fails_the_trial_and_keeps_what_was_spent(world):
    plan = plan_for(world, "sparse", 0.5, factor=4.5)
    assert plan.iterations == 4
    reward = CrashingReward(crash_on=3)
    with pytest.raises(TrialFailed, match="RuntimeError: reward server went away") as exc:
        run_trial(world, plan, reward)
    result = exc.value.result
    assert result.status == "failed" and result.error == "RuntimeError: reward server went away"
    assert reward.calls == 3
    # two whole iterations were charged; the third crashed in scoring, after its generation
    assert [r.iteration for r in result.curves] == [0, 1]
    spent = result.spent.executed
    assert spent.total_flops == result.curves[-1].cumulative_flops > 0
    assert spent.total_flops == sum(r.executed_flops for r in result.curves)
    assert spent.search_flops > 0 and spent.learning_flops > 0
    assert result.budget_flops == plan.budget_flops and spent.total_flops <= plan.budget_flops
    assert result.to_dict()["status"] == "failed"


@pytest.mark.parametrize("divide", [False, True])
def test_each_pass_steps_at_the_learning_rate_trl_runs(world, divide, monkeypatch):
    # rho 0.85 makes 3-4 passes over each batch (TRL num_iterations): every pass is one
    # optimizer step at the learning rate (TRL / verl semantics), or at lr / passes when divided
    from transformers import Trainer

    seen: list[tuple[float, int]] = []
    create = Trainer.create_optimizer

    def recording(self, *args, **kwargs):
        out = create(self, *args, **kwargs)
        seen.append((self.optimizer.param_groups[0]["lr"], self.args.num_iterations))
        return out

    monkeypatch.setattr(Trainer, "create_optimizer", recording)
    plan = plan_for(world, "sparse", 0.85, factor=1.2)
    passes = plan.num_iterations_trl
    assert passes >= 3
    setup = replace(SETUP, learning_rate=2e-3, divide_lr_by_passes=divide)
    run_grpo(plan, model=build_policy("tiny", seed=0), tokenizer=world.tokenizer,
             train_rows=world.rows, reward=make_reward("sparse"), setup=setup)
    assert seen and seen[0][1] == passes
    assert seen[0][0] == pytest.approx(2e-3 / passes if divide else 2e-3, rel=0.02)  # ≤ 1 scheduler step


def short_workload(world: World) -> Workload:
    """The test workload priced at a third of the generation limit: its plans buy iterations
    the meter's worst case (every completion at the limit) may not fit."""
    return world.workload().with_setup(completion_tokens=C // 3, padded_completion_tokens=C // 3)


def test_a_budget_below_the_first_worst_case_is_infeasible_not_an_untrained_trial(world):
    # the plan buys one iteration at short expected lengths; the meter's worst case (every
    # completion at C) is larger, so it refuses the first iteration before generating: nothing
    # is run, and the trial must not report the untrained policy's scores as its result
    w = short_workload(world)
    alloc = Allocation(rho=0.5, group_size=G, reward="prm")
    plan = make_plan(1.0 * min_budget(alloc, w), alloc, w)
    assert plan.iterations == 1
    with pytest.raises(InfeasiblePlan, match="worst case") as exc:
        run_grpo(plan, model=build_policy("tiny", seed=0), tokenizer=world.tokenizer,
                 train_rows=world.rows, reward=world.reward("prm"), setup=SETUP,
                 evaluate=lambda m: pytest.fail("evaluated a policy that was never trained"))
    assert exc.value.min_budget_flops > plan.budget_flops
    # the refused worst case (generation + learning, completions at C) is above the short
    # plan's own generation + learning (completions at C // 3)
    assert exc.value.min_budget_flops > plan.per_iteration.executed.search_flops \
        + plan.per_iteration.executed.learning_flops


def test_stage_two_prices_the_reward_exactly_and_refuses_a_batch_that_does_not_fit(world):
    """First iteration of one plan, run twice with the same seed: with room to spare it is
    admitted at its exact cost (= its charge, the PRM's FLOPs included, more than stage 1's
    worst case of generation + learning); with a budget between the two it passes stage 1,
    is refused once generated — before the PRM runs — and the trial is infeasible."""
    from dataclasses import replace

    w = short_workload(world)
    alloc = Allocation(rho=0.2, group_size=G, reward="prm")
    one = replace(SETUP, max_iterations=1)
    calls = {"n": 0}
    reward = world.reward("prm")
    call = type(reward).__call__

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return call(self, *args, **kwargs)

    stages: list[tuple[str, int]] = []
    admit, admit_exact = FlopMeter.admit, FlopMeter.admit_exact
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FlopMeter, "admit", lambda self, b: (admit(self, b), stages.append(("worst", b)))[0])
        mp.setattr(FlopMeter, "admit_exact",
                   lambda self, b, **kw: (admit_exact(self, b, **kw), stages.append(("exact", b)))[0])
        mp.setattr(type(reward), "__call__", counting)
        roomy = run_grpo(make_plan(10 * min_budget(alloc, w), alloc, w), model=build_policy("tiny", seed=0),
                         tokenizer=world.tokenizer, train_rows=world.rows, reward=reward, setup=one)
        assert [k for k, _ in stages] == ["worst", "exact"] and calls["n"] == 1
        (_, worst), (_, exact) = stages
        assert roomy.curves[0].executed_flops == exact == roomy.spent.executed.total_flops
        assert exact > worst  # stage 1 left the reward model out
        generation = roomy.spent.executed.search_flops
        tight = make_plan((worst + exact) // 2, alloc, w)
        with pytest.raises(InfeasiblePlan, match="exact cost once generated") as exc:
            run_grpo(tight, model=build_policy("tiny", seed=0), tokenizer=world.tokenizer,
                     train_rows=world.rows, reward=reward, setup=one,
                     evaluate=lambda m: pytest.fail("evaluated a policy that was never trained"))
    assert calls["n"] == 1  # the reward model never ran on the refused batch
    assert exc.value.min_budget_flops == exact and generation > 0


# ------------------------------------------------------------------------- budget use
@pytest.mark.parametrize("share, rho, factor", [
    (0.5, 0.5, 2.5),  # whole iterations at 8 rollouts spend 80%: the plan takes 4 a batch
    (1.0, 0.9, 2.8),  # 8 rollouts only: 2 whole iterations and a third cut to the rows that fit
])
def test_a_prm_trial_spends_its_budget(world, share, rho, factor):
    """Issue 17: a prm trial left 10-30% of its budget unspent. Budgets of 2.5 and 2.8
    iterations at the set-up's batch (whole iterations: 2, 80% and 71%): the plan takes a
    smaller batch or cuts its last iteration, the driver runs that batch and cuts its own
    last iteration to what fits once the batch's exact cost is known, and the trial spends
    at least 90% of its budget, never more."""
    w = world.workload(min_batch_share=share)
    alloc = Allocation(rho=rho, group_size=G, reward="prm")
    one = min_budget(alloc, world.workload())  # one iteration at 8 rollouts
    plan = make_plan(factor * one, alloc, w)
    assert plan.budget_utilization >= 0.97
    trial = run_trial(world, plan, world.reward("prm"))
    result = trial.result
    spent = result.spent.executed.total_flops
    print(f"share {share} rho {rho}: plan {plan.iterations} x {plan.rollouts_per_iteration} rollouts "
          f"(last {plan.last_iteration_rows}), use {plan.budget_utilization:.3f}; ran "
          f"{[r.rows_trained for r in result.curves]} rows, use {spent / plan.budget_flops:.3f}")
    assert 0.9 * plan.budget_flops <= spent <= plan.budget_flops
    assert result.status == "complete" and result.stopped_reason.startswith("budget")
    assert trial.stages[:2] == [("worst", trial.stages[0][1]), ("exact", trial.admitted[0])]
    assert [r.executed_flops for r in result.curves] == trial.admitted  # charged as admitted
    scheduled = [rows_schedule(plan.rows_trained_per_iteration, i) for i in range(len(result.curves))]
    rows = [r.rows_trained for r in result.curves]
    # every iteration trains its schedule's rows but the last, which may be cut, not below half
    assert rows[:-1] == scheduled[:-1]
    assert min_last_rows(scheduled[-1]) <= rows[-1] <= scheduled[-1]
    if plan.last_iteration_rows is not None:
        assert rows[-1] < scheduled[-1]  # the run's last iteration was cut, as the plan's
