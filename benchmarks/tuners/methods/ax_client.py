"""Ax (``ax-platform``, the ``bench`` extra) through its ``Client`` API, with its defaults.

One ``Client(random_seed=replication)`` per replication; the experiment's parameters are the
world's space (``rho`` a float range; ``group_size`` an ordered int choice; ``reward`` and, on a
world of several models, ``model`` unordered string choices, listed in the order
:meth:`Session.listed` draws for the replication: Ax's centre point takes the middle value of a
choice list, so the world's own order would choose the first run's reward system); one objective
``y`` (the target, maximized); the generation strategy Ax chooses itself
(``configure_generation_strategy()`` left at its default, ``method="fast"``: a centre point and
Sobol initialization, then BoTorch through Ax's modular model). Trials run one at a time at the
full budget only (``get_next_trials(max_trials=1)``, then ``complete_trial`` with the observed
target; an infeasible trial is told the worst target so far, or marked failed while none is
told: the penalty Optuna's samplers get, as Ax's model leaves a failed trial out and proposed
infeasible cells again). Own rule: ``get_best_parameterization(use_model_predictions=True)``,
Ax's best in-sample arm by model prediction (it falls back to the raw data when its model fits
poorly), asked only when the harness scores it. Runs offline; torch on one thread.
"""

from __future__ import annotations

import logging
from typing import Any

from allocopt.plan.allocation import Allocation
from benchmarks.tuners.methods import Method
from benchmarks.tuners.scoring import OWN
from benchmarks.tuners.session import Session


def missing() -> str | None:
    try:
        import ax  # noqa: F401
    except ImportError:
        return 'Ax is not installed: pip install -e ".[bench]"'
    return None


def _parameters(session: Session) -> list[Any]:
    from ax import ChoiceParameterConfig, RangeParameterConfig

    space = session.world.space
    out = [RangeParameterConfig(name="rho", parameter_type="float", bounds=tuple(space.rho)),
           ChoiceParameterConfig(name="group_size", parameter_type="int", values=list(space.group_sizes),
                                 is_ordered=True),
           ChoiceParameterConfig(name="reward", parameter_type="str",
                                 values=list(session.listed(space.rewards, "reward")), is_ordered=False)]
    if space.models:
        out.append(ChoiceParameterConfig(name="model", parameter_type="str",
                                         values=list(session.listed(space.models, "model")),
                                         is_ordered=False))
    return out


def _allocation(p: dict[str, Any]) -> Allocation:
    return Allocation(float(p["rho"]), int(p["group_size"]), str(p["reward"]), p.get("model"))


def run(session: Session) -> None:
    from ax import Client
    from ax.utils.common.logger import set_stderr_log_level

    set_stderr_log_level(logging.ERROR)
    client = Client(random_seed=session.replication)
    client.configure_experiment(parameters=_parameters(session))
    client.configure_optimization(objective="y")
    told: list[float] = []
    while not session.done:
        if session.answer_due() and session.full_runs():
            session.recommend(_allocation(client.get_best_parameterization(use_model_predictions=True)[0]))
        for index, params in client.get_next_trials(max_trials=1).items():
            y = session.observe(_allocation(params))
            if y is not None:
                told.append(y)
                client.complete_trial(index, raw_data={"y": y})
            elif told:
                client.complete_trial(index, raw_data={"y": min(told)})
            else:
                client.mark_trial_failed(index)
    session.recommend(_allocation(client.get_best_parameterization(use_model_predictions=True)[0]))


METHOD = Method("ax", "Ax (Client)", OWN, run, missing, weight=250)
