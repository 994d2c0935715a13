"""From an allocation and a FLOP budget to a runnable GRPO training plan.

Standard library only. An :class:`Allocation` says *how* to split compute (update fraction
ρ, group size G, reward system); a :class:`Workload` says *what* is trained: the policy's
shape, the :class:`~allocopt.setup.TrainingSetup` (rollout batch, expected token lengths,
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

How the budget is used up (a cut last iteration, a smaller batch): :mod:`allocopt.planning`,
where :func:`make_plan` lives (importable from here too).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

from allocopt.flops import ConfigError, FlopAccount, ModelShape
from allocopt.grpo_flops import GRPOStep, engine, grpo_step_flops
from allocopt.meter import largest_fitting
from allocopt.setup import MAX_ROLLOUTS_PER_ITERATION, TrainingSetup

REWARDS: tuple[str, ...] = ("sparse", "structured", "dense", "proxy_prm", "prm")
"""Reward systems: three rule-based (0 FLOPs), two model-based."""
RULE_BASED: frozenset[str] = frozenset({"sparse", "structured", "dense"})
MODEL_BASED: frozenset[str] = frozenset({"proxy_prm", "prm"})

RHO_TOLERANCE = 0.01
"""A plan is *realizable* when its ρ is within this of the asked ρ."""

class FrozenMap(dict):
    """A dict that is hashable (by its sorted items), so frozen configs holding one are too.
    Do not mutate it."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


class InfeasiblePlan(ValueError):
    """The budget cannot buy one iteration of this allocation (message gives the minimum)."""

    def __init__(self, message: str, min_budget_flops: int):
        super().__init__(message)
        self.min_budget_flops = min_budget_flops


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
    """Reward system, one of :data:`REWARDS`."""
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
        if self.reward not in REWARDS:
            raise ConfigError(f"reward={self.reward!r}: unknown reward system; allowed: "
                              f"{', '.join(REWARDS)}")


def default_reward_models() -> dict[str, ModelShape]:
    """Reward-model shape per model-based reward system when a workload names none: the
    ``prm`` Qwen2.5-Math-PRM-7B, the ``proxy_prm`` a 1.5B-size step scorer with a score head."""
    return {"prm": ModelShape.preset("Qwen/Qwen2.5-Math-PRM-7B"),
            "proxy_prm": ModelShape(**{**asdict(ModelShape.preset("Qwen/Qwen2.5-1.5B")),
                                       "name": "proxy-prm-1.5b", "head": "score"})}


_READ_THROUGH = frozenset(f.name for f in fields(TrainingSetup)) | {"lora", "reference"}


@dataclass(frozen=True)
class Workload:
    """What one trial trains and how: everything but the allocation.

    The set-up's fields read through: ``workload.completion_tokens`` is
    ``workload.setup.completion_tokens`` (and so on for every :class:`TrainingSetup` field,
    ``lora`` and ``reference``); none is repeated here, so a default ``Workload(policy)``
    prices the default ``TrainingSetup()``. Derived workloads: :meth:`with_setup`.
    """

    policy: ModelShape
    """The policy model's shape."""
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    """The training set-up plans are priced on and the driver runs."""
    reward_models: Mapping[str, ModelShape] = field(default_factory=default_reward_models)
    """Reward-model shape per model-based reward system (:func:`default_reward_models`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.setup, TrainingSetup):
            raise ConfigError(f"setup={self.setup!r}: must be a TrainingSetup")
        object.__setattr__(self, "reward_models", FrozenMap(self.reward_models))

    def __getattr__(self, name: str) -> Any:  # only for names not found on the workload itself
        if name in _READ_THROUGH:
            return getattr(self.setup, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def with_setup(self, **changes: Any) -> "Workload":
        """This workload with set-up fields changed (the generation limit and the runner's
        defaults stay as they were resolved unless given). Raises :class:`ConfigError` for an
        unknown field or a bad value, naming it."""
        return replace(self, setup=TrainingSetup.from_mapping({**self.setup.to_dict(), **changes}))

    def fingerprint(self, allocation: "Allocation | None" = None) -> str:
        """:func:`~allocopt.setup.setup_fingerprint` of what :func:`make_plan` prices for
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
    """:func:`~allocopt.setup.setup_fingerprint` of what the plan priced (policy shape, LoRA,
    engine, checkpointing, reference pass, generation limit); the driver refuses to run a plan
    whose fingerprint differs from what it is about to run."""
    setup: TrainingSetup | None = None
    """The set-up the plan priced (``model``: the allocation's when it names one), so that the
    driver can name the fields where what it would run differs (``None``: not recorded)."""

    @property
    def budget_utilization(self) -> float:
        return self.expected.executed.total_flops / self.budget_flops

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
        }
        out.update({f"expected_{k}": v for k, v in self.expected.to_dict().items()})
        out.update({f"per_iteration_{k}": v for k, v in self.per_iteration.executed.to_dict().items()})
        return out


