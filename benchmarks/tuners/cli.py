"""What the scripts that read measured tables share on their command line: the check of the
tables given, and one markdown table with rows per world, each a one-line error on bad input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence


def tables_refusal(tables: Sequence[Path]) -> str | None:
    """One line for a bad list of measured tables given on a command line (one that is not a
    file, or one given twice), or None."""
    seen: set[Path] = set()
    for t in tables:
        if not t.is_file():
            return f"--tables={str(t)!r}: not a file; give the grid runner's trials.csv of each world"
        if t.resolve() in seen:
            return f"--tables={str(t)!r}: given twice; give each world's table once"
        seen.add(t.resolve())
    return None


def print_per_table(tables: Sequence[Path], head: Sequence[str], rows_of: Callable[[Path], list[str]],
                    extra: str | None = None) -> int:
    """Print a markdown table: ``head`` (its two header lines), then ``rows_of(table)`` for each
    table. Returns the exit code: 2 with one ``error:`` line for bad tables (or ``extra``, a
    refusal of another flag) or a table that cannot be read, else 0."""
    from allocopt.flops import ConfigError

    bad = tables_refusal(tables) or extra
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    lines = list(head)
    for t in tables:
        try:
            lines += rows_of(t)
        except (ConfigError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print("\n".join(lines))
    return 0
