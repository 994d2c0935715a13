"""Seconds and peak memory from start to the one-line refusal of every row of the bad-input
table (``tests/test_bad_inputs.py``: ``ROWS``, ``STRANGER_ROWS`` with the reading layer's
``LAYER_ROWS``, and the ``command`` objective's ``FAILED_TRIAL_ROWS``), each in a fresh
``python -m allocopt.cli`` (the interpreter's start and imports included).

The bar: every row one line (``error: …``), exit 2 (a failed trial: exit 1, one error line),
in at most 2 s and 2 GB. Two times per row: ``seconds`` from start to exit (the interpreter's
start and ``allocopt.cli``'s imports included: on 2 busy cores these alone take 1.5-2.5 s) and
``refusal_s`` from the command's call to its exit (what the file costs; the bar is checked on
it). Each row's peak resident memory is GNU ``/usr/bin/time -f %M`` of the command (with the
``command`` objective, of the process that waits for the user's command: the largest of them).
A row past ``--timeout`` seconds is killed and shown as ``hang``.

Run from the repository root::

    nice -n 10 python benchmarks/bad_input.py                  # this checkout
    nice -n 10 python benchmarks/bad_input.py --code ../main   # another checkout (before/after)

Rows are appended to ``benchmarks/bad_input/<label>.csv`` as they finish (``--label``,
default ``current``); a run with the same label skips the rows already there (resumable).
Prints a row per kind and, per surface, the rows that met the bar.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_bad_inputs import ALL_ROWS, FAILED_TRIAL_ROWS, make_folder  # noqa: E402

SECONDS, MEMORY_MIB = 2.0, 2048
COLUMNS = ["surface", "kind", "exit", "seconds", "refusal_s", "peak_mib", "lines", "met", "line"]
DRIVER = """import sys, time
from allocopt.cli import main
t = time.perf_counter()
try:
    main(sys.argv[2:])
finally:
    open(sys.argv[1], "w").write(repr(time.perf_counter() - t))
"""
"""Runs one command and writes the seconds from the call to its exit (after the interpreter
started and ``allocopt.cli`` was imported)."""


def surface(kind: str) -> str:
    """The reader a row tries (``verl: a FIFO`` -> ``verl``)."""
    return kind.split(":")[0].split(" ")[0]


def run_row(kind: str, args: list[str], tmp: Path, code: Path, timeout: float) -> dict:
    """One row in a fresh process: exit code, wall seconds, peak memory, the output's lines."""
    argv = [a.replace("{tmp}", str(tmp)) for a in args]
    peak_file, inner_file = tmp / "peak", tmp / f"inner-{abs(hash(kind))}"
    peak_file.unlink(missing_ok=True)
    t = time.perf_counter()
    # a session of its own: a row that hangs is killed with everything it started
    p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", str(peak_file), sys.executable, "-c",
                          DRIVER, str(inner_file), *argv], cwd=tmp, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(code), "COLUMNS": "200"})
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        rc, out = p.returncode, stdout + stderr
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        rc, out = "hang", ""
    secs = time.perf_counter() - t
    try:
        inner = float(inner_file.read_text())
    except (OSError, ValueError):
        inner = float("nan")
    try:
        peak = int(peak_file.read_text().split()[-1]) / 1024
    except (OSError, ValueError, IndexError):
        peak = float("nan")
    lines = [ln for ln in out.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    failed_trial = any(kind == k for k, _, _ in FAILED_TRIAL_ROWS)
    one = len(errors) == 1 and "Traceback" not in out and (failed_trial or len(lines) == 1)
    met = one and rc == (1 if failed_trial else 2) and inner <= SECONDS and peak <= MEMORY_MIB
    shown = (errors[0] if errors else lines[-1] if lines else "").replace(str(tmp) + "/", "")[:100]
    return {"surface": surface(kind), "kind": kind, "exit": rc, "seconds": f"{secs:.2f}",
            "refusal_s": f"{inner:.2f}", "peak_mib": f"{peak:.0f}", "lines": len(lines), "met": "yes" if met else "no", "line": shown}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose allocopt runs (PYTHONPATH)")
    ap.add_argument("--label", default="current", help="results file benchmarks/bad_input/LABEL.csv")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds before a row counts as a hang")
    ap.add_argument("--only", default="", help="rows whose kind contains this text")
    a = ap.parse_args()
    out = ROOT / "benchmarks" / "bad_input" / f"{a.label}.csv"
    out.parent.mkdir(exist_ok=True)
    done = {r["kind"]: r for r in csv.DictReader(out.open())} if out.exists() else {}
    rows = [r for r in ALL_ROWS + FAILED_TRIAL_ROWS if a.only in r[0]]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with contextlib.redirect_stdout(io.StringIO()):
            make_folder(tmp)
        with out.open("a", newline="") as f:
            w = csv.DictWriter(f, COLUMNS)
            if not done:
                w.writeheader()
            for kind, args, _ in rows:
                if kind not in done:
                    done[kind] = run_row(kind, args, tmp, a.code.resolve(), a.timeout)
                    w.writerow(done[kind])
                    f.flush()
                r = done[kind]
                print(f"{r['kind'][:50]:<50} {r['exit']:>4} {float(r['seconds']):>6.2f} "
                      f"{float(r['refusal_s']):>6.2f} {r['peak_mib']:>5} MiB  {r['met']:>3}  {r['line'][:60]}")
    summary([done[k] for k, _, _ in rows if k in done])


def summary(results: list[dict]) -> None:
    """Per surface: rows, rows that met the bar, the slowest and the largest."""
    print(f"\n{'surface':<14} {'rows':>4} {'met':>4} {'max s':>6} {'max refusal s':>14} {'max MiB':>8}")
    for s in dict.fromkeys(r["surface"] for r in results):
        rs = [r for r in results if r["surface"] == s]
        print(f"{s:<14} {len(rs):>4} {sum(r['met'] == 'yes' for r in rs):>4} "
              f"{max(float(r['seconds']) for r in rs):>6.2f} "
              f"{max(float(r['refusal_s']) for r in rs):>14.2f} "
              f"{max(float(r['peak_mib']) for r in rs):>8.0f}")
    print(f"{'all':<14} {len(results):>4} {sum(r['met'] == 'yes' for r in results):>4}")


if __name__ == "__main__":
    main()
