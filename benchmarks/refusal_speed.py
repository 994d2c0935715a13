"""Wall seconds from start to the one-line refusal of each bad input, in a fresh process.

Every row of the bad-input table (``tests/test_refusal_imports.py``'s ``ALL_ROWS``: those of
``tests/test_bad_inputs.py`` and the storage, ``command`` objective and ``workers`` rows) is run
as ``python -m allocopt.cli ...`` in a folder holding the table's files; the interpreter's start
and imports are included, as a user meets them. Prints one line per row (seconds, exit code,
files the run left behind, which are then removed) and a summary: the median, the slowest and
the rows over the 2-second bar. Run from the repository root::

    python benchmarks/refusal_speed.py                # this checkout
    python benchmarks/refusal_speed.py --code DIR     # another checkout's code, the same rows
    python benchmarks/refusal_speed.py --only race    # rows whose kind contains 'race'
    python benchmarks/refusal_speed.py --repeat 3     # the least of 3 runs per row

``--code`` is for before/after tables: the rows and their files are this checkout's, the
``allocopt`` run is the one under ``DIR`` (a row that code does not refuse runs what it asks
for, with ``--trials 1`` at most, and shows its exit code). On a loaded machine the times grow
with the load: compare runs made back to back.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_bad_inputs import make_folder  # noqa: E402
from test_refusal_imports import ALL_ROWS  # noqa: E402

BAR_S = 2.0


def _entry_points(tmp: Path) -> str:
    """A folder whose distribution declares the ``command`` objective (as pyproject.toml does),
    for an installed metadata that predates it."""
    d = tmp / ".eps" / "allocopt_command_ep-0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: allocopt-command-ep\nVersion: 0\n")
    (d / "entry_points.txt").write_text("[allocopt.objectives]\ncommand = objectives.command:make\n")
    return str(tmp / ".eps")


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if ".eps" not in p.parts}


def run(rows: list, code: Path, tmp: Path, timeout_s: float, repeat: int = 1) -> list[tuple[str, float, int, list[str]]]:
    """Each row's kind, wall seconds (the least of ``repeat`` runs: the others waited for the
    CPU), exit code and the files it left (removed after it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), _entry_points(tmp)]), "COLUMNS": "200"}
    out = []
    for kind, args, _ in rows:
        argv = [a.replace("{tmp}", str(tmp)) for a in args]
        secs = []
        for _ in range(repeat):
            before = _files(tmp)
            t0 = time.perf_counter()
            try:
                rc = subprocess.run([sys.executable, "-m", "allocopt.cli", *argv], cwd=tmp, capture_output=True,
                                    text=True, timeout=timeout_s, env=env).returncode
            except subprocess.TimeoutExpired:
                rc = -1
            secs.append(time.perf_counter() - t0)
            left = sorted(_files(tmp) - before)
            for p in sorted(left, key=lambda p: len(p.parts), reverse=True):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        out.append((kind, min(secs), rc, [str(p.relative_to(tmp)) for p in left if p.parent == tmp]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose allocopt runs the rows")
    ap.add_argument("--only", default="", help="only rows whose kind contains this text")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a row may run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row; the least time is shown")
    a = ap.parse_args()
    rows = [r for r in ALL_ROWS if a.only in r[0]]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with contextlib.redirect_stdout(io.StringIO()):  # the ask that reserves trial 0
            make_folder(tmp)
        (tmp / "job.sh").touch()
        results = run(rows, a.code.resolve(), tmp, a.timeout, a.repeat)
    print(f"code: {a.code.resolve()}; {len(results)} rows, a fresh process each (least of {a.repeat}); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'kind':<58} {'s':>6} {'exit':>4}  left behind")
    for kind, secs, rc, left in results:
        print(f"{kind[:58]:<58} {secs:>6.2f} {rc:>4}  {', '.join(left) or '-'}")
    times = [s for _, s, _, _ in results]
    over = [k for k, s, _, _ in results if s > BAR_S]
    print(f"median {statistics.median(times):.2f} s, slowest {max(times):.2f} s; {len(over)} of {len(times)} "
          f"over {BAR_S:g} s; {sum(rc != 2 for _, _, rc, _ in results)} not exit 2; "
          f"{sum(bool(x) for _, _, _, x in results)} left files behind")


if __name__ == "__main__":
    main()
