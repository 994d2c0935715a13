"""``allocopt study``: Bayesian optimization of the allocation (the kg tuner by default, RACE's
pilot grid with ``--tuner race``); and the summary it prints at the end (the one answer, the
best observed trial as evidence, the counts).

The command parses (:func:`allocopt.cli.common.read_spec`: the study file read and the budget
parsed once), runs the study with one library call (:func:`allocopt.study.race.run_race` through
:func:`allocopt.cli.race.race_live` with RACE, else :func:`allocopt.study.loop.run_study`; both
store the study's answer themselves), prints the summary, and logs the report into the MLflow
parent run (:func:`allocopt.query.parent_report.report_into_parent`).

Registered on the app by :func:`register` (``allocopt/cli/__init__.py``); it does not import
``allocopt.cli``: bad input is raised as :class:`~allocopt.flops.ConfigError` (``main`` prints
one line, exit code 2). Optuna, torch and the objectives are imported inside the command.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, List, Optional, Sequence

import typer
from rich.console import Console
from rich.table import Table

from allocopt.cli.common import fail
from allocopt.cli.consoles import PipeConsole
from allocopt.cli.model_labels import legend, short_names, spelled_out
from allocopt.store.connect import DEFAULT_STORAGE
from allocopt.cli.account import fmt_flops
from allocopt.cli.common import takes_time_budget
from allocopt.flops import ConfigError

out = PipeConsole()
err = Console(stderr=True)


@takes_time_budget
def study(
    spec: Optional[Path] = typer.Option(None, "--spec", help="Study file (TOML, e.g. studies/tiny.toml); flags override it."),
    budget: Optional[str] = typer.Option(None, help="FLOP budget of each trial, e.g. 1e19. \\[default: the spec's; required without --spec]"),
    target: Optional[List[str]] = typer.Option(None, help="Target: native_reward, pass@1, pass@1:gsm8k, pass@1:math500, judge (maximized), or one the study file declares in its \\[targets] table. Repeat it for a multi-objective study (Pareto front). \\[default: the spec's, else pass@1]"),
    objective: Optional[str] = typer.Option(None, help="qwen (GPU), tiny (CPU arithmetic world), tiny-table (its measured grid, replayed), synthetic (test function) or command. \\[default: the spec's, else qwen]"),
    trials: Optional[int] = typer.Option(None, help="Full-budget trials in all (a resumed study runs the missing ones; infeasible proposals, never run, do not count). \\[default: the spec's, else 12]"),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="Study name; the same name resumes the study. \\[default: the spec's, else allocopt]"),
    storage: str = typer.Option(DEFAULT_STORAGE, envvar="ALLOCOPT_STORAGE", help="Optuna storage URL (sqlite:///…, postgresql://…); a password is better given in $ALLOCOPT_STORAGE than on the command line."),
    mlflow_uri: Optional[str] = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI. \\[default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db]"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not track in MLflow."),
    seed: Optional[int] = typer.Option(None, help="Seed of the sampler and the trials. \\[default: the spec's, else 0]"),
    sampler: Optional[str] = typer.Option(None, help="Sampler of plain BO (--tuner bo; with several targets a hypervolume search): gp, botorch or random. \\[default: the spec's, else gp]"),
    pilots: Optional[int] = typer.Option(None, help="Pilots at --pilot-fraction of the budget. --tuner race: its pilot points, run first, then surrogate proposals (0: plain BO with --sampler; default 60 or more: enough for every reward system × model). --tuner kg: the most pilots it may run, each only when worth its FLOPs (default 0: full runs only). \\[default: the spec's]"),
    pilot_fraction: Optional[float] = typer.Option(None, "--pilot-fraction", help="Budget fraction of a pilot, in (0, 1). \\[default: the spec's, else 0.1]"),
    tuner: Optional[str] = typer.Option(None, help="kg: each run (full or pilot, at most --pilots pilots) chosen by its value for the answer per FLOP, the answer printed with what one more run is worth (several targets: full runs, each on a fresh random weighting of them); race: RACE's pilot grid, then proposals; bo: plain BO at the full budget with --sampler. \\[default: the spec's, else kg]"),
    until_gain: Optional[float] = typer.Option(None, "--until-gain", help="With --tuner kg: stop before --trials once one more full run is worth less than this (target units, e.g. 0.002 pass@1). \\[default: the spec's, else run every trial]"),
    initial_design: bool = typer.Option(False, "--initial-design", help="With --tuner kg: first one full run per reward system (and policy size), alternately at two rho levels (one target: a third and two thirds of the way; several: the middle two), at the middle G, then the tuner's own choices (the default). --no-initial-design turns it off, a study file's too. \\[default: the spec's, else the design]"),
    no_initial_design: bool = typer.Option(False, "--no-initial-design", hidden=True),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plans the budget buys over the space; run nothing."),
    time: Optional[dict] = None,  # the time-budget flags (takes_time_budget)
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Objective setting KEY=VALUE over the spec's \\[objective_settings] (repeat), e.g. --set model=PATH."),
    verbose: bool = typer.Option(False, "--verbose", help="Show the libraries' warnings and log lines during trials (hidden by default)."),
    replicates: Optional[int] = typer.Option(None, help="RACE: extra seeds of the leading full run when it is within one evaluation's noise of another cell's best; each counts as a full trial. \\[default: 0]"),
    yes: bool = typer.Option(False, "--yes", help="Run even when one full run's estimated wall time (a CPU objective's measured FLOP/s) is above 1 h."),
    no_report: bool = typer.Option(False, "--no-report", help="Do not log the report (allocopt report: page and figures) into the study's MLflow parent run at the end."),
) -> None:
    """Bayesian optimization of the allocation (rho, G, reward) under a hard FLOP budget, tracked in MLflow.

    Exit codes: 0 at least one full-budget trial finished; 1 the study ran but none did
    (every trial failed or was infeasible: nothing to recommend); 2 bad input, refused before
    anything is recorded; 130 interrupted (finished trials are kept; the same command resumes);
    141 the reader of its output closed it early (`| head`).
    """
    from allocopt.cli.common import read_spec

    tgt = None if not target else (target[0] if len(target) == 1 else tuple(target))
    s = read_spec(spec, budget, set_, time=time, target=tgt, objective=objective, trials=trials, name=study_name,
                  seed=seed, sampler=sampler, pilots=pilots, pilot_fraction=pilot_fraction,
                  tuner=tuner, until_gain=until_gain, initial_design=_initial_design_flags(initial_design, no_initial_design))
    if sampler is not None and s.tuner == "kg":  # else it would be ignored without a word
        raise ConfigError(f"sampler={sampler!r}: the kg tuner has its own model and uses no Optuna sampler; "
                          "give --tuner bo to search with it, or leave --sampler out")
    s = _race_terms(s, pilots, replicates)  # a dry run refuses (and notes) what the run would
    if dry_run:  # the storage URL is checked (no connection, nothing written): the real run would refuse it
        from allocopt.cli.common import check_storage

        check_storage(storage)
        return print_plans(s)
    run = dict(storage=storage, mlflow_uri=mlflow_uri, no_mlflow=no_mlflow, verbose=verbose, yes=yes,
               usd_per_gpu_hour=(time or {}).get("usd_per_gpu_hour"))
    if s.pilots != 0 and s.tuner == "race":  # RACE: pilots, regime table, proposed full-budget trials
        from allocopt.cli.race import print_race, race_live
        from allocopt.race.design import settings_for

        res, tracker = race_live(s, settings_for(s, replicates=replicates),
                                 validations=s.trials, **run)
        print_race(s, res)
        st = res.study  # race printed its answer, if it made one
        print_study_summary(st, s, storage, show_answer=not st.user_attrs.get("recommendation"))
    else:
        st, tracker = study_live(s, **run)
        print_study_summary(st, s, storage)
    if tracker is not None and not no_report:
        report_into_parent(s.name, storage, mlflow_uri)
    for line in mlflow_lines(tracker):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def _race_terms(s: Any, pilots: Optional[int], replicates: Optional[int]) -> Any:
    """``s`` as the study runs it: several targets run without RACE (a note says so);
    ``--replicates`` refused without RACE, the pilot count checked under the name the user
    gave it (``--pilots`` or the study file's ``pilots``)."""
    from dataclasses import replace

    if replicates is not None and s.tuner == "kg":
        raise ConfigError(f"replicates={replicates}: RACE only; the kg tuner repeats a run itself "
                          "when a repeat is worth its FLOPs")
    if replicates is not None and (s.tuner != "race" or s.pilots == 0 or s.multi_objective):
        raise ConfigError(f"replicates={replicates}: RACE only (repeats of its leading full run); "
                          "plain BO (--tuner bo, or several targets) has no leader to repeat")
    if s.multi_objective and s.tuner == "race":
        err.print(f"note: {len(s.targets)} targets: RACE has one target; the study runs as --tuner bo "
                  f"(Optuna's hypervolume search, sampler {s.sampler}, no pilots)", highlight=False)
        return replace(s, pilots=0)
    if s.multi_objective and s.tuner == "kg" and s.pilots:
        err.print(f"note: {len(s.targets)} targets: the kg tuner runs full runs only (as --pilots 0)",
                  highlight=False)
        return replace(s, pilots=0)
    _check_race_pilots(s, pilots)
    return s


def _check_race_pilots(s: Any, pilots: Optional[int]) -> None:
    """RACE's pilot count against its pilot grid, refused under the name the user gave it
    (``--pilots`` or the study file's ``pilots``); nothing for other tuners or several targets."""
    if s.pilots != 0 and s.tuner == "race" and not s.multi_objective:
        from allocopt.race import pilot_grid
        from allocopt.race.design import settings_for

        try:
            pilot_grid(s.space, settings_for(s), s.seed)
        except ConfigError as e:
            name = f"--pilots {s.pilots}" if pilots is not None else f"pilots={s.pilots} (study file)"
            raise ConfigError(str(e).replace(f"max_pilots={s.pilots!r}", name, 1)) from None


def study_live(s: Any, *, storage: str, mlflow_uri: Optional[str], no_mlflow: bool,
               verbose: bool = False, usd_per_gpu_hour: Optional[float] = None,
               yes: bool = False) -> tuple[Any, Any]:
    """:func:`allocopt.study.loop.run_study` of ``s`` (plain BO) with a live display on stderr
    and the study's MLflow tracker (:func:`allocopt.cli.common.tracked_command`). Bad input (a budget
    no allocation can use, the storage, MLflow's store, the study's terms) is refused before
    anything is recorded. ``usd_per_gpu_hour`` (``--budget-usd``): the wall-time estimate
    states the runs in dollars; a full run estimated above an hour needs ``yes``
    (:func:`~allocopt.cli.common.check_run_time`). Returns ``(study, tracker)``."""
    from allocopt.cli.common import (check_run_time, check_storage, load_workload, probe_interrupt_exits,
                                     tracked_command)
    from allocopt.cli.live import StudyDisplay, finished_line, study_estimate
    from allocopt.study.loop import finished_full, full_runs_left, run_study, work_left
    from allocopt.study.open import StudyError, open_study
    from allocopt.tracking.lifecycle import probe_tracking

    obj, workload = load_workload(s)
    check_run_time(s, obj, yes)
    check_storage(storage, s)  # a storage typo or a refused resume: before MLflow records anything
    if not no_mlflow:  # an unusable MLflow store fails here, before the Optuna study exists
        with probe_interrupt_exits():
            probe_tracking(s.name, mlflow_uri)
    try:
        with err.status("opening the study..."):
            opened = open_study(s, storage)
    except StudyError as e:
        raise ConfigError(str(e)) from None
    left = work_left(opened, s)
    to_do = full_runs_left(left)
    if not to_do:  # one line, then the answer (the summary): no estimate, no empty bar
        err.print(finished_line(opened, s), highlight=False, markup=False, soft_wrap=True)

    before = finished_full(opened)

    def work(tracker: Any) -> Any:
        with StudyDisplay(err, s, num_full=to_do, disable=not to_do,  # a resumed study counts its runs left
                          done_full=lambda: finished_full(opened) - before,  # every worker's
                          study_best=lambda: study_best(opened, s)) as live:  # every worker's
            estimate = study_estimate(obj, s.budget_flops, to_do, time_budget=s.time_budget,
                                      usd_per_gpu_hour=usd_per_gpu_hour)
            if estimate:
                live.note(estimate)
            live.step("opening the study and its sampler")
            st = run_study(s, objective=obj, workload=workload, study=opened, tracker=tracker,
                           on_trial_start=live.on_start, on_trial_end=live.on_end,
                           progress=live.progress, verbose=verbose,
                           on_wait=lambda done, running: live.note(
                               f"waiting for {running} full run(s) on other workers ({done} of {s.trials} done)"))
            live.sync()
            return st

    return tracked_command(s, storage, mlflow_uri, no_mlflow, work)


def _nothing_finished(s: Any, rows: list[Any]) -> None:
    """The end of a study none of whose full-budget trials completed: exit 1 when it ran some
    (failed or infeasible), else a note."""
    n_fail = sum(r.state == "FAIL" for r in rows)
    n_inf = sum(r.state == "INFEASIBLE" for r in rows)
    if n_fail + n_inf:  # the study ran, and nothing it ran finished: exit 1, not 0
        fail(f"error: no trial of study {s.name!r} finished: {n_fail} failed, {n_inf} infeasible "
             "(their errors are in the trial lines above and in MLflow)", 1)
    out.print("no complete full-budget trial yet")


def sizes_line(models: Sequence[str], workload: Any) -> str:
    """The policies a model-size study searches, with their parameter counts relative to the first."""
    from allocopt.plan.allocation import policy_named

    n = [policy_named(workload, m, "space.models").num_params() for m in models]
    label = short_names(models)
    named = [spelled_out(label, m) for m in models]  # as the table names it
    return f"models: {named[0]} {n[0]:,} parameters; " + "; ".join(
        f"{m} {k:,} ({k / n[0]:.2f}x)" for m, k in zip(named[1:], n[1:]))


def _initial_design_flags(on: bool, off: bool) -> bool | None:
    """``--initial-design`` and its ``--no-`` form: True, False, or ``None`` (neither given)."""
    if on and off:
        raise ConfigError("--initial-design, --no-initial-design: give one of them, not both")
    return True if on else False if off else None


def print_plans(s: Any) -> None:
    """``--dry-run``: the plans the budget buys over the space (and RACE's pilot plans); runs
    nothing. Needs the objective's workload only, not a machine that can train."""
    from rich import box

    from allocopt.cli.common import check_models, check_objective_targets, check_space, objective_for_plans
    from allocopt.study.loop import dry_run as plans_over_space

    obj = objective_for_plans(s)
    check_space(s, obj)  # as the study refuses it
    try:  # the plans stand either way: an ask/tell study's runs report targets of their own
        check_objective_targets(s, obj)
    except ConfigError as e:
        err.print(f"note: {e}; `allocopt study` refuses it, `allocopt ask`/`tell` record it from "
                  "your own runs", highlight=False, markup=False, soft_wrap=True)
    with err.status("loading the objective's models..."):
        workload = s.priced(obj.workload())
    check_models(s, workload)
    tb = s.time_budget
    head = (f"{tb.gpu_hours:g} GPU-hours on {tb.gpus} GPU(s) per trial ({tb.profile.gpu}; FLOPs per allocation)"
            if tb else f"{fmt_flops(s.budget_flops)} FLOPs per trial")
    t = Table(title=f"Plans for {head} (objective {s.objective}); nothing is run",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, caption_justify="left",
              padding=(0, 0) if tb else (0, 1))  # 80 columns, nothing cut (a time budget's two more columns too)
    with err.status("planning each allocation's run (its FLOPs step by step)..."):
        plans = plans_over_space(s, workload)
    notes = any(note for _, _, note in plans)  # a note column only when a plan has one
    epochs = any(p is not None and p.epochs is not None for _, p, _ in plans)
    models = len(s.space.models) > 1  # a model-size study: which policy each plan trains
    for c in (*(("model",) if models else ()), "reward", "G", "rho", "got", "mu", "batch", "iters", *(("ep",) if epochs else ()),
              "search", "learn", "rwd", *(("FLOPs", "GPU-h") if tb else ()), *(("note",) if notes else ())):
        t.add_column(c, justify="left" if c in ("model", "reward", "note") else "right")
    label = short_names(s.space.models)  # the part that tells them apart; sizes_line names them
    for a, p, note in plans:
        lead = (label[str(a.model)],) if models else ()
        if p is None:
            t.add_row(*lead, a.reward, str(a.group_size), f"{a.rho:.2f}", *("-",) * ((9 if tb else 7) + epochs),
                      f"[red]{note}[/]")
        else:
            e = p.expected.executed
            share = lambda v: f"{v / e.total_flops:.0%}"  # noqa: E731
            t.add_row(*lead, a.reward, str(a.group_size), f"{a.rho:.2f}", f"{p.realized_rho:.3f}",
                      f"{p.update_passes:.2f}", str(p.rollouts_per_iteration), str(p.iterations),
                      *((_epochs(p.epochs),) if epochs else ()),
                      share(e.search_flops), share(e.learning_flops), share(e.reward_flops),
                      *((f"{p.budget_flops:.2e}".replace("e+", "e"), f"{tb.hours_of(e)['total']:.1f}") if tb else ()),
                      *((note,) if notes else ()))
    t.caption = ("got: realized rho; mu: update passes; batch: rollouts per iteration; "
                 + ("ep: epochs, passes over the training set; " if epochs else "")
                 + "search/learn/rwd: shares of the executed FLOPs")
    out.print(t)
    if models:
        out.print(sizes_line(s.space.models, workload), highlight=False, markup=False, soft_wrap=True)
    line = batch_rule_line(workload.setup, [p for _, p, _ in plans if p is not None])
    if line:
        out.print(line, highlight=False, markup=False)
    _print_tuner_lines(s, workload)
    if hasattr(obj, "length_sources"):
        out.print("lengths: " + "; ".join(f"{k} {v}" for k, v in obj.length_sources().items()))
    if hasattr(obj, "engine_choice"):  # which engine the plans priced, and why (auto)
        out.print(obj.engine_choice(), highlight=False, markup=False, soft_wrap=True)


def _print_tuner_lines(s: Any, workload: Any) -> None:
    """The dry run's lines on what the study's tuner will run: its targets, pilots and initial
    design (kg), or RACE's pilot plans."""
    if s.tuner == "kg":
        from allocopt.study.sampler import kg_initial_design
        from allocopt.tuner.study import LAYOUT_WORDS, initial_layout

        where = LAYOUT_WORDS[initial_layout(s.multi_objective)]
        design = (f"initial design: first one full run per reward system, {where} "
                  "(--no-initial-design: none)" if kg_initial_design(s) else
                  "no initial design: every run the tuner's choice (--initial-design: one full run per "
                  "reward system first)")
    if s.tuner == "kg" and s.multi_objective:
        out.print(f"tuner kg, {len(s.targets)} targets: each full run chosen on a fresh random weighting "
                  "of the targets (augmented Chebyshev, as ParEGO); the answer is the Pareto front; "
                  + design, highlight=False, markup=False, soft_wrap=True)
    elif s.multi_objective:
        runs_as = " runs as --tuner bo (RACE has one target) with" if s.tuner == "race" else ""
        out.print(f"tuner {s.tuner}, {len(s.targets)} targets:{runs_as} Optuna's hypervolume search (sampler "
                  f"{s.sampler}); the answer is the Pareto front", highlight=False, markup=False)
    elif s.tuner == "kg":
        from allocopt.study.sampler import kg_max_pilots

        cap = kg_max_pilots(s)
        stop = (f"; stops before {s.trials} full runs once one more is worth less than {s.until_gain:g} "
                f"{s.target}" if s.until_gain else "")
        out.print((f"tuner kg: pilots at {s.pilot_fraction:g} x the budget only when worth their FLOPs, "
                   f"at most {cap}" if cap else "tuner kg: full runs only (pilots = 0)") + "; " + design + stop,
                  highlight=False, markup=False, soft_wrap=True)
    elif s.tuner == "bo" or (s.tuner == "race" and s.pilots == 0):
        plain = " (RACE with no pilots is plain BO)" if s.tuner == "race" else ""
        sampler = {"gp": "Optuna's GPSampler", "random": "Optuna's RandomSampler"}.get(
            s.sampler, "optuna-integration's BoTorchSampler")
        out.print(f"tuner {s.tuner}: {sampler} proposes every full run{plain}; the answer "
                  "is the best observed run (no interval, no value of one more run: --tuner kg gives both)",
                  highlight=False, markup=False, soft_wrap=True)
    elif s.tuner == "race" and s.pilots != 0 and not s.multi_objective and len(set(s.space.rho)) > 1:
        from allocopt.cli.race import pilot_table

        table, line = pilot_table(s, workload)
        out.print(table)
        out.print(line, highlight=False)
        out.print(f"tuner race: the pilots above at {s.pilot_fraction:g} x the budget first, then {s.trials} full "
                  "runs its multi-fidelity surrogate proposes; the answer is the surrogate's best at the full budget",
                  highlight=False, markup=False)  # wrapped at the width, as the pilot table above


def batch_rule_line(setup: Any, plans: list) -> str | None:
    """One line under the dry run's plans: the batch rule when it raised a batch
    (``target_steps``), and a warning when plans pass over the training set more than
    :data:`~allocopt.plan.allocation.MAX_EPOCHS` times (how many, the most, and why it matters);
    ``None`` when neither applies."""
    from allocopt.plan.allocation import MAX_EPOCHS

    parts = []
    raised = [p for p in plans if p.rollouts_per_iteration > setup.rollouts_per_iteration]
    if raised:
        parts.append(f"batch: {len(raised)} of {len(plans)} plans run more than the set-up's "
                     f"{setup.rollouts_per_iteration} rollouts per iteration so that the budget buys "
                     f"about target_steps={setup.target_steps} iterations (at most "
                     f"{setup.largest_rollouts_per_iteration}; --set target_steps=0 keeps the set-up's batch)")
    over = [p for p in plans if p.warning]
    if over:
        parts.append(f"warning: {len(over)} of {len(plans)} plans pass over the training set "
                     f"({over[0].train_prompts:,} prompts) more than {MAX_EPOCHS:g} times (up to "
                     f"{max(p.epochs for p in over):.1f}): late iterations retrain on prompts already "
                     "solved, so those trials score repetition as much as their allocation; a smaller "
                     "budget or a larger training set keeps it under")
    return "\n".join(parts) or None


def report_into_parent(study_name: str, storage: str, mlflow_uri: Optional[str]) -> None:
    """:func:`allocopt.query.parent_report.report_into_parent`, said in one line. Never fails
    a finished study: an error becomes one line saying how to make the report by hand."""
    from allocopt.query.parent_report import report_into_parent as log_report

    try:
        with err.status("writing the report into the MLflow parent run..."):
            log_report(study_name, storage, mlflow_uri)
    except Exception as e:  # noqa: BLE001 - the study is done: never lose it over its report
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        err.print(f"note: the report was not logged to MLflow ({reason}); make it with `allocopt "
                  f"report --study {study_name} --out DIR --mlflow-run parent`", highlight=False,
                  markup=False)
        return
    # one line of 80 columns: a line that wraps breaks mid-phrase
    out.print("MLflow: report.html and its figures are in the study's parent run (report/)",
              highlight=False, markup=False)


def _epochs(e: float | None) -> str:
    """Passes over the training set, one decimal; under 0.05 ``<0.1`` (``0.0`` read as none)."""
    return "-" if e is None else f"{e:.1f}" if e >= 0.05 else "<0.1"


def mlflow_lines(tracker: Any) -> list[str]:
    """How to open the study's runs in the MLflow UI: the command for a local SQLite store (its
    path relative to the working folder when under it), then the link to the runs table
    (:func:`allocopt.tracking.runs_view_url`; MLflow 3.17 otherwise opens on its GenAI
    overview, "No data available"). ``[]`` without a tracker or for a ``file:`` store."""
    if tracker is None:
        return []
    from allocopt.tracking import runs_view_url

    from allocopt.redact import without_password

    uri, exp = str(tracker.tracking_uri), str(tracker.experiment_id)
    if uri.startswith(("http://", "https://")):
        uri = without_password(uri)[0]  # the link opens in a browser, which asks for the login
        return [f"MLflow runs: {runs_view_url(uri, exp)}"]
    if not uri.startswith("sqlite:///"):
        return []
    path = Path(uri[len("sqlite:///"):])
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass
    return [f"MLflow: mlflow ui --backend-store-uri sqlite:///{path}",
            f"  then open {runs_view_url('http://127.0.0.1:5000', exp)}"]


def study_best(st: Any, s: Any) -> float | None:
    """The best value of study ``s``'s complete full-budget runs in ``st`` (every worker's);
    ``None`` before one, or with several targets."""
    from allocopt.record import TrialRecord

    if s.multi_objective:
        return None
    recs = [TrialRecord.of(t) for t in st.get_trials(deepcopy=False)]
    values = [r.values[0] for r in recs if r.fidelity == "full" and r.state == "COMPLETE"
              and r.values and math.isfinite(r.values[0])]  # as the summary's top trials
    return (max(values) if s.sign > 0 else min(values)) if values else None


def print_study_summary(st: Any, s: Any, storage: str = DEFAULT_STORAGE,
                        show_answer: bool = True) -> None:
    """Final table: the top trials (the Pareto front when the study has several targets), the
    one answer (``show_answer``: RACE's recommendation, else the best trial) and the best
    observed trial as evidence. A worker of ``allocopt workers`` (``ALLOCOPT_WORKER``) that
    ends while others still run trials prints one line instead: the last to end prints it."""
    from allocopt.record import rows

    best_cmd = _best_command(s, storage)
    if os.environ.get("ALLOCOPT_WORKER") is not None and (_others_running(st, s, best_cmd)
                                                          or _another_ends(st, s, best_cmd)):
        return
    if s.multi_objective:
        from allocopt.cli.query import print_front
        from allocopt.query.sources import load_rows_from_study

        rows = [r for r in load_rows_from_study(storage, s.name) if r.fidelity == "full"]
        if any(r.state == "COMPLETE" for r in rows):
            print_front(rows, list(s.targets), None, f"study {s.name}", "full", vocabulary=s.vocabulary)
            return
        _nothing_finished(s, rows)
        return

    from allocopt.record import records

    recs = records(st)
    stopped = {r.number for r in recs if r.interrupted}  # Ctrl-C: run again, not failed
    full = {r.number for r in recs if r.fidelity == "full"} - stopped
    all_rows = [r for r in rows(st) if r.number in full]
    n_pilots = len(rows(st)) - len(all_rows) - len(stopped)
    sign = s.sign
    done = sorted((r for r in all_rows if r.state == "COMPLETE" and r.value == r.value), key=lambda r: -sign * r.value)
    best = done[0] if done else None
    if best is None:
        _nothing_finished(s, all_rows)
        return
    out.print(_top_trials(done[:8], s))
    from allocopt.answer import allocation_text, evidence_line, recommendation_lines
    from allocopt.spec import allocation_of

    rec = st.user_attrs.get("recommendation")  # RACE's answer (allocopt.answer.recommendation_dict)
    if not show_answer:
        pass
    elif rec:
        from allocopt.answer import from_dict

        for line in recommendation_lines(from_dict(rec), s.target):
            out.print(line, highlight=False, markup=False)
    else:  # plain BO: the best observed trial is the answer, with no posterior interval
        out.print(f"recommended: {allocation_text(allocation_of(s, best.params))}  (plain BO: the best "
                  "observed trial; no interval)", highlight=False, markup=False)
    out.print(evidence_line(best.number, best.value, allocation_of(s, best.params), s.target),
              highlight=False, markup=False)
    n_inf = sum(r.state == "INFEASIBLE" for r in all_rows)
    n_fail = sum(r.state == "FAIL" for r in all_rows)
    pilots = [r for r in rows(st) if r.number not in full and r.number not in stopped]
    p_inf = sum(r.state == "INFEASIBLE" for r in pilots)
    out.print(f"full-budget trials: {len(done)} complete, {n_inf} infeasible (never run), {n_fail} failed",
              highlight=False)
    if n_pilots:
        out.print(f"{'RACE ' if s.tuner == 'race' else ''}pilots: {n_pilots}, {p_inf} infeasible (never run)",
                  highlight=False)
    if st.user_attrs.get("stopped"):  # the stop rule (--until-gain) ended the study early
        out.print(f"stopped: {st.user_attrs['stopped']}", highlight=False, markup=False)
    if stopped:
        out.print(f"interrupted (Ctrl-C; each run again): {len(stopped)} trial(s)", highlight=False)
    running = sum(r.state == "RUNNING" for r in rows(st))
    if running:  # this worker is done; another's trials are not: its answer may still change
        out.print(f"note: {running} trial(s) still running (other workers, or a dead one's until its "
                  f"heartbeat expires): this answer covers the finished ones; the last worker to "
                  f"finish prints the final one" + (f" and stores it (`{best_cmd}` reads it)" if n_pilots
                                                    else f" (`{best_cmd}` shows the best trials then)"),
                  highlight=False, markup=False)


def _best_command(s: Any, storage: str | None) -> str:
    """The ``allocopt best`` command that reads study ``s`` where it is stored (a password left
    out: libpq reads it from ``PGPASSWORD`` or ``~/.pgpass``)."""
    from allocopt.redact import without_password

    if not storage or storage == DEFAULT_STORAGE:
        return f"allocopt best --study {s.name}"
    return f"allocopt best --study {s.name} --storage {without_password(storage)[0]}"


def _others_running(st: Any, s: Any, best_cmd: str) -> bool:
    """Whether other workers still run trials of ``st``; if so, says so in one line."""
    from allocopt.record import rows

    running = sum(r.state == "RUNNING" for r in rows(st))
    if running:
        out.print(f"this worker is done; {running} trial(s) still running (other workers, or a dead "
                  "one's until its heartbeat expires): the last worker to end prints the study's "
                  f"answer (`{best_cmd}` shows it at any time)",
                  highlight=False, markup=False, soft_wrap=True)  # one line: a worker's log is grepped
    return bool(running)


def _another_ends(st: Any, s: Any, best_cmd: str) -> bool:
    """Whether another worker ran the study's last finished trial (workers that wait for each
    other end together: that one prints the answer); if so, says so in one line."""
    from allocopt.record import is_released
    from allocopt.store.heartbeat import WORKER_ATTR, worker_name

    ended = [t for t in st.get_trials(deepcopy=False)
             if t.datetime_complete is not None and not is_released(t)]  # a release ran nothing
    if not ended:
        return False
    last = max(ended, key=lambda t: (t.datetime_complete, t.number))
    other = last.system_attrs.get(WORKER_ATTR)
    if other is None or other == worker_name():
        return False
    out.print(f"this worker is done; the study's answer is printed by the worker that ran its last "
              f"trial (trial {last.number}, worker {other}) (`{best_cmd}` shows it at any time)",
              highlight=False, markup=False, soft_wrap=True)
    return True


def _top_trials(done: list[Any], s: Any) -> Table:
    """The top complete full-budget trials of study ``s``: allocation, target, compute shares."""
    from rich import box

    # no outer edge, a rule under the header, one space between columns: with a model column and
    # the longest reward names nothing is cut at 80 columns
    t = Table(title=f"Study {s.name}: top trials by {s.target} (budget {fmt_flops(s.budget_flops)} FLOPs each)",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, caption_justify="left")
    models = bool(s.space.models)  # a column only when the space searches over policy models
    label = short_names(s.space.models)
    for c in ("trial", "rho", "got", "G", "reward", *(("model",) if models else ()), s.target,
              "search", "learn", "rwd", "FLOPs"):
        t.add_column(c, justify="left" if c in ("reward", "model") else "right",
                     no_wrap=c not in ("reward", "model"))
    for r in done:
        m = r.metrics
        tot = m.get("total_flops") or 1
        asked = float(r.params.get("rho", s.space.rho[0]))
        t.add_row(str(r.number), f"{asked:.2f}", f"{m.get('rho', float('nan')):.3f}",
                  str(r.params.get("group_size", s.space.group_sizes[0])),
                  str(r.params.get("reward", s.space.rewards[0])),
                  *((label.get(name := str(r.params.get("model", s.space.models[0])), name),) if models else ()),
                  f"{r.value:.4f}",
                  *(f"{m.get(k, 0) / tot:.0%}" for k in ("search_flops", "learning_flops", "reward_flops")),
                  fmt_flops(m.get("total_flops", 0)))
    t.caption = "rho: the update fraction asked; got: realized; search/learn/rwd: shares of the executed FLOPs" \
        + (f"; {legend(label)}" if models and legend(label) else "")
    return t


def register(app: typer.Typer) -> None:
    """Add the ``study`` command to ``app``."""
    app.command(name="study")(study)
