"""The objective contract: what one trial takes, returns and raises, and objectives by name.

An *objective* turns a :class:`~allocopt.plan.allocation.TrialPlan` (an allocation made runnable under
a FLOP budget) into scores. The study loop (:mod:`allocopt.study.loop`), the CLI and anyone's own
Optuna code drive every objective the same way::

    obj = get_objective("synthetic", noise=0.0)   # by registered name, with its settings
    obj.check_available()                         # ObjectiveUnavailable: cannot run here
    plan = make_plan(budget_flops, allocation, obj.workload())   # InfeasiblePlan: too small
    result = obj.run(plan, seed=0, progress=None)                # TrialResult
    # TrialFailed (with .result: what was spent), InfeasiblePlan (nothing spent)

Objectives are found by name through Python entry points of group ``allocopt.objectives``
(this project's ``tiny``, ``synthetic`` and ``qwen``, declared in its ``pyproject.toml``; a
user's package declares its own the same way), loaded on first use; code registers more with
:func:`register_objective`. The library never imports the objectives it runs.

Standard library and the pure core (:mod:`allocopt.flops`, :mod:`allocopt.plan.allocation`,
:mod:`allocopt.plan.meter`) only: no torch, TRL or Optuna.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from allocopt.errors import InfeasiblePlan, ObjectiveUnavailable, TrialFailed
from allocopt.plan.allocation import TrialPlan, Workload
from allocopt.flops import ComputeBreakdown, FlopAccount
from allocopt.plan.meter import FlopMeter, IterationRecord

__all__ = ["ENTRY_POINT_GROUP", "InfeasiblePlan", "Objective", "ObjectiveUnavailable", "Progress", "TrialFailed",
           "TrialResult", "get_objective", "objective_names", "objective_rewards", "objective_targets",
           "register_objective"]

Progress = Callable[[IterationRecord, FlopMeter], None]
"""Called after each training iteration with its record and the run's meter (live display)."""


@dataclass
class TrialResult:
    """What one trial produced: targets, the compute actually spent, curves."""

    targets: dict[str, float]
    """Scores by target key (``native_reward``, ``pass_at_1``, ``judge``, …), each a share in
    [0, 1]."""
    spent: FlopAccount
    """FLOPs actually spent in training (useful and executed), by phase."""
    budget_flops: float
    """The budget the trial ran under (FLOPs)."""
    curves: list[IterationRecord]
    """One record per training iteration (empty for objectives without a training loop)."""
    wall_seconds: dict[str, float]
    """Seconds by phase: ``search+reward`` (generation and scoring), ``reward`` (scoring
    alone), ``learning`` (the rest of the training loop), ``eval``."""
    eval_flops: int = 0
    """FLOPs of evaluation (outside the budget)."""
    status: str = "complete"
    """``complete`` or ``failed``."""
    error: str | None = None
    stopped_reason: str | None = None

    @property
    def breakdown(self) -> ComputeBreakdown:
        """The executed FLOPs by phase (what the budget is charged)."""
        return self.spent.executed

    def to_dict(self) -> dict[str, Any]:
        return {"targets": self.targets, "budget_flops": self.budget_flops,
                "eval_flops": self.eval_flops, "status": self.status, "error": self.error,
                "stopped_reason": self.stopped_reason, "wall_seconds": self.wall_seconds,
                "breakdown": self.spent.to_dict(),
                "curves": [asdict(r) for r in self.curves]}


