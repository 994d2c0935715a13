"""Optuna's samplers, stock: ``RandomSampler``, ``TPESampler``, ``GPSampler`` and
``optuna_integration.BoTorchSampler``, each built from Optuna's public API with the
replication's seed and (but random search) 4 random start-up trials, asked and told in an
in-memory study over the world's space (ρ a float in its range; G, reward system and model
categorical) at the full budget only; an infeasible trial is told the worst value told so far
(:func:`ask_and_tell`). Own rule: the best observed full run (the harness's, over the feasible
runs).
"""

from __future__ import annotations

from typing import Any, Callable

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import BEST_OBSERVED
from benchmarks.tuners.session import Session

STARTUP_TRIALS = 4


def distributions(space: Any) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    out = {"rho": FloatDistribution(*space.rho), "group_size": CategoricalDistribution(space.group_sizes),
           "reward": CategoricalDistribution(space.rewards)}
    if space.models:
        out["model"] = CategoricalDistribution(space.models)
    return out


def make_sampler(name: str, seed: int) -> Any:
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    from optuna_integration import BoTorchSampler

    return BoTorchSampler(seed=seed, n_startup_trials=STARTUP_TRIALS)


def ask_and_tell(study: Any, space: Any, observe: Callable[[Allocation], Any], done: Callable[[], bool],
                 max_asks: int | None = None) -> None:
    """Ask ``study`` for allocations of ``space`` and tell it what ``observe`` returns (a value,
    a list of values, or ``None``: an infeasible trial) until ``done()`` (or ``max_asks`` asks).

    An infeasible trial is told the worst value told so far (per objective, by the study's
    directions), the usual penalty, and failed before any value: a sampler ignores a failed
    trial, so GPSampler, whose proposal is deterministic, asked for the same infeasible cell
    again and again. A world without infeasible cells is replayed as without the penalty."""
    import optuna

    dists = distributions(space)
    asks = 0
    told: list[list[float]] = []
    while not done() and (max_asks is None or asks < max_asks):
        trial = study.ask(dists)
        asks += 1
        p = trial.params
        y = observe(Allocation(float(p["rho"]), int(p["group_size"]), p["reward"], p.get("model")))
        if y is None and not told:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif y is None:
            study.tell(trial, _worst(told, study.directions))
        else:
            study.tell(trial, y)
            told.append(list(y) if isinstance(y, (list, tuple)) else [y])


def _worst(told: list[list[float]], directions: Any) -> Any:
    import optuna

    worst = [min(col) if d == optuna.study.StudyDirection.MAXIMIZE else max(col)
             for col, d in zip(zip(*told), directions)]
    return worst if len(worst) > 1 else worst[0]


def run_sampler(name: str, session: Session) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(name, session.replication))
    ask_and_tell(study, session.world.space, session.observe, lambda: session.done)


def _method(name: str, label: str, weight: float) -> Method:
    return Method(name, label, BEST_OBSERVED, lambda s: run_sampler(name, s), weight=weight)


METHODS = {
    "random": _method("random", "random (Optuna)", 1),
    "tpe": _method("tpe", "Optuna TPE", 3),
    "gp": _method("gp", "Optuna GPSampler", 30),
    "botorch": _method("botorch", "Optuna BoTorchSampler", 150),
}
