"""A study's vocabulary: the targets it measures and the reward systems it may choose.

Standard library and the pure core only. Every study knows the built-in names (targets
``native_reward``, ``pass@1``, ``pass@1:gsm8k``, ``pass@1:math500``, ``judge``; reward systems
``sparse``, ``structured``, ``dense`` (rule-based), ``proxy_prm``, ``prm`` (model-based)); a study
file declares more, or changes a built-in one, in two tables::

    target = ["aime24", "cost_usd"]

    [targets]
    aime24 = { direction = "maximize", range = [0, 1] }
    cost_usd = { direction = "minimize" }

    [rewards]
    rule = { kind = "rule" }
    orm8b = { kind = "model", model = "configs/orm-8b/config.json", scoring = "forward" }

    [space]
    rewards = ["rule", "orm8b"]

A model-based reward system is priced from its model as a policy is (a preset, a local folder
or ``config.json``, a hub id, or an explicit ``shape`` table of
:class:`~allocopt.flops.shapes.ModelShape` fields) and by how it scores (:data:`SCORINGS`).

Names as stored. MLflow rejects ``@`` (and ``:``, spaces, ...) in keys, so a target is stored
under its *key* (:func:`metric_key`): ``@`` → ``_at_``, any other character MLflow rejects →
``_`` (``pass@1:gsm8k`` → ``pass_at_1_gsm8k``). Two names with one key are refused; tables
and queries show the declared name again (:meth:`Vocabulary.label`).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from allocopt.errors import ConfigError
from allocopt.tomlio import unknown_key

DIRECTIONS: tuple[str, ...] = ("maximize", "minimize")
KINDS: tuple[str, ...] = ("rule", "model")
SCORINGS: tuple[str, ...] = ("forward", "steps", "outcome")
"""How a model-based reward system scores a completion, which sets its FLOPs: ``forward`` (one
forward over prompt + completion, its head at every position, as HF's
``*ForSequenceClassification`` runs it), ``steps`` (the same plus one marker token per
reasoning step: a process reward model such as Qwen2.5-Math-PRM), ``outcome`` (the forward
with its head at the last position only: an outcome head that reads one hidden state)."""
MAX_NAME = 100
_NOT_KEY = re.compile(r"[^A-Za-z0-9_.\-/]")


def metric_key(name: str) -> str:
    """The key a target is stored under in MLflow and Optuna: ``@`` → ``_at_``, every other
    character outside ``[A-Za-z0-9_.-/]`` (``:``, spaces, ...) → ``_`` (``pass@1:gsm8k`` →
    ``pass_at_1_gsm8k``); :func:`allocopt.tracking.layout.mlflow_key` maps every key so."""
    return _NOT_KEY.sub("_", name.replace("@", "_at_"))


def check_name(name: Any, what: str) -> str:
    """``name`` if it is a usable target or reward-system name; else :class:`ConfigError`."""
    if not isinstance(name, str) or not name.strip() or name != name.strip() or not name.isprintable():
        raise ConfigError(f"{what}={str(name)[:80]!r}: must be a non-empty printable name without "
                          "leading or trailing spaces")
    if len(name) > MAX_NAME:
        raise ConfigError(f"{what}={name[:40]!r}...: at most {MAX_NAME} characters")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise ConfigError(f"{what}={name!r}: a '/' must sit between two names (MLflow keys are paths)")
    return name


@dataclass(frozen=True)
class TargetDef:
    """A target a study measures."""

    name: str
    direction: str = "maximize"
    """``maximize`` or ``minimize``."""
    range: tuple[float, float] | None = None
    """``[low, high]`` a measured value must lie in (a share: ``[0, 1]``); ``None``: any finite
    number."""

    def __post_init__(self) -> None:
        check_name(self.name, "targets")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"targets.{self.name}.direction={self.direction!r}: allowed: "
                              f"{', '.join(DIRECTIONS)}")
        if self.range is not None:
            r = self.range
            if not isinstance(r, (list, tuple)) or len(r) != 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in r) \
                    or not r[0] < r[1]:
                raise ConfigError(f"targets.{self.name}.range={r!r}: must be [low, high], finite, low < high")
            object.__setattr__(self, "range", (float(r[0]), float(r[1])))

    @property
    def key(self) -> str:
        return metric_key(self.name)

    @property
    def sign(self) -> float:
        """+1 for a maximized target, -1 for a minimized one."""
        return 1.0 if self.direction == "maximize" else -1.0

    def check_value(self, value: Any) -> float:
        """``value`` as a float if it is a finite number in :attr:`range`; else :class:`ConfigError`."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{self.name}={value!r}: a target must be a finite number")
        if self.range is not None and not self.range[0] <= value <= self.range[1]:
            lo, hi = self.range
            what = "a share in [0, 1] (0.52, not 52)" if (lo, hi) == (0.0, 1.0) else f"in [{lo:g}, {hi:g}]"
            raise ConfigError(f"{self.name}={value!r}: must be {what}")
        return float(value)


