"""A synthetic objective: a closed-form *test function* of the allocation, not a prediction.

Use it to test and benchmark the tuner (milliseconds per trial). It is shaped after the
paper's reported optima (Wilhelm & Kao 2026: ρ ≈ 0.72 for rule-based rewards, ρ ≈ 0.45 for
PRM-style rewards) but says nothing about real training: the variants below are made-up
shapes that exercise a tuner (easy, hard, sharp, one more dimension), not claims about how
model size, reward systems or budgets behave. Feasibility and compute breakdowns are the real
ones: every trial goes through :func:`allocopt.plan.allocation.make_plan`, and the "spent" FLOPs are
the plan's expected FLOPs.

Response of the default variant ``paper``, for target ``t`` at allocation (ρ, G, reward) and
budget ``B``::

    score = base(reward) + 0.25 · exp(-((ρ - ρ*)/0.18)²) + 0.04 · (1 - ((log2 G - 3)/2)²) + noise
    ρ*    = 0.72 - 0.27 · c(reward) + shift(t) + 0.03 · log10(B / B_ref)

* ``c(reward)``: the reward system's cost factor (0 rule-based, 0.5 proxy_prm, 1 prm), so
  ρ* = 0.72 for rule-based and 0.45 for prm at ``B_ref`` and target ``pass@1``;
* ``shift``: ``native_reward`` +0.06, ``pass@1`` 0, ``judge`` -0.08 (targets disagree);
* ``base``: sparse 0.30, structured 0.32, dense 0.33, proxy_prm 0.34, prm 0.36;
* the G term peaks at G = 8 (``log2 G = 3``);
* ``B_ref = 1e19``: the optimum drifts by +0.03 per decade of budget, so pilots at a fraction
  of the budget are informative but biased;
* ``noise``: Gaussian, σ = ``noise`` (default 0.01), seeded by (seed, allocation); the
  reported target is clipped to [0, 1].

Known optimum per target (noise-free): the reward with the highest ``base`` + peak (``prm``),
at ρ = ρ*(prm, t, B) and G = 8: score = 0.36 + 0.25 + 0.04 = 0.65.

Variants (:data:`VARIANTS`, selected by name: ``SyntheticObjective(variant=...)``,
``response(..., variant=...)``). Every variant keeps the form above; they change the
ρ-peak's height ``h`` and width ``w`` and, for ``model-size``, add the policy model::

    score = base(reward) + h · exp(-((ρ - ρ*)/w)²) + 0.04 · (1 - ((log2 G - 3)/2)²)
            + size(N, B) + noise
    ρ*    = 0.72 - 0.27 · c(reward) + shift(t) + 0.03 · log10(B / B_ref) - k · x,
    x     = log2(N / 1.5e9),   N = the policy's parameters (ModelShape.num_params)
    size  = s · (1 - ((x - x*(B)) / 1.5)²),   x*(B) = 1 + 0.5 · log10(B / B_ref)

============  ======  ======  =====  =====  =================================================
variant       h       w       k      s      what it exercises
============  ======  ======  =====  =====  =================================================
paper         0.25    0.18    0      0      the default; a broad peak in ρ, G peak at 8
model-size    0.25    0.18    0.06   0.05   larger models favour more search (ρ* falls 0.06
                                            per doubling); the level peaks at x*(B), about
                                            3B at ``B_ref`` and larger at larger budgets
flat          0.03    0.45    0      0      weak ρ dependence (3 noise σ over the whole ρ
                                            range): the hard case; reward and G dominate
narrow        0.25    0.05    0      0      a sharp ρ peak: a 0.1-spaced ρ grid misses it by
                                            up to 0.05 (a loss of 0.16)
============  ======  ======  =====  =====  =================================================

Three variants stress what the first four share (each keeps ``paper``'s h, w, k, s)::

    score += bonus(r, B),   bonus(r, B) = a_r · (1 + log10(B / B_ref))      (rank-flip)
    ρ*    += kg · (log2 G - 3)                                                 (rho-by-g)
    σ      = noise · noise_factor                                              (noisy)

============  =================================================================================
variant       what it exercises
============  =================================================================================
rank-flip     pilots rank the reward systems differently from the full budget: a_dense = +0.05,
              a_prm = -0.03 (0 at a tenth of B_ref, where pilots run). At 10 % of B_ref the best
              cells are prm 0.65 > proxy_prm 0.63 > dense 0.62; at B_ref dense 0.67 > proxy_prm
              0.63 > prm 0.62: a tuner that trusts the pilots' ranking loses 0.05 (13.5 %)
rho-by-g      the best ρ depends on G: kg = 0.1 (ρ* of prm for pass@1: 0.25, 0.35, 0.45, 0.55
              at G = 2, 4, 8, 16); the G term still peaks at 8 (G = 4 or 16 lose 0.01)
noisy         noise_factor 2: σ = 0.02 with the objective's default noise, twice ``paper``'s
============  =================================================================================

The variants' default search spaces (:func:`space_of`): ρ in [0.2, 0.9], G in {2, 4, 8, 16}, all
five reward systems; ``model-size`` adds the models Qwen2.5-1.5B, -3B and -7B (x ≈ 0.04,
1.04, 2.34).

Known optima at ``B_ref`` over those spaces (noise-free; :func:`optimum` gives them exactly for
any target, budget and space: the response is a sum of a reward(× model) term, a unimodal ρ
bump and a G term, so each reward(× model) is best at ρ* clamped to the ρ range and at the G
closest to 8 in log2 G, and the overall optimum is the best of these)::

    variant     best reward  G  model  ρ*: native_reward  pass@1  judge   score
    paper       prm          8  -                0.51     0.45    0.37    0.65
    model-size  prm          8  3B               0.4476   0.3876  0.3076  0.69996
    flat        prm          8  -                0.51     0.45    0.37    0.43
    narrow      prm          8  -                0.51     0.45    0.37    0.65
    rank-flip   dense        8  -                0.78     0.72    0.64    0.67
    rho-by-g    prm          8  -                0.51     0.45    0.37    0.65
    noisy       prm          8  -                0.51     0.45    0.37    0.65

(model-size at 3B, x = 1.0407: ρ* = 0.45 + shift(t) − 0.06 · 1.0407, i.e. 0.3876 for pass@1;
its score is 0.65 + 0.05 · (1 − (0.0407 / 1.5)²) = 0.69996. Regrets of a benchmark are quoted
in % of the target's range over the space, :attr:`Optimum.range`: about 0.35 for paper and
narrow, 0.39 for model-size, 0.12 for flat.)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from allocopt.plan.setup import TrainingSetup
from allocopt.plan.allocation import REWARDS, Allocation, TrialPlan, Workload
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.hub import model_shape
from allocopt.objective import TrialResult
from allocopt.spec import SearchSpace
from objectives import COMMON_TARGETS

B_REF = 1e19
REWARD_COST = {"sparse": 0.0, "structured": 0.0, "dense": 0.0, "proxy_prm": 0.5, "prm": 1.0}
BASE = {"sparse": 0.30, "structured": 0.32, "dense": 0.33, "proxy_prm": 0.34, "prm": 0.36}
SHIFT = dict(zip(COMMON_TARGETS, (0.06, 0.0, -0.08)))
"""``shift(t)`` by target key: ``native_reward`` +0.06, ``pass_at_1`` 0, ``judge`` -0.08."""
DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"
SIZE_MODELS = ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-7B")
"""Models of the ``model-size`` variant's search space."""
G_HEIGHT = 0.04


