"""Pieces the CLI commands share: the objective and the MLflow tracker, with one-line errors.

Kept apart from :mod:`allocopt.cli` so that command modules (:mod:`allocopt.cli.race`, ...) can
use them without importing ``allocopt.cli`` itself. The study a command runs is read by
:func:`read_spec` (the budget parsed once there), its objective loaded by :func:`load_workload`,
its run tracked by :func:`tracked_command` (the tracker's lifecycle is
:mod:`allocopt.tracking.lifecycle`'s; what is here prints, exits and guards against signals).
"""

from __future__ import annotations

import contextlib
import os

from typing import Any, Iterator

from allocopt.errors import DiskFull, disk_full
from allocopt.flops import ConfigError


def load_objective(name: str, settings: dict | None = None, *, available: bool = True) -> Any:
    """The objective ``name`` with its settings, ready to run on this machine (``available``;
    else :func:`check_available` before it runs, once what was asked of it is checked).

    Raises:
        ConfigError: unknown objective, bad settings, or the objective cannot run here (the
            message says what to use instead).
    """
    from allocopt.objective import get_objective

    try:
        obj = get_objective(name, **(settings or {}))
    except (ValueError, TypeError) as e:
        raise ConfigError(_settings_refusal(name, e)) from None
    return check_available(obj) if available else obj


def _settings_refusal(name: str, e: Exception) -> str:
    """The one line of an objective that refused to be built: a refused setting is led by
    ``objective_settings`` (the study file's table; :func:`with_flag` names ``--set`` when
    that gave it), else the objective's own line."""
    first = str(e).splitlines()[0]
    if isinstance(e, TypeError):
        return f"objective_settings for objective={name!r}: {first}"
    return f"objective_settings: {first}" if first.startswith("setting ") else first


def check_available(obj: Any) -> Any:
    """``obj`` when this machine can run it; else :class:`ConfigError` saying what to use instead."""
    from allocopt.objective import ObjectiveUnavailable

    try:
        obj.check_available()
    except ObjectiveUnavailable as e:
        raise ConfigError(str(e)) from None
    return obj


def check_storage(storage: str, spec: Any = None) -> None:
    """:func:`allocopt.store.connect.check_storage_url` and, given the study's ``spec``,
    :func:`allocopt.study.open.preflight_study` (the storage opens; a study of that name was run
    under the same terms), as a :class:`ConfigError` (one line, exit 2). Writes nothing: run
    before MLflow records anything."""
    from allocopt.errors import StorageError
    from allocopt.store.connect import check_storage_url

    try:
        check_storage_url(storage)
    except StorageError as e:
        raise ConfigError(str(e)) from None
    if spec is not None:
        from allocopt.study.open import StudyError, preflight_study

        try:
            preflight_study(spec, storage)
        except StudyError as e:
            raise ConfigError(str(e)) from None


def check_models(spec: Any, workload: Any) -> None:
    """Refuse a ``space.models`` entry the objective cannot plan, in one line naming the field
    and the objective's own sizes, before anything is planned or recorded."""
    from allocopt.plan.allocation import policy_named

    for m in spec.space.models:
        policy_named(workload, m, "space.models")


def check_space_feasible(spec: Any, workload: Any, pilot_fraction: float | None = None) -> None:
    """Refuse a study whose budget (or pilot budget) cannot buy one iteration of any allocation
    in its space, before anything is recorded. The cost of an iteration grows with ρ (more rows
    trained), so each G × reward × model is checked at both ends of the ρ range.

    Raises:
        ConfigError: one line with the smallest feasible plan's budget.
    """
    import itertools

    from allocopt.plan.allocation import Allocation, min_budget

    check_models(spec, workload)
    sp = spec.space
    allocs = [Allocation(rho=r, group_size=g, reward=w, model=m) for r, g, w, m in itertools.product(
        sorted(set(sp.rho)), sp.group_sizes, sp.rewards, sp.models or (None,))]
    # the allocation whose budget buys most of its smallest plan (a time budget gives each its
    # own): when even it cannot buy one iteration, no allocation can
    _, need, b, a = max(((spec.budget_for(a, workload) / min_budget(a, workload), min_budget(a, workload),
                          spec.budget_for(a, workload), a) for a in allocs), key=lambda x: x[0])
    where = (f"rho={a.rho:g}, group_size={a.group_size}, reward={a.reward}"
             + (f", model={a.model}" if a.model else ""))
    if b < need:
        raise ConfigError(f"budget_flops={b:.3g}: too small for one GRPO iteration of any allocation "
                          f"in the space; the smallest feasible plan ({where}) needs {need:.3g} FLOPs")
    if pilot_fraction is not None and pilot_fraction * b < need:
        raise ConfigError(f"pilot_fraction={pilot_fraction:g}: pilots at {pilot_fraction:g} x "
                          f"{b:.3g} = {pilot_fraction * b:.3g} FLOPs cannot buy one GRPO iteration of "
                          f"any allocation; the smallest feasible plan ({where}) needs {need:.3g} "
                          f"FLOPs (budget_flops >= {need / pilot_fraction:.3g}, or a larger pilot fraction)")


