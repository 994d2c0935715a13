"""Records of a long benchmark on disk: a CSV file appended to as each replication ends, so a
run that is stopped resumes where it was (a rerun reads what is there and skips it)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence


def read_rows(path: Path) -> list[dict[str, str]]:
    """The records of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append_rows(path: Path, keys: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Append ``rows`` (their ``keys`` columns) to ``path``, the header first on a new file."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(keys), extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


__all__ = ["append_rows", "read_rows"]