@dataclass(frozen=True)
class Variant:
    """One member of the synthetic family (see the module docstring's table)."""

    name: str
    peak_height: float = 0.25
    """``h``: height of the ρ bump (target units)."""
    peak_width: float = 0.18
    """``w``: width of the ρ bump (ρ units; the bump falls to 1/e at ρ* ± w)."""
    size_rho_slope: float = 0.0
    """``k``: fall of ρ* per doubling of the policy's parameters over 1.5e9."""
    size_height: float = 0.0
    """``s``: height of the model-size term (0: the model does not matter)."""
    rho_g_slope: float = 0.0
    """``kg``: shift of ρ* per doubling of G above 8 (0: the best ρ does not depend on G)."""
    noise_factor: float = 1.0
    """Multiplies the objective's noise σ (``noisy``: 2, twice the ``paper`` variant's)."""
    reward_budget_bonus: tuple[tuple[str, float], ...] = ()
    """``a_r`` per reward system: ``bonus(r, B) = a_r · (1 + log10(B / B_ref))`` is added to the
    level, 0 at a tenth of ``B_ref`` (the pilots' budget) and ``a_r`` at ``B_ref``: pilots at 10 %
    rank the reward systems differently from the full budget (``rank-flip``)."""

    def bonus(self, reward: str, budget_flops: float) -> float:
        """``a_r · (1 + log10(B / B_ref))`` (0 for reward systems without one)."""
        a = dict(self.reward_budget_bonus).get(reward, 0.0)
        return a * (1.0 + math.log10(budget_flops / B_REF)) if a else 0.0

    @property
    def uses_model(self) -> bool:
        return self.size_rho_slope != 0.0 or self.size_height != 0.0


