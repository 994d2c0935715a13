"""SMAC3's multi-fidelity facade (``smac``, the ``bench`` extra), with its defaults: Hyperband
over the world's budgets, a random forest surrogate and expected improvement.

The pilot fractions are SMAC's budgets: ``Scenario(min_budget=smallest fraction,
max_budget=1)`` and Hyperband's ``eta`` set so that its rungs are as many as the world's
fidelities (``eta = (1 / f_min) ** (1 / (k - 1))``, just below, for ``k`` fidelities:
``sqrt(10)`` for the tiny table's 0.1, 0.25 and 1); a trial SMAC asks at budget ``b`` runs at
the world's fraction nearest ``b`` in log (0.316 -> 0.25) and costs that fraction. Everything
else is the facade's default (``MultiFidelityFacade``: random initial design of 10 configurations
per hyperparameter, at most a quarter of ``n_trials = 1000``, an upper bound never reached;
incumbent on the highest budget observed). The configuration space: ``rho`` a float in its
range, ``group_size`` an ordered categorical, ``reward`` (and ``model``) categorical. SMAC
minimizes, so the cost is ``-target``; an infeasible trial is told ``CRASHED`` (crash cost 0,
a target of 0). Ask and tell, one trial at a time, seeded with the replication; its files go
to a temporary folder. Own rule: its incumbent (``intensifier.get_incumbent()``).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import OWN
from benchmarks.tuners.session import Session

N_TRIALS = 1000


def missing() -> str | None:
    try:
        import smac  # noqa: F401
    except ImportError:
        return 'SMAC3 is not installed: pip install -e ".[bench]"'
    return None


def config_space(space: Any, seed: int) -> Any:
    from ConfigSpace import Categorical, ConfigurationSpace, Float

    cs = ConfigurationSpace(seed=seed)
    cs.add(Float("rho", tuple(space.rho)))
    cs.add(Categorical("group_size", list(space.group_sizes), ordered=True))
    cs.add(Categorical("reward", list(space.rewards)))
    if space.models:
        cs.add(Categorical("model", list(space.models)))
    return cs


def eta_for(fractions: tuple[float, ...]) -> float:
    """Hyperband's ``eta`` that gives one rung per fidelity (just below, so that SMAC's
    ``floor(log(1 / f_min) / log(eta))`` is not rounded down)."""
    k = len(fractions) + 1
    return (1.0 / min(fractions)) ** (1.0 / (k - 1)) * (1 - 1e-6) if fractions else 3.0


def nearest_fraction(budget: float, fractions: tuple[float, ...]) -> float:
    return min((*fractions, 1.0), key=lambda f: abs(math.log(budget / f)))


def _allocation(cfg: Any) -> Allocation:
    d = dict(cfg)
    return Allocation(float(d["rho"]), int(d["group_size"]), str(d["reward"]), d.get("model"))


def run(session: Session) -> None:
    from smac import MultiFidelityFacade, Scenario
    from smac.runhistory.dataclasses import TrialValue
    from smac.runner.abstract_runner import StatusType

    fr = session.world.fractions
    with tempfile.TemporaryDirectory(prefix="smac-bench-") as tmp:
        scenario = Scenario(config_space(session.world.space, session.replication), deterministic=False,
                            n_trials=N_TRIALS, min_budget=min(fr) if fr else 1.0, max_budget=1.0,
                            seed=session.replication, crash_cost=0.0, output_directory=Path(tmp) / "smac")
        intensifier = MultiFidelityFacade.get_intensifier(scenario, eta=eta_for(fr))
        smac = MultiFidelityFacade(scenario, None, intensifier=intensifier, overwrite=True, logging_level=40)
        while not session.done:
            info = smac.ask()
            f = nearest_fraction(float(info.budget or 1.0), fr)
            y = session.observe(_allocation(info.config), f)
            value = TrialValue(cost=0.0, status=StatusType.CRASHED) if y is None else TrialValue(cost=-y)
            smac.tell(info, value, save=False)
            inc = smac.intensifier.get_incumbent()
            session.recommend(_allocation(inc) if inc is not None else None)


METHOD = Method("smac", "SMAC3 multi-fidelity", OWN, run, missing, weight=60)
