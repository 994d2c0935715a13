"""The ``allocopt`` command line (typer + rich). Thin: parsing, printing, exit codes.

Every bad input ends with one line ``error: <field>=<value>: <what is allowed>`` on stderr and
exit code 2. Heavy packages (torch, TRL, Optuna, MLflow) are imported inside the commands
that need them, so ``allocopt --help`` starts fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any, List, Optional

import typer
from typer import TyperException
from rich.console import Console
from rich.table import Table

from allocopt.flops import ConfigError

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


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: must be a number") from None


from allocopt.cli.account import breakdown_table, fmt_flops  # noqa: E402,F401 (re-exported)
from allocopt.cli.account import register as _register_account  # noqa: E402

_register_account(app)  # account and plan, listed first


from allocopt.cli.common import fail, parse_settings as _settings  # noqa: E402


# ----------------------------------------------------------------------------- trial
from allocopt.cli.live import TRIAL_WALL_LIMIT_S, duration, estimated_seconds  # noqa: E402


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

    from allocopt.plan.allocation import Allocation, check_budget, make_plan
    from allocopt.cli.common import load_objective

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

        from allocopt.objective import TrialFailed

        from allocopt.study.quiet import quiet

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


from allocopt.cli.study import register as _register_study  # noqa: E402
_register_study(app)  # study, listed after trial
from allocopt.cli.query import register as _register_query
_register_query(app)
from allocopt.cli.race import register as _register_race
_register_race(app)
from allocopt.cli.asktell import register as _register_asktell
_register_asktell(app)


def _reflow_help(typer_app: typer.Typer) -> None:
    """Each command's help from its docstring with the source's line breaks inside a paragraph
    removed: typer's rich help keeps them, and they break lines mid-sentence at any width."""
    import inspect

    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_reflow_help(app)

# ------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app, turns bad input into one line and exit code 2."""
    from allocopt.plan.allocation import InfeasiblePlan

    try:
        rc: Any = app(args=argv, standalone_mode=False, prog_name="allocopt")
    except typer.Abort:
        fail("aborted", 130)
    except KeyboardInterrupt:  # before any study was opened (loading, planning): nothing recorded
        fail("interrupted before anything was recorded", 130)
    except TyperException as e:  # usage errors: unknown option, bad int, missing option
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        fail(f"error: {msg} (see --help)", getattr(e, "exit_code", 2))
    except (ConfigError, InfeasiblePlan) as e:
        fail(f"error: {e}", 2)
    except OSError as e:  # a path that is a folder, exists already, cannot be written
        fail(f"error: {e.filename or ''}: {e.strerror or e}", 2)
    sys.exit(rc if isinstance(rc, int) else 0)




if __name__ == "__main__":
    main()
