"""Size, depth and count limits for every file allocopt reads from other people's jobs, and
the bounded readers that enforce them. Standard library only.

A file over a limit is refused with one line naming the file and the limit (a
:class:`~allocopt.errors.ConfigError`, or the error class the caller passes), before it is
read whole: sizes are checked with ``stat`` first, then while reading, so a file that grows or
lies about its size (a compressed member) is still cut at the limit.

=============================  ==========  ===================================================
limit                          value       file
=============================  ==========  ===================================================
:data:`MAX_METRICS_BYTES`      1 MiB       ``tell --metrics`` JSON
:data:`MAX_TOML_BYTES`         1 MiB       a study spec or recipe (TOML)
:data:`MAX_CONFIG_BYTES`       4 MiB       a model's ``config.json``, ``adapter_config.json``
:data:`MAX_STATE_BYTES`        64 MiB      TRL ``trainer_state.json``
:data:`MAX_ARGS_BYTES`         16 MiB      TRL ``training_args.bin`` (file and its pickle member)
:data:`MAX_LOG_BYTES`          512 MiB     a verl console log / JSON-lines metrics
:data:`MAX_LENGTHS_BYTES`      512 MiB     an ``account --lengths`` file
:data:`MAX_LINE_BYTES`         1 MiB       one line of a log or lengths file
:data:`MAX_DEPTH`              64          nesting of JSON / TOML / pickled values
:data:`MAX_VALUES`             100,000     values one pickle may build
=============================  ==========  ===================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from allocopt.errors import ConfigError

MiB = 1024 * 1024
MAX_METRICS_BYTES = 1 * MiB
"""``tell --metrics`` JSON (a handful of numbers)."""
MAX_TOML_BYTES = 1 * MiB
"""A study spec or recipe TOML file."""
MAX_CONFIG_BYTES = 4 * MiB
"""A model ``config.json`` or peft ``adapter_config.json``."""
MAX_STATE_BYTES = 64 * MiB
"""TRL ``trainer_state.json`` (about 300,000 logging records)."""
MAX_ARGS_BYTES = 16 * MiB
"""TRL ``training_args.bin``, and the pickle inside it, declared and actual size."""
MAX_LOG_BYTES = 512 * MiB
"""A verl console log or JSON-lines metrics file (read line by line)."""
MAX_LENGTHS_BYTES = 512 * MiB
"""An ``account --lengths`` CSV / JSON-lines file (read line by line)."""
MAX_LINE_BYTES = 1 * MiB
"""One line of a log or lengths file."""
MAX_DEPTH = 64
"""Nesting of containers in a JSON, TOML or pickled document."""
MAX_VALUES = 100_000
"""Values (containers, objects, strings, numbers) one pickle may build."""


def _size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def check_size(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> int:
    """The size of ``path`` in bytes, if at most ``limit``.

    Raises:
        error: missing file, not a regular file, unreadable, or over ``limit`` (one line
            ``{what}='path': ...``).
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise error(f"{what}={str(path)!r}: file not found") from None
    except OSError as e:
        raise error(f"{what}={str(path)!r}: cannot be read ({e.strerror or e})") from None
    if p.is_dir():
        raise error(f"{what}={str(path)!r}: is a folder, not a file")
    if st.st_size > limit:
        raise error(f"{what}={str(path)!r}: {st.st_size} bytes, over the limit of {_size_text(limit)} "
                    "for this file")
    return st.st_size


def read_capped(fh: BinaryIO, limit: int, name: str, what: str,
                error: type[Exception] = ConfigError) -> bytes:
    """At most ``limit`` bytes from ``fh``; ``error`` when there are more (``name`` is shown)."""
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what}={name!r}: over the limit of {_size_text(limit)} for this file")
    return data


def read_bytes(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> bytes:
    """The bytes of ``path``, at most ``limit`` (checked before and while reading).

    Raises:
        error: missing, unreadable or over ``limit``; one line naming the file and the limit.
    """
    check_size(path, limit, what, error)
    try:
        with open(path, "rb") as fh:
            return read_capped(fh, limit, str(path), what, error)
    except OSError as e:
        raise error(f"{what}={str(path)!r}: cannot be read ({e.strerror or e})") from None


def read_text(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes.

    Raises:
        error: missing, unreadable, over ``limit`` or not UTF-8; one line naming the file.
    """
    raw = read_bytes(path, limit, what, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what}={str(path)!r}: not UTF-8 text (byte {e.start})") from None


def iter_lines(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError,
               errors: str = "strict") -> Iterator[str]:
    """The lines of ``path`` (newline stripped) read one at a time: at most ``limit`` bytes in
    all and :data:`MAX_LINE_BYTES` per line, so memory stays bounded whatever the file holds.

    Raises:
        error: missing, unreadable, over a limit, or not UTF-8 (with ``errors="strict"``).
    """
    check_size(path, limit, what, error)
    total = 0
    try:
        with open(path, "rb") as fh:
            n = 0
            while True:
                raw = fh.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                n += 1
                total += len(raw)
                if total > limit:
                    raise error(f"{what}={str(path)!r}: over the limit of {_size_text(limit)} for this file")
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raise error(f"{what}={str(path)!r}: line {n} is longer than the limit of "
                                f"{_size_text(MAX_LINE_BYTES)} per line")
                try:
                    yield raw.decode("utf-8", errors=errors).rstrip("\r\n")
                except UnicodeDecodeError as e:
                    raise error(f"{what}={str(path)!r}: line {n}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise error(f"{what}={str(path)!r}: cannot be read ({e.strerror or e})") from None


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of dicts / lists / tuples in ``value`` (0 for a scalar), counted without
    recursion and stopping once past ``limit`` (so it returns at most ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list, tuple)):
            d += 1
            if d > limit:
                return d
            deepest = max(deepest, d)
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_depth(value: Any, name: str, what: str, error: type[Exception] = ConfigError) -> Any:
    """``value`` if nested at most :data:`MAX_DEPTH` deep; else ``error`` (one line)."""
    if depth(value) > MAX_DEPTH:
        raise error(f"{what}={name!r}: nested deeper than the limit of {MAX_DEPTH} levels")
    return value


def loads_json(text: str | bytes, name: str, what: str, error: type[Exception] = ConfigError) -> Any:
    """``json.loads`` with one-line errors: malformed, nested deeper than :data:`MAX_DEPTH`
    (also when Python's recursion limit is hit first), numbers with more than 4300 digits."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{what}={name!r}: nested deeper than the limit of {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise error(f"{what}={name!r}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError, and int() of a number over 4300 digits
        raise error(f"{what}={name!r}: not valid JSON ({str(e).splitlines()[0][:200]})") from None
    return check_depth(value, name, what, error)


def read_json(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> Any:
    """The JSON document in ``path`` (at most ``limit`` bytes, :data:`MAX_DEPTH` deep)."""
    return loads_json(read_bytes(path, limit, what, error), str(path), what, error)