VARIANTS: dict[str, Variant] = {
    "paper": Variant("paper"),
    "model-size": Variant("model-size", size_rho_slope=0.06, size_height=0.05),
    "flat": Variant("flat", peak_height=0.03, peak_width=0.45),
    "narrow": Variant("narrow", peak_width=0.05),
    "rank-flip": Variant("rank-flip", reward_budget_bonus=(("dense", 0.05), ("prm", -0.03))),
    "noisy": Variant("noisy", noise_factor=2.0),
    "rho-by-g": Variant("rho-by-g", rho_g_slope=0.1),
}
"""The synthetic family by name."""


def get_variant(name: str | Variant) -> Variant:
    """A variant by name. Raises :class:`ConfigError` naming the allowed ones."""
    if isinstance(name, Variant):
        return name
    if name not in VARIANTS:
        raise ConfigError(f"variant={name!r}: unknown synthetic variant; allowed: {', '.join(VARIANTS)}")
    return VARIANTS[name]


@lru_cache(maxsize=64)
def size_x(model: str | None) -> float:
    """``x = log2(N / 1.5e9)`` of a model (``None``: :data:`DEFAULT_MODEL`), N its parameters."""
    return math.log2(model_shape(model or DEFAULT_MODEL).num_params() / 1.5e9)


def _target(target: str) -> str:
    t = target.replace("@", "_at_").replace(":", "_")
    if t not in SHIFT:
        raise ConfigError(f"target={target!r}: the synthetic objective reports {', '.join(SHIFT)}")
    return t


def rho_star(reward: str, target: str = "pass_at_1", budget_flops: float = B_REF, *,
             variant: str | Variant = "paper", model: str | None = None, group_size: int = 8) -> float:
    """The optimal ρ of the synthetic response (see the module docstring); unclamped.
    ``group_size`` matters for variants with ``rho_g_slope`` only (``rho-by-g``)."""
    v = get_variant(variant)
    r = 0.72 - 0.27 * REWARD_COST[reward] + SHIFT[_target(target)] + 0.03 * math.log10(budget_flops / B_REF)
    if v.rho_g_slope:
        r += v.rho_g_slope * (math.log2(group_size) - 3)
    return r - v.size_rho_slope * size_x(model) if v.size_rho_slope else r


def size_term(model: str | None, budget_flops: float = B_REF, *, variant: str | Variant = "paper") -> float:
    """The model-size term ``s · (1 - ((x - x*(B)) / 1.5)²)`` (0 for variants without one)."""
    v = get_variant(variant)
    if not v.size_height:
        return 0.0
    x_best = 1.0 + 0.5 * math.log10(budget_flops / B_REF)
    return v.size_height * (1 - ((size_x(model) - x_best) / 1.5) ** 2)


