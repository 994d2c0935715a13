"""Scalars per step from TensorBoard event files, and the bits of logs the OpenRLHF and NeMo-RL
importers share (Python-literal dumps, ``--flag value`` command lines, phase timings).

TensorBoard's own ``EventAccumulator`` reads the files (the ``tensorboard`` package, an
optional extra: ``pip install 'allocopt[tensorboard]'``); imported inside the function.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any

from allocopt.errors import RunLogError
from allocopt.limits import MAX_NUMBER_CHARS, RepeatCounter, check_size

_ASCII_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)

MAX_EVENT_BYTES = 512 * 2**20
"""Event files larger than this in total are refused (a run's scalars are a few MB)."""
MAX_EVENT_FILES = 1000
"""Event files one run's folder may hold."""
MAX_FOLDER_ENTRIES = 100_000
"""Entries looked at while searching a folder for event files."""
MAX_FLAG_LINES = 1000
"""``--key value`` command lines read from one log (a launch script is a few)."""
MAX_FLAG_LINE_CHARS = 64 * 1024
"""Longest ``--key value`` command line read (longer lines are not a launch command)."""
EVENT_PREFIX = "events.out.tfevents."


def event_files(path: Path, source: str = "") -> list[Path]:
    """``path`` if it is an event file, else the event files under it (sorted; symlinked
    folders are not followed).

    Raises:
        RunLogError: an event file that is not a regular file (a FIFO, a device), more than
            :data:`MAX_EVENT_FILES` of them, or more than :data:`MAX_FOLDER_ENTRIES` entries
            under ``path``.
    """
    if not path.is_dir():
        if not path.name.startswith(EVENT_PREFIX):
            return []
        check_size(path, MAX_EVENT_BYTES, source or "events", RunLogError)
        return [path]
    found: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(path):
        seen += len(dirs) + len(names)
        if seen > MAX_FOLDER_ENTRIES:
            raise RunLogError(f"{source}: more than {MAX_FOLDER_ENTRIES} entries under the folder; "
                              "point at one run's TensorBoard folder")
        for name in names:
            if name.startswith(EVENT_PREFIX):
                f = Path(root) / name
                check_size(f, MAX_EVENT_BYTES, source or "events", RunLogError)
                found.append(f)
        if len(found) > MAX_EVENT_FILES:
            raise RunLogError(f"{source}: more than {MAX_EVENT_FILES} event files; point at one "
                              "run's TensorBoard folder")
    return sorted(found)


def read_event_scalars(files: list[Path], source: str) -> dict[int, dict[str, float]]:
    """``{step: {tag: value}}`` of every scalar in ``files`` (later files win on a repeated
    step and tag, as a resumed run overwrites).

    Raises:
        RunLogError: tensorboard is not installed, the files are too large or unreadable.
    """
    total = sum(f.stat().st_size for f in files)
    if total > MAX_EVENT_BYTES:
        raise RunLogError(f"{source}: event files of {total / 2**20:.0f} MiB; at most "
                          f"{MAX_EVENT_BYTES // 2**20} MiB are read (point at one run's folder)")
    try:
        from tensorboard.backend.event_processing.event_accumulator import (
            SCALARS, EventAccumulator)
    except ImportError:
        raise RunLogError(f"{source}: reading TensorBoard event files needs the tensorboard "
                          "package: pip install 'allocopt[tensorboard]'") from None
    steps: dict[int, dict[str, float]] = {}
    repeats = RepeatCounter()
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={SCALARS: 0})  # 0: keep every point
        try:
            acc.Reload()
            tags = acc.Tags().get("scalars", [])
        except Exception as e:  # noqa: BLE001 - any corrupt record is one error
            raise RunLogError(f"{f}: not a readable TensorBoard event file "
                              f"({type(e).__name__})") from None
        for tag in tags:
            for ev in acc.Scalars(tag):
                repeats.add((tag, int(ev.step)), str(f), f"{tag[:80]} at step {int(ev.step)}", RunLogError)
                if math.isfinite(ev.value):
                    steps.setdefault(int(ev.step), {})[tag] = float(ev.value)
    return steps