@dataclass(frozen=True)
class RewardDef:
    """A reward system a study may choose, and what it costs."""

    name: str
    kind: str = "rule"
    """``rule`` (a checker: no FLOPs) or ``model`` (a reward model's forward per completion)."""
    model: str | None = None
    """A model-based system's model: a preset, a local folder or ``config.json``, a hub id."""
    shape: Mapping[str, Any] | None = None
    """Or its shape, as :class:`~allocopt.flops.shapes.ModelShape` fields."""
    scoring: str = "forward"
    """How it scores (:data:`SCORINGS`)."""

    def __post_init__(self) -> None:
        check_name(self.name, "rewards")
        where = f"rewards.{self.name}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}.kind={self.kind!r}: allowed: {', '.join(KINDS)}")
        if self.scoring not in SCORINGS:
            raise ConfigError(f"{where}.scoring={self.scoring!r}: allowed: {', '.join(SCORINGS)}")
        if self.kind == "rule" and (self.model is not None or self.shape is not None):
            raise ConfigError(f"{where}: a rule-based system costs no FLOPs; drop model/shape or "
                              "set kind = \"model\"")
        if self.kind == "model":
            if (self.model is None) == (self.shape is None):
                raise ConfigError(f"{where}: a model-based reward system needs its price: give model "
                                  "(a preset, a config.json or folder, a hub id) or shape (its "
                                  "fields), one of them")
            if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
                raise ConfigError(f"{where}.model={self.model!r}: must name a model")
            if self.shape is not None and not isinstance(self.shape, Mapping):
                raise ConfigError(f"{where}.shape={self.shape!r}: must be a table of model-shape fields")
        if self.shape is not None:
            object.__setattr__(self, "shape", dict(self.shape))

    def model_shape(self) -> Any:
        """The reward model's :class:`~allocopt.flops.shapes.ModelShape` (a hub id is fetched).
        Raises :class:`ConfigError` naming this system."""
        from allocopt.flops.shapes import ModelShape
        from allocopt.plan.hub import model_shape
        from allocopt.tomlio import check_keys

        import os

        where = f"rewards.{self.name}"
        m = str(self.model or "")
        if self.shape is None and (m.endswith(".json") or m.startswith((".", "/", "~"))) and not os.path.exists(m):
            raise ConfigError(f"{where}.model={m!r}: no such file or folder (from the working folder "
                              f"{os.getcwd()}); give a config.json, a folder holding one, a preset or a hub id")
        try:
            if self.shape is not None:
                check_keys(self.shape, ModelShape, f"{where}.shape")
                return ModelShape(**{"name": self.name, **self.shape})
            return model_shape(str(self.model))
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{where}: {e}") from None


TARGETS: tuple[TargetDef, ...] = (
    TargetDef("native_reward"),
    TargetDef("pass@1", range=(0.0, 1.0)),
    TargetDef("pass@1:gsm8k", range=(0.0, 1.0)),
    TargetDef("pass@1:math500", range=(0.0, 1.0)),
    TargetDef("judge", range=(0.0, 1.0)),
)
"""The built-in targets (the tiny and qwen objectives measure them)."""
REWARDS: tuple[RewardDef, ...] = (
    RewardDef("sparse"), RewardDef("structured"), RewardDef("dense"),
    RewardDef("proxy_prm", "model", model="proxy-prm-1.5b", scoring="steps"),
    RewardDef("prm", "model", model="Qwen/Qwen2.5-Math-PRM-7B", scoring="steps"),
)
"""The built-in reward systems (their models: :func:`allocopt.plan.allocation.default_reward_models`)."""
BUILTIN_REWARDS = frozenset(r.name for r in REWARDS)