class one_interrupt:
    """Within the block, the first Ctrl-C (SIGINT) or SIGTERM (what ``kill``, ``timeout`` and
    a batch scheduler's preemption send) raises KeyboardInterrupt as usual; further ones only
    print a line, so the interrupted trial's record (Optuna and MLflow) is written in full (a
    second Ctrl-C used to cut it short and leave the MLflow run RUNNING; a SIGTERM used to end
    the process at once and leave the trial and both MLflow runs RUNNING). With
    ``raise_first=False`` every such signal only prints (for the closing records).
    :attr:`exit_code` is the shell's for the signal received: 130 (SIGINT), 143 (SIGTERM)."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, raise_first: bool = True):
        self.raise_first = raise_first
        self.exit_code = 130
        self.received = False

    def __enter__(self) -> "one_interrupt":
        import signal
        import sys

        def first(signum: int, frame: Any) -> None:
            self.exit_code, self.received = 128 + signum, True
            for name in self.SIGNALS:
                signal.signal(getattr(signal, name), again)
            raise KeyboardInterrupt

        def again(signum: int, frame: Any) -> None:
            sys.stderr.write("interrupting: saving the interrupted trial's record, one moment\n")

        self.previous = {name: signal.getsignal(getattr(signal, name)) for name in self.SIGNALS}
        for name in self.SIGNALS:
            signal.signal(getattr(signal, name), first if self.raise_first else again)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self.received:  # the process is on its way out: a second signal between this block
            return  # and the closing records' block must not kill it (it only prints)
        for name, handler in self.previous.items():
            signal.signal(getattr(signal, name), handler)


def parse_settings(items: list[str] | None) -> dict:
    """``--set KEY=VALUE`` pairs as objective settings; values read as TOML (numbers, true,
    quoted strings), else kept as text. Raises :class:`ConfigError` for a pair without ``=``,
    a NaN or infinite number, or a value nested deeper than 64 levels."""
    import math

    from allocopt.limits import MAX_DEPTH, check_depth
    from allocopt.tomlio import tomllib  # tomli on Python 3.10

    out: dict = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item[:80]!r}: must be KEY=VALUE (an objective setting)")
        try:
            v = tomllib.loads(f"v = {value}")["v"]
        except RecursionError:
            raise ConfigError(f"--set {key.strip()}: nested deeper than the limit of {MAX_DEPTH} levels") from None
        except ValueError:  # TOMLDecodeError: not a TOML value, kept as text
            v = value
        check_depth(v, key.strip(), "--set")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"--set {key.strip()}={value}: must be a finite number")
        out[key.strip()] = v
    return out


def quiet_library_warnings() -> None:
    """Hide the optimization libraries' warnings in a study's or race's output (BoTorch's
    "not standardized", Optuna's "is experimental" for its BoTorch sampler and heartbeats):
    they are about the libraries' own internals, not the user's input."""
    import os
    import warnings

    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    warnings.filterwarnings("ignore", module=r"(botorch|optuna|optuna_integration|linear_operator|gpytorch)(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(not standardized|is experimental).*")


FLAG_OF = {"budget_flops": "--budget", "rollouts_per_iteration": "--rollouts",
           "max_rollouts_per_iteration": "--max-rollouts", "name": "--study-name",
           "objective_settings": "--set"}
"""The flags whose field (in a study file, in an error line) is spelled otherwise; any other
field's flag is its name with dashes (``pilot_fraction``: ``--pilot-fraction``)."""
ALIASES = {"--max-pilots": ("--pilots",), "--group-size": ("-G",), "--num": ("-n",)}
"""Other names a flag is given by (``allocopt race --pilots``, as ``allocopt study`` names it)."""


