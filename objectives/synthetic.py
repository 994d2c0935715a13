"""A synthetic objective: a closed-form *test function* of the allocation, not a prediction.

Use it to test and benchmark the tuner (milliseconds per trial). It is shaped after the
paper's reported optima (Wilhelm & Kao 2026: ρ ≈ 0.72 for rule-based rewards, ρ ≈ 0.45 for
PRM-style rewards) but says nothing about real training. Feasibility and compute breakdowns
are the real ones: every trial goes through :func:`allocopt.allocation.make_plan`, and the
"spent" FLOPs are the plan's expected FLOPs.

Response, for target ``t`` at allocation (ρ, G, reward) and budget ``B``::

    score = base(reward) + 0.25 · exp(-((ρ - ρ*)/0.18)²) + 0.04 · (1 - ((log2 G - 3)/2)²) + noise
    ρ*    = 0.72 - 0.27 · c(reward) + shift(t) + 0.03 · log10(B / B_ref)

* ``c(reward)``: the reward system's cost factor (0 rule-based, 0.5 proxy_prm, 1 prm), so
  ρ* = 0.72 for rule-based and 0.45 for prm at ``B_ref`` and target ``pass@1``;
* ``shift``: ``native_reward`` +0.06, ``pass@1`` 0, ``judge`` -0.08 (targets disagree);
* ``base``: sparse 0.30, structured 0.32, dense 0.33, proxy_prm 0.34, prm 0.36;
* the G term peaks at G = 8 (``log2 G = 3``);
* ``B_ref = 1e19``: the optimum drifts by +0.03 per decade of budget, so pilots at a fraction
  of the budget are informative but biased;
* ``noise``: Gaussian, σ = ``noise`` (default 0.01), seeded by (seed, allocation).

Known optimum per target (noise-free): the reward with the highest ``base`` + peak (``prm``),
at ρ = ρ*(prm, t, B) and G = 8: score = 0.36 + 0.25 + 0.04 = 0.65.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from allocopt.allocation import TrialPlan, Workload
from allocopt.flops import ModelShape

B_REF = 1e19
REWARD_COST = {"sparse": 0.0, "structured": 0.0, "dense": 0.0, "proxy_prm": 0.5, "prm": 1.0}
BASE = {"sparse": 0.30, "structured": 0.32, "dense": 0.33, "proxy_prm": 0.34, "prm": 0.36}
SHIFT = {"native_reward": 0.06, "pass_at_1": 0.0, "judge": -0.08}


def rho_star(reward: str, target: str = "pass_at_1", budget_flops: float = B_REF) -> float:
    """The optimal ρ of the synthetic response (see the module docstring)."""
    return 0.72 - 0.27 * REWARD_COST[reward] + SHIFT[target] + 0.03 * math.log10(budget_flops / B_REF)


def response(rho: float, group_size: int, reward: str, target: str = "pass_at_1",
             budget_flops: float = B_REF) -> float:
    """Noise-free synthetic score in [0, 1]."""
    peak = 0.25 * math.exp(-((rho - rho_star(reward, target, budget_flops)) / 0.18) ** 2)
    g = 0.04 * (1 - ((math.log2(group_size) - 3) / 2) ** 2)
    return BASE[reward] + peak + g


@dataclass
class SyntheticObjective:
    """The synthetic test function as an objective (same contract as the real ones)."""

    noise: float = 0.01
    model: str = "Qwen/Qwen2.5-1.5B"
    name: str = "synthetic"

    def workload(self) -> Workload:
        return Workload(policy=ModelShape.from_pretrained(self.model))

    def run(self, plan: TrialPlan, *, seed: int = 0, progress=None):
        from objectives.grpo import TrialResult  # light: no torch at import

        a = plan.allocation
        rng = random.Random(f"{seed}|{a.rho:.6f}|{a.group_size}|{a.reward}")
        targets = {t: min(1.0, max(0.0, response(a.rho, a.group_size, a.reward, t, plan.budget_flops)
                                   + rng.gauss(0.0, self.noise)))
                   for t in SHIFT}
        return TrialResult(targets=targets, spent=plan.expected, budget_flops=plan.budget_flops,
                           curves=[], wall_seconds={})
