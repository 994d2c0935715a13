"""RACE's recommendation: the allocation to run at the full budget, restricted to what full runs
support, with its uncertainty (:class:`Recommendation`). The candidate grid is shared with
:func:`allocopt.race.propose`. torch is imported inside functions.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Sequence

from allocopt.plan.allocation import Allocation
from allocopt.flops import ConfigError
from allocopt.race.design import RaceSettings
from allocopt.race.data import Observation
from allocopt.spec import SearchSpace


def _rho_grid(space: SearchSpace, settings: RaceSettings) -> list[float]:
    lo, hi = space.rho
    return sorted({round(lo + (hi - lo) * i / (settings.rho_grid - 1), 4) for i in range(settings.rho_grid)})


def _full_candidates(space: SearchSpace, settings: RaceSettings) -> list[Allocation]:
    return [Allocation(r, g, w, m) for m in (space.models or (None,)) for w in space.rewards
            for g in space.group_sizes for r in _rho_grid(space, settings)]


def _is_full(o: Observation) -> bool:
    return o.fidelity == "full" or o.budget_fraction >= 1 - 1e-9


def _supported(cands: list[Allocation], full: Sequence[Allocation], settings: RaceSettings) -> list[Allocation]:
    """Candidates that full runs support: same cell (reward system × model) and G as a full run,
    ρ within ``rho_trust`` of it; failing that, same cell only; failing that, all."""
    near = [a for a in cands if any(b.reward == a.reward and b.model == a.model and b.group_size == a.group_size
                                    and abs(b.rho - a.rho) <= settings.rho_trust + 1e-9 for b in full)]
    if not near:
        near = [a for a in cands if any(b.reward == a.reward and b.model == a.model
                                        and abs(b.rho - a.rho) <= settings.rho_trust + 1e-9 for b in full)]
    return near or cands


def recommend(surrogate: Any, obs: Sequence[Observation], space: SearchSpace,
              settings: RaceSettings = RaceSettings()) -> tuple[Allocation, float, float]:
    """The allocation to run at the full budget: the argmax of the surrogate's posterior mean at
    fidelity 1 over the candidate grid (``rho_grid`` ρ × G × reward × model), restricted, once
    there are full-budget runs, to what they support: a cell (reward system × model) and G with
    a full run, and ρ within ``rho_trust`` of one (the mean is not trusted far from full-budget
    data; :func:`recommendation` gives the same allocation with its uncertainty).

    Returns:
        ``(allocation, posterior mean, posterior sd)`` at the full budget (target units).
    """
    enc = surrogate.encoding
    full = [o.allocation for o in obs if _is_full(o)]
    cands = _full_candidates(space, settings)
    if full:
        cands = _supported(cands, full, settings)
    mean, sd = surrogate.predict(enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0)
                                             for a in cands]))
    i = int(mean.argmax())
    return cands[i], float(mean[i]), float(sd[i])


@dataclass(frozen=True)
class Recommendation:
    """RACE's answer at the full budget, with its uncertainty (:func:`recommendation`)."""

    allocation: Allocation
    """The allocation to run: the best posterior mean among those full runs support."""
    mean: float
    """Posterior mean of the target there at the full budget (target units, noise-free)."""
    interval: tuple[float, float]
    """Central credible interval of that mean at ``level`` (posterior sample quantiles)."""
    prob_best: float
    """Posterior probability that the allocation's cell (reward system × model) holds the best
    full-budget allocation of the space (share of joint posterior samples)."""
    within_noise: tuple[Allocation, ...]
    """The best allocation of each (cell, G) that full runs support whose mean is within one
    evaluation's noise (``noise_sd``) of the recommendation's, best first, the recommendation
    included: more than one means the top allocations cannot be told apart by one run."""
    noise_sd: float
    """Measured noise of one evaluation (the surrogate's fitted noise, target units)."""
    cell_prob_best: tuple[tuple[str, str | None, float], ...] = ()
    """``(reward, model, probability)`` per cell: the posterior probability it holds the best
    full-budget allocation (a cell below ``rule_out`` is ruled out with that confidence)."""
    full_runs: int = 0
    """Full-budget runs the recommendation rests on."""
    level: float = 0.9
    gain_of_one_more_run: float = math.nan
    """Expected rise of the answer's true value (target units) from the best next full run,
    its knowledge gradient (:class:`allocopt.tuner.study.KGTuner`); NaN when not computed (RACE)."""
    best_next: Allocation | None = None
    """The full run that gain belongs to."""
    untried: tuple[str, ...] = ()
    """Reward systems (``reward`` or ``reward/model``) of the space without a full-budget run
    yet: what the answer says of them rests on pilots and the model's sharing alone."""

    def __post_init__(self) -> None:
        if not 0 < self.level < 1:
            raise ConfigError(f"level={self.level!r}: must be strictly between 0 and 1")
        if not 0 <= self.prob_best <= 1:
            raise ConfigError(f"prob_best={self.prob_best!r}: must be in [0, 1]")

    def to_dict(self) -> dict[str, Any]:
        def alloc(a: Allocation) -> dict[str, Any]:
            return {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model}

        return {"allocation": alloc(self.allocation), "mean": self.mean, "interval": list(self.interval),
                "level": self.level, "prob_best": self.prob_best, "noise_sd": self.noise_sd,
                "within_noise": [alloc(a) for a in self.within_noise], "full_runs": self.full_runs,
                "cell_prob_best": [{"reward": r, "model": m, "prob_best": p} for r, m, p in self.cell_prob_best],
                "gain_of_one_more_run": self.gain_of_one_more_run,
                "best_next": alloc(self.best_next) if self.best_next is not None else None,
                "untried": list(self.untried)}


