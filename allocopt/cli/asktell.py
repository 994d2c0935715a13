"""``allocopt ask`` and ``allocopt tell``: trials of a study run by training launched elsewhere.

``ask`` reserves trials with the study's sampler and writes, per trial, a folder
``<out>/trial-<N>/`` with ``ask.json`` (study, trial, budget, fidelity, allocation, the whole-pass
run, the config and the ``tell`` command to run afterwards) and ``grpo_config.json`` (TRL
``GRPOConfig`` fields) or ``verl_overrides.txt`` (Hydra overrides; :mod:`allocopt.plan.handoff`).
``tell`` reads the run's metrics (:mod:`allocopt.run_metrics`) and records targets and the compute
actually spent (:mod:`allocopt.study.asktell`). Registered by :func:`register`; bad input
is raised as :class:`~allocopt.flops.ConfigError` (one line, exit 2, nothing changed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer

from allocopt.cli.consoles import PipeConsole
from allocopt.record import TrialRecord
from allocopt.store.connect import DEFAULT_STORAGE
from rich.console import Console
from rich.table import Table

from allocopt.flops import ConfigError

out = PipeConsole()
err = Console(stderr=True)
_STORAGE = typer.Option(DEFAULT_STORAGE, "--storage", envvar="ALLOCOPT_STORAGE", help="Optuna storage URL (sqlite:///…, postgresql://…); a password is better given in $ALLOCOPT_STORAGE than on the command line.")



from allocopt.cli.common import takes_time_budget  # noqa: E402


def _load(study_name: str, storage: str, new: Any = None, before_making: Any = None) -> tuple[Any, Any]:
    """``(study, spec)`` of an existing study, opened as a worker opens it; a study not there
    yet is made from ``new`` (a :class:`StudySpec`) when given, after ``before_making(new)``
    (a check that raises leaves no study behind)."""
    import warnings

    from allocopt.cli.common import check_storage

    check_storage(storage)  # a typo, an in-memory or another tool's database: one line, before Optuna
    if new is None:  # nothing to make: a SQLite file that is not there would be created empty by Optuna
        _check_database_exists(study_name, storage)
    import optuna

    from allocopt.study.asktell import TellError, spec_of
    from allocopt.redact import redact_url
    from allocopt.store.connect import make_storage
    from allocopt.study.open import StudyError, open_study

    warnings.filterwarnings("ignore", module=r"(botorch|optuna|optuna_integration|linear_operator|gpytorch)(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(not standardized|is experimental|Heartbeat of storage).*")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        names = optuna.study.get_all_study_names(make_storage(storage))
    except Exception as e:  # noqa: BLE001 - bad URL, unreachable server, missing driver
        from allocopt.errors import disk_full

        if disk_full(e):  # the file's disk is full: disk_full_as_one_line's line, not "cannot be opened"
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"storage={redact_url(storage)!r}: cannot be opened ({redact_url(msg)})") from None
    if study_name not in names and new is not None:
        if before_making is not None:
            before_making(new)
        try:
            st = open_study(new, storage)
        except StudyError as e:
            raise ConfigError(str(e)) from None
        st.set_user_attr("spec", new.to_dict())
        return st, new
    if study_name not in names:
        raise ConfigError(f"study={study_name!r}: not in {redact_url(storage)}; studies there: "
                          f"{', '.join(names) or 'none'}")
    try:
        spec = spec_of(optuna.load_study(study_name=study_name, storage=make_storage(storage)))
        return open_study(spec, storage), spec
    except (TellError, StudyError) as e:
        raise ConfigError(str(e)) from None


def _check_database_exists(study_name: str, storage: str) -> None:
    """Refuse a ``sqlite:///`` storage whose file is not there, before anything opens it (which
    would leave an empty database behind a refusal)."""
    from allocopt.query.sources import missing_sqlite_file
    from allocopt.redact import redact_url

    missing = missing_sqlite_file(storage)
    if missing:
        raise ConfigError(f"study={study_name!r}: not found: storage {redact_url(storage)!r} has no database "
                          f"file ({missing}); run where the study was made, give --storage, "
                          f"or make it (allocopt study --study-name {study_name} --trials 0, or ask --spec FILE)")


@takes_time_budget
def ask(
    study: str = typer.Option(..., "--study", help="Study name (made by `allocopt study`; `--trials 0` makes an empty one)."),
    storage: str = _STORAGE,
    n: int = typer.Option(1, "-n", "--num", help="Trials to reserve."),
    fmt: str = typer.Option("trl", "--format", help="trl (GRPOConfig fields) or verl (Hydra overrides)."),
    out_dir: Path = typer.Option(Path("asked"), "--out", help="Folder for one trial-<N>/ per reserved trial."),
    learning_rate: Optional[float] = typer.Option(None, "--learning-rate", help="Per optimizer step, not scaled by the passes (default: the objective's)."),
    micro_batch: int = typer.Option(8, "--micro-batch", help="TRL: largest per_device_train_batch_size."),
    num_processes: int = typer.Option(1, "--num-processes", help="TRL: processes (GPUs) of the run."),
    as_json: bool = typer.Option(False, "--json", help="Print the reserved runs as JSON."),
    spec_file: Optional[Path] = typer.Option(None, "--spec", help="Study file (TOML) that makes the study if it is not there yet."),
    budget: Optional[str] = typer.Option(None, help="With a new study: FLOP budget per trial."),
    target: Optional[str] = typer.Option(None, help="With a new study: the target."),
    objective: Optional[str] = typer.Option(None, help="With a new study: the objective whose workload plans are made for."),
    time: Optional[dict] = None,  # the time-budget flags (takes_time_budget)
) -> None:
    """Reserve trials for runs launched elsewhere; write a ready TRL or verl config for each."""
    from allocopt.plan.handoff import FORMATS

    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r}: allowed: {', '.join(FORMATS)}")
    if n < 1 or n > 1000:
        raise ConfigError(f"num={n!r}: must be in 1..1000")
    if learning_rate is not None and not (learning_rate > 0 and math.isfinite(learning_rate)):
        raise ConfigError(f"learning_rate={learning_rate!r}: must be > 0")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"out={str(out_dir)!r}: exists and is not a folder")
    new = _new_spec(study, spec_file, budget, target, objective, time or {})
    _check_out(out_dir)  # before anything is reserved
    from allocopt.cli.common import disk_full_as_one_line

    with disk_full_as_one_line(storage, again="it reserves anew (a trial cut short is given back when "
                               "the study is next opened)"):  # a full disk under the study's file: one line, exit 1
        _ask(study, storage, new, n, fmt, out_dir, learning_rate, micro_batch, num_processes, as_json)


def _ask(study: str, storage: str, new: Any, n: int, fmt: str, out_dir: Path, learning_rate: Optional[float],
         micro_batch: int, num_processes: int, as_json: bool) -> None:
    """``ask``'s work once its options are checked."""
    from allocopt.study.asktell import reserve_and_write
    from allocopt.study.open import distributions

    made: list[Any] = []  # a new study's workload, built (its models checked) before the study is made
    st, spec = _load(study, storage, new, before_making=lambda s: made.append(_workload_of(s)))
    workload = made[0] if made else _workload_of(spec)
    from dataclasses import replace

    from allocopt.study.loop import resumed_seed
    from allocopt.study.open import make_sampler

    # each ask is a new process: seeded as a resumed study is (by the trials already there), or
    # every ask would draw the first trial's random start-up point again
    done = len(st.get_trials(deepcopy=False))
    st.sampler = make_sampler(replace(spec, seed=resumed_seed(spec.seed, done)) if done else spec,
                              workload=workload)  # RACE: feasible proposals only
    race = hasattr(st.sampler, "suggest")
    dists = distributions(spec, fidelity=True) if race else distributions(spec)
    lr = learning_rate or workload.setup.learning_rate
    runs, n_infeasible, shown = reserve_and_write(
        st, spec, workload, n, fmt, dists, out_dir, study=study, storage=storage, learning_rate=lr,
        micro_batch=micro_batch, num_processes=num_processes)
    print_asked(shown, spec, study=study, fmt=fmt, out_dir=out_dir, as_json=as_json)
    if n_infeasible:
        err.print(f"{n_infeasible} proposal(s) the budget cannot buy were recorded as INFEASIBLE", highlight=False)
    if len(runs) < n:
        raise ConfigError(f"num={n}: only {len(runs)} runnable trial(s) found in {20 * n} proposals")