def field_of(message: str) -> str | None:
    """The field a refusal (``field=value: what is allowed``) names first, or ``None``."""
    import re

    m = re.match(r"([a-z_]+)[=:]", message)
    return m.group(1) if m else None


def with_flag(message: str, argv: list[str]) -> str:
    """``message`` (``field=value: what is allowed``) led by the flag that gave the field when
    that flag was given in ``argv`` (``--budget: budget_flops='-5': ...``, ``--trials:
    trials=0: ...``): the user typed the flag, the study file and the records say the field,
    and the line says which of the two was wrong."""
    field = field_of(message)
    flag = (FLAG_OF.get(field) or "--" + field.replace("_", "-")) if field else None
    typed = next((f for f in (flag, *ALIASES.get(flag, ())) if any(a == f or a.startswith(f + "=") for a in argv)),
                 None) if flag else None
    if typed is None and field and _set_gave(field, argv):  # an objective setting: --set model=PATH
        typed = "--set"
    return f"{typed}: {message}" if typed else message


def _set_gave(field: str, argv: list[str]) -> bool:
    """Whether ``--set FIELD=...`` (or ``--set=FIELD=...``) is in ``argv``."""
    given = [b for a, b in zip(argv, argv[1:]) if a == "--set"] + [a[6:] for a in argv if a.startswith("--set=")]
    return any(g.startswith(field + "=") for g in given)


def fail(line: str, code: int = 2) -> None:
    """Print one line on stderr and exit with ``code``."""
    import sys

    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.exit(code)


def read_spec(path: Any, budget: str | None, set_: list[str] | None = None, *,
              time: dict | None = None, **overrides: Any) -> Any:
    """The study of a command: the study file ``path`` (read once, TOML) or the defaults, the
    flags over it (``overrides``, ``None`` left out) and ``--set KEY=VALUE`` over its objective
    settings. The budget is parsed here, once (:func:`allocopt.plan.allocation.check_budget`):
    everything below gets ``spec.budget_flops`` (FLOPs, a float), or, for a time budget
    (``time``: the flags of :func:`time_flags`), ``spec.budget_for(allocation, workload)``.

    Raises:
        ConfigError: no budget (neither ``--budget`` nor ``--spec``), a bad budget, a bad file,
            setting or ``[race]`` entry (one line).
    """
    from dataclasses import replace

    from allocopt.plan.allocation import check_budget
    from allocopt.spec import StudySpec

    quiet_library_warnings()
    t = read_one_budget(budget, time)
    if path is None and budget is None and t is None:
        raise ConfigError("budget: missing; give --budget FLOPS (e.g. 1e19), --budget-gpu-hours H with "
                          "--throughput FILE, or --spec FILE")
    b = None if budget is None else check_budget(budget)
    if path and not os.path.lexists(path):  # else a bare "file not found": say where and what to give
        raise ConfigError(f"spec={str(path)!r}: file not found (relative to {os.getcwd()}); give a study file "
                          "(TOML, e.g. studies/tiny.toml in allocopt's repository), or flags without --spec")
    if path:
        s = _file_then_flags(StudySpec.from_toml(path, b, t), path, b, overrides)
    else:
        s = StudySpec(**(t or {})).with_overrides(budget_flops=b, **overrides)
    if set_:
        s = replace(s, objective_settings={**s.objective_settings, **parse_settings(set_)})
    from allocopt.race.design import check_race_table

    from allocopt.objective import unknown_objective

    in_file = f" (in spec {os.path.basename(path)})" if path else ""
    try:
        check_race_table(s.race)  # a bad [race] key is refused now, before anything is opened
    except ConfigError as e:  # the [race] table is only ever the file's: say which file
        raise type(e)(f"{e}{in_file}") from None
    bad = unknown_objective(s.objective)
    if bad:  # refused where it is read, so the line can say where
        raise ConfigError(bad + ("" if overrides.get("objective") is not None else in_file))
    return s


def _file_then_flags(spec: Any, path: Any, budget: float | None, overrides: dict) -> Any:
    """``spec`` (read from ``path``) with the flags over it; a value of the file's that a flag
    makes wrong (``initial_design = true`` with ``--tuner bo``) is refused naming the file."""
    try:
        return spec.with_overrides(budget_flops=budget, **overrides)
    except ConfigError as e:
        field = field_of(str(e))
        if field and overrides.get(field) is None and field not in ("budget_flops", "budget_gpu_hours"):
            raise type(e)(f"{e} (in spec {os.path.basename(path)})") from None
        raise


