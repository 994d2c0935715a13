"""``allocopt workers`` hands a storage or tracking URL with a password to its workers through
their environment, never on their command line (which ``ps`` shows every user of the host);
and its ``--help`` works where click is not installed (typer 0.29 brings its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.store.launch import secrets_to_environment

ROOT = Path(__file__).resolve().parents[1]
SECRET = "Wk7SENTINELpw"
PG = f"postgresql+psycopg://al:{SECRET}@127.0.0.1:9/db?connect_timeout=2"
HTTP = f"http://al:{SECRET}@127.0.0.1:9"


@pytest.mark.parametrize("args, kept, env", [
    (["--storage", PG, "--budget", "1e19"], ["--budget", "1e19"], {"ALLOCOPT_STORAGE": PG}),
    ([f"--storage={PG}", f"--mlflow-uri={HTTP}"], [], {"ALLOCOPT_STORAGE": PG, "MLFLOW_TRACKING_URI": HTTP}),
    (["--mlflow-uri", HTTP, "--storage", "sqlite:///a.db"], ["--storage", "sqlite:///a.db"],
     {"MLFLOW_TRACKING_URI": HTTP}),
    (["--storage", "postgresql://al@h/db?password=x1"], [], {"ALLOCOPT_STORAGE": "postgresql://al@h/db?password=x1"}),
    (["--set", f"note={PG}", "--storage"], ["--set", f"note={PG}", "--storage"], {}),  # not the option's value
])
def test_secrets_to_environment(args, kept, env):
    assert secrets_to_environment(args) == (kept, env)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_a_started_workers_command_line_holds_no_password(tmp_path):
    """A real launcher and worker: while the worker runs, its ``/proc/<pid>/cmdline`` has no
    password and its environment has the URL; the worker then refuses the unreachable server
    with the URL redacted, which it can only have read from its environment."""
    p = subprocess.Popen([sys.executable, "-m", "allocopt.cli", "workers", "--gpus", "0", "--", "--objective",
                          "synthetic", "--budget", "1e18", "--target", "pass@1", "--pilots", "0", "--trials", "1",
                          "--storage", PG, "--mlflow-uri", HTTP], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    launcher = Path(f"/proc/{p.pid}/cmdline").read_bytes()  # Popen returns once it is exec'd
    seen = []
    deadline = time.monotonic() + 60
    while not seen and p.poll() is None and time.monotonic() < deadline:
        for pid in _children(p.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline == launcher:
                continue  # forked and not yet exec'd: still the launcher's command line (seen under load)
            seen.append((cmdline, environ))
        time.sleep(0.02)
    out = p.communicate(timeout=60)[0]
    assert seen, f"no worker seen running: {out}"
    cmdline, environ = seen[0]
    assert b"allocopt.cli\0study\0" in cmdline and b"--budget\x001e18" in cmdline
    assert SECRET.encode() not in cmdline
    assert f"ALLOCOPT_STORAGE={PG}".encode() in environ and f"MLFLOW_TRACKING_URI={HTTP}".encode() in environ
    assert p.returncode == 2 and SECRET not in out
    assert "[gpu 0] error: storage='postgresql+psycopg://al:***@127.0.0.1:9/db?connect_timeout=2'" in out, out


def test_help_works_without_click(tmp_path):
    """``allocopt --help`` and ``allocopt workers --help`` where ``import click`` fails (a plain
    ``pip install allocopt``: typer 0.29 vendors click and no longer installs it)."""
    code = ("import sys; sys.modules['click'] = None\n"  # 'import click' raises ImportError
            "from allocopt.cli import main\n"
            "main(sys.argv[1:])\n")
    for args in (["--help"], ["workers", "--help"]):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"})
        assert r.returncode == 0 and "Usage: allocopt" in r.stdout, r.stderr[-2000:]
