"""Seconds from start to the one-line error of ``allocopt study`` with an unusable MLflow store.

Loopback targets only: a closed port (connection refused), another loopback address, IPv6
loopback, a server that accepts the connection and never answers (read timeout), and a
read-only SQLite store (``chattr +i``, works as root). Prints a table; run from the repository
root: ``python benchmarks/mlflow_unreachable.py``. Each row starts one ``python -m allocopt.cli``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(uri: str, folder: Path, interrupt_after: float | None = None) -> tuple[float, int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "allocopt.cli", "study", "--objective", "synthetic", "--budget",
            "1e18", "--target", "pass@1", "--pilots", "0", "--trials", "2", "--mlflow-uri", uri,
            "--storage", f"sqlite:///{folder}/optuna.db"]
    t = time.perf_counter()
    # a child of a shell's background job inherits SIGINT ignored: restore it for the Ctrl-C row
    p = subprocess.Popen(args, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        p.send_signal(2)
    out, err = p.communicate(timeout=300)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    return time.perf_counter() - t, p.returncode, lines


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts connections in the kernel, never reads: the request hangs
    port = silent.getsockname()[1]
    ro = folder / "ro.db"
    subprocess.run([sys.executable, "-c", f"import mlflow; mlflow.MlflowClient('sqlite:///{ro}')"
                    ".search_experiments()"], check=True, capture_output=True)
    readonly = subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode == 0
    cases = [("closed port", "http://127.0.0.1:9", None), ("other loopback address", "http://127.0.0.2:8080", None),
             ("IPv6 loopback", "http://[::1]:9", None),
             ("server that never answers", f"http://127.0.0.1:{port}", None),
             ("never answers, Ctrl-C at 6 s", f"http://127.0.0.1:{port}", 6.0)]
    if readonly:
        cases.append(("read-only SQLite store", f"sqlite:///{ro}", None))
    print(f"{'case':30} {'s to error':>10} {'rc':>4} {'lines':>5}  {'optuna.db left':>14}  line")
    for name, uri, ctrl_c in cases:
        secs, rc, lines = run(uri, folder, ctrl_c)
        left = (folder / "optuna.db").exists()
        print(f"{name:30} {secs:10.1f} {rc:4d} {len(lines):5d}  {str(left):>14}  {lines[-1] if lines else ''}")
        (folder / "optuna.db").unlink(missing_ok=True)
    if readonly:
        subprocess.run(["chattr", "-i", str(ro)])
    silent.close()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
