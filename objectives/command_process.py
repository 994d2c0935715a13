"""A trial's command as a process that never outlives the worker that started it.

:func:`run_guarded` runs the user's shell line through a guard: this file, run as a script by
the same Python (``python -I -S command_process.py WORKER_PID GRACE_S LINE``, standard library
only). The guard leads a session of its own, so the line and everything it starts share one
process group, whose id is the guard's pid. It asks Linux to send it SIGTERM when the worker
dies (``prctl(PR_SET_PDEATHSIG)``: a SIGKILLed worker runs no code of its own; strictly, when
the worker's thread that started it ends, so start it from a thread that outlives the command,
as the study loop's main thread does), and on SIGTERM,
SIGINT or SIGHUP it ends the group: SIGTERM, at most ``GRACE_S`` seconds for it to go, SIGKILL.

A guard can be killed too (both SIGKILLed at once, an out-of-memory kill). So each running
command has a record, ``command.pid`` in its trial's folder (:data:`RECORD`): host, process
group, the worker, and a token every process of the group carries in its environment
(``ALLOCOPT_COMMAND_TOKEN``). Before a worker starts a command it ends the commands of the same
study whose workers are gone (:func:`end_orphans`): each process whose environment carries such
a record's token, found through ``/proc``. So a killed study, resumed, never runs a trial again
beside the training the killed worker left. A worker that is alive is told apart from a new
process that got its pid by the start time ``/proc`` gives (Linux). On other systems the
command still runs in its own process group and is ended on a timeout or Ctrl-C; the guard and
the record do nothing there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Callable

RECORD = "command.pid"
"""File, in a trial's folder, naming the process group of its running command."""
TOKEN_VAR = "ALLOCOPT_COMMAND_TOKEN"
"""Environment variable every process of a trial's command carries: its record's token."""
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22);
    ``None`` when there is no such process (or no ``/proc``). A zombie counts as gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _alive(pid: int, ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` still runs (not a zombie)."""
    now = start_ticks(pid)
    if now is not None:
        return ticks is None or now == ticks
    if Path("/proc/self/stat").exists():
        return False
    try:  # no /proc: the pid alone says it
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- the guard (a script of its own)
def _die_with_parent() -> None:
    """SIGTERM to this process when the thread that started it ends (Linux); else nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _group_members(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` other than this one, zombies left out (Linux);
    ``[]`` without ``/proc``."""
    members = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _end_own_group(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to this guard's process group, then SIGKILL to it if anything of it is left
    after ``grace_s`` seconds (this guard included: it has nothing left to do)."""
    pgid = os.getpgid(0)
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()
        if child.returncode is not None and not _group_members(pgid):
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)


def guard(worker_pid: int, grace_s: float, line: str) -> int:
    """Run ``line`` with ``/bin/sh`` in this process group; end the group when a stop signal
    comes or the worker ``worker_pid`` is gone. Returns the line's exit code (``128 + s`` when
    a signal ``s`` ended the shell)."""
    stop: list[int] = []
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    _die_with_parent()
    if os.getppid() != worker_pid:  # the worker died before the line above
        stop.append(signal.SIGTERM)
    child = subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.DEVNULL)
    while child.poll() is None:
        if stop:
            _end_own_group(child, grace_s)
            child.wait()
            break
        time.sleep(0.1)
    rc = child.returncode
    return 128 - rc if rc < 0 else rc


# ---------------------------------------------------------------- the worker's side
def run_guarded(line: str, folder: Path, log: IO[bytes], *, timeout_s: float, grace_s: float,
                on_timeout: Callable[[], BaseException]) -> int:
    """Run ``line`` under the guard (module docstring), output to ``log``; return its exit
    code. The record ``folder/command.pid`` exists while it runs. Past ``timeout_s``, or on
    any exception here (Ctrl-C, SIGTERM turned into KeyboardInterrupt), the group is ended
    (:func:`stop_group`); a timeout raises ``on_timeout()``."""
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_VAR: token}
    proc = subprocess.Popen([sys.executable, "-I", "-S", __file__, str(os.getpid()), repr(grace_s), line],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    record = folder / RECORD
    try:
        _write_record(record, proc.pid, token)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s)
            raise on_timeout() from None
        except BaseException:
            stop_group(proc, grace_s)
            raise
    finally:
        if proc.poll() is not None:
            record.unlink(missing_ok=True)


def _write_record(record: Path, pgid: int, token: str) -> None:
    data = {"host": socket.gethostname(), "pgid": pgid, "token": token, "worker_pid": os.getpid(),
            "worker_start": start_ticks(os.getpid())}
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, record)


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL if its guard is still there after
    ``grace_s`` seconds (the guard ends the group itself in that time)."""
    for sig, wait in ((signal.SIGTERM, grace_s + 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _carriers(tokens: set[str]) -> dict[int, str]:
    """Processes of this host whose environment carries one of ``tokens``: pid -> token."""
    found: dict[int, str] = {}
    needles = {f"{TOKEN_VAR}={t}".encode(): t for t in tokens}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var in needles:
                found[int(entry.name)] = needles[var]
                break
    return found


def end_orphans(study_folder: Path, grace_s: float) -> list[str]:
    """End the commands of the trials under ``study_folder`` (``trial-*/command.pid``) whose
    worker ran on this host and is gone: SIGTERM to every process carrying their token,
    SIGKILL to those left after ``grace_s`` seconds; then their records are removed. Records of
    other hosts and of live workers are left alone.

    Returns:
        one line per trial folder whose command was ended (for the study's output).
    """
    orphans: dict[str, Path] = {}
    for record in sorted(study_folder.glob(f"trial-*/{RECORD}")):
        try:
            data = json.loads(record.read_text())
            if data["host"] != socket.gethostname() or _alive(int(data["worker_pid"]), data.get("worker_start")):
                continue
            orphans[str(data["token"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a record cut short or not ours: nothing to go by
    if not orphans:
        return []
    found = _carriers(set(orphans))
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(start_ticks(p) is not None for p in found):
        time.sleep(0.05)
    for pid in found:
        if start_ticks(pid) is not None:
            _signal(pid, signal.SIGKILL)
    lines = []
    for token, record in orphans.items():
        n = sum(1 for t in found.values() if t == token)
        if n:
            lines.append(f"ended the command a stopped worker left running ({n} process(es), trial folder "
                         f"{record.parent})")
        record.unlink(missing_ok=True)
    return lines


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(guard(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