def _cell_win_shares(surrogate: Any, space: SearchSpace, settings: RaceSettings, num_samples: int):
    """Per cell, the share of joint posterior samples (full budget) whose maximizer lies in it;
    candidates pruned to those whose upper bound (mean + 3 sd) reaches the best lower bound."""
    import torch

    enc = surrogate.encoding
    cands = _full_candidates(space, settings)
    X = enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0) for a in cands])
    mean, sd = surrogate.predict(X)
    keep = torch.nonzero(mean + 3 * sd >= float((mean - 3 * sd).max()))[:, 0]
    keep = keep[torch.argsort((mean + 3 * sd)[keep], descending=True)[:400]]
    draws = surrogate.sample(X[keep].unsqueeze(0), num_samples)[:, 0, :]
    wins = draws.argmax(-1)
    out: dict[tuple[str, str | None], float] = {(w, m): 0.0 for m in (space.models or (None,)) for w in space.rewards}
    for j in wins.tolist():
        a = cands[int(keep[j])]
        out[(a.reward, a.model)] += 1.0 / num_samples
    return out


def recommendation(surrogate: Any, obs: Sequence[Observation], space: SearchSpace,
                   settings: RaceSettings = RaceSettings(), level: float = 0.9) -> Recommendation:
    """:func:`recommend`'s allocation with its uncertainty (:class:`Recommendation`): the
    credible interval from ``posterior_samples`` posterior samples of its full-budget value,
    the probability per cell that it holds the best allocation (joint posterior samples over
    the whole space), and the set of supported allocations within one evaluation's noise of it.
    """
    import torch

    enc = surrogate.encoding
    full = [o.allocation for o in obs if _is_full(o)]
    cands = _full_candidates(space, settings)
    if full:
        cands = _supported(cands, full, settings)
    X = enc.tensor([enc.row(a.rho, a.group_size, a.reward, a.model, 1.0) for a in cands])
    mean, _ = surrogate.predict(X)
    i = int(mean.argmax())
    best = cands[i]
    draws = surrogate.sample(X[i:i + 1].unsqueeze(0), settings.posterior_samples)[:, 0, 0]
    q = torch.quantile(draws, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=draws.dtype))
    noise = surrogate.noise_sd
    per: dict[tuple, int] = {}
    for k, a in enumerate(cands):
        key = (a.reward, a.model, a.group_size)
        if key not in per or mean[k] > mean[per[key]]:
            per[key] = k
    close = sorted((k for k in per.values() if float(mean[k]) >= float(mean[i]) - noise),
                   key=lambda k: -float(mean[k]))
    shares = _cell_win_shares(surrogate, space, settings, settings.posterior_samples)
    return Recommendation(
        allocation=best, mean=float(mean[i]), interval=(float(q[0]), float(q[1])),
        prob_best=min(1.0, shares[(best.reward, best.model)]),
        within_noise=tuple(cands[k] for k in close) or (best,), noise_sd=noise,
        cell_prob_best=tuple((w, m, p) for (w, m), p in sorted(shares.items(), key=lambda t: -t[1])),
        full_runs=len(full), level=level)


def final_surrogate(obs: Sequence[Observation], space: SearchSpace, seed: int) -> Any:
    """The surrogate the study's one answer comes from: a fresh fit on its trials ``obs``
    alone (:func:`allocopt.race.fit.fit_surrogate`), seeded ``seed + len(obs)``. The same
    trials give the same answer whatever fits came before (a sampler's cached fit depends on
    when its hyperparameters were last refitted: two workers that saw the same trials printed
    different intervals). Raises ``ValueError`` with fewer than 2 observations."""
    from allocopt.race.fit import fit_surrogate

    return fit_surrogate(obs, space, seed=seed + len(obs))


def final_recommendation(obs: Sequence[Observation], space: SearchSpace, settings: RaceSettings,
                         seed: int, level: float = 0.9) -> Recommendation:
    """The study's one answer: :func:`recommendation` on :func:`final_surrogate` (what
    ``allocopt race`` / ``study`` store at their end, and the report computes when a study
    stored none)."""
    return recommendation(final_surrogate(obs, space, seed), obs, space, settings, level=level)
