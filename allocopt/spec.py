"""Study definitions: what a study searches, at which budget, for which target (TOML).

Standard library only. A study file (``studies/*.toml``)::

    name = "tiny"
    objective = "tiny"
    budget_flops = 2e10
    target = "pass@1"
    trials = 12
    seed = 0

    [space]
    rho = [0.2, 0.9]          # range of the update fraction
    group_sizes = [2, 4, 8]
    rewards = ["sparse", "dense", "prm"]
    models = []               # optional: policy models to search over

    [objective_settings]      # passed to the objective
    eval_problems = 300

    [race]                    # optional: RACE's settings (allocopt.race.RaceSettings)
    bandwidth = 0.35

    [targets]                 # optional: targets beyond the built-in ones (allocopt.vocabulary)
    aime24 = { direction = "maximize", range = [0, 1] }

    [rewards]                 # optional: reward systems beyond the built-in ones, with their price
    orm8b = { kind = "model", model = "path/to/config.json" }

CLI flags override file values (:meth:`StudySpec.with_overrides`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from allocopt.plan.allocation import REWARDS, Allocation
from allocopt.flops import ConfigError
from allocopt.plan.budget import Budget
from allocopt.plan.throughput import ThroughputProfile, TimeBudget, time_budget
from allocopt.tomlio import check_keys, read_toml
from allocopt.vocabulary import TARGETS as _BUILTIN_TARGETS, Vocabulary, check_name, metric_key

TARGETS: tuple[str, ...] = tuple(t.name for t in _BUILTIN_TARGETS)
"""The built-in targets as people and the CLI spell them (a study file declares more:
:mod:`allocopt.vocabulary`)."""


TUNERS: tuple[str, ...] = ("kg", "race", "bo")
"""allocopt's tuners (:attr:`StudySpec.tuner`)."""


def target_key(target: str) -> str:
    """Python / MLflow name of a target: ``pass@1`` -> ``pass_at_1``, ``pass@1:gsm8k`` ->
    ``pass_at_1_gsm8k`` (:func:`allocopt.vocabulary.metric_key`). Raises :class:`ConfigError`
    for a name no study could declare; whether a study knows it is its vocabulary's check
    (:meth:`StudySpec.vocabulary`)."""
    return metric_key(check_name(target, "target"))


def target_label(key: str, vocabulary: Vocabulary | None = None) -> str:
    """Inverse of :func:`target_key` among the built-in targets and ``vocabulary``'s, for tables."""
    return (vocabulary or Vocabulary()).label(key)


_LIST_EXAMPLE = {"group_sizes": "[2, 4, 8]", "rewards": '["sparse", "prm"]', "models": '["tiny", "small"]'}


@dataclass(frozen=True)
class SearchSpace:
    """The search variables of a study."""

    rho: tuple[float, float] = (0.2, 0.9)
    """Range of the update fraction ρ, inside (0, 1)."""
    group_sizes: tuple[int, ...] = (2, 4, 8)
    """Group sizes G to choose from (each >= 2)."""
    rewards: tuple[str, ...] = ("sparse", "structured", "dense", "proxy_prm", "prm")
    """Reward systems to choose from: built-in ones or those the study declares
    (:attr:`StudySpec.vocabulary`, which checks each is known)."""
    models: tuple[str, ...] = ()
    """Policy models to choose from; empty: the objective's own."""

    def __post_init__(self) -> None:
        for f in ("rho", "group_sizes", "rewards", "models"):
            if isinstance(getattr(self, f), (str, int, float)):
                raise ConfigError(f"space.{f}={getattr(self, f)!r}: must be a list"
                                  + (" [low, high]" if f == "rho" else f", e.g. {_LIST_EXAMPLE[f]}"))
        object.__setattr__(self, "rho", tuple(self.rho))
        object.__setattr__(self, "group_sizes", tuple(self.group_sizes))
        object.__setattr__(self, "rewards", tuple(self.rewards))
        object.__setattr__(self, "models", tuple(self.models))
        lo_hi = self.rho
        if len(lo_hi) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in lo_hi) \
                or not (0 < lo_hi[0] <= lo_hi[1] < 1):
            raise ConfigError(f"space.rho={list(self.rho)!r}: must be [low, high] with 0 < low <= high < 1")
        if not self.group_sizes:
            raise ConfigError("space.group_sizes=[]: empty search space; give at least one G >= 2")
        for g in self.group_sizes:
            if isinstance(g, bool) or not isinstance(g, int) or g < 2:
                raise ConfigError(f"space.group_sizes: {g!r} is not an integer >= 2")
        if not self.rewards:
            raise ConfigError(f"space.rewards=[]: empty search space; give at least one (built in: "
                              f"{', '.join(REWARDS)})")
        for r in self.rewards:
            check_name(r, "space.rewards")
        for m in self.models:
            if not isinstance(m, str) or not m.strip():
                shown = repr(m) if not isinstance(m, str) else repr(m[:80])
                raise ConfigError(f"space.models={shown}: must be a model name, a string (the objective's policy "
                                  "sizes, a preset or a folder with a config.json)")
        for f in ("group_sizes", "rewards", "models"):
            values = getattr(self, f)
            if len(set(values)) < len(values):
                twice = next(v for i, v in enumerate(values) if v in values[:i])
                raise ConfigError(f"space.{f}: {twice!r} given more than once ({len(values)} values, "
                                  f"{len(set(values))} distinct); give each once")


