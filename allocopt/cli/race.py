"""``allocopt race``: RACE pilots, the regime table, and validation runs (or their plans).

The command parses, runs :func:`allocopt.study.race.run_race` (which stores the answer in the
study and on the MLflow parent run) with a live display (:func:`race_live`, shared with
``allocopt study``) and prints what the race found (:func:`print_race`).

Registered on the app by :func:`register` (``allocopt/cli/__init__.py``). This module does not import
``allocopt.cli`` (``python -m allocopt.cli`` runs that file as ``__main__``): bad input is raised
as :class:`~allocopt.flops.ConfigError`, which ``main`` turns into one line and exit code 2.
Optuna, torch and the objectives are imported inside the command.
"""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from allocopt.cli.consoles import PipeConsole
from allocopt.store.connect import DEFAULT_STORAGE
from allocopt.flops import ConfigError
from allocopt.cli.race_tables import proposal_table, regime_table, validation_table

out = PipeConsole()
err = Console(stderr=True)



from allocopt.cli.common import takes_time_budget  # noqa: E402


def _json(obj: Any) -> str:
    """Strict JSON (NaN and infinities as ``null``)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(obj), indent=2, default=str, allow_nan=False)


def pilot_table(spec: Any, workload: Any, settings: Any = None) -> tuple[Table, str]:
    """The pilot plans a RACE study runs (``--dry-run``): each pilot's ρ (moved from the grid's
    when it was not usable there, :func:`allocopt.race.pilot_plans.fit_pilots`), the rollouts
    per iteration its plan runs, the iterations
    the meter is expected to admit of the plan's, the realized ρ, the expected use of the pilot
    budget and whether it is usable; with one summary line."""
    from allocopt.race import pilot_grid
    from allocopt.race.design import settings_for
    from allocopt.plan.allocation import RHO_TOLERANCE
    from allocopt.race.pilot_plans import MIN_PILOT_USE, fit_pilots, plan_pilot, usable_share

    settings = settings or settings_for(spec)
    tb = spec.time_budget
    budget = lambda a: spec.budget_for(a, workload, spec.pilot_fraction)  # noqa: E731 - per allocation under a time budget
    grid = pilot_grid(spec.space, settings, spec.seed)
    fitted = fit_pilots(grid, spec.space.rho, budget, workload) if settings.fit_pilots else grid
    t = Table(title=(f"RACE pilots at {spec.pilot_fraction:g} x {tb.gpu_hours:g} GPU-hours = "
                     f"{spec.pilot_fraction * tb.gpu_hours:.3g} GPU-hours each (FLOPs per allocation); nothing is run")
              if tb else f"RACE pilots at {spec.pilot_fraction:g} x {spec.budget_flops:.3g} = "
              f"{spec.pilot_fraction * spec.budget_flops:.3g} FLOPs; nothing is run")
    moved = sum(g.allocation != p.allocation for g, p in zip(grid, fitted))
    for c in ("reward", "G", "rho", *(("grid rho",) if moved else ()), *(("FLOPs",) if tb else ()), "batch",
              "iters", "got", "use", "usable"):
        t.add_column(c, justify="left" if c in ("reward", "usable") else "right")
    plans = [plan_pilot(p, budget(p.allocation), workload) for p in fitted]
    for g, pp in zip(grid, plans):
        a = pp.point.allocation
        iters = "-" if pp.plan is None else f"{pp.admitted_iterations}/{pp.plan.iterations}"
        got = "-" if pp.admitted_iterations == 0 else f"{pp.realized_rho:.3f}"
        batch = "-" if pp.plan is None else str(pp.plan.rollouts_per_iteration)
        grid_rho = ("=" if g.allocation == a else f"{g.allocation.rho:.3f}",) if moved else ()
        flops = (f"{budget(a):.3g}",) if tb else ()
        t.add_row(a.reward, str(a.group_size), f"{a.rho:.3f}", *grid_rho, *flops, batch, iters, got,
                  f"{pp.budget_use:.0%}", "yes" if pp.usable else "[red]no[/]")
    t.caption = (("grid rho: the grid's rho of a pilot moved to the nearest usable one ('=': not "
                  "moved); " if moved else "")
                 + "batch: rollouts per iteration the plan runs; iters: admitted by the meter's worst "
                 "case / planned (0/n: the first iteration is refused; -: one costs more than the "
                 "pilot budget); got: realized rho; use: expected "
                 f"share of the pilot budget spent; usable: got within {RHO_TOLERANCE:g} of rho and "
                 f"use >= {MIN_PILOT_USE:.0%}")
    line = (f"{sum(p.usable for p in plans)} of {len(plans)} pilots usable ({usable_share(plans):.0%}: "
            f"realizable and spending >= {MIN_PILOT_USE:.0%} of the pilot budget); {moved} moved to "
            "the nearest usable rho")
    return t, line


@takes_time_budget
def race(
    spec: Optional[Path] = typer.Option(None, "--spec", help="Study file (TOML, e.g. studies/tiny.toml); flags override it."),
    budget: Optional[str] = typer.Option(None, help="Full FLOP budget of a run, e.g. 1e19 (required unless --spec gives it)."),
    target: Optional[List[str]] = typer.Option(None, help="Target: native_reward, pass@1, pass@1:gsm8k, pass@1:math500, judge (one: RACE has one target). \\[default: the spec's, else pass@1]"),
    objective: Optional[str] = typer.Option(None, help="qwen (GPU), tiny (CPU world), tiny-table (its measured grid, replayed), synthetic (test function) or command. \\[default: the spec's, else qwen]"),
    pilot_fraction: Optional[float] = typer.Option(None, "--pilot-fraction", help="Pilots run at this fraction of the budget, in (0, 1). \\[default: the spec's, else 0.1]"),
    validations: int = typer.Option(4, help="Full-budget validation runs proposed by the surrogate (0: pilots only)."),
    propose_only: bool = typer.Option(False, "--propose-only", help="Run the pilots, then print the proposals as ready-to-run plans (JSON) without running them."),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="Study name; the same name resumes the race. \\[default: the spec's, else allocopt]"),
    storage: str = typer.Option(DEFAULT_STORAGE, envvar="ALLOCOPT_STORAGE", help="Optuna storage URL (sqlite:///…, postgresql://…); a password is better given in $ALLOCOPT_STORAGE than on the command line."),
    mlflow_uri: Optional[str] = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI. \\[default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db]"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not track in MLflow."),
    seed: Optional[int] = typer.Option(None, help="Seed of the pilot design, the trials and the surrogate. \\[default: the spec's, else 0]"),
    max_pilots: Optional[int] = typer.Option(None, "--max-pilots", "--pilots", help="Most distinct pilot points (a larger grid becomes a Latin hypercube over rho). \\[default: 60, more when the space needs them: 7 per reward system x model with 4 group sizes]"),
    repeats: Optional[int] = typer.Option(None, help="Runs of each pilot point (seeds). \\[default: 1]"),
    replicates: Optional[int] = typer.Option(None, help="Extra seeds of the leading full run when it is within one evaluation's noise of another cell's best (noise measured, not assumed); each counts as a full run. \\[default: 0]"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Ignored (kept for old scripts): every trial gets its own proposal; parallel workers are conditioned on each other's pending trials."),
    extra_pilot_budget: Optional[float] = typer.Option(None, "--extra-pilot-budget", help="Compute, in full-budget runs, the proposals may spend on extra pilots. \\[default: 0]"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    time: Optional[dict] = None,  # the time-budget flags (takes_time_budget)
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Objective setting KEY=VALUE over the spec's \\[objective_settings] (repeat), e.g. --set model=PATH."),
    verbose: bool = typer.Option(False, "--verbose", help="Show the libraries' warnings and log lines during trials (hidden by default)."),
    yes: bool = typer.Option(False, "--yes", help="Run even when one full run's estimated wall time (a CPU objective's measured FLOP/s) is above 1 h."),
) -> None:
    """RACE: IsoFLOP pilots at a fraction of the budget diagnose the regime per reward system
    (search-heavy, update-heavy, reward-heavy, balanced); a multi-fidelity GP surrogate that
    learns the pilots' budget drift proposes full-budget validation runs; the same-regime table
    checks the pilots.

    Exit codes: 0 the race ran; 2 bad input,
    refused before anything is recorded; 130 interrupted (finished trials are kept; the same
    command resumes).
    """
    from allocopt.cli.common import read_spec

    if target and len(target) > 1:  # click would keep the last one silently
        raise ConfigError(f"--target: {', '.join(target)}: RACE has one target; give --target once (several "
                          "targets: allocopt study --target A --target B searches their Pareto front)")
    target = target[0] if target else None
    from dataclasses import replace

    from allocopt.race import check_pilot_fraction

    # the command is RACE whatever the file's tuner: a field only the kg tuner reads is refused
    s = read_spec(spec, budget, set_, time=time, target=target, objective=objective, name=study_name, seed=seed,
                  tuner="race")
    if s.multi_objective:
        where = f" (in spec {spec.name})" if spec is not None else ""
        raise ConfigError(f"target={list(s.targets)}: RACE has one target; give --target to pick one, or run "
                          f"allocopt study --spec FILE, which searches their Pareto front{where}")
    s = replace(s, pilot_fraction=check_pilot_fraction(s.pilot_fraction if pilot_fraction is None else pilot_fraction))
    if validations < 0:
        raise ConfigError(f"validations={validations}: must be an integer >= 0")
    from allocopt.race.design import settings_for

    settings = settings_for(s, max_pilots=max_pilots, repeats=repeats, replicates=replicates,
                            extra_pilot_budget=extra_pilot_budget)  # --batch-size: ignored
    res, _ = race_live(s, settings, storage=storage, mlflow_uri=mlflow_uri, no_mlflow=no_mlflow,
                       validations=validations, propose_only=propose_only, quiet=as_json, verbose=verbose,
                       usd_per_gpu_hour=(time or {}).get("usd_per_gpu_hour"), yes=yes)
    print_race(s, res, propose_only=propose_only, as_json=as_json)


def race_live(s: Any, settings: Any, *, storage: str, mlflow_uri: Optional[str], no_mlflow: bool,
              validations: int, propose_only: bool = False, quiet: bool = False,
              verbose: bool = False, usd_per_gpu_hour: Optional[float] = None,
              yes: bool = False) -> tuple[Any, Any]:
    """:func:`allocopt.study.race.run_race` of ``s`` with a live display on stderr (none with
    ``quiet``) and the study's MLflow tracker (:func:`allocopt.cli.common.tracked_command`); the regime
    table goes on the parent run. Bad input (pilot fraction, space, pilot count, a budget too
    small, storage) is refused before anything is recorded. ``usd_per_gpu_hour``
    (``--budget-usd``): the wall-time estimate states the runs in dollars; a full run estimated
    above an hour needs ``yes`` (:func:`~allocopt.cli.common.check_run_time`). Returns
    ``(RaceResult, tracker)``."""
    from dataclasses import replace

    from allocopt.cli.common import check_run_time, check_storage, load_workload, tracked_command
    from allocopt.cli.live import StudyDisplay
    from allocopt.race import check_pilot_fraction, pilot_grid
    from allocopt.study.loop import full_runs_left
    from allocopt.study.race import run_race

    s = replace(s, pilot_fraction=check_pilot_fraction(s.pilot_fraction))  # the study records it
    design = pilot_grid(s.space, settings, s.seed)  # bad space / max_pilots: fail before any storage
    obj, workload = load_workload(s, s.pilot_fraction)
    check_run_time(s, obj, yes, validations)
    check_storage(storage, s)  # a storage typo or a refused resume: before MLflow records anything
    left = None if propose_only else _race_left(s, settings, storage, workload, validations)
    opened = left.pop("study") if left is not None else None
    done = left is not None and not any(left.values())
    if done and not quiet:  # one line, then the answer: no estimate, no empty bar
        from allocopt.cli.live import finished_line

        err.print(finished_line(opened, replace(s, trials=validations)), highlight=False, markup=False,
                  soft_wrap=True)
    num_full = validations if left is None else full_runs_left(left)
    live = StudyDisplay(err, s, num_full=num_full, disable=quiet or done)

    def work(tracker: Any) -> Any:
        with live:
            live.step("opening the study and the pilot design")
            res = run_race(s, objective=obj, workload=workload, storage=storage, tracker=tracker,
                           pilot_fraction=s.pilot_fraction, validations=validations,
                           propose_only=propose_only, settings=settings,
                           on_phase=_on_phase(live, s, obj, len(design), 0 if propose_only else num_full, done,
                                              usd_per_gpu_hour),
                           on_trial_start=live.on_start, on_trial_end=None if quiet else live.on_end,
                           progress=live.progress, verbose=verbose)
        if tracker:
            tracker.log_text(_text(regime_table(res.diagnoses, pilot_budget_text(s, res), s.target,
                                                bool(s.space.models))), "regime_table.txt")
        return res

    return tracked_command(s, storage, mlflow_uri, no_mlflow, work)


def _race_left(s: Any, settings: Any, storage: str, workload: Any, validations: int) -> Any:
    """:func:`allocopt.study.loop.work_left` of an existing race study (plus the opened study
    under ``"study"``), as :func:`allocopt.study.race.run_race` will run it; ``None`` for a
    study not there yet."""
    from dataclasses import replace

    from allocopt.query.sources import study_names
    from allocopt.study.loop import work_left
    from allocopt.study.open import open_study
    from allocopt.study.sampler import race_sampler

    try:
        if s.name not in study_names(storage):
            return None
    except Exception:  # noqa: BLE001 - no store yet: a new study
        return None
    r = replace(s, trials=max(validations, 1))
    sampler = race_sampler(r, workload, settings)
    study = open_study(r, storage, sampler)
    left = work_left(study, replace(r, trials=validations), sampler)
    return {**left, "study": study}


def _on_phase(live: Any, s: Any, obj: Any, num_design: int, num_full: int, finished: bool = False,
              usd_per_gpu_hour: Optional[float] = None) -> Any:
    """What the live display says at each phase of the race (nothing for a finished study)."""
    from allocopt.cli.live import study_estimate

    f = s.pilot_fraction

    def on_phase(phase: str, payload: Any) -> None:
        if finished:
            return
        if phase == "pilots":
            live.pilots_to_run(len(payload))
            tb = s.time_budget
            if tb and usd_per_gpu_hour:  # --budget-usd: the user's units
                usd = tb.gpu_hours * usd_per_gpu_hour
                each = (f"{f:g} x ${usd:.4g} = ${f * usd:.4g} each ({f * tb.gpu_hours:.3g} GPU-hours; "
                        "FLOPs per allocation)")
            elif tb:
                each = f"{f:g} x {tb.gpu_hours:g} = {f * tb.gpu_hours:.3g} GPU-hours each (FLOPs per allocation)"
            else:
                each = f"{f:g} x {s.budget_flops:.3e} = {f * s.budget_flops:.3e} FLOPs each"
            live.note(f"RACE {s.name}: {len(payload)} of {num_design} pilot run(s) to do at {each}")
            estimate = study_estimate(obj, s.budget_flops, num_full, len(payload), f,
                                      time_budget=tb, usd_per_gpu_hour=usd_per_gpu_hour)
            if estimate:
                live.note(estimate)
        elif phase == "proposals":
            live.note(f"proposed {len(payload)} run(s): " + ", ".join(
                f"{p.fidelity} rho={p.allocation.rho:.3f} G={p.allocation.group_size} {p.allocation.reward}"
                for p in payload))
        elif phase == "diagnoses":
            live.step("proposing the full-budget runs (surrogate fit)")
    return on_phase


def pilot_budget_text(s: Any, res: Any) -> float | str:
    """The pilots' budget as the regime table's title gives it: FLOPs, or under a time budget
    the hours each pilot gets (its allocation's FLOPs differ)."""
    tb = s.time_budget
    return (res.pilot_budget_flops if tb is None else
            f"{s.pilot_fraction:g} x {tb.gpu_hours:g} = {s.pilot_fraction * tb.gpu_hours:.3g} GPU-hours each")


def print_race(s: Any, res: Any, *, propose_only: bool = False, as_json: bool = False) -> None:
    """What a race found: one JSON document, or the regime table, the proposals (with
    ``propose_only``: as ready-to-run JSON), the validation table, the stored answer and the
    surrogate's timings."""
    from allocopt.race import same_regime_rate

    rate_all = same_regime_rate(res.validation, validated_only=False)
    if as_json:
        doc = {"study": s.name, "budget_flops": s.budget_flops, "target": s.target,
               "pilot_fraction": s.pilot_fraction, **res.to_dict(), "same_regime_rate_all": rate_all}
        sys.stdout.write(_json(doc) + "\n")
        return
    out.print(regime_table(res.diagnoses, pilot_budget_text(s, res), s.target, bool(s.space.models)))
    if propose_only:
        out.print(f"{len(res.proposals)} proposal(s), ready to run (allocation, plan and TRL "
                  "hyperparameters):", highlight=False)
        out.file.flush()
        sys.stdout.write(_json([p.to_dict() for p in res.proposals]) + "\n")
        sys.stdout.flush()
    elif res.proposals:
        out.print(proposal_table(res.proposals))
    if res.validation:
        out.print(validation_table(res.validation, res.same_regime_rate, rate_all))
    if res.recommendation is not None and not propose_only:  # stored by run_race
        from allocopt.answer import from_dict, recommendation_dict, recommendation_lines

        rec = from_dict(recommendation_dict(res.recommendation, s.targets[0], s.directions[0]))
        for line in recommendation_lines(rec, s.target):
            out.print(line, highlight=False, markup=False)
    fits = res.timings.get("fit_seconds") or []
    if fits:
        props = res.timings.get("proposal_seconds") or []
        err.print(f"surrogate: {len(fits)} fit(s), mean {sum(fits) / len(fits):.2f} s; proposals "
                  f"{sum(props) / max(1, len(props)):.2f} s each", highlight=False)


def _text(table: Any) -> str:
    """A rich table as plain text, 80 columns."""
    con = Console(width=80, record=True, file=io.StringIO())
    con.print(table)
    return con.export_text()


def register(app: typer.Typer) -> None:
    """Add the ``race`` command to ``app``."""
    app.command(name="race")(race)
