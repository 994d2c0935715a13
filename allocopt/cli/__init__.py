"""The ``allocopt`` command line (typer + rich). Thin: parsing, printing, exit codes.

This module builds the app, registers the command modules (one per command group:
:mod:`~allocopt.cli.account`, :mod:`~allocopt.cli.trial`, :mod:`~allocopt.cli.study`,
:mod:`~allocopt.cli.query`, :mod:`~allocopt.cli.race`, :mod:`~allocopt.cli.asktell`, :mod:`~allocopt.cli.workers`) and runs
it (:func:`main`); what commands share is :mod:`~allocopt.cli.common`.

Every bad input ends with one line ``error: <field>=<value>: <what is allowed>`` on stderr and
exit code 2. Heavy packages (torch, TRL, Optuna, MLflow) are imported inside the commands
that need them, so ``allocopt --help`` starts fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer import TyperException

from allocopt.flops import ConfigError

class _HelpWithoutType:
    """Its ``--help`` option shows no type: it takes no value (typer 0.29 shows ``<bool>``)."""

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)  # type: ignore[misc]
        if opt is not None:
            opt.metavar = ""
        return opt


class _Command(_HelpWithoutType, typer.core.TyperCommand):
    """A command of the ``allocopt`` app (:class:`_HelpWithoutType`)."""


class _Group(_HelpWithoutType, typer.core.TyperGroup):
    """The ``allocopt`` app (:class:`_HelpWithoutType`)."""


app = typer.Typer(
    name="allocopt",
    help="Where should a fixed GRPO post-training FLOP budget go? Exact FLOP accounting "
         "(search / learning / reward), budget plans, trials and Bayesian-optimization studies "
         "of the allocation (update fraction rho, group size G, reward system).",
    epilog="First, on any machine (a minute, no GPU): allocopt study --objective synthetic --budget 1e19 "
           "--target pass@1 --trials 8. The main job, on GPUs: allocopt study --budget 1e19 --target pass@1 "
           "(add --dry-run to see the plans the budget buys first).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("allocopt")
        except PackageNotFoundError:  # run from a source tree that was never installed
            v = "unknown (not installed: pip install -e .)"
        typer.echo(f"allocopt {v}")
        raise typer.Exit()


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                            help="Print allocopt's version and exit.")) -> None:
    """The app's options (``--version``); its help is the app's."""


from allocopt.cli.account import breakdown_table, fmt_flops  # noqa: E402,F401 (re-exported)
from allocopt.cli.common import fail, with_flag  # noqa: E402
from allocopt.cli import account, asktell, query, race, study, trial, workers  # noqa: E402

account.register(app)  # account and plan, listed first
trial.register(app)
study.register(app)
query.register(app)
race.register(app)
asktell.register(app)
workers.register(app)


def _reflow_help(typer_app: typer.Typer) -> None:
    """Each command's help from its docstring with the source's line breaks inside a paragraph
    removed: typer's rich help keeps them, and they break lines mid-sentence at any width."""
    import inspect

    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback)
        if doc:
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


def _plain_metavars(typer_app: typer.Typer) -> None:
    """Typer (0.29) shows a type beside every option, ``<bool>`` for an on/off flag too (which
    takes no value) and ``<list[str]>`` for a repeatable one; at 80 columns that column squeezes
    the option names to a cut-off sliver. A flag shows no type, a repeatable option its
    element's type followed by ``...`` (give it again for another value); ``--help`` none either
    (:class:`_Command`)."""
    import inspect
    import typing

    from typer.models import DefaultPlaceholder, OptionInfo

    for info in typer_app.registered_commands:
        if info.cls in (None, typer.core.TyperCommand) or isinstance(info.cls, DefaultPlaceholder):
            info.cls = _Command
        elif not issubclass(info.cls, _HelpWithoutType):  # a command's own class (workers')
            info.cls = type(info.cls.__name__, (_HelpWithoutType, info.cls), {})
        hints = typing.get_type_hints(info.callback)
        for name, param in inspect.signature(info.callback).parameters.items():
            opt, hint = param.default, hints.get(name)
            if not isinstance(opt, OptionInfo) or opt.metavar is not None:
                continue
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if hint is bool or args == [bool]:
                opt.metavar = ""
            elif typing.get_origin(hint) is list or (args and typing.get_origin(args[0]) is list):
                inner = typing.get_args(hint if typing.get_origin(hint) is list else args[0])[0]
                opt.metavar = f"<{getattr(inner, '__name__', 'str')}>..."


_reflow_help(app)
_plain_metavars(app)

# ------------------------------------------------------------------------------- main
def _spec_hint(e: Exception, msg: str) -> str:
    """A study file given without ``--spec`` to a command that takes one (``allocopt study
    s.toml``): say how to give it."""
    import re

    ctx = getattr(e, "ctx", None)
    if ctx is None or not any("--spec" in p.opts for p in ctx.command.params):
        return ""
    m = re.search(r"unexpected extra argument\S* \((\S+?\.toml)\b", msg)
    return f"; a study file is given as --spec {m.group(1)}" if m else ""


def _given_value(e: Exception, argv: list[str]) -> str:
    """The value a refused option was given (``Invalid value for '--trials'`` says the flag and
    the rule, not what was typed): `` (got 'two')`` from ``argv``, else nothing."""
    param = getattr(e, "param", None)
    opts = [o for o in getattr(param, "opts", []) + getattr(param, "secondary_opts", []) if o.startswith("-")]
    for i, a in enumerate(argv):
        for o in opts:
            if a.startswith(o + "="):
                return f" (got {a[len(o) + 1:]!r})"
            if a == o and i + 1 < len(argv):
                return f" (got {argv[i + 1]!r})"
    return ""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app, turns bad input into one line and exit code 2."""
    import warnings

    from allocopt.cli.consoles import OUTPUT_CLOSED_EXIT, OutputClosed
    from allocopt.errors import DiskFull, StorageUnreachable
    from allocopt.plan.allocation import InfeasiblePlan

    # a warning is one line ("warning: ..."), like an error, not Python's two with the source line
    python_format = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *a, **k: f"warning: {message}\n"
    try:
        rc: Any = app(args=argv, standalone_mode=False, prog_name="allocopt")
    except typer.Abort:
        fail("aborted", 130)
    except KeyboardInterrupt:  # before any study was opened (loading, planning): nothing recorded
        fail("interrupted before anything was recorded", 130)
    except (OutputClosed, BrokenPipeError):  # `| head` read what it wanted; no message can reach it
        _drop_stdout()
        sys.exit(OUTPUT_CLOSED_EXIT)
    except TyperException as e:  # usage errors: unknown option, bad int, missing option
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        got = _given_value(e, sys.argv[1:] if argv is None else argv)
        fail(f"error: {msg}{got}{_spec_hint(e, msg)} (see --help)", getattr(e, "exit_code", 2))
    except (ConfigError, InfeasiblePlan) as e:
        fail(f"error: {with_flag(str(e), sys.argv[1:] if argv is None else argv)}", 2)
    except StorageUnreachable as e:  # the database server stayed away: what is finished is kept
        fail(f"error: {e}", 1)
    except DiskFull as e:  # a disk under the records filled up: what is finished is kept
        fail(f"error: {e}", 1)
    except OSError as e:  # a path that is a folder, exists already, cannot be written
        fail(f"error: {e.filename or ''}: {e.strerror or e}", 2)
    finally:
        warnings.formatwarning = python_format
    sys.exit(rc if isinstance(rc, int) else 0)


def _drop_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's last flush does not fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    main()
