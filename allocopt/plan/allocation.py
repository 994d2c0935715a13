"""From an allocation and a FLOP budget to a runnable GRPO training plan.

Standard library only. An :class:`Allocation` says *how* to split compute (update fraction
ρ, group size G, reward system); a :class:`Workload` says *what* is trained: the policy's
shape, the :class:`~allocopt.plan.setup.TrainingSetup` (rollout batch, expected token lengths,
LoRA, engine, …: every set-up field and its one default live there) and the reward models'
shapes; :func:`make_plan` returns the :class:`TrialPlan` that the budget buys.

How ρ is realized. Per iteration, search ``S`` and reward ``R`` FLOPs are fixed by the rollout
batch; learning is ``L(k) = ref + old·[k > N] + (k / N)·T`` where ``N`` is the rollouts per
iteration, ``T`` one forward + backward pass over all of them, and ``k`` the rows trained per
iteration (``μ = k / N`` update passes: ``k < N`` trains on part of the batch, ``k > N`` passes
over it again). ρ = L / (S + R + L) is solved for ``k``; a fractional ``k`` alternates
iterations of ``floor(k)`` and ``floor(k) + 1`` rows, so any ρ in range is realized over the
run, across the jump where a second pass adds an old-policy log-prob pass too. Passes are decoupled from step size by the driver (it scales the
learning rate by ``1/μ``), so ρ measures compute, not step size.

The plan never exceeds its budget: it runs the most whole iterations whose executed FLOPs fit
(:func:`max_iterations`); a budget below one iteration of the workload's batch raises
:class:`InfeasiblePlan` naming the smallest budget that works.

How the budget is used up. Whole iterations leave up to one iteration's cost unspent, which is
most of a budget that buys few (issue 17: a ρ = 0.9 trial of the tiny world bought 3 and left
23 % unspent). Two things fill it, in the plan and in the driver alike:

* the last iteration may train fewer rows, down to :data:`LAST_ROWS_SHARE` of its scheduled
  rows (:func:`min_last_rows`), the most that fit (:func:`allocopt.plan.meter.largest_fitting`;
  :attr:`TrialPlan.last_iteration_rows`); the driver cuts an iteration after the first the same
  way once its exact cost is known (:meth:`allocopt.plan.meter.FlopMeter.largest_fitting`);
* when that still leaves more than :data:`MAX_UNUSED_SHARE` of the budget unspent (or the ρ
  unrealized), :func:`make_plan` tries smaller batches, down to the set-up's
  ``min_batch_share`` of the workload's prompts per iteration, and keeps the one whose plan
  realizes ρ and uses the most (:attr:`TrialPlan.prompts_per_iteration`; the driver runs the
  plan's batch, :func:`batch_workload` prices it).

How the batch follows the budget. A set-up with ``target_steps`` (default 500) runs a budget
that buys more iterations than that at its batch at a larger batch, so that it buys about
``target_steps`` (:func:`steps_batch`, up to ``max_rollouts_per_iteration``), as public
recipes fix their steps and scale the batch. Every plan knows its passes over the training set
(:attr:`TrialPlan.epochs`) and warns beyond :data:`MAX_EPOCHS` (:attr:`TrialPlan.warning`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from allocopt.flops import ConfigError, FlopAccount, ModelShape
from allocopt.flops.grpo import GRPOStep, engine, grpo_step_flops
from allocopt.plan.meter import largest_fitting
from allocopt.plan.setup import MAX_ROLLOUTS_PER_ITERATION, TrainingSetup
from allocopt.plan.hub import model_shape

REWARDS: tuple[str, ...] = ("sparse", "structured", "dense", "proxy_prm", "prm")
"""Reward systems: three rule-based (0 FLOPs), two model-based."""
RULE_BASED: frozenset[str] = frozenset({"sparse", "structured", "dense"})
MODEL_BASED: frozenset[str] = frozenset({"proxy_prm", "prm"})
FIDELITIES: tuple[str, ...] = ("pilot", "full")
"""Fidelities of a trial: ``pilot`` (a share of the budget, inside a RACE grid) and ``full``
(the whole budget); this order is the stored Optuna distribution's (:mod:`allocopt.study.sampler`)."""

RHO_TOLERANCE = 0.01
"""A plan is *realizable* when its ρ is within this of the asked ρ."""

