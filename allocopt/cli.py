"""The ``allocopt`` command line (typer + rich). Thin: parsing, printing, exit codes.

Every bad input ends with one line ``error: <field>=<value>: <what is allowed>`` on stderr and
exit code 2. Heavy packages (torch, TRL, Optuna, MLflow) are imported inside the commands
that need them, so ``allocopt --help`` starts fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from typer import TyperException
from rich.console import Console
from rich.table import Table

from allocopt.flops import PHASES, ConfigError, FlopAccount

app = typer.Typer(
    name="allocopt",
    help="Where should a fixed GRPO post-training FLOP budget go? Exact FLOP accounting "
         "(search / learning / reward), budget plans, trials and Bayesian-optimization studies "
         "of the allocation (update fraction rho, group size G, reward system).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


class UsageProblem(ValueError):
    """Bad input found by a command (exit 2)."""


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: must be a number") from None


from allocopt.commands_account import breakdown_table, fmt_flops  # noqa: E402,F401 (re-exported)
from allocopt.commands_account import register as _register_account  # noqa: E402

_register_account(app)  # account and plan, listed first


from allocopt.cli_common import parse_settings as _settings  # noqa: E402


# ----------------------------------------------------------------------------- trial
TRIAL_WALL_LIMIT_S = 3600.0
"""``allocopt trial`` refuses a run estimated above this many seconds unless ``--yes``."""


def estimated_seconds(obj: Any, flops: float) -> float | None:
    """Wall seconds a trial spending ``flops`` executed FLOPs should take with ``obj``: its
    ``overhead_seconds`` (loading, evaluation) plus ``flops / flops_per_second``, both measured
    properties of the objective; ``None`` when the objective has no measured throughput."""
    rate = getattr(obj, "flops_per_second", None)
    if not rate:
        return None
    return getattr(obj, "overhead_seconds", 0.0) + flops / rate


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 days``, ``31.7 years``."""
    for unit, size, least in (("years", 365.25 * 86400, 1), ("days", 86400, 2), ("h", 3600, 1),
                              ("min", 60, 2)):
        if seconds >= least * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