def time_flags() -> dict:
    """The typer options of a time budget, shared by ``plan``, ``study``, ``race`` and ``ask``
    (parameter name -> ``typer.Option``); :func:`read_time_budget` reads them."""
    import typer

    return {
        "budget_gpu_hours": typer.Option(None, "--budget-gpu-hours", help="Time budget instead of --budget: GPU-hours of each run (wall hours x --gpus), priced per allocation at --throughput's per-phase FLOP/s (search-heavy allocations get fewer FLOPs)."),
        "gpus": typer.Option(None, "--gpus", help="GPUs a run uses, with a time budget. \\[default: 1]"),
        "budget_usd": typer.Option(None, "--budget-usd", help="Time budget in dollars: GPU-hours = this / --usd-per-gpu-hour."),
        "usd_per_gpu_hour": typer.Option(None, "--usd-per-gpu-hour", help="Price of one GPU-hour in dollars, with --budget-usd."),
        "throughput": typer.Option(None, "--throughput", help="Throughput profile (TOML/JSON: FLOP/s per GPU per phase; allocopt account --from-verl LOG --save-throughput FILE writes one)."),
        "gpu": typer.Option(None, "--gpu", help="GPU the runs will use (e.g. H100-80GB), with a time budget: a --throughput profile measured on another GPU (its gpu field, case aside) is refused. \\[default: not checked]"),
    }


TIME_FLAGS = ("budget_gpu_hours", "gpus", "budget_usd", "usd_per_gpu_hour", "throughput", "gpu")
"""The parameters of :func:`time_flags`, in the order :func:`read_time_budget` takes them."""


def bundled_options(bundle: str, options: dict[str, tuple[Any, Any]]) -> Any:
    """A decorator: the command's keyword parameter ``bundle`` becomes the typer ``options``
    (parameter name -> ``(type, typer.Option)``), shown and parsed where ``bundle`` stands;
    the command receives their values as one dict ``bundle`` (name -> value). Options several
    commands share are so written once, and read as one thing."""
    import functools
    import inspect

    def decorate(command: Any) -> Any:
        @functools.wraps(command)
        def with_bundle(**kwargs: Any) -> Any:
            values = {k: kwargs.pop(k) for k in options}
            return command(**kwargs, **{bundle: values})

        sig = inspect.signature(command, eval_str=True)
        params = []
        for p in sig.parameters.values():  # the options stand where the bundle stands (--help order)
            params += [p] if p.name != bundle else [
                inspect.Parameter(k, p.kind, default=opt, annotation=kind) for k, (kind, opt) in options.items()]
        with_bundle.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        with_bundle.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != bundle},
                                       **{k: kind for k, (kind, _) in options.items()}}
        return with_bundle

    return decorate


def takes_time_budget(command: Any) -> Any:
    """``command`` with the time-budget options (:func:`time_flags`) in place of its keyword
    parameter ``time`` (:func:`bundled_options`): it receives them as one dict ``time``
    (:data:`TIME_FLAGS` -> value, for ``read_time_budget(**time)``). Shared by ``plan``,
    ``study``, ``race`` and ``ask``."""
    from pathlib import Path
    from typing import Optional

    types = {"budget_gpu_hours": Optional[float], "gpus": Optional[int], "budget_usd": Optional[float],
             "usd_per_gpu_hour": Optional[float], "throughput": Optional[Path], "gpu": Optional[str]}
    flags = time_flags()
    return bundled_options("time", {k: (types[k], flags[k]) for k in TIME_FLAGS})(command)


def read_one_budget(budget: str | None, time: dict | None) -> dict | None:
    """:func:`read_time_budget` of the flags ``time``, refused first when ``--budget`` is given
    beside hours or dollars (the time budget's own refusals, such as a missing profile, would
    otherwise hide that the two were given)."""
    time = time or {}
    if budget is not None and any(time.get(k) is not None for k in ("budget_gpu_hours", "budget_usd")):
        raise ConfigError("budget, budget_gpu_hours: give a FLOP budget (--budget) or a time budget "
                          "(--budget-gpu-hours / --budget-usd), not both")
    return read_time_budget(**time)


