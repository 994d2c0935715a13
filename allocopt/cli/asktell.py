"""``allocopt ask`` and ``allocopt tell``: trials of a study run by training launched elsewhere.

``ask`` reserves trials with the study's sampler and writes, per trial, a folder
``<out>/trial-<N>/`` with ``ask.json`` (study, trial, budget, fidelity, allocation, the whole-pass
run, the config and the ``tell`` command to run afterwards) and ``grpo_config.json`` (TRL
``GRPOConfig`` fields) or ``verl_overrides.txt`` (Hydra overrides). ``tell`` records targets and
the compute actually spent (:mod:`allocopt.study.asktell`). Registered by :func:`register`; bad input
is raised as :class:`~allocopt.flops.ConfigError` (one line, exit 2, nothing changed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from allocopt.study.storage import DEFAULT_STORAGE
from allocopt.flops import ConfigError

out = Console()
err = Console(stderr=True)
_STORAGE = typer.Option(DEFAULT_STORAGE, "--storage", help="Optuna storage URL (sqlite:///…, postgresql://…).")


def _load(study_name: str, storage: str, new: Any = None) -> tuple[Any, Any]:
    """``(study, spec)`` of an existing study, opened as a worker opens it; a study not there
    yet is made from ``new`` (a :class:`StudySpec`) when given."""
    import warnings

    import optuna

    from allocopt.study.asktell import TellError, spec_of
    from allocopt.study.storage import make_storage, redact_url
    from allocopt.study.open import StudyError, open_study

    warnings.filterwarnings("ignore", module=r"(botorch|optuna|optuna_integration|linear_operator|gpytorch)(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(not standardized|is experimental|Heartbeat of storage).*")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        names = optuna.study.get_all_study_names(make_storage(storage))
    except Exception as e:  # noqa: BLE001 - bad URL, unreachable server, missing driver
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"storage={redact_url(storage)!r}: cannot be opened ({redact_url(msg)})") from None
    if study_name not in names and new is not None:
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
) -> None:
    """Reserve trials for runs launched elsewhere; write a ready TRL or verl config for each."""
    from allocopt.study.asktell import FORMATS, reserve, trl_command, trl_config, verl_overrides
    from allocopt.study.storage import redact_url
    from allocopt.study.open import distributions

    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r}: allowed: {', '.join(FORMATS)}")
    if n < 1 or n > 1000:
        raise ConfigError(f"num={n!r}: must be in 1..1000")
    if learning_rate is not None and not (learning_rate > 0 and math.isfinite(learning_rate)):
        raise ConfigError(f"learning_rate={learning_rate!r}: must be > 0")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"out={str(out_dir)!r}: exists and is not a folder")
    new = None
    if spec_file is not None or budget is not None or target is not None or objective is not None:
        from allocopt.plan.allocation import check_budget
        from allocopt.spec import StudySpec

        base = StudySpec.from_toml(spec_file) if spec_file else StudySpec()
        new = base.with_overrides(name=study, budget_flops=None if budget is None else check_budget(budget),
                                  target=target, objective=objective)
    st, spec = _load(study, storage, new)
    from allocopt.objective import get_objective

    try:  # plans need the workload only, not a machine that can train
        obj = get_objective(spec.objective, **spec.objective_settings)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"objective={spec.objective!r}: {str(e).splitlines()[0]}") from None
    workload = obj.workload()
    setup = workload.setup  # the objective's training set-up: its plans price it, its driver runs it
    lr = learning_rate or setup.learning_rate
    max_len = setup.max_completion_length
    run_kw = dict(max_completion_length=max_len, temperature=setup.temperature, beta=setup.beta,
                  gradient_checkpointing=setup.gradient_checkpointing)
    from allocopt.study.open import make_sampler

    st.sampler = make_sampler(spec, workload=workload)  # RACE: feasible proposals only
    race = hasattr(st.sampler, "suggest")
    dists = distributions(spec, fidelity=True) if race else distributions(spec)
    runs, n_infeasible = reserve(st, spec, workload, n, fmt, dists)
    shown = []
    for run in runs:
        folder = out_dir / f"trial-{run.trial_number}"
        folder.mkdir(parents=True, exist_ok=True)
        tell = (f"allocopt tell --study {study} --storage '{redact_url(storage)}' --trial {run.trial_number} "
                f"--metrics metrics.json" + (" --from-trl OUT" if fmt == "trl" else " --from-verl LOG"))
        info: dict[str, Any] = {"study": study, "storage": redact_url(storage), **run.to_dict(),
                                "format": fmt, "learning_rate": lr, "tell": tell}
        if fmt == "trl":
            cfg = trl_config(run, learning_rate=lr, **run_kw, micro_batch=micro_batch,
                             num_processes=num_processes, seed=spec.seed + run.trial_number,
                             importance_sampling_correction=setup.importance_sampling_correction)
            (folder / "grpo_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            info.update(config=cfg, command=trl_command(cfg, str(folder / "grpo_config.json")))
        else:
            ov = verl_overrides(run, learning_rate=lr, **run_kw)
            (folder / "verl_overrides.txt").write_text("\n".join(ov) + "\n")
            info.update(overrides=ov, command="python -m verl.trainer.main_ppo " + " ".join(ov))
        (folder / "ask.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        shown.append({**info, "folder": str(folder)})
    if as_json:
        out.print_json(json.dumps(shown, default=str))
    else:
        t = Table(title=f"Reserved {len(runs)} trial(s) of study {study} ({fmt})")
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
    if n_infeasible:
        err.print(f"{n_infeasible} proposal(s) the budget cannot buy were recorded as INFEASIBLE", highlight=False)
    if len(runs) < n:
        raise ConfigError(f"num={n}: only {len(runs)} runnable trial(s) found in {20 * n} proposals")


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
    import os

    from allocopt.study.asktell import TellError, account_from_metrics, check_tellable, record, targets_from_metrics

    if from_trl is not None and from_verl is not None:
        raise ConfigError("from_trl/from_verl: give one of them, not both")
    try:
        data = json.loads(metrics.read_text())
    except FileNotFoundError:
        raise ConfigError(f"metrics={str(metrics)!r}: no such file") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"metrics={str(metrics)!r}: not JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"metrics={str(metrics)!r}: must be a JSON object")
    st, spec = _load(study, storage)
    try:
        frozen = check_tellable(st, trial)
    except TellError as e:
        raise ConfigError(str(e)) from None
    targets = targets_from_metrics(data, spec)
    extra: dict[str, Any] = {}
    if from_trl is not None or from_verl is not None:
        try:
            from allocopt.runlogs import RunLogError, import_trl, import_verl
        except ImportError:
            raise ConfigError("from_trl/from_verl: the run-log importers (allocopt.runlogs) are not "
                              "in this install; give the breakdown in --metrics") from None
        # the reward model is not in a run's logs: the trial's plan names it
        rm = (frozen.user_attrs.get("plan") or {}).get("reward_model")
        overrides = {"reward_model": rm} if rm else {}
        try:
            imported = import_trl(from_trl, **overrides) if from_trl is not None else \
                import_verl(from_verl, **overrides)
        except RunLogError as e:
            raise ConfigError(str(e)) from None
        spent = imported.account
        extra["imported_steps"] = getattr(imported, "steps", math.nan)
    else:
        spent = account_from_metrics(data)
        if spent is None:
            raise ConfigError(f"metrics={str(metrics)!r}: no compute; give search_flops, learning_flops, "
                              "reward_flops in it, or --from-trl DIR / --from-verl LOG")
    budget = float(frozen.user_attrs.get("budget_flops", spec.budget_flops))
    tracker = None
    if not no_mlflow:
        from allocopt.cli.common import make_tracker

        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        tracker = make_tracker(spec.name, mlflow_uri)
    m = record(st, frozen, spec, targets, spent, extra=extra)
    if tracker is not None:
        p = frozen.params
        plan = frozen.user_attrs.get("plan") or {}
        params = {"rho": p.get("rho", spec.space.rho[0]), "group_size": p.get("group_size", plan.get("group_size")),
                  "reward": p.get("reward", plan.get("reward")), "model": plan.get("model"),
                  "budget_flops": budget, "objective": spec.objective, "target": spec.target, "source": "tell"}
        run_id = tracker.start_trial(trial, params, {"objective": spec.objective,
                                                     "fidelity": frozen.user_attrs.get("fidelity", "full"),
                                                     "source": "tell"})
        tracker.finish_trial(run_id, state="COMPLETE", metrics={**targets, **m}, plan=plan or None)
        tracker.close()
    used = spent.executed.total_flops
    shown = ", ".join(f"{t}={targets[k]:.4f}" for t, k in zip(spec.targets, spec.target_keys))
    out.print(f"trial {trial} COMPLETE: {shown}; spent {used:.3e} FLOPs ({used / budget:.1%} of "
              f"{budget:.3e}), rho={spent.executed.rho:.3f}", highlight=False, markup=False, soft_wrap=True)
    if used > budget:
        err.print(f"warning: trial {trial} spent {used:.3e} FLOPs, {used / budget - 1:.1%} over its "
                  "budget; recorded with a violated budget constraint (over_budget)", highlight=False,
                  markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``ask`` and ``tell`` to the ``allocopt`` app."""
    app.command(name="ask")(ask)
    app.command(name="tell")(tell)
