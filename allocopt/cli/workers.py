"""``allocopt workers``: one ``allocopt study`` worker per GPU on this host (:mod:`allocopt.study.workers`)."""

from __future__ import annotations

import typer

from allocopt.flops import ConfigError


def workers(
    ctx: typer.Context,
    gpus: str = typer.Option(..., "--gpus", help="One worker per GPU: 0,1,2,3 or 0-3; 0+1,2+3 gives each worker two GPUs. Sets CUDA_VISIBLE_DEVICES per worker."),
) -> None:
    """Start one `allocopt study` worker per GPU on one study; the arguments after -- are the study's.

    Example: allocopt workers --gpus 0,1,2,3 -- --spec studies/paper-rewards.toml --storage postgresql://...
    Every worker runs the same study (same --study-name and --storage; SQLite is fine on one
    host, PostgreSQL across hosts). Output lines are prefixed \\[gpu N]; Ctrl-C stops every worker
    (their running trials are run again on resume); the exit code is the worst worker's.
    """
    from allocopt.study.workers import parse_gpus, run_workers

    args = list(ctx.args)
    if not args:
        raise ConfigError("study args: none given; put the `allocopt study` arguments after --, e.g. "
                          "allocopt workers --gpus 0,1 -- --spec study.toml")
    if args[0] == "study":  # `allocopt workers --gpus 0,1 -- study --spec ...` reads as well
        args = args[1:]
    code = run_workers(parse_gpus(gpus), args)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add ``workers`` to the ``allocopt`` app."""
    app.command(name="workers", context_settings={"allow_extra_args": True,
                                                  "ignore_unknown_options": True})(workers)