def g_term(group_size: int) -> float:
    """``0.04 · (1 - ((log2 G - 3)/2)²)``: peaks at G = 8."""
    return G_HEIGHT * (1 - ((math.log2(group_size) - 3) / 2) ** 2)


def response(rho: float, group_size: int, reward: str, target: str = "pass_at_1",
             budget_flops: float = B_REF, *, variant: str | Variant = "paper",
             model: str | None = None) -> float:
    """Noise-free synthetic score (target units; in [0, 1] over the documented spaces)."""
    v = get_variant(variant)
    star = rho_star(reward, target, budget_flops, variant=v, model=model, group_size=group_size)
    peak = v.peak_height * math.exp(-((rho - star) / v.peak_width) ** 2)
    out = BASE[reward] + v.bonus(reward, budget_flops) + peak + g_term(group_size)
    return out + size_term(model, budget_flops, variant=v) if v.size_height else out


def observe(rho: float, group_size: int, reward: str, budget_flops: float = B_REF, *,
            variant: str | Variant = "paper", model: str | None = None, seed: int = 0,
            noise: float = 0.01) -> dict[str, float]:
    """Noisy scores of every target of one run, clipped to [0, 1].

    The noise is Gaussian (σ = ``noise``), drawn once per target in the order of
    :data:`SHIFT` from a generator seeded by ``(seed, ρ, G, reward[, model])``: the same run
    gives the same scores, another seed other ones.
    """
    v = get_variant(variant)
    model = model if v.uses_model else None  # the key (and score) of other variants ignore it
    key = f"{seed}|{rho:.6f}|{group_size}|{reward}" + (f"|{model}" if model else "")
    rng = random.Random(key)
    sd = noise * v.noise_factor
    return {t: min(1.0, max(0.0, response(rho, group_size, reward, t, budget_flops, variant=v,
                                          model=model) + rng.gauss(0.0, sd)))
            for t in SHIFT}


def space_of(name: str | Variant = "paper") -> SearchSpace:
    """The documented search space of a variant (module docstring)."""
    v = get_variant(name)
    return SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 4, 8, 16), rewards=REWARDS,
                       models=SIZE_MODELS if v.uses_model else ())


@dataclass(frozen=True)
class Optimum:
    """The exact optimum (and worst value) of a variant over a search space."""

    allocation: Allocation
    """The best allocation (``model`` set when the space names models)."""
    value: float
    """Noise-free score at the optimum (target units)."""
    worst: float
    """Noise-free score at the worst allocation of the space."""

    @property
    def range(self) -> float:
        """``value - worst``: the target's range over the space (regrets are quoted in % of it)."""
        return self.value - self.worst


def optimum(target: str = "pass_at_1", budget_flops: float = B_REF, space: SearchSpace | None = None,
            *, variant: str | Variant = "paper") -> Optimum:
    """The exact optimum of the noise-free response over ``space`` (default: :func:`space_of`).

    Closed form: per reward system (× model) and G the score is a constant plus a unimodal bump
    in ρ, so its best ρ is ρ* (of that G) clamped to the range and its worst ρ the end of the
    range farther from ρ*; the optimum is the best over reward systems (× models) and G, the
    worst the least of the worst values.
    """
    v = get_variant(variant)
    space = space or space_of(v)
    t = _target(target)
    lo, hi = space.rho
    best, worst = None, math.inf
    for m in (space.models or (None,)):
        for r in space.rewards:
            for g in space.group_sizes:
                star = rho_star(r, t, budget_flops, variant=v, model=m, group_size=g)
                rho = min(max(star, lo), hi)
                val = response(rho, g, r, t, budget_flops, variant=v, model=m)
                if best is None or val > best[1] + 1e-15 or (abs(val - best[1]) <= 1e-15 and g < best[0].group_size):
                    best = (Allocation(rho, g, r, m), val)
                far = lo if abs(lo - star) >= abs(hi - star) else hi
                worst = min(worst, response(far, g, r, t, budget_flops, variant=v, model=m))
    return Optimum(best[0], best[1], worst)