@app.command()
def trial(
    budget: str = typer.Option(..., help="FLOP budget of the run, e.g. 3e11 for the tiny objective (about 30-40 s on 2 cores)."),
    rho: str = typer.Option(..., help="Update fraction rho = learning / total, in (0, 1)."),
    group_size: int = typer.Option(4, "--group-size", "-G", help="Completions per prompt (G), >= 2."),
    reward: str = typer.Option("sparse", help="Reward system: sparse, structured, dense, proxy_prm, prm."),
    objective: str = typer.Option("tiny", help="What the trial trains and scores (tiny: CPU arithmetic world)."),
    seed: int = typer.Option(0, help="Random seed of the trial."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    yes: bool = typer.Option(False, "--yes", help=f"Run even when the estimated wall time (from the objective's measured FLOP/s) is above {TRIAL_WALL_LIMIT_S / 3600:g} h."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Objective setting KEY=VALUE (repeat), e.g. --set model=PATH for qwen."),
    verbose: bool = typer.Option(False, "--verbose", help="Show the libraries' warnings and log lines (hidden by default)."),
) -> None:
    """Run one real GRPO trial at an allocation under a hard FLOP budget; print targets and breakdown."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from allocopt.allocation import Allocation, check_budget, make_plan
    from allocopt.cli_common import load_objective

    alloc = Allocation(rho=_number("rho", rho), group_size=group_size, reward=reward)
    b = check_budget(budget)
    if not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed}: must be an integer from 0 to 2**32 - 1")
    obj = load_objective(objective, _settings(set_))
    with err.status("building / loading the objective's models (cached after the first run)..."):
        workload = obj.workload()
    p = make_plan(b, alloc, workload)
    secs = estimated_seconds(obj, p.expected.executed.total_flops)
    if secs is not None:
        if secs > TRIAL_WALL_LIMIT_S and not yes:
            raise ConfigError(
                f"budget={b:.3g}: the {objective} objective would take about {duration(secs)} here "
                f"(at {obj.flops_per_second:.2g} FLOP/s measured on a CPU core); allowed without "
                f"--yes: at most {duration(TRIAL_WALL_LIMIT_S)} (give a smaller --budget, or --yes)")
        err.print(f"estimated wall time: about {duration(secs)} ({fmt_flops(p.expected.executed.total_flops)} "
                  f"FLOPs at {obj.flops_per_second:.2g} FLOP/s, plus evaluation)", highlight=False,
                  soft_wrap=True)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               TextColumn("{task.fields[spent]}"), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=as_json) as bar:
        task = bar.add_task("GRPO", total=b, spent="")

        def progress(rec, meter):
            bar.update(task, completed=meter.executed_flops,
                       description=f"GRPO iteration {rec.iteration + 1} (~{p.iterations})",
                       spent=f"{fmt_flops(meter.executed_flops)} / {fmt_flops(b)} FLOPs, "
                             f"reward {rec.reward_mean:.3f}")

        from objectives.grpo import TrialFailed

        from allocopt.quiet import quiet

        try:
            with quiet(verbose):
                res = obj.run(p, seed=seed, progress=progress)
        except TrialFailed as e:
            fail(f"error: trial failed after spending {fmt_flops(e.result.spent.executed.total_flops)} "
                 f"FLOPs: {e}", 1)
    if as_json:
        out.print_json(json.dumps({"plan": p.to_dict(), **res.to_dict()}, default=str))
        return
    t = Table(title=f"Trial: rho={alloc.rho:g}, G={alloc.group_size}, reward={alloc.reward}, "
                    f"budget {fmt_flops(b)} FLOPs")
    t.add_column("target")
    t.add_column("value", justify="right")
    for k, v in res.targets.items():
        t.add_row(k.replace("pass_at_1", "pass@1"), f"{v:.4f}")
    out.print(t)
    out.print(breakdown_table(res.spent, f"Compute spent ({len(res.curves)} iterations, "
                                         f"{res.spent.executed.total_flops / b:.1%} of budget; "
                                         f"planned rho {p.realized_rho:.3f})"))
    walls = ", ".join(f"{k} {v:.1f}s" for k, v in res.wall_seconds.items())
    out.print(f"wall time: {walls}; evaluation {fmt_flops(res.eval_flops)} FLOPs (outside the budget)")


# ----------------------------------------------------------------------------- study
@app.command()
def study(
    spec: Optional[Path] = typer.Option(None, "--spec", help="Study file (TOML, e.g. studies/tiny.toml); flags override it."),
    budget: Optional[str] = typer.Option(None, help="FLOP budget of each trial, e.g. 1e19. \\[default: the spec's, else 1e19]"),
    target: Optional[List[str]] = typer.Option(None, help="Target to maximize: native_reward, pass@1, pass@1:gsm8k, pass@1:math500, judge. Repeat it for a multi-objective study (Pareto front). \\[default: the spec's, else pass@1]"),
    objective: Optional[str] = typer.Option(None, help="qwen (GPU), tiny (CPU arithmetic world) or synthetic (test function). \\[default: the spec's, else qwen]"),
    trials: Optional[int] = typer.Option(None, help="Full-budget trials in all (a resumed study runs the missing ones). \\[default: the spec's, else 12]"),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="Study name; the same name resumes the study. \\[default: the spec's, else allocopt]"),
    storage: str = typer.Option("sqlite:///allocopt.db", help="Optuna storage URL (sqlite:///…, postgresql://…)."),
    mlflow_uri: Optional[str] = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI. \\[default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db]"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not track in MLflow."),
    seed: Optional[int] = typer.Option(None, help="Seed of the sampler and the trials. \\[default: the spec's, else 0]"),
    sampler: Optional[str] = typer.Option(None, help="Sampler when --pilots 0: botorch, gp or random. \\[default: the spec's, else botorch]"),
    pilots: Optional[int] = typer.Option(None, help="RACE pilot points run first at --pilot-fraction of the budget; a multi-fidelity surrogate then proposes the full-budget trials. 0: plain BO. \\[default: the spec's, else 60 or more: enough for every reward system × model]"),
    pilot_fraction: Optional[float] = typer.Option(None, "--pilot-fraction", help="Budget fraction of a pilot, in (0, 1). \\[default: the spec's, else 0.1]"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plans the budget buys over the space; run nothing."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Objective setting KEY=VALUE over the spec's \\[objective_settings] (repeat), e.g. --set model=PATH."),
) -> None:
    """Bayesian optimization of the allocation (rho, G, reward) under a hard FLOP budget, tracked in MLflow.

    Exit codes: 0 at least one full-budget trial finished; 1 the study ran but none did
    (every trial failed or was infeasible: nothing to recommend); 2 bad input, refused before
    anything is recorded; 130 interrupted (finished trials are kept; the same command resumes).
    """
    from allocopt.cli_common import quiet_library_warnings

    quiet_library_warnings()
    from allocopt.spec import StudySpec, target_label
    from allocopt.study import StudyError, dry_run as plans_over_space, run_study

    from allocopt.allocation import check_budget

    if spec is None and budget is None:
        raise ConfigError("budget: missing; give --budget FLOPS (e.g. 1e19) or --spec FILE")
    b = None if budget is None else check_budget(budget)
    base = StudySpec.from_toml(spec, b) if spec else StudySpec()
    tgt = None if not target else (target[0] if len(target) == 1 else tuple(target))
    s = base.with_overrides(budget_flops=b, target=tgt, objective=objective, trials=trials,
                            name=study_name, seed=seed, sampler=sampler, pilots=pilots,
                            pilot_fraction=pilot_fraction)
    if set_:
        from dataclasses import replace as _replace

        s = _replace(s, objective_settings={**s.objective_settings, **_settings(set_)})
    from allocopt.cli_common import load_objective, make_tracker

    if dry_run:  # plans need the workload only, not a machine that can train
        from objectives import get_objective

        try:
            obj = get_objective(s.objective, **s.objective_settings)
        except (ValueError, TypeError) as e:
            raise UsageProblem(f"objective={s.objective!r}: {str(e).splitlines()[0]}") from None
    else:
        obj = load_objective(s.objective, s.objective_settings)
    if dry_run:
        with err.status("loading the objective's models..."):
            workload = obj.workload()
        t = Table(title=f"Plans for {fmt_flops(s.budget_flops)} FLOPs per trial ({s.objective}); nothing is run")
        for c in ("reward", "G", "rho", "got", "mu", "iters", "search", "learn", "rwd", "note"):
            t.add_column(c, justify="left" if c in ("reward", "note") else "right")
        for a, p, note in plans_over_space(s, workload):
            if p is None:
                t.add_row(a.reward, str(a.group_size), f"{a.rho:.2f}", "-", "-", "-", "-", "-", "-", f"[red]{note}[/]")
            else:
                e = p.expected.executed
                share = lambda v: f"{v / e.total_flops:.0%}"  # noqa: E731
                t.add_row(a.reward, str(a.group_size), f"{a.rho:.2f}", f"{p.realized_rho:.3f}",
                          f"{p.update_passes:.2f}", str(p.iterations), share(e.search_flops),
                          share(e.learning_flops), share(e.reward_flops), note)
        t.caption = ("got: realized rho; mu: update passes; search/learn/rwd: shares of the "
                     "executed FLOPs")
        out.print(t)
        if s.pilots != 0 and not s.multi_objective and len(set(s.space.rho)) > 1:
            from allocopt.commands_race import pilot_table

            table, line = pilot_table(s, workload)
            out.print(table)
            out.print(line, highlight=False)
        if hasattr(obj, "length_sources"):
            out.print("lengths: " + "; ".join(f"{k} {v}" for k, v in obj.length_sources().items()))
        return
    if s.multi_objective and s.pilots != 0:
        err.print(f"note: {len(s.targets)} targets: a multi-objective study runs without RACE "
                  "pilots (as --pilots 0)", highlight=False)
        from dataclasses import replace

        s = replace(s, pilots=0)
    if s.pilots != 0:  # RACE first: pilots, regime table, surrogate-proposed full-budget trials
        from dataclasses import replace

        from allocopt.commands_race import race
        from allocopt.study import open_study

        race(spec=spec, budget=repr(s.budget_flops) if b is None and spec is None else (None if b is None else repr(b)),
             target=tgt if tgt is not None or spec is not None else s.target, objective=objective,
             pilot_fraction=s.pilot_fraction, validations=s.trials, propose_only=False,
             study_name=study_name, storage=storage, mlflow_uri=mlflow_uri, no_mlflow=no_mlflow,
             seed=seed, max_pilots=s.pilots, repeats=None, batch_size=None, extra_pilot_budget=None,
             as_json=False, set_=set_)
        # opened for the summary only: no RACE sampler needed (nor its checks of the grid)
        st = open_study(replace(s, pilots=0), storage)
        print_study_summary(st, s, storage,  # race printed its answer, if it made one
                            show_answer=not st.user_attrs.get("recommendation"))
        return
    from allocopt.cli_common import check_space_feasible
    from allocopt.study import open_study

    with err.status("building / loading the objective's models (cached after the first run)..."):
        workload = obj.workload()
    check_space_feasible(s, workload)  # a budget no allocation can use: refused, nothing recorded
    if not no_mlflow:  # an unusable MLflow store fails here, before the Optuna study exists
        from allocopt.cli_common import probe_tracking

        probe_tracking(s.name, mlflow_uri)
    try:
        open_study(s, storage)  # a bad storage URL or a mismatched study fails before any work
    except StudyError as e:
        raise UsageProblem(str(e)) from None
    tracker = make_tracker(s.name, mlflow_uri, enabled=not no_mlflow)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    state = {"best": None, "spent": 0.0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err) as bar:
        trials_task = bar.add_task("trials", total=s.trials, info="")
        flops_task = bar.add_task("trial", total=s.budget_flops, info="", visible=False)

        def on_start(number, alloc, plan):
            bar.update(flops_task, completed=0, visible=True,
                       description=f"trial {number}: rho={alloc.rho:.3f} G={alloc.group_size} {alloc.reward}")

        def progress(rec, meter):
            bar.update(flops_task, completed=meter.executed_flops,
                       info=f"it {rec.iteration + 1}, {fmt_flops(meter.executed_flops)} FLOPs")

        def on_end(row, result):
            if result is not None:
                state["spent"] += result.spent.executed.total_flops
            if row.state == "COMPLETE" and (state["best"] is None or row.value > state["best"].value):
                state["best"] = row
            best = state["best"]
            bar.update(trials_task, advance=1, info=(
                f"best {target_label(s.target_key)}={best.value:.3f} " if best else "") +
                f"| spent {fmt_flops(state['spent'])} FLOPs")
            from allocopt.answer import trial_line

            bar.console.print(trial_line(row, s), markup=False, highlight=False, soft_wrap=True)

        from allocopt.cli_common import close_tracker, one_interrupt

        status = "FAILED"  # the parent run is FINISHED only when the loop ends normally
        try:
            with one_interrupt():
                st = run_study(s, objective=obj, workload=workload, storage=storage, tracker=tracker,
                               on_trial_start=on_start, on_trial_end=on_end, progress=progress)
            status = "FINISHED"
        except StudyError as e:
            raise UsageProblem(str(e)) from None
        except KeyboardInterrupt:
            status = "KILLED"
            from allocopt.storage import redact_url

            fail(f"interrupted: finished trials are kept in {redact_url(storage)}; run the same command "
                 "to resume", 130)
        finally:
            with one_interrupt(raise_first=False):
                close_tracker(tracker, s.name, storage, status)
    print_study_summary(st, s, storage)


def print_study_summary(st: Any, s: Any, storage: str = "sqlite:///allocopt.db",
                        show_answer: bool = True) -> None:
    """Final table: the top trials (the Pareto front when the study has several targets), the
    one answer (``show_answer``: RACE's recommendation, else the best trial) and the best
    observed trial as evidence."""
    from allocopt.study import rows

    if s.multi_objective:
        from allocopt.commands_query import pareto

        pareto(objectives=",".join(s.targets), study=s.name, storage=storage, from_mlflow=None,
               mlflow_uri=None, directions=None, where=None, fidelity="full", as_json=False)
        return

    full = {t.number for t in st.get_trials(deepcopy=False) if t.user_attrs.get("fidelity", "full") == "full"}
    all_rows = [r for r in rows(st) if r.number in full]
    n_pilots = len(rows(st)) - len(all_rows)
    done = sorted((r for r in all_rows if r.state == "COMPLETE" and r.value == r.value), key=lambda r: -r.value)
    best = done[0] if done else None
    if best is None:
        n_fail = sum(r.state == "FAIL" for r in all_rows)
        n_inf = sum(r.state == "INFEASIBLE" for r in all_rows)
        if n_fail + n_inf:  # the study ran, and nothing it ran finished: exit 1, not 0
            fail(f"error: no trial of study {s.name!r} finished: {n_fail} failed, {n_inf} infeasible "
                 "(their errors are in the trial lines above and in MLflow)", 1)
        out.print("no complete full-budget trial yet")
        return
    t = Table(title=f"Study {s.name}: top trials by {s.target} (budget {fmt_flops(s.budget_flops)} FLOPs each)")
    models = bool(s.space.models)  # a column only when the space searches over policy models
    for c in ("trial", "rho", "G", "reward", *(("model",) if models else ()), s.target,
              "search", "learn", "rwd", "FLOPs"):
        t.add_column(c, justify="left" if c in ("reward", "model") else "right")
    for r in done[:8]:
        m = r.metrics
        tot = m.get("total_flops") or 1
        t.add_row(str(r.number), f"{m.get('rho', float('nan')):.3f}",
                  str(r.params.get("group_size", s.space.group_sizes[0])),
                  str(r.params.get("reward", s.space.rewards[0])),
                  *((str(r.params.get("model", s.space.models[0])).split("/")[-1],) if models else ()),
                  f"{r.value:.4f}",
                  *(f"{m.get(k, 0) / tot:.0%}" for k in ("search_flops", "learning_flops", "reward_flops")),
                  fmt_flops(m.get("total_flops", 0)))
    t.caption = "rho: realized update fraction; search/learn/rwd: shares of the executed FLOPs"
    out.print(t)
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
    pilots = [r for r in rows(st) if r.number not in full]
    p_inf = sum(r.state == "INFEASIBLE" for r in pilots)
    out.print(f"full-budget trials: {len(done)} complete, {n_inf} infeasible (never run), {n_fail} failed",
              highlight=False)
    if n_pilots:
        out.print(f"RACE pilots: {n_pilots}, {p_inf} infeasible (never run)", highlight=False)

from allocopt.commands_query import register as _register_query
_register_query(app)
from allocopt.commands_race import register as _register_race
_register_race(app)
from allocopt.commands_asktell import register as _register_asktell
_register_asktell(app)

# ------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app, turns bad input into one line and exit code 2."""
    from allocopt.allocation import InfeasiblePlan

    try:
        rc: Any = app(args=argv, standalone_mode=False, prog_name="allocopt")
    except typer.Abort:
        fail("aborted", 130)
    except KeyboardInterrupt:  # before any study was opened (loading, planning): nothing recorded
        fail("interrupted before anything was recorded", 130)
    except TyperException as e:  # usage errors: unknown option, bad int, missing option
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        fail(f"error: {msg} (see --help)", getattr(e, "exit_code", 2))
    except (ConfigError, InfeasiblePlan, UsageProblem) as e:
        fail(f"error: {e}", 2)
    except OSError as e:  # a path that is a folder, exists already, cannot be written
        fail(f"error: {e.filename or ''}: {e.strerror or e}", 2)
    sys.exit(rc if isinstance(rc, int) else 0)


def fail(line: str, code: int = 2) -> None:
    """Print one line on stderr and exit with ``code``."""
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