@runtime_checkable
class Objective(Protocol):
    """What a study runs. The built-in ones: :class:`objectives.tiny.objective.TinyObjective`,
    :class:`objectives.synthetic.SyntheticObjective`, :class:`objectives.qwen.objective.QwenObjective`.

    Optional attributes: ``flops_per_second`` (executed training FLOPs per wall second,
    measured on the machine the objective targets) and ``overhead_seconds`` (loading and
    evaluation); with them ``allocopt trial`` prints the estimated wall time before starting
    and refuses a run estimated above an hour unless ``--yes``. ``check_space(space)``: raise
    :class:`~allocopt.flops.ConfigError` (one line) for a search space the objective cannot
    tell apart (a study checks it before it plans anything)."""

    name: str
    """The registered name (``tiny``, ``synthetic``, ``qwen``); MLflow tag ``allocopt.objective``."""

    def workload(self) -> Workload:
        """What plans are made for: the policy's shape, the :class:`~allocopt.plan.setup.TrainingSetup`
        the objective's driver runs (rollout batch, lengths, engine, …) and the reward models'
        shapes. Needs no accelerator (``--dry-run`` and planning use it on any machine)."""
        ...

    def check_available(self) -> None:
        """Return if trials can run on this machine; else raise :class:`ObjectiveUnavailable`
        (one line naming what to use instead), before anything is spent."""
        ...

    def run(self, plan: TrialPlan, *, seed: int = 0, progress: Progress | None = None) -> TrialResult:
        """Train and score one trial of ``plan``; its executed FLOPs never exceed
        ``plan.budget_flops``.

        Raises:
            ObjectiveUnavailable: cannot run here (nothing spent).
            InfeasiblePlan: the budget cannot buy even the first iteration (nothing spent).
            TrialFailed: the run crashed; ``.result`` holds what it spent until then.
        """
        ...


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Objective]
    targets: tuple[str, ...] | None
    rewards: tuple[str, ...] | None = None


ENTRY_POINT_GROUP = "allocopt.objectives"
"""The entry-point group objectives are declared in (``pyproject.toml``:
``[project.entry-points."allocopt.objectives"]``, ``name = "package.module:factory"``)."""

_REGISTRY: dict[str, _Entry] = {}
"""Objectives registered in this process (:func:`register_objective`, or loaded from an entry
point on first use)."""


def register_objective(name: str, factory: Callable[..., Objective], *,
                       targets: Sequence[str] | None = None, replace: bool = False,
                       rewards: Sequence[str] | None = None) -> None:
    """Make ``get_objective(name, **settings)`` call ``factory(**settings)``.

    Installed packages declare their objectives as entry points of group
    :data:`ENTRY_POINT_GROUP` instead (found on first use, see :func:`get_objective`); this
    registers one from Python code (a test, a notebook).

    Args:
        name: the objective's name (``--objective NAME``, ``objective = "NAME"`` in a study file).
        factory: builds the objective from its settings (keyword arguments); a bad setting
            raises ``TypeError`` or ``ValueError`` with one line.
        targets: the target keys its results report (``pass_at_1``, …), so a study can refuse
            a target it does not report before any trial runs; ``None``: not known in advance.
        replace: allow replacing an objective registered under the same name.
        rewards: the reward systems its trials can score, so a study can refuse a reward system
            (built in or declared in its study file) the objective cannot run before any trial;
            ``None``: any (the ``command`` objective runs the user's own job).

    Raises:
        ValueError: ``name`` is empty or already registered (and not ``replace``).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name={name!r}: an objective needs a non-empty name")
    if name in _REGISTRY and not replace:
        raise ValueError(f"objective={name!r}: already registered (pass replace=True to replace it)")
    _REGISTRY[name] = _Entry(factory, None if targets is None else tuple(targets),
                             None if rewards is None else tuple(rewards))


def _entry_points() -> dict[str, Any]:
    """The installed objectives' entry points by name (first found wins), not loaded."""
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def objective_names() -> tuple[str, ...]:
    """Names of every objective: the installed ones (entry points, in declaration order), then
    those registered in this process."""
    return tuple(dict.fromkeys([*_entry_points(), *_REGISTRY]))


def objective_targets(name: str) -> tuple[str, ...] | None:
    """The target keys objective ``name`` reports (``None``: not declared).
    Raises ``ValueError`` (one line) for an unknown name."""
    return _entry(name).targets


def objective_rewards(name: str) -> tuple[str, ...] | None:
    """The reward systems objective ``name`` can score (``None``: any, or not declared).
    Raises ``ValueError`` (one line) for an unknown name."""
    return _entry(name).rewards


def unknown_objective(name: str) -> str | None:
    """The one line refusing ``name`` when no objective is called so, else ``None``."""
    if name in objective_names():
        return None
    return f"objective={name!r}: unknown objective; allowed: {', '.join(objective_names())}"