def _new_spec(study: str, spec_file: Optional[Path], budget: Optional[str], target: Optional[str],
              objective: Optional[str], time: dict) -> Any:
    """The study ``ask`` makes when it is not there yet (from ``--spec`` and the flags), or
    ``None`` when no flag describes one; the budget parsed once (FLOPs, or a time budget)."""
    from allocopt.cli.common import read_one_budget

    t = read_one_budget(budget, time)
    if spec_file is None and budget is None and target is None and objective is None and not t:
        return None
    from allocopt.plan.allocation import check_budget
    from allocopt.spec import StudySpec

    b = None if budget is None else check_budget(budget)
    base = StudySpec.from_toml(spec_file, b, t) if spec_file else StudySpec(**(t or {}))
    return base.with_overrides(name=study, budget_flops=b, target=target, objective=objective)


def _check_out(out_dir: Path) -> None:
    """Refuse an ``--out`` that cannot be made or written (one line), before reserving."""
    import os

    probe = out_dir
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"out={str(out_dir)!r}: {probe} is not a writable folder; give --out a "
                          "folder you can write")


def _workload_of(spec: Any) -> Any:
    """The workload plans of ``spec`` are made for: the objective's, built without checking the
    machine can train (the runs are launched elsewhere)."""
    from allocopt.cli.common import check_models, objective_for_plans

    workload = spec.priced(objective_for_plans(spec).workload())
    check_models(spec, workload)
    return workload