MAX_EPOCHS = 4.0
"""Passes over the training set above which a plan carries a warning (:attr:`TrialPlan.warning`):
transformers' ``TrainingArguments`` (and so TRL's ``GRPOConfig``) default to 3 epochs and verl's
DAPO recipe runs 1 (``trainer.total_epochs=1``); a run that sees each prompt many more times
keeps drawing groups it already solves (all-equal rewards: zero GRPO advantage) and fits its
training prompts rather than the task."""

class FrozenMap(dict):
    """A dict that is hashable (by its sorted items), so frozen configs holding one are too.
    Do not mutate it."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


from allocopt.errors import InfeasiblePlan  # noqa: E402,F401  (defined there; imported from here too)


def check_budget(budget_flops: Any) -> float:
    """A FLOP budget as a float. Raises :class:`ConfigError` for non-numbers, NaN, inf, <= 0."""
    try:
        b = float(budget_flops)
    except (TypeError, ValueError):
        raise ConfigError(f"budget_flops={budget_flops!r}: must be a positive number of FLOPs, "
                          "e.g. 1e19") from None
    if not math.isfinite(b) or b <= 0:
        raise ConfigError(f"budget_flops={budget_flops!r}: must be a positive finite number of "
                          "FLOPs, e.g. 1e19")
    return b


@dataclass(frozen=True)
class Allocation:
    """Where compute goes: the search variables of a study."""

    rho: float
    """ρ, the update fraction: learning / (search + learning + reward), in (0, 1)."""
    group_size: int
    """G, completions per prompt (TRL ``num_generations``), >= 2."""
    reward: str
    """Reward system: one of :data:`REWARDS` or one a study declares
    (:mod:`allocopt.vocabulary`); the workload prices it (:func:`reward_model_of`)."""
    model: str | None = None
    """Policy model (a preset or config path); ``None``: the workload's policy."""

    def __post_init__(self) -> None:
        if isinstance(self.rho, bool) or not isinstance(self.rho, (int, float)) \
                or not (0.0 < self.rho < 1.0):
            raise ConfigError(f"rho={self.rho!r}: must be a number strictly between 0 and 1")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) \
                or self.group_size < 2:
            raise ConfigError(f"group_size={self.group_size!r}: must be an integer >= 2 "
                              "(GRPO needs a group to compare completions)")
        if self.group_size > MAX_ROLLOUTS_PER_ITERATION:
            raise ConfigError(f"group_size={self.group_size!r}: must be at most "
                              f"{MAX_ROLLOUTS_PER_ITERATION} (completions per iteration are priced "
                              "row by row)")
        if not isinstance(self.reward, str) or not self.reward.strip() or len(self.reward) > 100:
            raise ConfigError(f"reward={str(self.reward)[:80]!r}: must name a reward system "
                              f"(built in: {', '.join(REWARDS)}; a study file declares more)")


def default_reward_models() -> dict[str, ModelShape]:
    """Reward-model shape per model-based reward system when a workload names none: the
    ``prm`` Qwen2.5-Math-PRM-7B, the ``proxy_prm`` a 1.5B-size step scorer with a score head."""
    return {"prm": ModelShape.preset("Qwen/Qwen2.5-Math-PRM-7B"),
            "proxy_prm": ModelShape(**{**asdict(ModelShape.preset("Qwen/Qwen2.5-1.5B")),
                                       "name": "proxy-prm-1.5b", "head": "score"})}


@dataclass(frozen=True)
class Workload:
    """What one trial trains and how: everything but the allocation.

    The set-up is read where it lives, ``workload.setup.completion_tokens`` (no field of it is
    repeated here), so a default ``Workload(policy)`` prices the default ``TrainingSetup()``.
    Derived workloads: :meth:`with_setup`.
    """

    policy: ModelShape
    """The policy model's shape."""
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    """The training set-up plans are priced on and the driver runs."""
    reward_models: Mapping[str, ModelShape] = field(default_factory=default_reward_models)
    """Reward-model shape per model-based reward system (:func:`default_reward_models`)."""
    rule_rewards: frozenset[str] = RULE_BASED
    """Reward systems that cost no FLOPs (rule-based checkers)."""
    reward_scoring: Mapping[str, str] = field(default_factory=lambda: {r: "steps" for r in MODEL_BASED})
    """How each model-based reward system scores (:data:`allocopt.vocabulary.SCORINGS`):
    ``steps`` reads one marker token per reasoning step (``setup.steps_per_completion``),
    ``forward`` none, ``outcome`` none and its head at the last position only; absent:
    ``forward``."""
    policies: Mapping[str, ModelShape] = field(default_factory=dict)
    """Policy shapes by the names an allocation's ``model`` may give (an objective's own sizes,
    e.g. the tiny world's ``tiny``, ``small``, ``medium``); a name not here is read as a preset
    or a config path."""

    def __post_init__(self) -> None:
        if not isinstance(self.setup, TrainingSetup):
            raise ConfigError(f"setup={self.setup!r}: must be a TrainingSetup")
        object.__setattr__(self, "reward_models", FrozenMap(self.reward_models))
        object.__setattr__(self, "rule_rewards", frozenset(self.rule_rewards))
        object.__setattr__(self, "reward_scoring", FrozenMap(self.reward_scoring))
        object.__setattr__(self, "policies", FrozenMap(self.policies))

    def with_setup(self, **changes: Any) -> "Workload":
        """This workload with set-up fields changed (the generation limit and the runner's
        defaults stay as they were resolved unless given). Raises :class:`ConfigError` for an
        unknown field or a bad value, naming it."""
        return replace(self, setup=TrainingSetup.from_mapping({**self.setup.to_dict(), **changes}))

    def fingerprint(self, allocation: "Allocation | None" = None) -> str:
        """:func:`~allocopt.plan.setup.setup_fingerprint` of what :func:`make_plan` prices for
        ``allocation`` (its own policy when it names one)."""
        policy = self.policy if allocation is None else _policy(self, allocation)
        return self.setup.fingerprint(policy)