def _entry(name: str) -> _Entry:
    """Objective ``name``: registered in this process, else loaded from its entry point (the
    loaded object is the factory; its ``targets`` and ``rewards`` attributes, if any, the targets
    it reports and the reward systems it scores)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _entry_points().get(name)
    if ep is None:
        raise ValueError(unknown_objective(name))
    factory = ep.load()
    register_objective(name, factory, targets=getattr(factory, "targets", None), replace=True,
                       rewards=getattr(factory, "rewards", None))
    return _REGISTRY[name]


def get_objective(name: str, **settings: Any) -> Objective:
    """The objective registered as ``name``, built with ``settings``.

    Raises:
        ValueError: unknown name (one line listing the allowed ones), an unknown setting or a
            setting of the wrong type (built-in objectives: :func:`check_settings`).
        TypeError: an unknown setting of a registered objective that does not check them.
    """
    return _entry(name).factory(**settings)


def _optional_type(annotation: Any) -> type | None:
    """``bool`` for ``"bool | None"`` (an annotation string, as under ``from __future__ import
    annotations``); ``None`` when it names none of bool, int, float, str first."""
    first = str(annotation).split("|")[0].strip()
    return {"bool": bool, "int": int, "float": float, "str": str}.get(first)


def check_settings(cls: type, settings: Mapping[str, Any], objective: str) -> None:
    """Check an objective's ``settings`` (a study's ``[objective_settings]``, ``--set``) against
    the dataclass ``cls`` that takes them, before it is built: every key is one of its fields,
    and each value has its default's type (a bool is ``true``/``false``, not the string
    ``"false"``, which Python would read as true; an int field takes no float or bool).

    Raises:
        ValueError: one line naming the setting, the value and what is allowed.
    """
    import dataclasses

    fs = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key, value in settings.items():
        f = fs.get(key)
        if f is None:
            raise ValueError(f"setting {key!r}: unknown for objective {objective}; allowed: "
                             f"{', '.join(sorted(fs))}")
        default = f.default
        if default is dataclasses.MISSING:
            continue
        if default is None:  # ``T | None``: None, or what the annotation names first
            want = _optional_type(f.type)
            if want is None or value is None:
                continue
        else:
            want = type(default)
        ok = (isinstance(value, bool) if want is bool
              else isinstance(value, int) and not isinstance(value, bool) if want is int
              else isinstance(value, (int, float)) and not isinstance(value, bool) if want is float
              else isinstance(value, str) if want is str else True)
        if not ok:
            what = {bool: "true or false (unquoted)", int: "an integer", float: "a number",
                    str: "a string"}[want]
            raise ValueError(f"setting {key}={value!r}: must be {what}")


def split_settings(cls: type, settings: Mapping[str, Any], objective: str, *,
                   setup_keys: Sequence[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split an objective's flat settings (``--set key=value``, a study's
    ``[objective_settings]``) between the :class:`~allocopt.plan.setup.TrainingSetup` its
    settings dataclass ``cls`` nests as ``setup`` and ``cls``'s own fields, each checked with
    :func:`check_settings`.

    Args:
        cls: the settings dataclass, with a ``setup: TrainingSetup`` field.
        settings: the flat settings.
        objective: its name, for the messages.
        setup_keys: the set-up fields a user may set (default: all of them); the others are
            the objective's to fill (measured lengths, the world's model).

    Returns:
        ``(setup changes, own settings)``.

    Raises:
        ValueError: one line naming an unknown setting (and the allowed ones) or a value of
            the wrong type.
    """
    import dataclasses

    from allocopt.plan.setup import TrainingSetup

    setup_all = {f.name for f in dataclasses.fields(TrainingSetup)}
    open_keys = setup_all if setup_keys is None else set(setup_keys)
    own = {f.name for f in dataclasses.fields(cls) if f.init} - {"setup"}
    for key in settings:
        if key not in open_keys and key not in own:
            why = (" (the objective sets it)" if key in setup_all else "")
            raise ValueError(f"setting {key!r}: unknown for objective {objective}{why}; allowed: "
                             f"{', '.join(sorted(open_keys | own))}")
    setup = {k: v for k, v in settings.items() if k in open_keys}
    mine = {k: v for k, v in settings.items() if k in own}
    check_settings(TrainingSetup, setup, objective)
    check_settings(cls, mine, objective)
    return setup, mine