def read_time_budget(budget_gpu_hours: float | None = None, gpus: int | None = None,
                     budget_usd: float | None = None, usd_per_gpu_hour: float | None = None,
                     throughput: Any = None, gpu: str | None = None) -> dict | None:
    """The time budget of the flags as :class:`~allocopt.spec.StudySpec` fields
    (``budget_gpu_hours``, ``gpus``, ``throughput``), ``None`` when none is given. ``gpu``: the
    GPU the runs will use, checked against the profile's (``None``: not checked); the set-up's
    fingerprint is checked per allocation, once its workload is known
    (:meth:`~allocopt.spec.StudySpec.budget_for`).

    Raises:
        ConfigError: hours and dollars both; dollars without a price; no throughput source;
            a bad profile file or value; a profile measured on another GPU than ``gpu`` (one
            line)."""
    from allocopt.plan.throughput import gpu_hours_of, load_profile, time_budget

    hours = gpu_hours_of(gpu_hours=budget_gpu_hours, usd=budget_usd, usd_per_gpu_hour=usd_per_gpu_hour)
    if hours is None:
        given = [n for n, v in (("gpus", gpus), ("throughput", throughput), ("gpu", gpu)) if v is not None]
        if given:
            raise ConfigError(f"{given[0]}: only used with a time budget; give --budget-gpu-hours H or "
                              "--budget-usd D")
        return None
    profile = None if throughput is None else load_profile(throughput)
    tb = time_budget(gpu_hours=hours, gpus=1 if gpus is None else gpus, profile=profile)
    if gpu is not None:  # the set-up (fingerprint) is checked per allocation, later
        tb.profile.check_for(tb.profile.setup_fingerprint, gpu)
    return {"budget_gpu_hours": tb.gpu_hours, "gpus": tb.gpus, "throughput": tb.profile.to_dict()}


def load_workload(spec: Any, pilot_fraction: float | None = None) -> tuple[Any, Any]:
    """The objective of ``spec`` and its workload (models built or loaded, cached after the
    first run), refused when the budget (or, given ``pilot_fraction``, the pilot budget) buys
    no iteration of any allocation (:func:`check_space_feasible`)."""
    from rich.console import Console

    obj = load_objective(spec.objective, spec.objective_settings)
    check_objective_targets(spec, obj)
    check_space(spec, obj)
    with Console(stderr=True).status("preparing the objective's workload (its models are built or loaded, "
                                     "cached after the first run)..."):
        workload = spec.priced(obj.workload())
    check_space_feasible(spec, workload, pilot_fraction)
    return obj, workload


def check_run_time(spec: Any, obj: Any, yes: bool, num_full: int | None = None) -> None:
    """Refuse, before anything is recorded, a study whose full run would take longer here than
    ``allocopt trial`` allows without ``--yes`` (:data:`~allocopt.cli.live.TRIAL_WALL_LIMIT_S`),
    by the objective's measured FLOP/s (the CPU objectives have one). A time budget
    (``--budget-gpu-hours``) states the run's length itself, and an objective without a measured
    rate (a GPU run) cannot be estimated: both pass. ``num_full``: the full runs the command
    would run (default the study's ``trials``), stated with the refusal."""
    from allocopt.cli.live import TRIAL_WALL_LIMIT_S, duration, estimated_seconds

    secs = None if yes or spec.time_budget is not None else estimated_seconds(obj, spec.budget_flops)
    if secs is None or secs <= TRIAL_WALL_LIMIT_S:
        return
    n = spec.trials if num_full is None else max(num_full, 1)
    raise ConfigError(
        f"budget={spec.budget_flops:.3g}: one full run of the {spec.objective} objective would take about "
        f"{duration(secs)} here ({n} of them about {duration(secs * n)}; at "
        f"{obj.flops_per_second:.2g} FLOP/s, its measured rate); allowed without --yes: at most "
        f"{duration(TRIAL_WALL_LIMIT_S)} a run (give a smaller --budget, or --yes)")