def _policy(workload: Workload, allocation: Allocation) -> ModelShape:
    return workload.policy if allocation.model is None else ModelShape.from_pretrained(allocation.model)


@functools.lru_cache(maxsize=16384)
def iteration_flops(workload: Workload, allocation: Allocation, rows_trained: int) -> FlopAccount:
    """FLOPs of one iteration training on ``rows_trained`` rollouts in all (μ = rows / N).
    Memoized (workloads and allocations are frozen and hashable)."""
    G = allocation.group_size
    prompts = max(1, workload.rollouts_per_iteration // G)
    N = prompts * G
    c_mean = max(1, round(workload.completion_tokens))
    eng = engine(workload.engine)
    if eng.padded_generation or eng.padded_training:
        c_pad = round(workload.padded_completion_tokens or workload.completion_tokens)
        # one row at the padded length stands for the batch's longest; the rest at the mean
        completions = (max(1, c_pad),) + (c_mean,) * (N - 1)
    else:
        completions = (c_mean,) * N
    reward_model = workload.reward_models.get(allocation.reward) \
        if allocation.reward in MODEL_BASED else None
    if allocation.reward in MODEL_BASED and reward_model is None:
        raise ConfigError(f"reward={allocation.reward!r}: the workload names no reward model for it")
    step = GRPOStep(
        prompt_tokens=(max(1, round(workload.prompt_tokens)),) * prompts,
        completion_tokens=completions,
        group_size=G,
        update_passes=rows_trained / N,
        reference=workload.reference,
        importance_sampling_correction=workload.importance_sampling_correction,
        reward_steps=(max(0, round(workload.steps_per_completion)),) * N,
    )
    return grpo_step_flops(_policy(workload, allocation), step, lora=workload.lora,
                           gradient_checkpointing=workload.gradient_checkpointing,
                           reward_model=reward_model, engine_name=eng)


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
    ``L* = ρ/(1-ρ)·(S+R)``; ``k0`` is found by :func:`allocopt.meter.largest_fitting` (``L(k)``
    increases with k and is affine in it between the jump where a second pass adds the
    old-policy pass: a few pricings) and ``q`` by linear interpolation. Range: ``k`` in
    [0, 64·N] (up to 64 passes).
    """
    G = allocation.group_size
    N = max(1, workload.rollouts_per_iteration // G) * G
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


_PLANNING = frozenset({"LAST_ROWS_SHARE", "MAX_UNUSED_SHARE", "REBATCH_CANDIDATES", "batch_candidates",
                       "batch_workload", "make_plan", "min_budget", "min_last_rows", "min_prompts",
                       "plan_workload"})


def __getattr__(name: str) -> Any:
    """``make_plan`` and the rest of :mod:`allocopt.planning` read from here too (PEP 562: a
    lazy re-export, so the two modules import without a cycle)."""
    if name in _PLANNING:
        from allocopt import planning

        return getattr(planning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Allocation", "InfeasiblePlan", "MODEL_BASED", "REWARDS", "RHO_TOLERANCE", "RULE_BASED",
           "TrialPlan", "Workload", "check_budget", "default_reward_models", "iteration_flops",
           "expected_flops", "max_iterations", "rows_for_rho", "rows_schedule", *sorted(_PLANNING)]