def print_asked(shown: list[dict[str, Any]], spec: Any, *, study: str, fmt: str, out_dir: Path,
                as_json: bool) -> None:
    """The reserved trials (a table and the ``tell`` command to run after each, or JSON), and a
    note for trials whose whole update passes run another ρ than asked."""
    if as_json:
        out.print_json(json.dumps(shown, default=str))
    else:
        t = Table(title=f"Reserved {len(shown)} trial(s) of study {study} ({fmt})")
        for c in ("trial", "fidelity", "rho", "G", "reward", "passes", "iters", "exp. rho"):
            t.add_column(c, justify="left" if c in ("fidelity", "reward") else "right", no_wrap=True)
        for s in shown:
            t.add_row(str(s["trial"]), s["fidelity"], f"{s['rho']:.3f}", str(s["group_size"]), s["reward"],
                      str(s["update_passes"]), str(s["iterations"]), f"{s['expected_rho']:.3f}")
        t.caption = (f"budget {spec.budget_flops:.3e} FLOPs per full trial; passes: whole update passes; "
                     f"configs in {out_dir}/trial-<N>/")
        out.print(t)
        out.print("run each, then: " + (shown[0]["tell"] if shown else "-"), highlight=False, markup=False, soft_wrap=True)
    far = [s for s in shown if abs(s["expected_rho"] - s["rho"]) > 0.05]
    if far:
        err.print(f"note: {fmt} trains whole update passes: " + "; ".join(
            f"trial {s['trial']} asks rho={s['rho']:.3f}, runs {s['expected_rho']:.3f}" for s in far)
            + " (tell records the rho spent)", highlight=False, markup=False, soft_wrap=True)


