"""The command reference, generated from the ``allocopt`` app itself (click's view of typer's app).

Run by the mkdocs hook ``docs/hooks.py`` (the page ``reference/cli.md`` holds the marker
``<!-- cli-reference -->``), and by hand: ``python docs/gen_cli.py`` prints the Markdown. Every
command, argument and option comes from the same objects ``allocopt --help`` prints, so the page
cannot drift from the code.
"""

from __future__ import annotations

import inspect



def _app():
    import typer.main

    from allocopt.cli import app

    return typer.main.get_command(app)


def _esc(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def command_markdown(name: str, cmd) -> str:
    """One command's section: its help text, usage, and each option as ``--help`` prints it."""
    from typer._click.core import Context  # typer 0.29 carries its own click

    ctx = Context(cmd, info_name=name)
    help_text = inspect.cleandoc(cmd.help or "").replace("\b\n", "")
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    lines = [f"## `allocopt {name}`", "", help_text, "",
             "```text", f"allocopt {name} {usage}", "```", ""]
    rows = [r for p in cmd.params if not getattr(p, "hidden", False)
            and (r := p.get_help_record(ctx)) is not None]
    if rows:
        lines += ["| argument / option | what |", "|---|---|"]
        lines += [f"| `{_esc(names)}` | {_esc(text)} |" for names, text in rows]
        lines.append("")
    return "\n".join(lines)


def cli_markdown() -> str:
    """Every ``allocopt`` command, in the order ``allocopt --help`` lists them."""
    group = _app()
    parts = [inspect.cleandoc(group.help or ""), ""]
    parts += [f"- [`allocopt {n}`](#allocopt-{n})" for n in group.commands]
    parts.append("")
    for n, cmd in group.commands.items():
        parts.append(command_markdown(n, cmd))
    return "\n".join(parts)


if __name__ == "__main__":
    print(cli_markdown())