@dataclass
class SyntheticObjective:
    """The synthetic test function as an objective (same contract as the real ones)."""

    noise: float = 0.01
    model: str = "Qwen/Qwen2.5-1.5B"
    name: str = "synthetic"
    variant: str = "paper"
    """Member of the family (:data:`VARIANTS`); ``model-size`` reads the plan's policy model."""
    sleep_s: float = 0.0
    """Wall seconds each run waits before it returns (default 0: instant). Lets tests of many
    workers kill one mid-trial deterministically (``[objective_settings] sleep_s = 2``)."""
    train_prompts: int | None = None
    """Size of the training set plans count epochs over (``TrainingSetup.train_prompts``;
    default ``None``: unknown, no epochs). Small values make plans pass over it many times
    (the epochs warning), e.g. ``--set train_prompts=1000``."""

    def __post_init__(self) -> None:
        get_variant(self.variant)
        if isinstance(self.noise, bool) or not isinstance(self.noise, (int, float)) \
                or not 0 <= self.noise <= 1:
            raise ConfigError(f"noise={self.noise!r}: must be a standard deviation in [0, 1] (a share)")
        if not isinstance(self.sleep_s, (int, float)) or not 0 <= self.sleep_s <= 3600:
            raise ValueError(f"sleep_s={self.sleep_s!r}: must be seconds in [0, 3600]")

    def workload(self) -> Workload:
        """The default set-up on the policy's shape, with ``target_steps`` off (the batch stays
        64 at every budget: the known optimum and its tests price these plans)."""
        return Workload(policy=model_shape(self.model),
                        setup=TrainingSetup(target_steps=None, train_prompts=self.train_prompts))

    def optimum(self, target: str = "pass_at_1", budget_flops: float = B_REF,
                space: SearchSpace | None = None) -> Optimum:
        """The known optimum (see :func:`optimum`)."""
        return optimum(target, budget_flops, space, variant=self.variant)

    def check_available(self) -> None:
        """Always available: a closed-form function, no accelerator, no libraries."""

    def check_space(self, space: SearchSpace) -> None:
        """Refuse a search over models with a variant that scores every model alike (its study
        would rank sizes by noise alone), in one line saying what to set instead."""
        if len(space.models) > 1 and not get_variant(self.variant).uses_model:
            raise ConfigError(f"space.models={list(space.models)!r}: the synthetic variant {self.variant!r} scores "
                              "every model alike; give one model, or set variant = \"model-size\" under "
                              "[objective_settings] (--set variant=model-size)")

    def run(self, plan: TrialPlan, *, seed: int = 0, progress=None) -> TrialResult:
        """Scores of ``plan``'s allocation (:func:`observe`); the spent FLOPs are the plan's
        expected ones (within its budget by construction)."""
        if self.sleep_s:
            import time

            time.sleep(self.sleep_s)
        a = plan.allocation
        model = a.model or plan.policy  # used by variants with a model-size term only
        targets = observe(a.rho, a.group_size, a.reward, plan.budget_flops, variant=self.variant,
                          model=model, seed=seed, noise=self.noise)
        return TrialResult(targets=targets, spent=plan.expected, budget_flops=plan.budget_flops,
                           curves=[], wall_seconds={})


def make(**settings: Any) -> SyntheticObjective:
    """The ``synthetic`` objective built from settings (entry point ``allocopt.objectives``:
    ``synthetic``). Raises ``ValueError`` (one line) for an unknown or ill-typed setting."""
    from allocopt.objective import check_settings

    check_settings(SyntheticObjective, settings, "synthetic")
    return SyntheticObjective(**settings)


make.targets = COMMON_TARGETS  # type: ignore[attr-defined]
make.rewards = REWARDS  # type: ignore[attr-defined]