@dataclass(frozen=True)
class Vocabulary:
    """The built-in targets and reward systems with a study's declared ones (a declared name
    replaces the built-in one of that name)."""

    targets: tuple[TargetDef, ...] = TARGETS
    rewards: tuple[RewardDef, ...] = REWARDS
    declared: tuple[str, ...] = field(default=(), compare=False)
    """Names the study file declared (``targets.X``/``rewards.X``), for messages."""

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for t in self.targets:
            other = seen.setdefault(t.key, t.name)
            if other != t.name:
                raise ConfigError(f"targets.{t.name}: stored as {t.key!r} (MLflow keys: @ → _at_, "
                                  f"other characters MLflow rejects → _), the key of target {other!r} "
                                  "too; rename one")

    @classmethod
    def declare(cls, targets: Mapping[str, Any] | None = None,
                rewards: Mapping[str, Any] | None = None) -> "Vocabulary":
        """The built-ins with a study file's ``[targets]`` and ``[rewards]`` tables (name →
        fields). Raises :class:`ConfigError` in one line naming the table and field."""
        ts = {t.name: t for t in TARGETS}
        rs = {r.name: r for r in REWARDS}
        for table, kind, given, out in (("targets", TargetDef, targets, ts), ("rewards", RewardDef, rewards, rs)):
            if given is None:
                continue
            if not isinstance(given, Mapping):
                raise ConfigError(f"{table}={given!r}: must be a table of name = {{ ... }}")
            for name, fields_ in given.items():
                check_name(name, table)
                if not isinstance(fields_, Mapping):
                    raise ConfigError(f"{table}.{name}={fields_!r}: must be a table, e.g. "
                                      + ('{ direction = "maximize" }' if table == "targets" else '{ kind = "rule" }'))
                out[name] = _build(kind, table, name, fields_)
        declared = tuple(targets or ()) + tuple(rewards or ())
        return cls(tuple(ts.values()), tuple(rs.values()), declared)

    @classmethod
    def of(cls, data: "Vocabulary | Mapping[str, Any] | None") -> "Vocabulary":
        """From itself, ``None`` (the built-ins) or :meth:`to_dict`'s data (a stored spec)."""
        if data is None:
            return cls()
        if isinstance(data, Vocabulary):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"vocabulary={data!r}: must be a table with targets and rewards")
        return cls.declare(data.get("targets") or {}, data.get("rewards") or {})

    def to_dict(self) -> dict[str, Any]:
        """The declared entries that differ from the built-ins (what a stored spec keeps)."""
        bt, br = {t.name: t for t in TARGETS}, {r.name: r for r in REWARDS}
        drop = ("name",)
        return {"targets": {t.name: {k: v for k, v in asdict(t).items() if k not in drop and v is not None}
                            for t in self.targets if t.name in self.declared or bt.get(t.name) != t},
                "rewards": {r.name: {k: v for k, v in asdict(r).items() if k not in drop and v is not None}
                            for r in self.rewards if r.name in self.declared or br.get(r.name) != r}}

    # --- targets
    def target(self, name: str) -> TargetDef:
        """The target ``name`` (or its key). Raises :class:`ConfigError` naming the allowed ones."""
        for t in self.targets:
            if name in (t.name, t.key):
                return t
        raise ConfigError(f"target={name!r}: unknown target; allowed: "
                          f"{', '.join(t.name for t in self.targets)} (or declare it in the study "
                          "file's [targets] table)")

    def key(self, name: str) -> str:
        return self.target(name).key

    def label(self, key: str) -> str:
        """The declared name of a stored key (itself when no target has it)."""
        return next((t.name for t in self.targets if t.key == key), key)

    # --- reward systems
    def reward(self, name: str) -> RewardDef:
        """The reward system ``name``. Raises :class:`ConfigError` naming the allowed ones."""
        for r in self.rewards:
            if r.name == name:
                return r
        raise ConfigError(f"reward={name!r}: unknown reward system; allowed: "
                          f"{', '.join(r.name for r in self.rewards)} (or declare it in the study "
                          "file's [rewards] table)")

    @property
    def reward_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rewards)

    def price(self, workload: Any, names: tuple[str, ...] | None = None) -> Any:
        """``workload`` (:class:`~allocopt.plan.allocation.Workload`) that prices the declared
        reward systems among ``names`` (default: all declared): model-based ones by their
        model's shape and scoring, rule-based ones at no FLOPs. Built-ins keep the objective's
        own pricing (the tiny world's PRMs are its own). Raises :class:`ConfigError`."""
        declared = [r for r in self.rewards if r.name in self.declared
                    and (names is None or r.name in names)]
        if not declared:
            return workload
        models = dict(workload.reward_models)
        rules = set(workload.rule_rewards)
        scoring = dict(workload.reward_scoring)
        for r in declared:
            if r.kind == "rule":
                rules.add(r.name)
                models.pop(r.name, None)
            else:
                models[r.name] = r.model_shape()
                rules.discard(r.name)
                scoring[r.name] = r.scoring
        return replace(workload, reward_models=models, rule_rewards=frozenset(rules),
                       reward_scoring=scoring)


def _build(cls_: type, table: str, name: str, fields_: Mapping[str, Any]) -> Any:
    """``cls_(name, **fields_)`` with one-line errors naming ``table.name``."""
    from dataclasses import fields

    if "name" in fields_:
        raise ConfigError(f"{table}.{name}.name: the table's key is the name; drop the field")
    known = sorted(f.name for f in fields(cls_) if f.name != "name")
    unknown = sorted(set(fields_) - set(known))
    if unknown:
        raise ConfigError(unknown_key(f"{table}.{name}", unknown[0], known))
    try:
        return cls_(name, **fields_)
    except TypeError as e:
        raise ConfigError(f"{table}.{name}: {e}") from None


__all__ = ["BUILTIN_REWARDS", "DIRECTIONS", "KINDS", "REWARDS", "RewardDef", "SCORINGS", "TARGETS",
           "TargetDef", "Vocabulary", "check_name", "metric_key"]