def tracked_command(spec: Any, storage: str, mlflow_uri: str | None, no_mlflow: bool, work: Any) -> tuple[Any, Any]:
    """A command's :func:`allocopt.tracking.lifecycle.tracked`: ``work(tracker)`` run with the
    study's MLflow tracker (``None`` with ``no_mlflow``), which is closed after it (parent run
    FINISHED, FAILED, or KILLED on Ctrl-C or SIGTERM: then one line and exit 130 or 143,
    finished trials are kept; a second signal only prints while the records are written).
    Returns ``(what work returned, tracker)``.

    Raises:
        ConfigError: the study cannot start (:class:`allocopt.study.open.StudyError`).
        DiskFull: a disk under the study's records filled up (one line).
    """
    from rich.console import Console

    from allocopt.redact import redact_url
    from allocopt.study.open import StudyError
    from allocopt.tracking.lifecycle import make_tracker, tracked

    with Console(stderr=True).status("opening MLflow tracking..."), probe_interrupt_exits():
        tracker = make_tracker(spec.name, mlflow_uri, enabled=not no_mlflow, storage=storage)
    guard = one_interrupt()

    def guarded(t: Any) -> Any:
        with guard:
            return work(t)

    def interrupted() -> None:
        fail(f"interrupted: finished trials are kept in {redact_url(storage)}; run the same command "
             "to resume", guard.exit_code)

    try:
        return tracked(tracker, spec.name, storage, guarded, on_interrupt=interrupted,
                       closing=lambda: one_interrupt(raise_first=False)), tracker
    except StudyError as e:
        raise ConfigError(str(e)) from None


@contextlib.contextmanager
def probe_interrupt_exits() -> Iterator[None]:
    """Within the block, Ctrl-C while the MLflow store is probed
    (:class:`~allocopt.errors.ProbeInterrupted`) is its one line on stderr and exit 130."""
    from allocopt.errors import ProbeInterrupted

    try:
        yield
    except ProbeInterrupted as e:
        fail(str(e), 130)


@contextlib.contextmanager
def disk_full_as_one_line(storage: str, tracker: Any = None, again: str | None = None) -> Iterator[None]:
    """Within the block, an error that is a full disk under the study's records (Optuna's
    SQLite file, MLflow's store: :func:`allocopt.errors.disk_full`) becomes :class:`DiskFull`
    with :func:`~allocopt.tracking.lifecycle.disk_full_line` (one line naming the file, exit 1),
    as :func:`tracked_command` does for a study; ``tracker`` is the MLflow tracker or a
    zero-argument callable returning it (or ``None``); ``again``: what running the same command
    does then (:func:`~allocopt.tracking.lifecycle.disk_full_line`). MLflow's store's own log of
    each failed write is silenced meanwhile.

    Raises:
        DiskFull: the disk filled up (what was finished is kept; the same command again).
    """
    from allocopt.tracking.lifecycle import disk_full_line, quiet_disk_full_logs

    with quiet_disk_full_logs():
        try:
            yield
        except ConfigError:  # already one line (e.g. ask's --out on a full disk: that folder, not the records)
            raise
        except Exception as e:
            if disk_full(e):
                raise DiskFull(disk_full_line(storage, tracker() if callable(tracker) else tracker, again)) from None
            raise


def check_objective_targets(spec: Any, obj: Any) -> None:
    """Refuse, before anything is recorded, a target or reward system the objective does not
    report or run (:func:`allocopt.study.loop.check_targets`). Raises :class:`ConfigError`."""
    from allocopt.study.loop import check_targets
    from allocopt.study.open import StudyError

    try:
        check_targets(spec, obj)
    except StudyError as e:
        raise ConfigError(str(e)) from None


def check_space(spec: Any, obj: Any) -> None:
    """The objective's own check of the search space, where it has one (optional
    ``check_space``, :class:`allocopt.objective.Objective`): a :class:`ConfigError` for a space
    whose allocations it would score alike."""
    if hasattr(obj, "check_space"):
        obj.check_space(spec.space)


def objective_for_plans(spec: Any) -> Any:
    """The objective of ``spec`` built without checking that this machine can train it: plans
    need its workload only (``--dry-run``, ``ask``: the runs happen elsewhere).

    Raises:
        ConfigError: an unknown objective or setting (one line)."""
    from allocopt.objective import get_objective

    try:
        return get_objective(spec.objective, **spec.objective_settings)
    except (ValueError, TypeError) as e:
        first = _settings_refusal(spec.objective, e)
        named = f"objective={spec.objective!r}: "  # a line that names no field: say whose it is
        raise ConfigError(first if field_of(first) else named + first) from None
