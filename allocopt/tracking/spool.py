"""Trials go on while an MLflow server is away: :class:`SpooledClient` wraps an
:class:`mlflow.MlflowClient`, bounds every request (:class:`allocopt.tracking.requests.short_mlflow_requests`:
one try, :data:`~allocopt.tracking.requests.PROBE_TIMEOUT_S` seconds), and while the server does
not answer it appends the writes (new runs, params, tags, metrics, artifacts, run ends) to a
local spool file, one JSON line each, and replays them in order once the server answers again
(tried at most every :data:`RETRY_EVERY_S` seconds, at the next write). A spool left by a process
that stopped while the server was away is replayed the next time a tracker of that study opens.

Runs created while away get a placeholder id (``spooled-<hex>``), mapped to the real run id when
the ``create_run`` is replayed; their start and end times are those of the moment they were
spooled. Reads (``get_run``, ``search_runs``) while away raise :class:`MlflowUnreachable`; the
tracker skips what needs them (the parent-run check, reconciling). Only ``http(s)://`` stores
are spooled: an error of a local store (SQLite, files) is raised as before.

The spool of a study is ``<folder>/<study>.mlflow-spool.<pid>.jsonl`` (artifacts copied beside
it), ``<folder>`` being the SQLite Optuna storage's folder, else ``$TMPDIR/allocopt-spool``.
Standard library only; MLflow entities are built when replayed.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from allocopt.tracking.requests import short_mlflow_requests

RETRY_EVERY_S = 10.0
"""Seconds between tries to reach a server that did not answer (at the next call);
``$ALLOCOPT_MLFLOW_RETRY_S`` overrides it."""

WRITES = ("create_run", "log_batch", "update_run", "set_terminated", "log_dict", "log_text",
          "log_artifact", "delete_run", "set_tag")
READS = ("get_run", "search_runs", "get_experiment_by_name", "get_experiment", "create_experiment",
         "set_experiment_tag", "restore_experiment")

_DOWN = re.compile(r"failed with (timeout )?exception|Max retries exceeded|Connection refused|"
                   r"Connection aborted|Connection reset|Read timed out|RemoteDisconnected|"
                   r"error code 5\d\d|TEMPORARILY_UNAVAILABLE", re.I)


class MlflowUnreachable(RuntimeError):
    """A read while the MLflow server does not answer (writes are spooled instead)."""


def unreachable(e: BaseException) -> bool:
    """Whether ``e`` says the server did not answer (refused, reset, timed out, 5xx), as opposed
    to a request it refused (a bad param, a missing run)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = type(e).__name__
        if name in ("ConnectionError", "Timeout", "ReadTimeout", "ConnectTimeout", "MaxRetryError") \
                or _DOWN.search(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def spool_folder(storage: str | None) -> Path:
    """The folder of a study's spool: that of a SQLite Optuna ``storage`` file, else
    ``$TMPDIR/allocopt-spool``."""
    import tempfile

    prefix = "sqlite:///"
    if storage and storage.startswith(prefix) and ":memory:" not in storage:
        folder = Path(os.path.abspath(storage[len(prefix):].split("?", 1)[0])).parent
        if os.access(folder, os.W_OK):
            return folder
    return Path(tempfile.gettempdir(), "allocopt-spool")


def spool_stem(study_name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study_name)[:60]
    return f"{safe}-{hashlib.sha1(study_name.encode()).hexdigest()[:8]}.mlflow-spool"


class SpooledClient:
    """An :class:`mlflow.MlflowClient` whose writes are spooled while its server is away
    (module docstring). Attributes: :attr:`path` (this process's spool file), :attr:`pending`
    (writes spooled and not yet replayed), :attr:`replayed_runs` (runs replayed so far),
    :attr:`down_since` (``time.time()`` of the first failed request, ``None`` while it answers).

    Args:
        client: the MLflow client.
        folder: where spool files go (:func:`spool_folder`).
        study_name: names the spool file.
        say: prints one line (default: stderr).
        spool: ``False`` for a local store: errors raised, nothing spooled.
    """

    def __init__(self, client: Any, folder: Path, study_name: str, say: Callable[[str], None] | None = None,
                 spool: bool = True):
        self._client = client
        self._folder = Path(folder)
        self._stem = spool_stem(study_name)
        self.path = self._folder / f"{self._stem}.{os.getpid()}.jsonl"
        self._spool_on = spool
        self._say = say or (lambda line: sys.stderr.write(line + "\n"))
        self._ids: dict[str, str] = {}
        self._fh: Any = None
        self.pending = 0
        self.replayed_runs = 0
        self.down_since: float | None = None
        self._last_try = 0.0

    # ------------------------------------------------------------------ calls
    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if name not in WRITES and name not in READS:
            return fn

        def call(*args: Any, **kw: Any) -> Any:
            if self.down_since is not None:
                self.try_replay()
            if self.down_since is None:
                try:
                    with short_mlflow_requests():
                        return fn(*self._real(args), **self._real(kw))
                except Exception as e:
                    if not (self._spool_on and unreachable(e)):
                        raise
                    self._went_down(e)
            if name not in WRITES:
                raise MlflowUnreachable(f"MLflow server not answering ({name})")
            return self._append(name, args, kw)
        return call

    def _real(self, x: Any) -> Any:
        if isinstance(x, str):
            return self._ids.get(x, x)
        if isinstance(x, tuple):
            return tuple(self._real(v) for v in x)
        if isinstance(x, list):
            return [self._real(v) for v in x]
        if isinstance(x, dict):
            return {k: self._real(v) for k, v in x.items()}
        return x

    # ------------------------------------------------------------------ spool
    def _went_down(self, e: BaseException) -> None:
        from allocopt.redact import redact_url

        self.down_since = self._last_try = time.time()
        self._say(f"MLflow unreachable ({redact_url(_short(e))}): logging to {self.path}; trials go on, "
                  "the runs are sent when it answers again")

    def _open_spool(self) -> Any:
        if self._fh is None:
            self._folder.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while this process lives
        return self._fh

    def _append(self, name: str, args: tuple, kw: dict) -> Any:
        fh = self._open_spool()
        entry = {"call": name, "time_ms": int(time.time() * 1000)}
        result: Any = None
        if name == "create_run":
            result = _FakeRun(f"spooled-{uuid.uuid4().hex}")
            entry.update(id=result.info.run_id, args=_encode(args), kw=_encode(kw))
        elif name == "log_artifact":
            src = Path(args[0] if len(args) > 1 else kw.get("local_path"))
            copy = self._folder / f"{self._stem}.{os.getpid()}.files" / uuid.uuid4().hex / src.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, copy)
            entry.update(args=[args[0] if args else kw.get("run_id"), str(copy)],
                         kw=_encode({k: v for k, v in kw.items() if k not in ("run_id", "local_path")}))
            if len(args) > 2:
                entry["kw"]["artifact_path"] = args[2]
        else:
            entry.update(args=_encode(args), kw=_encode(kw))
        fh.write(json.dumps(entry) + "\n")
        fh.flush()
        self.pending += 1
        return result

    def try_replay(self, force: bool = False) -> bool:
        """Send this process's spool if the server answers (tried at most every
        :data:`RETRY_EVERY_S` seconds unless ``force``); one line says so. Returns whether
        nothing is left spooled."""
        if self.down_since is None:
            return True
        every = float(os.environ.get("ALLOCOPT_MLFLOW_RETRY_S") or RETRY_EVERY_S)
        if not force and time.time() - self._last_try < every:
            return False
        self._last_try = time.time()
        if self._fh is not None:
            self._fh.flush()
        try:
            with short_mlflow_requests():
                self._client.search_experiments(max_results=1)  # answers at all (a spool may be empty)
            runs = self._replay_file(self.path, self._ids) if self.path.exists() else 0
        except Exception as e:  # noqa: BLE001 - still away (or a Ctrl-C-free failure): keep spooling
            if unreachable(e):
                return False
            raise
        if self._fh is not None:
            self._fh.truncate(0)
        self.pending, self.down_since = 0, None
        self.replayed_runs += runs
        self._say(f"MLflow answers again: replayed {runs} run(s) from {self.path}")
        return True

    def replay_left(self) -> int:
        """Replay the spools of this study that stopped processes left (their lock is free);
        returns the runs replayed. A spool that cannot be sent yet stays."""
        total = 0
        for name in sorted(glob.glob(str(self._folder / f"{self._stem}.*.jsonl"))):
            if Path(name) == self.path:
                continue
            with open(name, "a+", encoding="utf-8") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # a live worker's spool
                    continue
                ids: dict[str, str] = {}
                total += self._replay_file(Path(name), ids)
                os.unlink(name)
                shutil.rmtree(name[:-len(".jsonl")] + ".files", ignore_errors=True)
        if total:
            self._say(f"MLflow: replayed {total} run(s) spooled by an earlier run of this study "
                      f"while the server was away ({self._folder})")
        return total

    def _replay_file(self, path: Path, ids: dict[str, str]) -> int:
        """Replay every entry of ``path`` whose effect is not there yet (entries before the
        first one that fails were sent: a replay that fails half-way resumes after them)."""
        from mlflow.entities import Metric, Param, RunTag

        lines = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        done_file = path.with_suffix(".done")  # entries sent and run ids made, if a replay stopped half-way
        state = json.loads(done_file.read_text() or "{}") if done_file.exists() else {}
        done = int(state.get("done", 0))
        ids.update(state.get("ids", {}))
        runs = 0

        def real(x: Any) -> Any:
            return ids.get(x, x) if isinstance(x, str) else x

        with short_mlflow_requests():
            for i, e in enumerate(lines[done:], start=done):
                args = [real(a) for a in e["args"]]
                kw = {k: ({t: real(v) for t, v in val.items()} if k == "tags" and isinstance(val, dict) else val)
                      for k, val in e["kw"].items()}
                c, client = e["call"], self._client
                if c == "create_run":
                    kw.setdefault("start_time", e["time_ms"])
                    ids[e["id"]] = client.create_run(*args, **kw).info.run_id
                    runs += 1
                elif c == "log_batch":
                    client.log_batch(args[0], metrics=[Metric(*m) for m in kw.get("metrics") or []],
                                     params=[Param(*p) for p in kw.get("params") or []],
                                     tags=[RunTag(*t) for t in kw.get("tags") or []], synchronous=True)
                elif c == "set_terminated":
                    kw.setdefault("end_time", e["time_ms"])
                    client.set_terminated(*args, **kw)
                else:
                    getattr(client, c)(*args, **kw)
                done_file.write_text(json.dumps({"done": i + 1, "ids": ids}))
        done_file.unlink(missing_ok=True)
        return runs

    def close(self) -> None:
        if self._fh is not None:
            empty = self.pending == 0
            self._fh.close()
            self._fh = None
            if empty:
                self.path.unlink(missing_ok=True)
                shutil.rmtree(self._folder / f"{self._stem}.{os.getpid()}.files", ignore_errors=True)


class _FakeRun:
    class _Info:
        def __init__(self, run_id: str):
            self.run_id = run_id
            self.lifecycle_stage = "active"

    def __init__(self, run_id: str):
        self.info = self._Info(run_id)


def _encode(x: Any) -> Any:
    """JSON-able form of a call's arguments; MLflow entities as tuples."""
    from_entity = getattr(x, "key", None)
    if hasattr(x, "step") and hasattr(x, "timestamp"):  # Metric
        return [x.key, x.value, x.timestamp, x.step]
    if from_entity is not None and hasattr(x, "value"):  # Param, RunTag
        return [x.key, x.value]
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _encode(v) for k, v in x.items()}
    return x


def _short(e: BaseException) -> str:
    text = str(e)
    m = re.search(r"(Connection refused|Read timed out|Connection reset[^)]*|error code 5\d\d|"
                  r"Max retries exceeded)", text)
    return m.group(1) if m else (text.splitlines() or [type(e).__name__])[0][:120]