def flag_line(line: str) -> bool:
    """Whether ``line`` is a ``--key value`` command line (at most
    :data:`MAX_FLAG_LINE_CHARS` characters)."""
    return len(line) <= MAX_FLAG_LINE_CHARS and bool(_FLAG_LINE.match(line))


def _literal(node: ast.AST, call_names: tuple[str, ...]) -> Any:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in call_names and not node.args:
        return {k.arg: _literal(k.value, call_names) for k in node.keywords if k.arg}
    return ast.literal_eval(node)


def parse_call_dump(text: str, call: str) -> dict[str, Any] | None:
    """``namespace(a=1, b=namespace(c='x'))`` (``repr`` of a ``SimpleNamespace`` or an
    ``argparse.Namespace``) as a flat ``{"a": 1, "b.c": "x"}``; ``None`` when ``text`` holds
    no such dump. Only literals are evaluated; nothing is run."""
    start = text.find(f"{call}(")
    if start < 0:
        return None
    try:
        tree = ast.parse(text[start:].strip(), mode="eval")
        value = _literal(tree.body, (call, "Namespace"))
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None
    return flatten(value) if isinstance(value, dict) else None


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


_FLAG_LINE = re.compile(r"^\s*(?:[\w./-]+\s+)*--[A-Za-z_][\w.]*")


def parse_flags(text: str) -> dict[str, Any]:
    """``--key.path value`` and bare ``--switch`` flags of the command lines in ``text``
    (a launch script pasted in the log), values as Python scalars; the first wins."""
    out: dict[str, Any] = {}
    for line in text.replace("\\\n", " ").splitlines()[:MAX_FLAG_LINES]:
        if not flag_line(line):
            continue
        try:
            toks = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, t in enumerate(toks):
            if not t.startswith("--") or len(t) < 3:
                continue
            key, eq, val = t[2:].partition("=")
            if not eq:
                nxt = toks[i + 1] if i + 1 < len(toks) else None
                val = nxt if nxt is not None and not nxt.startswith("--") else "true"
            out.setdefault(key, scalar(val))
    return out


def scalar(text: str) -> Any:
    """A value of a ``key=value`` or ``--key value`` line as Python reads it: ``true`` /
    ``false``, ``null`` / ``none``, a number written in ASCII digits (:func:`~allocopt.limits.
    read_number`; a number written otherwise stays text, refused where it is used), else the
    text."""
    t = text.strip().strip("'\"")
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if len(t) <= MAX_NUMBER_CHARS and _ASCII_NUMBER.fullmatch(t):
        return int(t) if t.lstrip("+-").isdigit() else float(t)
    return t


def read_event_hparams(files: list[Path], source: str) -> dict[str, Any]:
    """The hyperparameters written by ``SummaryWriter.add_hparams`` (TensorBoard's hparams
    plugin, ``session_start_info``) in ``files`` (and event files in sub-folders of theirs:
    ``add_hparams`` writes to a timestamped sub-folder), as a flat ``{name: value}``.
    Empty when none. Raises :class:`RunLogError` as :func:`read_event_scalars`."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.plugins.hparams import plugin_data_pb2
    except ImportError:
        raise RunLogError(f"{source}: reading TensorBoard event files needs the tensorboard "
                          "package: pip install 'allocopt[tensorboard]'") from None
    out: dict[str, Any] = {}
    for f in files:
        acc = EventAccumulator(str(f))
        try:
            acc.Reload()
            content = acc.PluginTagToContent("hparams")
        except KeyError:
            continue
        except Exception as e:  # noqa: BLE001
            raise RunLogError(f"{f}: not a readable TensorBoard event file "
                              f"({type(e).__name__})") from None
        for raw in content.values():
            data = plugin_data_pb2.HParamsPluginData.FromString(raw)
            if not data.HasField("session_start_info"):
                continue
            for name, v in data.session_start_info.hparams.items():
                kind = v.WhichOneof("kind")
                if kind == "number_value":
                    x = v.number_value
                    out[name] = int(x) if float(x).is_integer() else x
                elif kind == "string_value":
                    out[name] = scalar(v.string_value)
                elif kind == "bool_value":
                    out[name] = v.bool_value
    return out
