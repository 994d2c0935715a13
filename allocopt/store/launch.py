"""One study worker per GPU on a host: ``allocopt workers --gpus 0,1,2,3 -- <study args>``.

Starts one ``allocopt study <study args>`` process per GPU group, each with
``CUDA_VISIBLE_DEVICES`` set to its group (and ``ALLOCOPT_WORKER`` to its index), all on the
same study (same ``--study-name`` and ``--storage``: Optuna's RDB storage shares the trials;
PostgreSQL for several hosts, SQLite is fine on one). Each worker's output lines are printed
with a prefix (``[gpu 0] ``); Ctrl-C (SIGINT) and SIGTERM are forwarded to every worker, which
marks its running trial interrupted (run again on resume); the launcher exits with the worst
exit code of its workers. An ``error:`` line that several workers print alike (a bad study
argument) is printed once.

A storage or tracking URL with a password never goes on a worker's command line, which any
user of the host can read (``ps``, ``/proc/<pid>/cmdline``): :func:`secrets_to_environment`
moves it into the worker's environment (``ALLOCOPT_STORAGE``, ``MLFLOW_TRACKING_URI``, which
``allocopt study`` reads when ``--storage`` / ``--mlflow-uri`` are not given; a process's
environment is readable by its own user only). Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Callable, Sequence, TextIO

from allocopt.flops import ConfigError

__all__ = ["SECRET_OPTIONS", "parse_gpus", "run_workers", "secrets_to_environment", "worst_exit_code"]

SECRET_OPTIONS = {"--storage": "ALLOCOPT_STORAGE", "--mlflow-uri": "MLFLOW_TRACKING_URI"}
"""Study options whose URL may hold a password, and the variable ``allocopt study`` reads it
from when the option is not given."""


def parse_gpus(text: str) -> list[str]:
    """GPU groups from ``--gpus``: ``0,1,2,3`` (four workers), ``0-3`` (the same),
    ``0+1,2+3`` (two workers of two GPUs each). Returns one ``CUDA_VISIBLE_DEVICES`` value per
    worker (``"0"``, ``"0,1"``).

    Raises:
        ConfigError: an empty list, an entry that is not a GPU index (or ``a-b`` range with
            ``a <= b``), or a GPU named twice; one line naming the value.
    """
    groups: list[str] = []
    seen: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            raise ConfigError(f"gpus={text!r}: give GPU indices, e.g. 0,1,2,3 or 0-3 (0+1,2+3: two GPUs a worker)")
        if "-" in part and "+" not in part:
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
                raise ConfigError(f"gpus={text!r}: {part!r} is not a range a-b of GPU indices with a <= b")
            singles = [[i] for i in range(int(lo), int(hi) + 1)]
        else:
            ids = part.split("+")
            if not all(i.strip().isdigit() for i in ids):
                raise ConfigError(f"gpus={text!r}: {part!r} is not a GPU index (0, 1, ...) or a group 0+1")
            singles = [[int(i) for i in ids]]
        for group in singles:
            twice = seen.intersection(group)
            if twice:
                raise ConfigError(f"gpus={text!r}: GPU {min(twice)} is named twice")
            seen.update(group)
            groups.append(",".join(str(i) for i in group))
    return groups


def secrets_to_environment(study_args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``study_args`` with each :data:`SECRET_OPTIONS` option whose URL holds a password taken
    out (``--storage URL`` and ``--storage=URL`` alike), and the environment variables that
    carry those URLs instead. Options without a password stay on the command line.

    >>> secrets_to_environment(["--budget", "1e19", "--storage", "postgresql://u:pw@h/db"])
    (['--budget', '1e19'], {'ALLOCOPT_STORAGE': 'postgresql://u:pw@h/db'})
    """
    from allocopt.redact import redact_url

    args, env = list(study_args), {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in SECRET_OPTIONS and (eq or i + 1 < len(args)):
            value, width = (value, 1) if eq else (args[i + 1], 2)
            if redact_url(value) != value:
                env[SECRET_OPTIONS[name]] = value
                del args[i:i + width]
                continue
        i += 1
    return args, env


def worst_exit_code(codes: Sequence[int]) -> int:
    """The worst of the workers' exit codes: 0 if all are 0, else the largest, a worker
    killed by signal ``s`` (``-s`` from :mod:`subprocess`) counted as ``128 + s`` as a shell
    reports it."""
    norm = [128 - c if c < 0 else c for c in codes]
    return max(norm, default=0)


def _pump(stream: TextIO, prefix: str, out: TextIO, lock: threading.Lock, errors: set[str]) -> None:
    """Copy a worker's lines to ``out`` with its prefix; an ``error:`` line another worker
    printed already (every worker refuses the same bad argument) is left out."""
    for line in iter(stream.readline, ""):
        with lock:
            if line.startswith("error: "):
                if line in errors:
                    continue
                errors.add(line)
            out.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
            out.flush()
    stream.close()


def run_workers(gpus: Sequence[str], study_args: Sequence[str], *, out: TextIO | None = None,
                command: Sequence[str] | None = None,
                on_start: Callable[[int, str, int], None] | None = None) -> int:
    """Run one ``allocopt study`` worker per entry of ``gpus`` until all have exited.

    Args:
        gpus: one ``CUDA_VISIBLE_DEVICES`` value per worker (:func:`parse_gpus`).
        study_args: the ``allocopt study`` arguments every worker gets (the same study).
        out: where the prefixed lines go (default ``sys.stdout``).
        command: the worker's command before ``study_args`` (default
            ``[sys.executable, "-m", "allocopt.cli", "study"]``).
        on_start: called with ``(index, gpus, pid)`` for each worker started.

    Returns:
        the worst exit code (:func:`worst_exit_code`).

    Raises:
        ConfigError: no GPUs, or ``study_args`` with ``--dry-run`` (nothing to share).
    """
    if not gpus:
        raise ConfigError("gpus='': give one GPU (or group) per worker, e.g. --gpus 0,1,2,3")
    if "--dry-run" in study_args:
        raise ConfigError("study args: --dry-run runs no trials; run `allocopt study --dry-run` once instead")
    out = out or sys.stdout
    base = list(command or [sys.executable, "-m", "allocopt.cli", "study"])
    study_args, secrets = secrets_to_environment(study_args)
    width = max(len(g) for g in gpus)
    lock = threading.Lock()
    errors: set[str] = set()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signum)
                except ProcessLookupError:
                    pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        for i, g in enumerate(gpus):
            env = {**os.environ, **secrets, "CUDA_VISIBLE_DEVICES": g, "ALLOCOPT_WORKER": str(i),
                   "PYTHONUNBUFFERED": "1"}
            # own process group: a terminal's Ctrl-C reaches the launcher once, which forwards it
            p = subprocess.Popen([*base, *study_args], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                 bufsize=1, start_new_session=True)
            procs.append(p)
            if on_start:
                on_start(i, g, p.pid)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[gpu {g:>{width}}] ", out, lock, errors),
                                 daemon=True)
            t.start()
            pumps.append(t)
        codes = [p.wait() for p in procs]
        for t in pumps:
            t.join(timeout=5)
        return worst_exit_code(codes)
    finally:
        if any(p.poll() is None for p in procs):  # the launcher itself failed: leave no worker behind
            forward(signal.SIGTERM, None)
        for s, h in old.items():
            signal.signal(s, h)