@dataclass(frozen=True)
class TrialPlan:
    """A runnable GRPO training plan under a budget. FLOPs are executed FLOPs unless named
    ``useful``."""

    allocation: Allocation
    budget_flops: float
    policy: str
    reward_model: str | None
    group_size: int
    prompts_per_iteration: int
    rollouts_per_iteration: int
    rows_trained_per_iteration: float
    """``k``: rollouts trained on per iteration, over all passes, as a mean: iteration ``i``
    trains :func:`rows_schedule` ``(k, i)`` rows."""
    update_passes: float
    """μ = k / rollouts_per_iteration."""
    num_iterations_trl: int
    """Whole passes TRL runs (``ceil(μ)``); the last one may train on part of the batch."""
    iterations: int
    """GRPO iterations (rollout batches) the budget buys."""
    per_iteration: FlopAccount
    """Mean FLOPs of one iteration (``expected / iterations``, rounded down per item)."""
    expected: FlopAccount
    """``per_iteration × iterations``."""
    realized_rho: float
    realizable: bool
    """Whether ``|realized_rho - allocation.rho| <= RHO_TOLERANCE``."""
    last_iteration_rows: int | None = None
    """Rows the last of :attr:`iterations` trains when the budget cuts it (at least
    :func:`min_last_rows` of its scheduled rows); ``None``: it trains its schedule's rows."""
    setup_fingerprint: str = ""
    """:func:`~allocopt.plan.setup.setup_fingerprint` of what the plan priced (policy shape, LoRA,
    engine, checkpointing, reference pass, generation limit); the driver refuses to run a plan
    whose fingerprint differs from what it is about to run."""
    setup: TrainingSetup | None = None
    """The set-up the plan priced (``model``: the allocation's when it names one), so that the
    driver can name the fields where what it would run differs (``None``: not recorded)."""
    train_prompts: int | None = None
    """Prompts in the training set (the set-up's :attr:`~allocopt.plan.setup.TrainingSetup.train_prompts`;
    ``None``: unknown)."""

    @property
    def budget_utilization(self) -> float:
        return self.expected.executed.total_flops / self.budget_flops

    @property
    def epochs(self) -> float | None:
        """Passes over the training set: prompts sampled (``iterations × prompts_per_iteration``;
        a cut last iteration still samples all its prompts) / :attr:`train_prompts`. ``None``
        when the training set's size is unknown."""
        if not self.train_prompts:
            return None
        return self.iterations * self.prompts_per_iteration / self.train_prompts

    @property
    def warning(self) -> str | None:
        """One line when the plan passes over its training set more than :data:`MAX_EPOCHS`
        times, saying why that matters; else ``None``."""
        e = self.epochs
        if e is None or e <= MAX_EPOCHS:
            return None
        return (f"epochs={e:.1f}: the plan samples {self.iterations * self.prompts_per_iteration:,} "
                f"prompts from a training set of {self.train_prompts:,} (more than {MAX_EPOCHS:g} "
                "passes): late iterations retrain on prompts already solved, so the trial scores "
                "repetition as much as its allocation; a smaller budget or a larger training set "
                "keeps it under")

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON- and MLflow-friendly dict (FLOPs as numbers)."""
        out: dict[str, Any] = {
            "rho": self.allocation.rho, "group_size": self.group_size,
            "reward": self.allocation.reward, "model": self.policy,
            "reward_model": self.reward_model, "budget_flops": self.budget_flops,
            "prompts_per_iteration": self.prompts_per_iteration,
            "rollouts_per_iteration": self.rollouts_per_iteration,
            "rows_trained_per_iteration": self.rows_trained_per_iteration,
            "update_passes": self.update_passes, "num_iterations_trl": self.num_iterations_trl,
            "iterations": self.iterations, "realized_rho": self.realized_rho,
            "realizable": self.realizable, "budget_utilization": self.budget_utilization,
            "last_iteration_rows": self.last_iteration_rows,
            "setup_fingerprint": self.setup_fingerprint,
            "train_prompts": self.train_prompts, "epochs": self.epochs, "plan_warning": self.warning,
        }
        out.update({f"expected_{k}": v for k, v in self.expected.to_dict().items()})
        out.update({f"per_iteration_{k}": v for k, v in self.per_iteration.executed.to_dict().items()})
        return out


def _policy(workload: Workload, allocation: Allocation) -> ModelShape:
    return workload.policy if allocation.model is None else policy_named(workload, allocation.model)


def policy_named(workload: Workload, model: str, field_name: str = "model") -> ModelShape:
    """The policy ``model`` names: one of the workload's own sizes, a preset or a local folder
    with a ``config.json``. Raises :class:`ConfigError` naming ``field_name`` and what is allowed."""
    named = workload.policies.get(model)
    if named is not None:
        return named
    try:
        return model_shape(model)
    except ConfigError as e:
        if not workload.policies:
            if field_name == "model":
                raise
            why = str(e).removeprefix(f"model={model!r}: ")  # named once, under the field given
            raise ConfigError(f"{field_name}={model!r}: {why}") from e
        raise ConfigError(f"{field_name}={model!r}: not one of this objective's policies "
                          f"({', '.join(workload.policies)}), nor a preset or a local folder with "
                          "a config.json") from e


def reward_model_of(workload: Workload, reward: str) -> ModelShape | None:
    """The reward model ``workload`` prices ``reward`` with; ``None`` for a rule-based system.
    Raises :class:`ConfigError` for a system the workload has no price for."""
    if reward in workload.rule_rewards:
        return None
    rm = workload.reward_models.get(reward)
    if rm is None:
        raise ConfigError(f"reward={reward!r}: no price for this reward system (neither rule-based "
                          "nor a reward model of the workload); declare it in the study file's "
                          "[rewards] table: kind = \"rule\", or kind = \"model\" with its model")
    return rm


@functools.lru_cache(maxsize=16384)
def iteration_flops(workload: Workload, allocation: Allocation, rows_trained: int) -> FlopAccount:
    """FLOPs of one iteration training on ``rows_trained`` rollouts in all (μ = rows / N, N
    the rows of the ``rollouts_per_iteration // G`` prompts trained). With the set-up's
    ``generated_per_trained`` > 1, ``round(prompts × generated_per_trained)`` groups are
    generated and rewarded, and the log-prob passes and updates run on the trained ones only;
    with a critic, its values and updates are learning. Memoized (workloads and allocations are frozen and hashable)."""
    G = allocation.group_size
    prompts = max(1, workload.setup.rollouts_per_iteration // G)
    N = prompts * G  # rows trained on at one pass
    # dynamic sampling / filtering: more groups generated and rewarded than trained
    generated = max(prompts, round(prompts * workload.setup.generated_per_trained))
    N_gen = generated * G
    c_mean = max(1, round(workload.setup.completion_tokens))
    eng = engine(workload.setup.engine)
    if eng.padded_generation or eng.padded_training:
        c_pad = round(workload.setup.padded_completion_tokens or workload.setup.completion_tokens)
        # one row at the padded length stands for the batch's longest; the rest at the mean
        completions = (max(1, c_pad),) + (c_mean,) * (N_gen - 1)
    else:
        completions = (c_mean,) * N_gen
    reward_model = reward_model_of(workload, allocation.reward)
    steps = workload.setup.steps_per_completion \
        if workload.reward_scoring.get(allocation.reward) == "steps" else 0
    step = GRPOStep(
        prompt_tokens=(max(1, round(workload.setup.prompt_tokens)),) * generated,
        completion_tokens=completions,
        group_size=G,
        update_passes=rows_trained / N,
        reference=workload.setup.reference,
        importance_sampling_correction=workload.setup.importance_sampling_correction,
        reward_steps=(max(0, round(steps)),) * N_gen,
        reward_last_position=workload.reward_scoring.get(allocation.reward) == "outcome",
        trained_prompts=None if generated == prompts else prompts,
    )
    critic = model_shape(workload.setup.critic) if workload.setup.critic else None
    return grpo_step_flops(_policy(workload, allocation), step, lora=workload.setup.lora,
                           gradient_checkpointing=workload.setup.gradient_checkpointing,
                           reward_model=reward_model, engine_name=eng, critic=critic)


def rows_schedule(rows_trained: float, iteration: int) -> int:
    """Rows trained at ``iteration`` (0-based) so that the first ``I`` iterations train
    ``floor(I × rows_trained)`` rows in all: ``floor((i+1)k) - floor(ik)``, each either
    ``floor(k)`` or ``floor(k) + 1`` (Bresenham's line)."""
    return math.floor((iteration + 1) * rows_trained + 1e-9) - math.floor(iteration * rows_trained + 1e-9)


def rows_for_rho(workload: Workload, allocation: Allocation) -> float:
    """Rows trained per iteration, ``k`` (a mean over iterations), that realize ``allocation.rho``.

    Whole ``k`` give the learning FLOPs ``L(k)``; a fractional ``k = k0 + q`` alternates
    iterations of ``k0`` and ``k0 + 1`` rows (:func:`rows_schedule`), so the mean learning is
    ``(1-q)·L(k0) + q·L(k0+1)`` while search and reward stay fixed. ρ = L/(S+R+L) gives
    ``L* = ρ/(1-ρ)·(S+R)``; ``k0`` is found by :func:`allocopt.plan.meter.largest_fitting` (``L(k)``
    increases with k and is affine in it between the jump where a second pass adds the
    old-policy pass: a few pricings) and ``q`` by linear interpolation. Range: ``k`` in
    [0, 64·N] (up to 64 passes).
    """
    G = allocation.group_size
    N = max(1, workload.setup.rollouts_per_iteration // G) * G
    flops = lambda k: iteration_flops(workload, allocation, k).executed  # noqa: E731
    base = flops(0)
    fixed = base.search_flops + base.reward_flops
    target = allocation.rho / (1 - allocation.rho) * fixed  # learning FLOPs per iteration
    if flops(0).learning_flops >= target:
        return 0.0
    lo, hi = 0, 64 * N
    if flops(hi).learning_flops <= target:
        return float(hi)
    # the largest k with L(k) < target (L in whole FLOPs): L(lo) < target <= L(lo + 1)
    lo = largest_fitting(lambda k: flops(k).learning_flops, lo, hi, math.ceil(target) - 1)
    assert lo is not None and lo < hi  # L(0) < target < L(hi)
    hi = lo + 1
    L0, L1 = flops(lo).learning_flops, flops(hi).learning_flops
    return lo + (target - L0) / (L1 - L0)


def expected_flops(workload: Workload, allocation: Allocation, rows_trained: float,
                   iterations: int, last_rows: int | None = None) -> FlopAccount:
    """Exact FLOPs of ``iterations`` iterations following :func:`rows_schedule`; with
    ``last_rows``, the last of them trains that many rows instead (a cut last iteration)."""
    if last_rows is not None and iterations >= 1:
        return expected_flops(workload, allocation, rows_trained, iterations - 1) \
            + iteration_flops(workload, allocation, last_rows)
    k0 = math.floor(rows_trained + 1e-9)
    # Σ_{i<I} rows_schedule(k, i) telescopes to floor(I·k): the iterations at k0 + 1 rows
    n_hi = math.floor(iterations * rows_trained + 1e-9) - iterations * k0
    acct = iteration_flops(workload, allocation, k0) * (iterations - n_hi)
    if n_hi:
        acct = acct + iteration_flops(workload, allocation, k0 + 1) * n_hi
    return acct


def max_iterations(budget_flops: float, workload: Workload, allocation: Allocation,
                   rows_trained: float) -> int:
    """The most iterations whose exact executed FLOPs (:func:`expected_flops`) fit in
    ``budget_flops``; 0 when not even one does.

    ``expected_flops`` grows with the iteration count (every iteration costs > 0), so the
    answer is found by bisection between 0 and an upper bound from the mean cost of 64
    iterations, doubled until it is over the budget: O(log(budget)) evaluations, so a budget
    of 1e30 FLOPs answers at once.
    """
    def fits(n: int) -> bool:
        return expected_flops(workload, allocation, rows_trained, n).executed.total_flops <= budget_flops

    mean_cost = expected_flops(workload, allocation, rows_trained, 64).executed.total_flops / 64
    hi = int(budget_flops // mean_cost) + 1
    while fits(hi):
        hi *= 2
    lo = 0  # invariant: fits(lo) (0 iterations cost 0), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ----------------------------------------------------------------------------- the plan a budget buys

LAST_ROWS_SHARE = 0.5
"""Least share of its scheduled rows the last iteration of a plan (or of a run, in the driver)
may train when all of them do not fit the budget (:func:`min_last_rows`): a cut deeper than
this would move the run's ρ too far from the plan's (at ρ = 0.9, a run of 4 iterations whose
last trains half its rows realizes 0.89)."""

MAX_UNUSED_SHARE = 0.03
"""A plan at the workload's batch that leaves more than this share of its budget unspent (or
does not realize its ρ) is compared with plans at smaller batches (:func:`make_plan`)."""

REBATCH_CANDIDATES = 6
"""Smaller batches :func:`make_plan` prices exactly, the ones whose whole iterations are
estimated (cost proportional to the batch) to use the most; each costs one plan."""


def min_last_rows(rows: int) -> int:
    """Fewest rows an iteration scheduled to train ``rows`` may train when it is cut to fit
    the budget: ``ceil(LAST_ROWS_SHARE × rows)``."""
    return math.ceil(LAST_ROWS_SHARE * rows - 1e-9)


def batch_workload(workload: Workload, rollouts_per_iteration: int) -> Workload:
    """``workload`` at another batch: what a plan that runs ``rollouts_per_iteration``
    completions per iteration (:attr:`TrialPlan.rollouts_per_iteration`) is priced on."""
    if rollouts_per_iteration == workload.setup.rollouts_per_iteration:
        return workload
    return replace(workload, setup=replace(workload.setup, rollouts_per_iteration=rollouts_per_iteration))


def plan_workload(workload: Workload, plan: "TrialPlan") -> Workload:
    """The workload ``plan`` was priced on: ``workload`` at the plan's batch."""
    return batch_workload(workload, plan.rollouts_per_iteration)


def _plan_at(budget: float, allocation: Allocation, workload: Workload) -> TrialPlan:
    """The plan at ``workload``'s batch: the most whole iterations that fit, then a last one
    cut to the most rows that fit, when at least :func:`min_last_rows` of its schedule do."""
    G = allocation.group_size
    prompts = max(1, workload.setup.rollouts_per_iteration // G)
    N = prompts * G
    k = rows_for_rho(workload, allocation)
    iterations = max_iterations(budget, workload, allocation, k)
    if iterations < 1:
        need = iteration_flops(workload, allocation, rows_schedule(k, 0)).executed.total_flops
        raise InfeasiblePlan(
            f"budget_flops={budget:.3g}: too small for one GRPO iteration at rho={allocation.rho}, "
            f"group_size={G}, reward={allocation.reward} ({N} rollouts); the smallest feasible "
            f"plan needs {need:.3g} FLOPs", min_budget_flops=need)
    expected = expected_flops(workload, allocation, k, iterations)
    rows = rows_schedule(k, iterations)  # the next iteration's rows: they do not fit
    last = None
    if rows > min_last_rows(rows):
        last = largest_fitting(
            lambda r: iteration_flops(workload, allocation, r).executed.total_flops,
            min_last_rows(rows), rows - 1, budget - expected.executed.total_flops)
    if last is not None:
        expected = expected + iteration_flops(workload, allocation, last)
        iterations += 1
    realized = expected.executed.rho
    rm = reward_model_of(workload, allocation.reward)
    return TrialPlan(
        allocation=allocation, budget_flops=budget, policy=_policy(workload, allocation).name,
        reward_model=rm.name if rm else None, group_size=G, prompts_per_iteration=prompts,
        rollouts_per_iteration=N, rows_trained_per_iteration=k, update_passes=k / N,
        num_iterations_trl=max(1, math.ceil(k / N - 1e-9)), iterations=iterations,
        per_iteration=expected * (1 / iterations), expected=expected, realized_rho=realized,
        realizable=abs(realized - allocation.rho) <= RHO_TOLERANCE, last_iteration_rows=last,
        setup_fingerprint=workload.fingerprint(allocation),
        setup=workload.setup if allocation.model is None else replace(workload.setup, model=allocation.model),
        train_prompts=workload.setup.train_prompts)


def min_prompts(workload: Workload, group_size: int) -> int:
    """Fewest prompts per iteration a plan at ``group_size`` may run:
    ``ceil(min_batch_share × prompts)`` of the workload's ``rollouts_per_iteration // G``."""
    prompts = max(1, workload.setup.rollouts_per_iteration // group_size)
    return max(1, math.ceil(workload.setup.min_batch_share * prompts - 1e-9))


def _merit(use: float, rho_error: float, realizable: bool = True) -> tuple:
    """How :func:`make_plan` ranks plans (larger is better): realizable first; then those
    spending at least ``1 - MAX_UNUSED_SHARE`` of the budget, by how near ρ they come (a cut
    last iteration lowers ρ: with the budget spent, ρ is set by the number of iterations);
    the others by their use."""
    full = use >= 1 - MAX_UNUSED_SHARE
    return (realizable, full, -rho_error if full else use)


def batch_candidates(budget_flops: float, allocation: Allocation, workload: Workload) -> list[int]:
    """Prompts per iteration below the workload's that :func:`make_plan` prices: the
    :data:`REBATCH_CANDIDATES` of ``min_prompts .. prompts - 1`` estimated best by
    :func:`_merit`, the best first (the larger batch among equals).

    The estimate takes an iteration's cost proportional to its prompts (the first iteration's
    at the workload's batch, per prompt) with the share ρ of it learning: the whole iterations
    that fit, plus the rest of the budget when a last iteration cut to :data:`LAST_ROWS_SHARE`
    of its rows would fit in it (its search and reward, the share 1 - ρ of a whole iteration,
    then lower the realized ρ)."""
    G = allocation.group_size
    p0 = max(1, workload.setup.rollouts_per_iteration // G)
    k = rows_for_rho(workload, allocation)
    per_prompt = iteration_flops(workload, allocation, rows_schedule(k, 0)).executed.total_flops / p0
    rho = allocation.rho

    def estimate(p: int) -> tuple:
        cost = per_prompt * p
        n = math.floor(budget_flops / cost)
        left = budget_flops - n * cost
        if n == 0:
            return (False, False, 0.0)
        if left < (1 - LAST_ROWS_SHARE * rho) * cost:  # no cut iteration fits
            return _merit(n * cost / budget_flops, 0.0)
        return _merit(1.0, abs(1 - (n + 1) * (1 - rho) * cost / budget_flops - rho))

    est = {p: estimate(p) for p in range(min_prompts(workload, G), p0)}
    return sorted((p for p in est if est[p][0]), key=lambda p: (est[p], p), reverse=True)[:REBATCH_CANDIDATES]


def steps_batch(budget_flops: float, allocation: Allocation, workload: Workload) -> int:
    """Prompts per iteration at which ``budget_flops`` buys about the set-up's
    :attr:`~allocopt.plan.setup.TrainingSetup.target_steps` iterations (the batch follows the
    budget), within the set-up's batch range.

    The rule, as public recipes set it: a GRPO run fixes its number of steps (a few hundred to
    a couple of thousand) and a batch of a few hundred prompts, and a larger budget buys a larger
    batch rather than ever more steps over the same small batch (verl's DAPO recipe: 512 prompts
    x 16 completions per step, 1 epoch; DeepSeekMath's GRPO: 1,024 x 64; TRL's ``GRPOConfig``
    trains ``num_train_epochs`` passes over its prompts at whatever batch the devices give).
    With ``p0`` the set-up's prompts (``rollouts_per_iteration // G``) and ``c`` the mean
    executed FLOPs of one prompt's share of an iteration at ``p0`` (search + reward + learning
    at the ρ's update passes; the iteration cost is proportional to its rows):

    * ``target_steps`` off, or ``budget / (c·p0) <= target_steps``: ``p0`` (a small budget
      keeps the set-up's batch; the tiny world and every test budget stay as they were);
    * else ``min(ceil(budget / (c · target_steps)), largest_rollouts_per_iteration // G)``.

    Returns:
        prompts per iteration (>= ``p0``). Raises :class:`ConfigError` for a workload without a
        model-based reward's model.
    """
    G = allocation.group_size
    p0 = max(1, workload.setup.rollouts_per_iteration // G)
    steps = workload.setup.target_steps
    if steps is None:
        return p0
    k = rows_for_rho(workload, allocation)
    cost = expected_flops(workload, allocation, k, 64).executed.total_flops / 64  # mean iteration at p0
    if budget_flops / cost <= steps:
        return p0
    most = max(p0, workload.setup.largest_rollouts_per_iteration // G)
    return min(most, max(p0, math.ceil(budget_flops / (cost / p0 * steps))))


def make_plan(budget_flops: float, allocation: Allocation, workload: Workload) -> TrialPlan:
    """The training plan ``budget_flops`` buys at ``allocation``.

    The batch starts at :func:`steps_batch` (the set-up's, or larger so that a large budget
    buys about ``target_steps`` iterations). At that batch: the most whole iterations that fit, and a last one cut to the
    most rows that fit (at least :func:`min_last_rows` of its schedule). When that plan leaves
    more than :data:`MAX_UNUSED_SHARE` of the budget unspent, misses ρ by more than half of
    :data:`RHO_TOLERANCE`, or does not exist (the budget is below one iteration), the plans at
    the smaller batches of :func:`batch_candidates` are priced too, and the best by
    :func:`_merit` is returned (realizable; then, among those that spend the budget, the one
    nearest ρ, else the one that spends the most; the larger batch among equals). The driver
    runs the plan's batch and cuts its last iteration by the same rule.

    Returns:
        a :class:`TrialPlan` whose expected executed total is at most ``budget_flops``.

    Raises:
        ConfigError: a bad budget or allocation (message names the field).
        InfeasiblePlan: the budget is below one iteration at the smallest batch allowed
            (:func:`min_prompts`); ``min_budget_flops`` says how much the smallest feasible
            plan of this allocation needs (:func:`min_budget`).
    """
    budget = check_budget(budget_flops)
    prompts_for_steps = steps_batch(budget, allocation, workload)
    if prompts_for_steps > max(1, workload.setup.rollouts_per_iteration // allocation.group_size):
        workload = batch_workload(workload, prompts_for_steps * allocation.group_size)

    def merit(plan: TrialPlan) -> tuple:
        return _merit(plan.budget_utilization, abs(plan.realized_rho - allocation.rho), plan.realizable)

    try:
        best: TrialPlan | None = _plan_at(budget, allocation, workload)
    except InfeasiblePlan as e:
        best, refusal = None, e
    if best is not None and merit(best) >= _merit(1 - MAX_UNUSED_SHARE, RHO_TOLERANCE / 2):
        return best  # spends the budget and realizes rho closely: the workload's batch
    candidates = batch_candidates(budget, allocation, workload)
    least = min_prompts(workload, allocation.group_size)
    if best is None and least < max(1, workload.setup.rollouts_per_iteration // allocation.group_size) \
            and least not in candidates:
        candidates.append(least)  # the cheapest iteration, when the estimates say none fits
    for prompts in candidates:
        try:
            plan = _plan_at(budget, allocation, batch_workload(workload, prompts * allocation.group_size))
        except InfeasiblePlan:
            continue
        if best is None or merit(plan) > merit(best):
            best = plan
    if best is None:
        G = allocation.group_size
        need = min_budget(allocation, workload)
        raise InfeasiblePlan(
            f"budget_flops={budget:.3g}: too small for one GRPO iteration at rho={allocation.rho}, "
            f"group_size={G}, reward={allocation.reward} ({min_prompts(workload, G) * G} rollouts, "
            f"the smallest batch allowed); the smallest feasible plan needs {need:.3g} FLOPs",
            min_budget_flops=need) from refusal
    return best


def min_budget(allocation: Allocation, workload: Workload) -> int:
    """Executed FLOPs of the first iteration at ``allocation`` and the smallest batch a plan
    may run (:func:`min_prompts`): the smallest feasible budget."""
    w = batch_workload(workload, min_prompts(workload, allocation.group_size) * allocation.group_size)
    k = rows_for_rho(w, allocation)
    return iteration_flops(w, allocation, rows_schedule(k, 0)).executed.total_flops


__all__ = ["LAST_ROWS_SHARE", "MAX_UNUSED_SHARE", "REBATCH_CANDIDATES", "batch_candidates", "batch_workload",
           "make_plan", "min_budget", "min_last_rows", "min_prompts", "plan_workload"]


__all__ = ["Allocation", "InfeasiblePlan", "MODEL_BASED", "REWARDS", "RHO_TOLERANCE", "RULE_BASED",
           "TrialPlan", "Workload", "MAX_EPOCHS", "policy_named", "reward_model_of", "steps_batch", "check_budget", "default_reward_models", "iteration_flops",
           "expected_flops", "max_iterations", "rows_for_rho", "rows_schedule", "LAST_ROWS_SHARE", "MAX_UNUSED_SHARE", "REBATCH_CANDIDATES", "batch_candidates",
           "batch_workload", "make_plan", "min_budget", "min_last_rows", "min_prompts", "plan_workload"]
