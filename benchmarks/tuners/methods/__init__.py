"""The methods compared, one module each; every one runs inside a :class:`~benchmarks.tuners.session.Session`.

A method module defines ``METHOD``, a :class:`Method`: its name, label, own rule
(:data:`~benchmarks.tuners.scoring.BEST_OBSERVED` or its own answers), a ``run(session)``
that spends the session's compute, and ``missing()``: ``None`` when it can run, else the reason
it cannot (a peer whose package is not installed: ``pip install -e ".[bench]"``). Modules are
imported only when their method is asked for, so a missing peer costs nothing to the rest.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from benchmarks.tuners.session import Session

MODULES: dict[str, str] = {
    "grid": "grid",
    "random": "optuna_samplers",
    "tpe": "optuna_samplers",
    "gp": "optuna_samplers",
    "botorch": "optuna_samplers",
    "ax": "ax_client",
    "smac": "smac_mf",
    "botorch-mf": "botorch_mf",
    "race": "race",
    "allocopt": "allocopt",
    "allocopt-pilots": "allocopt",
    "allocopt-design": "allocopt",
    "allocopt-no-design": "allocopt",
}
"""Method name -> module in this package (the order is the tables' order)."""
METHODS: tuple[str, ...] = tuple(MODULES)
OWN_ABLATIONS: tuple[str, ...] = ("allocopt-pilots", "allocopt-design", "allocopt-no-design")
"""allocopt's own ablation rows: other settings of its tuner, not peers it is judged against."""
PEERS: tuple[str, ...] = tuple(m for m in METHODS if m not in ("allocopt", *OWN_ABLATIONS, "race", "kg"))


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    rule: str
    """``best_observed`` (the harness reads it from the trials) or ``own`` (its answers)."""
    run: Callable[[Session], None]
    missing: Callable[[], str | None] = lambda: None
    weight: float = 1.0
    """Rough cost of one replication to 40 runs, in seconds on one shared core (the ETA's prior)."""


def tiny_study() -> str:
    """The study file whose terms allocopt's methods replay on a table: ``$ALLOCOPT_TINY_STUDY``,
    else ``studies/tiny.toml``."""
    import os
    from pathlib import Path

    return os.environ.get("ALLOCOPT_TINY_STUDY", str(Path(__file__).resolve().parents[3] / "studies" / "tiny.toml"))


def race_study() -> str:
    """The study file whose RACE terms the ``race`` method replays: ``$ALLOCOPT_RACE_STUDY``,
    else ``benchmarks/tiny_grid/tiny_race.toml`` (RACE's 70 pilots at 10 %; the shipped
    ``studies/tiny.toml`` runs the kg tuner without pilots)."""
    import os
    from pathlib import Path

    return os.environ.get("ALLOCOPT_RACE_STUDY",
                          str(Path(__file__).resolve().parents[3] / "benchmarks" / "tiny_grid" / "tiny_race.toml"))


def get(name: str) -> Method:
    """The method called ``name``. Raises ``KeyError`` for an unknown one."""
    mod = importlib.import_module(f"benchmarks.tuners.methods.{MODULES[name]}")
    return mod.METHODS[name] if hasattr(mod, "METHODS") else mod.METHOD


def label(name: str) -> str:
    try:
        return get(name).label
    except Exception:  # noqa: BLE001 - a module that does not import still has a name
        return name