def tell(
    study: str = typer.Option(..., "--study", help="Study name."),
    trial: int = typer.Option(..., "--trial", help="Trial number printed by `allocopt ask`."),
    metrics: Path = typer.Option(..., "--metrics", help="JSON: the targets (e.g. {\"pass@1\": 0.52}); without --from-trl/--from-verl also search_flops, learning_flops, reward_flops (executed)."),
    storage: str = _STORAGE,
    from_trl: Optional[Path] = typer.Option(None, "--from-trl", help="The TRL run's output folder: compute accounted from its logs."),
    from_verl: Optional[Path] = typer.Option(None, "--from-verl", help="The verl run's log: compute accounted from it."),
    mlflow_uri: Optional[str] = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI \\[default: sqlite:///mlflow.db]."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not track in MLflow."),
) -> None:
    """Record a reserved trial: its targets and the compute it actually spent."""
    if from_trl is not None and from_verl is not None:
        raise ConfigError("from_trl/from_verl: give one of them, not both")
    data = _read_metrics(metrics)
    from allocopt.run_metrics import account_from_metrics, metric_targets

    metric_targets(data)  # its values checked before the storage is opened (which target is
    if from_trl is None and from_verl is None:  # the study's is known once it is)
        account_from_metrics(data)
    from allocopt.cli.common import disk_full_as_one_line

    tracker: list[Any] = [None]
    with disk_full_as_one_line(storage, lambda: tracker[0], again=f"it records trial {trial}"):  # one line, exit 1
        _tell(study, trial, data, metrics, storage, from_trl, from_verl, mlflow_uri, no_mlflow, tracker)


def _tell(study: str, trial: int, data: dict[str, Any], metrics: Path, storage: str, from_trl: Optional[Path],
          from_verl: Optional[Path], mlflow_uri: Optional[str], no_mlflow: bool, held: list[Any]) -> None:
    """``tell``'s work once the metrics are read; the MLflow tracker is put in ``held[0]``."""
    from allocopt.run_metrics import targets_from_metrics
    from allocopt.study.asktell import TellError, check_tellable, record

    st, spec = _load(study, storage)
    try:
        frozen = check_tellable(st, trial)
    except TellError as e:
        raise ConfigError(str(e)) from None
    targets = targets_from_metrics(data, spec)
    spent, extra = _spent(frozen, data, metrics, from_trl, from_verl)
    budget = TrialRecord.of(frozen).budget(spec.budget_flops)
    tracker = None
    if not no_mlflow:
        import os

        from allocopt.cli.common import probe_interrupt_exits
        from allocopt.tracking.lifecycle import make_tracker

        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        with probe_interrupt_exits():
            tracker = held[0] = make_tracker(spec.name, mlflow_uri)
    try:
        m = record(st, frozen, spec, targets, spent, extra=extra)
    except TellError as e:  # another tell of this trial won
        if tracker is not None:
            tracker.close()
        raise ConfigError(str(e)) from None
    if tracker is not None:
        _track_tell(tracker, frozen, spec, budget, {**targets, **m})
    used = spent.executed.total_flops
    shown = ", ".join(f"{t}={targets[k]:.4f}" for t, k in zip(spec.targets, spec.target_keys))
    out.print(f"trial {trial} COMPLETE: {shown}; spent {used:.3e} FLOPs ({used / budget:.1%} of "
              f"{budget:.3e}), rho={spent.executed.rho:.3f}", highlight=False, markup=False, soft_wrap=True)
    if used > budget:
        err.print(f"warning: trial {trial} spent {used:.3e} FLOPs, {used / budget - 1:.1%} over its "
                  "budget; recorded with a violated budget constraint (over_budget)", highlight=False,
                  markup=False, soft_wrap=True)


def _read_metrics(metrics: Path) -> dict[str, Any]:
    """The ``--metrics`` JSON object (at most 1 MiB, nested at most 64 deep:
    :mod:`allocopt.limits`); a missing file, one over a limit or another document is one line."""
    from allocopt.limits import MAX_METRICS_BYTES, read_json

    data = read_json(metrics, MAX_METRICS_BYTES, "metrics")
    if not isinstance(data, dict):
        raise ConfigError(f"metrics={str(metrics)!r}: must be a JSON object")
    return data


def _spent(frozen: Any, data: dict[str, Any], metrics: Path, from_trl: Optional[Path],
           from_verl: Optional[Path]) -> tuple[Any, dict[str, Any]]:
    """The compute the run spent (an executed FLOP account) and extra trial metrics: from the
    TRL or verl run's logs (the reward model named by the trial's plan), else from the
    breakdown in ``--metrics``."""
    from allocopt.run_metrics import account_from_metrics

    if from_trl is None and from_verl is None:
        spent = account_from_metrics(data)
        if spent is None:
            raise ConfigError(f"metrics={str(metrics)!r}: no compute; give search_flops, learning_flops, "
                              "reward_flops in it, or --from-trl DIR / --from-verl LOG")
        return spent, {}
    try:
        from allocopt.runlogs import RunLogError, import_trl, import_verl
    except ImportError:
        raise ConfigError("from_trl/from_verl: the run-log importers (allocopt.runlogs) are not "
                          "in this install; give the breakdown in --metrics") from None
    # the reward model is not in a run's logs: the trial's plan names it
    rm = TrialRecord.of(frozen).plan.get("reward_model")
    overrides = {"reward_model": rm} if rm else {}
    try:
        imported = import_trl(from_trl, **overrides) if from_trl is not None else \
            import_verl(from_verl, **overrides)
    except RunLogError as e:
        raise ConfigError(str(e)) from None
    return imported.account, {"imported_steps": getattr(imported, "steps", math.nan)}


def _track_tell(tracker: Any, frozen: Any, spec: Any, budget: float, metrics: dict[str, Any]) -> None:
    """The told trial as an MLflow run of the study (source ``tell``), then close the tracker."""
    rec = TrialRecord.of(frozen)
    p, plan = rec.params, rec.plan
    params = {"rho": p.get("rho", spec.space.rho[0]), "group_size": p.get("group_size", plan.get("group_size")),
              "reward": p.get("reward", plan.get("reward")), "model": plan.get("model"),
              "budget_flops": budget, "objective": spec.objective, "target": spec.target, "source": "tell"}
    run_id = tracker.start_trial(frozen.number, params, {"objective": spec.objective,
                                                         "fidelity": rec.fidelity,
                                                         "source": "tell"})
    tracker.finish_trial(run_id, state="COMPLETE", metrics=metrics, plan=plan or None)
    tracker.close()


def register(app: typer.Typer) -> None:
    """Add ``ask`` and ``tell`` to the ``allocopt`` app."""
    app.command(name="ask")(ask)
    app.command(name="tell")(tell)
