"""Seconds and peak memory from start to the one-line refusal of files from other people's jobs
(``allocopt.limits``): over-size files, nesting past Python's recursion limit, pickle bombs, a
compressed member declaring 3 GB. Each row starts one ``python -m allocopt.cli`` and reads its
peak resident memory (GNU ``/usr/bin/time -f %M``); the files are the ones of
``tests/test_bad_inputs.py``'s ``STRANGER_ROWS`` (sparse where large: no disk used). Prints a
table; run from the repository root: ``python benchmarks/stranger_files.py [N]`` (N: rows, all
by default). The interpreter's start and imports (about 2-3 s on 2 busy cores) are included.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_bad_inputs import STRANGER_ROWS, _stranger_files  # noqa: E402

TRIED = ("trainer_state over", "nested", "bytearray", "shared lists", "declaring 3 GB", "log over",
         "2 MiB line", "lengths: file over", "spec: over", "metrics over", "100000 times")


def main() -> None:
    rows = [r for r in STRANGER_ROWS if any(t in r[0] for t in TRIED)]
    rows = rows[:int(sys.argv[1])] if len(sys.argv) > 1 else rows
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()):  # the ask that reserves trial 0
            _stranger_files(tmp)
        print(f"{'file':<46} {'exit':>4} {'s':>6} {'peak MiB':>9}  line")
        for kind, args, _ in rows:
            argv = [a.replace("{tmp}", str(tmp)) for a in args]
            t = time.perf_counter()
            # GNU time: the command's own peak resident memory (a forked child's ru_maxrss would
            # start from this parent's)
            r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(tmp / "peak"), sys.executable, "-m",
                                "allocopt.cli", *argv], cwd=tmp, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
            secs = time.perf_counter() - t
            peak_kib = int((tmp / "peak").read_text().split()[-1])
            line = (r.stdout + r.stderr).strip().splitlines()
            shown = line[0][:72] if len(line) == 1 else f"{len(line)} lines"
            print(f"{kind[:46]:<46} {r.returncode:>4} {secs:>6.2f} {peak_kib / 1024:>9.0f}  "
                  f"{shown.replace(str(tmp) + '/', '')}")


if __name__ == "__main__":
    main()
