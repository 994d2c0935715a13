"""A throwaway PostgreSQL server for the tests and CI (Debian's ``postgresql`` package).

The server listens on 127.0.0.1 only, on a free port, with its data folder and its Unix socket
in a temporary folder, and trusts local connections (no password is checked; a URL may still
carry one, which is how the redaction tests use it). As root, ``initdb`` and ``postgres`` run
as the ``postgres`` OS user (``runuser``), since PostgreSQL refuses to run as root.

Used two ways:

* ``tests/conftest.py``'s session fixture ``postgres_url``: the server named by
  ``$ALLOCOPT_TEST_POSTGRES_URL`` if set (CI's), else one started here for the session and
  stopped after it, else the PostgreSQL tests are skipped (binaries not found). With
  ``$ALLOCOPT_REQUIRE_POSTGRES=1`` (CI) a missing server fails those tests instead.
* ``.ci/run``: ``python tests/pgserver.py start DIR`` starts one and prints
  ``export ALLOCOPT_TEST_POSTGRES_URL=...``; ``python tests/pgserver.py stop DIR`` stops it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DB_NAME = "allocopt_test"


def find_bin_dir() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: ``$PATH``, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (highest version), else ``None``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl") and shutil.which("postgres"):
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                  key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parent.name.split(".")])
    for d in reversed(dirs):
        if all(Path(d, b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    return None


def _as_server_user(cmd: list[str]) -> list[str]:
    """``cmd`` run as the ``postgres`` OS user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder: Path, timeout_s: float = 60.0) -> str:
    """Start a server with its data in ``folder/data``; returns its URL
    ``postgresql://postgres@127.0.0.1:<port>/allocopt_test``.

    Raises:
        RuntimeError: no binaries, or the server did not start (its log's tail in the message).
    """
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL binaries (initdb, pg_ctl, postgres) not found")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data, sock, log = folder / "data", folder / "sock", folder / "server.log"
    sock.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        shutil.chown(sock, "postgres")
        folder.chmod(0o700)
    subprocess.run(_as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
                                    "--auth=trust", "-E", "UTF8", "--no-sync"]),
                   check=True, capture_output=True, timeout=timeout_s)
    port = _free_port()
    opts = (f"-h 127.0.0.1 -p {port} -k {sock} -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200")
    r = subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log),
                                        "-o", opts, "-w", "-t", str(int(timeout_s)), "start"]),
                       capture_output=True, text=True, timeout=timeout_s + 10)
    if r.returncode != 0:
        tail = log.read_text(errors="replace")[-800:] if log.exists() else r.stderr[-800:]
        raise RuntimeError(f"postgres did not start: {tail}")
    (folder / "port").write_text(str(port))
    _create_database(port, timeout_s)
    return f"postgresql://postgres@127.0.0.1:{port}/{DB_NAME}"


def _create_database(port: int, timeout_s: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                                 autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"CREATE DATABASE {DB_NAME}")
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop(folder: Path) -> None:
    """Stop the server started in ``folder`` (fast shutdown); no error if it is not running."""
    bin_dir = find_bin_dir()
    data = Path(folder).resolve() / "data"
    if bin_dir is None or not data.exists():
        return
    subprocess.run(_as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                   capture_output=True, timeout=60)


def fresh_database(url: str, name: str) -> str:
    """A new empty database ``name`` on the server of ``url`` (dropped first if it exists);
    returns its URL. One per test keeps tests independent on one server."""
    import psycopg

    base, _, _ = url.rpartition("/")
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: python tests/pgserver.py start|stop DIR")
    if sys.argv[1] == "start":
        print(f"export ALLOCOPT_TEST_POSTGRES_URL={start(Path(sys.argv[2]))}")
    else:
        stop(Path(sys.argv[2]))
