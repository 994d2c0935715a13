"""Scalars per step from TensorBoard event files, and the bits of logs the OpenRLHF and NeMo-RL
importers share (Python-literal dumps, ``--flag value`` command lines, phase timings).

TensorBoard's own protobuf messages (``Event``, the hparams plugin's data) parse the event
files' records (the ``tensorboard`` package, an optional extra: ``pip install
'allocopt[tensorboard]'``; imported inside the function).
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
import struct
from pathlib import Path
from typing import Any, Iterator

from allocopt.errors import RunLogError
from allocopt.limits import MAX_NUMBER_CHARS, RepeatCounter, check_size, open_regular

_ASCII_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)

MAX_EVENT_BYTES = 128 * 2**20
"""Event files larger than this in total are refused (a run's scalars are a few MB; about a
million records, read in ~7 s)."""
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


def _records(f: Path, source: str) -> Iterator[bytes]:
    """The records of the TFRecord file ``f`` (TensorBoard's event files: per record a
    little-endian u64 length, its masked CRC, the data, the data's masked CRC), read through
    the reading layer, one at a time. A record cut short at the end of the file ends it (as
    TensorBoard reads a file still being written); a length past the end of a finished record
    stream is refused. CRCs are not checked (a flipped byte then reads as a wrong value or a
    record that does not parse)."""
    fh = open_regular(f, MAX_EVENT_BYTES, source or "events", RunLogError)
    with fh:
        while True:
            head = fh.read(12)
            if len(head) < 12:
                return
            (n,) = struct.unpack("<Q", head[:8])
            if n > MAX_EVENT_BYTES:
                raise RunLogError(f"{f}: not a readable TensorBoard event file (a record of {n} bytes)")
            data = fh.read(n + 4)
            if len(data) < n + 4:
                return
            yield data[:n]


def _scalar_value(v: Any) -> float | None:
    """The number a summary value holds: TF1 ``simple_value`` (``torch.utils.tensorboard``),
    or a one-element float tensor of the ``scalars`` plugin (TF2 summaries); else ``None``."""
    kind = v.WhichOneof("value")
    if kind == "simple_value":
        return float(v.simple_value)
    if kind != "tensor" or v.metadata.plugin_data.plugin_name != "scalars":
        return None
    t = v.tensor
    if t.float_val or t.double_val:
        return float((t.float_val or t.double_val)[0])
    fmt = {1: "<f", 2: "<d"}.get(t.dtype)  # DT_FLOAT, DT_DOUBLE
    if fmt and len(t.tensor_content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, t.tensor_content)[0])
    return None


def read_events(files: list[Path], source: str) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """``({step: {tag: value}}, hparams)`` of ``files``: every finite scalar (later files win on a
    repeated step and tag, as a resumed run overwrites) and the hyperparameters written by
    ``SummaryWriter.add_hparams`` (TensorBoard's hparams plugin, ``session_start_info``), flat.
    Read record by record with TensorBoard's own protobuf messages (its ``EventAccumulator``
    takes ~100 µs a record: 10 s for 100,000).

    Raises:
        RunLogError: tensorboard is not installed; the files are too large, not regular files
            or unreadable; one step of one tag logged more than
            :data:`~allocopt.limits.MAX_REPEATS` times.
    """
    total = sum(check_size(f, MAX_EVENT_BYTES, source or "events", RunLogError) for f in files)
    if total > MAX_EVENT_BYTES:
        raise RunLogError(f"{source}: event files of {total / 2**20:.0f} MiB; at most "
                          f"{MAX_EVENT_BYTES // 2**20} MiB are read (point at one run's folder)")
    try:
        from google.protobuf.message import DecodeError
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        raise RunLogError(f"{source}: reading TensorBoard event files needs the tensorboard "
                          "package: pip install 'allocopt[tensorboard]'") from None
    steps: dict[int, dict[str, float]] = {}
    hparams: dict[str, Any] = {}
    repeats = RepeatCounter()
    for f in files:
        for raw in _records(f, source):
            try:
                event = event_pb2.Event.FromString(raw)
            except (DecodeError, RuntimeError, ValueError) as e:
                raise RunLogError(f"{f}: not a readable TensorBoard event file "
                                  f"({type(e).__name__})") from None
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "hparams":
                    hparams.update(_hparams(v.metadata.plugin_data.content, f))
                    continue
                x = _scalar_value(v)
                if x is None:
                    continue
                repeats.add((v.tag, event.step), str(f), f"{v.tag[:80]} at step {event.step}", RunLogError)
                if math.isfinite(x):
                    steps.setdefault(int(event.step), {})[v.tag] = x
    return steps, hparams


def read_event_scalars(files: list[Path], source: str) -> dict[int, dict[str, float]]:
    """``{step: {tag: value}}`` of every scalar in ``files`` (:func:`read_events`)."""
    return read_events(files, source)[0]


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


def _hparams(content: bytes, f: Path) -> dict[str, Any]:
    """The hyperparameters of one hparams-plugin summary (``session_start_info``), flat."""
    from google.protobuf.message import DecodeError
    from tensorboard.plugins.hparams import plugin_data_pb2

    try:
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise RunLogError(f"{f}: not a readable TensorBoard event file ({type(e).__name__})") from None
    out: dict[str, Any] = {}
    if not data.HasField("session_start_info"):
        return out
    for name, v in data.session_start_info.hparams.items():
        kind = v.WhichOneof("kind")
        if kind == "number_value":
            x = v.number_value
            out[name] = int(x) if math.isfinite(x) and float(x).is_integer() else x
        elif kind == "string_value":
            out[name] = scalar(v.string_value)
        elif kind == "bool_value":
            out[name] = v.bool_value
    return out