@dataclass(frozen=True)
class StudySpec:
    """A whole study: objective, budget, target, space, trial count."""

    name: str = "allocopt"
    """Study name (Optuna study and MLflow experiment ``allocopt/<name>``)."""
    objective: str = "qwen"
    """What trials run: ``tiny`` (CPU world) or ``qwen`` (GPU, Qwen2.5)."""
    budget_flops: float = 1e19
    """FLOPs each full-budget trial may spend."""
    target: str | tuple[str, ...] = "pass@1"
    """Target to maximize (see :data:`TARGETS`), or several: a multi-objective study that
    searches the Pareto front (expected hypervolume improvement with :attr:`sampler`)."""
    trials: int = 12
    """Full-budget trials to run in all (a resumed study runs only the missing ones); RACE
    pilots come on top, and so do proposals the budget cannot buy (recorded infeasible, never
    run)."""
    seed: int = 0
    sampler: str = "gp"
    """The sampler of ``tuner = "bo"`` and of a study of several targets: ``gp`` (Optuna's
    GPSampler: log EI, log EHVI for several targets, the ``budget`` constraint and running trials
    taken into account; about ten times faster per proposal than BoTorch's here), ``botorch``
    (optuna_integration.BoTorchSampler: qLogNEHVI for several targets), ``random``."""
    tuner: str = "kg"
    """allocopt's tuner of a one-target study: ``kg`` (:mod:`allocopt.tuner`: each run, a full run
    or a pilot, chosen by its knowledge gradient per FLOP; at most :attr:`pilots` pilots, none
    unless given), ``race`` (:mod:`allocopt.race`: a fixed pilot grid, then surrogate
    proposals) or ``bo`` (plain Bayesian optimization at the full budget with :attr:`sampler`).
    ``kg`` without pilots is the default: on both measured tiny worlds, each choosing for the
    other, it had lower median regret than kg with pilots and than RACE at 8-40 runs (where the
    truth separates them: not the small world's held-out seed, which is noise)."""
    until_gain: float | None = None
    """Stop rule (``tuner = "kg"``): end the study before :attr:`trials` full runs once one more
    full run is worth less than this, in target units (the answer's knowledge gradient: the
    expected rise of its true value), e.g. 0.002 for pass@1; ``None``: run every trial."""
    initial_design: bool | None = None
    """``tuner = "kg"``: first one full run per reward system, alternately at two ρ levels near
    the middle (one target: a third and two thirds of the way; several: the two middle levels),
    at the middle group size, then the knowledge gradient (``true``), or the knowledge gradient
    from the first run (``false``; the only value other tuners accept, having no such design).
    ``None``: the measured default, the design for one target and for several
    (:data:`allocopt.tuner.study.INITIAL_DESIGN`)."""
    startup_trials: int = 4
    """Quasi-random trials before :attr:`sampler` proposes (``tuner = "bo"``, several targets)."""
    pilots: int | None = None
    """``tuner = "kg"``: the most pilots it may run, each only when worth its FLOPs (``None`` or
    0: none, full runs only). ``tuner = "race"``: RACE pilot points run first (at most;
    :mod:`allocopt.race`); ``None``: RACE's default, ``max(60, (len(group_sizes) + 3) × reward
    systems × models)``; 0 turns RACE off, as ``tuner = "bo"``. ``tuner = "bo"``: none (0 or
    unset)."""
    pilot_fraction: float = 0.1
    """Pilots run at ``pilot_fraction × budget_flops``, in (0, 1)."""
    budget_gpu_hours: float | None = None
    """A time budget instead: GPU-hours each full-budget trial may take (wall hours × ``gpus``),
    priced per allocation at :attr:`throughput` (:meth:`budget_for`). ``None``: a FLOP budget."""
    gpus: int = 1
    """GPUs a trial runs on (with :attr:`budget_gpu_hours`)."""
    throughput: Mapping[str, Any] | None = None
    """The :class:`~allocopt.plan.throughput.ThroughputProfile` a time budget is priced at (its
    fields as a table)."""
    space: SearchSpace = field(default_factory=SearchSpace)
    vocabulary: Vocabulary = field(default_factory=Vocabulary)
    """The targets and reward systems this study knows: the built-in ones and those a study file
    declares in its ``[targets]`` and ``[rewards]`` tables (:mod:`allocopt.vocabulary`)."""
    objective_settings: Mapping[str, Any] = field(default_factory=dict)
    race: Mapping[str, Any] = field(default_factory=dict)
    """RACE's settings (a ``[race]`` table): any field of :class:`allocopt.race.RaceSettings` but
    ``max_pilots`` (this study's :attr:`pilots`) and ``seed`` (:attr:`seed`), e.g.
    ``bandwidth = 0.35``, ``rho_levels = 6``, ``repeats = 2``; checked by RACE, which sits below
    this module (:func:`allocopt.race.design.check_race_table`, called by
    :func:`~allocopt.race.design.settings_for` and by the commands as they read a study file)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"name={self.name!r}: must be a non-empty string")
        if not self.name.isprintable() or len(self.name) > 200:
            raise ConfigError(f"name={self.name[:80]!r}: must be printable (no newline, tab or control "
                              "character) and at most 200 characters; it names the Optuna study and "
                              "the MLflow experiment")
        object.__setattr__(self, "_budget", Budget(self.budget_flops))  # checked once, here
        object.__setattr__(self, "budget_flops", self._budget.flops)
        if isinstance(self.target, (list, tuple)):
            ts = tuple(dict.fromkeys(self.target))
            if not ts:
                raise ConfigError("target=[]: give at least one target; allowed: " + ", ".join(TARGETS))
            if len(ts) < len(self.target):
                twice = next(t for t in ts if list(self.target).count(t) > 1)
                raise ConfigError(f"target={twice!r}: given more than once; give each target once")
            object.__setattr__(self, "target", ts[0] if len(ts) == 1 else ts)
        object.__setattr__(self, "vocabulary", Vocabulary.of(self.vocabulary))
        for t in self.targets:
            self.vocabulary.target(t)
        if isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1:
            raise ConfigError(f"trials={self.trials!r}: must be an integer >= 1")
        if self.pilots is not None and (isinstance(self.pilots, bool)
                                        or not isinstance(self.pilots, int) or self.pilots < 0):
            raise ConfigError(f"pilots={self.pilots!r}: must be an integer >= 0 (0: no RACE pilots)")
        if isinstance(self.pilot_fraction, bool) or not isinstance(self.pilot_fraction, (int, float)):
            raise ConfigError(f"pilot_fraction={self.pilot_fraction!r}: must be a number in (0, 1) "
                              "(unquoted in a study file)")
        if not 0 < self.pilot_fraction < 1:
            raise ConfigError(f"pilot_fraction={self.pilot_fraction!r}: must be in (0, 1)")
        if self.sampler not in ("botorch", "gp", "random"):
            raise ConfigError(f"sampler={self.sampler!r}: allowed: botorch, gp, random")
        if self.tuner not in TUNERS:
            raise ConfigError(f"tuner={self.tuner!r}: allowed: {', '.join(TUNERS)}")
        if self.tuner == "bo" and self.pilots:
            raise ConfigError(f"pilots={self.pilots!r}: tuner = \"bo\" runs full-budget trials only; "
                              "pilots run with tuner = \"kg\" or \"race\"")
        if self.until_gain is not None:
            g = self.until_gain
            if isinstance(g, bool) or not isinstance(g, (int, float)) or not (0 <= g < math.inf):
                raise ConfigError(f"until_gain={g!r}: must be a finite number >= 0 (target units, e.g. 0.002; unquoted in a study file)")
            if self.tuner != "kg":
                raise ConfigError(f"until_gain={g!r}: needs tuner = \"kg\", not \"{self.tuner}\" (the value of one "
                                  "more run is the knowledge-gradient tuner's); leave until_gain out")
            if isinstance(self.target, (tuple, list)) and len(self.target) > 1:
                raise ConfigError(f"until_gain={g!r}: one target only (a study of several targets "
                                  "searches their Pareto front: no one answer to value one more run of)")
        if self.initial_design is not None:
            if not isinstance(self.initial_design, bool):
                raise ConfigError(f"initial_design={self.initial_design!r}: must be true or false (unquoted in a "
                                  "study file), or left out for the default")
            if self.initial_design and self.tuner != "kg":
                raise ConfigError(f"initial_design=true: needs tuner = \"kg\", not \"{self.tuner}\" (the initial "
                                  "design is the knowledge-gradient tuner's first runs); leave initial_design out "
                                  "or set it false (allocopt study: or give --no-initial-design)")
        if isinstance(self.space, Mapping):
            object.__setattr__(self, "space", _space(self.space))
        elif not isinstance(self.space, SearchSpace):
            raise ConfigError(f"space={self.space!r}: must be a table ([space] with rho, group_sizes, rewards, models)")
        for r in self.space.rewards:
            self.vocabulary.reward(r)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (0 <= self.seed < 2**32):
            raise ConfigError(f"seed={self.seed!r}: must be an integer from 0 to 2**32 - 1")
        if not isinstance(self.objective_settings, Mapping):
            raise ConfigError(f"objective_settings={self.objective_settings!r}: must be a table")
        object.__setattr__(self, "objective_settings", dict(self.objective_settings))
        if not isinstance(self.race, Mapping):
            raise ConfigError(f"race={self.race!r}: must be a table ([race] with RACE's settings, e.g. bandwidth)")
        object.__setattr__(self, "race", dict(self.race))  # its keys and values: RACE checks them
        if self.budget_gpu_hours is not None or self.throughput is not None:
            object.__setattr__(self, "_budget", self._time_budget())

    def _time_budget(self) -> Budget:
        """The :class:`~allocopt.plan.budget.Budget` of the time-budget fields, checked once; it
        sets :attr:`budget_flops` to its ceiling and :attr:`throughput` to its profile's fields.
        Raises :class:`ConfigError` (hours without a profile, a profile without hours, bad
        values)."""
        profile = None if self.throughput is None else ThroughputProfile.from_mapping(self.throughput)
        tb = time_budget(gpu_hours=self.budget_gpu_hours, gpus=self.gpus, profile=profile)
        if tb is None:
            raise ConfigError("throughput: given without a time budget; give budget_gpu_hours "
                              "(--budget-gpu-hours or --budget-usd)")
        budget = Budget.of_time(tb)
        object.__setattr__(self, "budget_flops", budget.flops)
        object.__setattr__(self, "throughput", tb.profile.to_dict())
        return budget

    @property
    def budget(self) -> Budget:
        """The full budget of a trial, parsed once when the spec was built: FLOPs, or GPU-hours
        at :attr:`throughput` (:class:`~allocopt.plan.budget.Budget`)."""
        return self._budget  # type: ignore[attr-defined]

    @property
    def time_budget(self) -> "TimeBudget | None":
        """The :class:`~allocopt.plan.throughput.TimeBudget` of :attr:`budget_gpu_hours`, ``None``
        for a FLOP budget (:attr:`budget`'s)."""
        return self.budget.time

    def budget_for(self, allocation: Allocation, workload: Any, fraction: float = 1.0) -> float:
        """FLOPs a trial of ``allocation`` on ``workload`` may spend at ``fraction`` of the full
        budget (:meth:`allocopt.plan.budget.Budget.for_allocation`).

        Raises:
            ConfigError: the profile was measured on another set-up (fingerprint), or a phase
                the allocation spends FLOPs in has no rate.
        """
        return self.budget.for_allocation(allocation, workload, fraction)

    @classmethod
    def from_toml(cls, path: str | Path, budget_flops: float | None = None,
                  time: Mapping[str, Any] | None = None) -> "StudySpec":
        """Read a study file; ``budget_flops`` (the CLI's ``--budget``) or ``time`` (the time
        budget's fields ``budget_gpu_hours``, ``gpus``, ``throughput``), when given, replaces
        the file's budget. Raises :class:`ConfigError` (missing file, malformed TOML, unknown key, bad
        value, no budget in the file nor given: a study never runs at a default budget) with
        one line."""
        p = Path(path)
        data = read_toml(p, "spec")
        if "vocabulary" in data:
            raise ConfigError(f"vocabulary: not a study-file key in spec {p.name}; declare targets in "
                              "a [targets] table and reward systems in a [rewards] table")
        declared = {k: data.pop(k) for k in ("targets", "rewards") if k in data}
        check_keys(data, cls, f"spec {p.name}", file_keys={"vocabulary": "targets,rewards"})
        if declared:
            data["vocabulary"] = Vocabulary.declare(declared.get("targets"), declared.get("rewards"))
        if isinstance(data.get("budget_flops"), str):
            raise ConfigError(f"budget_flops={data['budget_flops']!r}: must be a number of FLOPs, unquoted "
                              f"in a study file (budget_flops = 1e19), in spec {p.name}")
        if "budget_flops" in data and "budget_gpu_hours" in data:
            raise ConfigError(f"budget_flops, budget_gpu_hours: spec {p.name} gives both a FLOP and a time "
                              "budget; keep one")
        if budget_flops is not None:  # the flag's FLOP budget replaces the file's budget, whichever
            for k in ("budget_gpu_hours", "gpus", "throughput"):
                data.pop(k, None)
            data["budget_flops"] = budget_flops
        if time is not None:  # the flags' time budget likewise
            data.pop("budget_flops", None)
            data.update({k: v for k, v in time.items() if v is not None})
        try:
            spec = cls(**data)
        except TypeError as e:
            raise ConfigError(f"spec {p.name}: {e}") from None
        except ConfigError as e:  # a bad value of the file's: say which file holds it
            flagged = ("budget", "gpus", "throughput") if budget_flops is not None or time is not None else ()
            if p.name in str(e) or str(e).startswith(flagged):
                raise
            raise type(e)(f"{e} (in spec {p.name})") from None
        if "budget_flops" not in data and "budget_gpu_hours" not in data:
            raise ConfigError(f"budget_flops: missing in spec {p.name}; set budget_flops = <FLOPs "
                              "per trial> there (e.g. 1e19) or give --budget")
        return spec

    def with_overrides(self, **kw: Any) -> "StudySpec":
        """A copy with every non-``None`` keyword replaced (CLI flags over file values)."""
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    @property
    def targets(self) -> tuple[str, ...]:
        """Every target, as spelled for people."""
        return self.target if isinstance(self.target, tuple) else (self.target,)

    @property
    def target_keys(self) -> tuple[str, ...]:
        """Every target's Python / MLflow key."""
        return tuple(self.vocabulary.key(t) for t in self.targets)

    @property
    def directions(self) -> tuple[str, ...]:
        """Every target's direction (``maximize``/``minimize``), as its vocabulary declares."""
        return tuple(self.vocabulary.target(t).direction for t in self.targets)

    @property
    def target_key(self) -> str:
        """The (first) target's key."""
        return self.target_keys[0]

    @property
    def sign(self) -> float:
        """+1 when the (first) target is maximized, -1 when minimized: a tuner maximizes
        ``sign × value``."""
        return self.vocabulary.target(self.targets[0]).sign

    @property
    def multi_objective(self) -> bool:
        return len(self.targets) > 1

    def priced(self, workload: Any) -> Any:
        """``workload`` with the reward systems this study declared priced
        (:meth:`allocopt.vocabulary.Vocabulary.price`, those of its space). Raises
        :class:`ConfigError` (a reward model that cannot be read)."""
        return self.vocabulary.price(workload, self.space.rewards)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["space"] = asdict(self.space)
        d["vocabulary"] = self.vocabulary.to_dict()
        return d


def _space(data: Mapping[str, Any]) -> SearchSpace:
    check_keys(data, SearchSpace, "space")
    return SearchSpace(**data)


def allocation_in(space: SearchSpace, params: Mapping[str, Any]) -> Allocation:
    """The allocation of a trial's parameters (``rho``, ``group_size``, ``reward``, ``model``;
    dimensions ``space`` fixes are filled from it; other parameters are ignored). Raises
    :class:`ConfigError` for values no allocation accepts."""
    s = space
    return Allocation(rho=float(params.get("rho", s.rho[0])),
                      group_size=int(params.get("group_size", s.group_sizes[0])),
                      reward=str(params.get("reward", s.rewards[0])),
                      model=params.get("model", s.models[0] if s.models else None))


def allocation_of(spec: StudySpec, params: Mapping[str, Any]) -> Allocation:
    """:func:`allocation_in` the study's space."""
    return allocation_in(spec.space, params)
