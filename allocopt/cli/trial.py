"""``allocopt trial``: one real GRPO trial at an allocation under a hard FLOP budget.

Registered on the app by :func:`register`. Bad input is raised as
:class:`~allocopt.flops.ConfigError` (``main`` prints one line, exit code 2); torch, TRL and the
objectives are imported inside the command.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from allocopt.cli.account import breakdown_table, fmt_flops
from allocopt.cli.common import fail, parse_settings
from allocopt.cli.consoles import PipeConsole
from allocopt.cli.live import TRIAL_WALL_LIMIT_S, duration, estimated_seconds
from allocopt.flops import ConfigError

out = PipeConsole()
err = Console(stderr=True)


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: must be a number") from None


def trial(
    budget: str = typer.Option(..., help="FLOP budget of the run, e.g. 3e11 for the tiny objective (about a minute on 2 cores: the measured grids' median 59 s at the tiny size, 92 s at medium)."),
    rho: str = typer.Option(..., help="Update fraction rho = learning / total, in (0, 1)."),
    group_size: int = typer.Option(4, "--group-size", "-G", help="Completions per prompt (G), >= 2."),
    reward: str = typer.Option("sparse", help="Reward system: sparse, structured, dense, proxy_prm, prm."),
    model: Optional[str] = typer.Option(None, help="Policy of an objective that has several (the tiny world's sizes: tiny, small, medium). \\[default: the objective's own]"),
    objective: str = typer.Option("tiny", help="What the trial trains and scores (tiny: CPU arithmetic world; tiny-table: its measured grid, replayed; qwen: GPU; synthetic; command)."),
    seed: int = typer.Option(0, help="Random seed of the trial."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    yes: bool = typer.Option(False, "--yes", help=f"Run even when the estimated wall time (from the objective's measured FLOP/s) is above {TRIAL_WALL_LIMIT_S / 3600:g} h."),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="Objective setting KEY=VALUE (repeat), e.g. --set model=PATH for qwen."),
    verbose: bool = typer.Option(False, "--verbose", help="Show the libraries' warnings and log lines (hidden by default)."),
) -> None:
    """Run one real GRPO trial at an allocation under a hard FLOP budget; print targets and breakdown."""
    from allocopt.cli.common import check_available, load_objective
    from allocopt.plan.allocation import Allocation, check_budget, make_plan

    from allocopt.vocabulary import Vocabulary

    Vocabulary().reward(reward)  # the built-in systems: a study file declares others
    alloc = Allocation(rho=_number("rho", rho), group_size=group_size, reward=reward, model=model)
    b = check_budget(budget)
    if not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed}: must be an integer from 0 to 2**32 - 1")
    # the plan (its model among them) is checked before the machine is: a wrong --model is
    # named even where the objective could not run
    obj = load_objective(objective, parse_settings(set_), available=False)
    with err.status("preparing the objective's workload (its models are built or loaded, "
                    "cached after the first run)..."):
        workload = obj.workload()
    p = make_plan(b, alloc, workload)
    check_available(obj)
    _check_wall_time(obj, p, objective, yes)
    res = _run(obj, p, seed=seed, verbose=verbose, show=not as_json)
    if as_json:
        out.print_json(json.dumps({"plan": p.to_dict(), **res.to_dict()}, default=str))
    else:
        print_trial(p, res)


def _check_wall_time(obj: Any, p: Any, objective: str, yes: bool) -> None:
    """Say the trial's estimated wall time (from the objective's measured FLOP/s, when it has
    one); refuse one above :data:`~allocopt.cli.live.TRIAL_WALL_LIMIT_S` without ``--yes``."""
    secs = estimated_seconds(obj, p.expected.executed.total_flops)
    if secs is None:
        return
    if secs > TRIAL_WALL_LIMIT_S and not yes:
        raise ConfigError(
            f"budget={p.budget_flops:.3g}: the {objective} objective would take about {duration(secs)} here "
            f"(at {obj.flops_per_second:.2g} FLOP/s measured on a CPU core); allowed without "
            f"--yes: at most {duration(TRIAL_WALL_LIMIT_S)} (give a smaller --budget, or --yes)")
    err.print(f"estimated wall time: about {duration(secs)} ({fmt_flops(p.expected.executed.total_flops)} "
              f"FLOPs at {obj.flops_per_second:.2g} FLOP/s, plus evaluation)", highlight=False,
              soft_wrap=True)


def _run(obj: Any, p: Any, *, seed: int, verbose: bool, show: bool) -> Any:
    """Run plan ``p`` with a progress bar on stderr (``show``); a trial that fails is one line
    and exit code 1."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from allocopt.objective import TrialFailed

    from allocopt.quiet import quiet

    b = p.budget_flops
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               TextColumn("{task.fields[spent]}"), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=not show) as bar:
        task = bar.add_task("GRPO", total=b, spent="")

        def progress(rec: Any, meter: Any) -> None:
            bar.update(task, completed=meter.executed_flops,
                       description=f"GRPO iteration {rec.iteration + 1} (~{p.iterations})",
                       spent=f"{fmt_flops(meter.executed_flops)} / {fmt_flops(b)} FLOPs, "
                             f"reward {rec.reward_mean:.3f}")

        try:
            with quiet(verbose):
                return obj.run(p, seed=seed, progress=progress)
        except TrialFailed as e:
            fail(f"error: trial failed after spending {fmt_flops(e.result.spent.executed.total_flops)} "
                 f"FLOPs: {e}", 1)


def print_trial(p: Any, res: Any) -> None:
    """The trial's targets, the compute it spent and its wall times."""
    a, b = p.allocation, p.budget_flops
    policy = f", model={a.model}" if a.model else ""
    # the heading on its own line: as the narrow table's title it wrapped mid-phrase
    out.print(f"Trial: rho={a.rho:g}, G={a.group_size}, reward={a.reward}{policy}, budget {fmt_flops(b)} FLOPs",
              highlight=False, markup=False)
    t = Table()
    t.add_column("target")
    t.add_column("value", justify="right")
    for k, v in res.targets.items():
        t.add_row(k.replace("pass_at_1", "pass@1"), f"{v:.4f}")
    out.print(t)
    # an objective without a training loop here (tiny-table replays measured trials) has no
    # iteration records, wall times or evaluation FLOPs to show: those parts are left out
    iterations = f"{len(res.curves)} iterations, " if res.curves else ""
    out.print(breakdown_table(res.spent, f"Compute spent ({iterations}"
                                         f"{res.spent.executed.total_flops / b:.1%} of budget; "
                                         f"planned rho {p.realized_rho:.3f})"))
    if res.wall_seconds:  # one line each: joined, they wrapped mid-phrase at 80 columns
        out.print("wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.wall_seconds.items()),
                  highlight=False, markup=False)
    if res.eval_flops:
        out.print(f"evaluation: {fmt_flops(res.eval_flops)} FLOPs (outside the budget)", highlight=False,
                  markup=False)


def register(app: typer.Typer) -> None:
    """Add the ``trial`` command to ``app``."""
    app.command(name="trial")(trial)
