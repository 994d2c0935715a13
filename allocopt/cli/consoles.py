"""The command line's rich consoles, which report a reader that closed stdout (``| head``).

rich's own :meth:`~rich.console.Console.on_broken_pipe` exits with code 1, the code this command
line gives a study in which no full-budget trial finished; :func:`allocopt.cli.main` turns
:class:`OutputClosed` into the shell's code for a writer whose pipe was closed (141) instead.
"""

from __future__ import annotations

from rich.console import Console

#: What a shell reports for a process ended by SIGPIPE (128 + 13): ``git log | head`` exits so.
OUTPUT_CLOSED_EXIT = 141


class OutputClosed(Exception):
    """The reader of the command's output closed it before the command ended."""


class PipeConsole(Console):
    """A rich console that raises :class:`OutputClosed` when its reader has gone."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more can reach the reader
        raise OutputClosed
