"""``allocopt workers``: one ``allocopt study`` worker per GPU on this host (:mod:`allocopt.store.launch`)."""

from __future__ import annotations

import typer
from typer.core import TyperCommand

from allocopt.flops import ConfigError

EXAMPLE = "allocopt workers --gpus 0,1 -- --budget 1e19 --objective synthetic"
_AFTER = "allocopt.workers.after_dashes"


class _WorkersCommand(TyperCommand):
    """Keeps what came after ``--`` apart: the parser hands every extra argument over in one
    list, so a study argument given before ``--`` could not be told from one given after it."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        ctx.meta[_AFTER] = list(args[args.index("--") + 1:]) if "--" in args else None
        return super().parse_args(ctx, args)



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
    from allocopt.store.launch import parse_gpus, run_workers

    args = study_args(list(ctx.args), ctx.meta.get(_AFTER))
    code = run_workers(parse_gpus(gpus), args)
    raise typer.Exit(code)


def study_args(extra: list[str], after: list[str] | None) -> list[str]:
    """The study's arguments: ``after``, what followed ``--`` (``None``: no ``--``), checked
    against ``extra``, every argument the parser did not take as the launcher's own.

    Raises:
        ConfigError: no ``--`` or nothing after it, an argument before ``--`` (a study option
            or the word ``study``), or ``study`` right after ``--``; one line saying to pass
            the study's arguments after ``--``.
    """
    stray = extra[:len(extra) - len(after)] if after is not None else extra
    if stray:
        raise ConfigError(f"study args: {stray[0]!r} is before --; workers run `allocopt study` themselves: "
                          f"pass the study's arguments after --, e.g. {EXAMPLE}")
    if not after:
        raise ConfigError(f"study args: none given; pass the study's arguments after --, e.g. {EXAMPLE}")
    if after[0] == "study":
        raise ConfigError("study args: 'study' after --; workers run `allocopt study` themselves: pass "
                          f"only the study's arguments after --, e.g. {EXAMPLE}")
    return after


def register(app: typer.Typer) -> None:
    """Add ``workers`` to the ``allocopt`` app."""
    app.command(name="workers", cls=_WorkersCommand,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(workers)
