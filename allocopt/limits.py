"""The one reading layer for every file a user hands in: size, kind, depth, count, number,
string and pattern limits, and the bounded readers that enforce them. Standard library only.

Every reader of a user's file goes through it (the run importers and their event and scalar
files, a study file, a recipe, ``tell --metrics``, a ``command`` objective's metrics file, the
``tiny-table`` objective's table, a throughput profile, a lengths file). A file is refused with
one line naming the file, the field and what is allowed (a
:class:`~allocopt.errors.ConfigError`, or the error class the caller passes) before it is read
whole:

* only regular files are read (symlinks resolved): a FIFO, a device (``/dev/zero``), a socket
  or a folder is refused without opening it for reading (a FIFO would block, a device never
  ends); the file is opened non-blocking and checked again after opening;
* sizes are checked with ``stat`` first, then while reading, so a file that grows or lies about
  its size (a compressed member) is still cut at the limit: a multi-GB file is refused by its
  size alone, and memory stays bounded by the limit;
* JSON and TOML documents: nested at most :data:`MAX_DEPTH` deep, numbers of at most
  :data:`MAX_NUMBER_CHARS` characters, strings of at most :data:`MAX_DOC_STRING_CHARS`, no key
  twice in one object;
* numbers written as text (log lines, CSV cells, ``key=value`` lines): ASCII digits only
  (:func:`read_number`; Python's ``float`` would read ``'١٢٣'`` or ``'1_0'``), at most
  :data:`MAX_NUMBER_CHARS` characters; ranges are the reader's (field by field);
* regular expressions from a file (:func:`safe_pattern`): short, no back-references, no
  quantified group that holds a quantifier or an alternation, at most
  :data:`MAX_PATTERN_REPEATS` unbounded quantifiers, so matching a short name cannot
  backtrack for ever;
* entries repeated in one file (a step logged again and again): at most :data:`MAX_REPEATS`
  times (:class:`RepeatCounter`).

=============================  ==========  ===================================================
limit                          value       file
=============================  ==========  ===================================================
:data:`MAX_METRICS_BYTES`      1 MiB       ``tell --metrics`` JSON, a ``command`` metrics file
:data:`MAX_TOML_BYTES`         1 MiB       a study spec, recipe or throughput profile
:data:`MAX_CONFIG_BYTES`       4 MiB       a model's ``config.json``, ``adapter_config.json``
:data:`MAX_STATE_BYTES`        64 MiB      TRL ``trainer_state.json``
:data:`MAX_ARGS_BYTES`         16 MiB      TRL ``training_args.bin`` (file and its pickle member)
:data:`MAX_TABLE_BYTES`        64 MiB      the ``tiny-table`` objective's CSV table
:data:`MAX_LOG_BYTES`          512 MiB     a verl, OpenRLHF console log / JSON-lines metrics
:data:`MAX_LENGTHS_BYTES`      512 MiB     an ``account --lengths`` file
:data:`MAX_LINE_BYTES`         1 MiB       one line of a log, table or lengths file
:data:`MAX_DEPTH`              64          nesting of JSON / TOML / pickled values
:data:`MAX_VALUES`             100,000     values one pickle may build
:data:`MAX_NUMBER_CHARS`       64          characters of one number
:data:`MAX_STRING_CHARS`       4,096       a name read from a file (a model, a key's value)
:data:`MAX_DOC_STRING_CHARS`   65,536      any string of a JSON / TOML document
:data:`MAX_REPEATS`            1,000       times one entry (a step) may repeat in a file
=============================  ==========  ===================================================
"""

from __future__ import annotations

import json
import os
import re
import stat
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
MAX_TABLE_BYTES = 64 * MiB
"""The ``tiny-table`` objective's CSV table (a measured grid: a few MB)."""
MAX_NUMBER_CHARS = 64
"""Characters of one number in a file (a float's shortest repr is at most 24)."""
MAX_STRING_CHARS = 4096
"""A name read from a file: a model id or path, an estimator, a key's value."""
MAX_DOC_STRING_CHARS = 64 * 1024
"""Any string of a JSON or TOML document."""
MAX_REPEATS = 1000
"""Times one entry (the same step) may be logged in one file; a resumed run repeats a few."""
MAX_PATTERN_CHARS = 256
"""A regular expression read from a file."""
MAX_PATTERN_REPEATS = 3
"""Unbounded quantifiers (``*``, ``+``, ``{n,}``) in a regular expression read from a file:
matching a name of ``n`` characters costs at most about ``n`` to this power."""


def _size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file, else ``None``."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_size(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> int:
    """The size of ``path`` in bytes, if it is a regular file (symlinks resolved) of at most
    ``limit`` bytes.

    Raises:
        error: missing file, not a regular file (a folder, FIFO, device, socket), unreadable,
            or over ``limit`` (one line ``{what}='path': ...``).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what}={str(path)!r}: file not found") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise error(f"{what}={str(path)!r}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise error(f"{what}={str(path)!r}: is {kind}, not a regular file; allowed: a regular file")
    if st.st_size > limit:
        raise error(f"{what}={str(path)!r}: {st.st_size} bytes, over the limit of {_size_text(limit)} "
                    "for this file")
    return st.st_size


def open_regular(path: str | Path, limit: int, what: str,
                 error: type[Exception] = ConfigError) -> BinaryIO:
    """``path`` opened for binary reading, if a regular file of at most ``limit`` bytes: checked
    before opening (:func:`check_size`) and again on the open file (opened non-blocking, so a
    FIFO swapped in between cannot block).

    Raises:
        error: as :func:`check_size`, or the file cannot be opened.
    """
    check_size(path, limit, what, error)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{what}={str(path)!r}: cannot be read ({e.strerror or e})") from None
    st = os.fstat(fd)
    kind = _kind(st.st_mode)
    if kind is not None or st.st_size > limit:
        os.close(fd)
        raise error(f"{what}={str(path)!r}: changed while opened ({kind or 'over the limit'}); "
                    "allowed: a regular file")
    return os.fdopen(fd, "rb")


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
    fh = open_regular(path, limit, what, error)
    try:
        with fh:
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
    total = 0
    fh = open_regular(path, limit, what, error)
    try:
        with fh:
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
    return _walk(value, limit)[0]


_BIGGEST = 10 ** MAX_NUMBER_CHARS


def _walk(value: Any, limit: int) -> tuple[int, int, bool]:
    """``(depth, longest string, an integer of more than MAX_NUMBER_CHARS digits)`` of
    ``value`` (keys included), level by level without recursion (a document of 300,000 values
    in ~0.2 s); stops once deeper than ``limit`` or at such an integer."""
    deepest = longest = 0
    level = [value]
    while True:
        below: list[Any] = []
        containers = False
        for v in level:
            t = type(v)  # the exact types first: this loop sees every value of the document
            if t is float or t is bool or v is None:
                continue
            if t is dict or (t is not str and t is not int and isinstance(v, dict)):
                containers = True
                below += v.values()
                below += v.keys()
            elif t is list or t is tuple or (t is not str and t is not int and isinstance(v, (list, tuple))):
                containers = True
                below += v
            elif isinstance(v, str):
                longest = max(longest, len(v))
            elif isinstance(v, int) and not -_BIGGEST < v < _BIGGEST:
                return deepest, longest, True
        if not containers:
            return deepest, longest, False
        deepest += 1
        if deepest > limit:
            return deepest, longest, False
        level = below


def check_depth(value: Any, name: str, what: str, error: type[Exception] = ConfigError) -> Any:
    """``value`` if nested at most :data:`MAX_DEPTH` deep, its strings (keys too) at most
    :data:`MAX_DOC_STRING_CHARS` long; else ``error`` (one line)."""
    deepest, longest, big = _walk(value, MAX_DEPTH)
    if deepest > MAX_DEPTH:
        raise error(f"{what}={name!r}: nested deeper than the limit of {MAX_DEPTH} levels")
    if big:
        raise error(f"{what}={name!r}: a number of more than {MAX_NUMBER_CHARS} digits, over the "
                    f"limit of {MAX_NUMBER_CHARS} characters")
    if longest > MAX_DOC_STRING_CHARS:
        raise error(f"{what}={name!r}: a string of {longest} characters, over the limit of "
                    f"{MAX_DOC_STRING_CHARS}")
    return value


class _Refused(Exception):
    """A JSON document over a limit of this module (raised inside the parser's hooks)."""


def _number(kind: type) -> Any:
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _Refused(f"a number of {len(text)} characters ({text[:12]}...), over the limit "
                           f"of {MAX_NUMBER_CHARS}")
        return kind(text)
    return parse


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"key {k[:80]!r} given more than once in one object; allowed: each key once")
        out[k] = v
    return out


def loads_json(text: str | bytes, name: str, what: str, error: type[Exception] = ConfigError) -> Any:
    """``json.loads`` with one-line errors: malformed, nested deeper than :data:`MAX_DEPTH`
    (also when Python's recursion limit is hit first), a number longer than
    :data:`MAX_NUMBER_CHARS` characters, a string longer than :data:`MAX_DOC_STRING_CHARS`, a
    key twice in one object. ``NaN`` and ``Infinity`` are read (Python's ``json`` writes them
    for a diverged metric): each field that is used is checked where it is read."""
    try:
        value = json.loads(text, parse_int=_number(int), parse_float=_number(float),
                           object_pairs_hook=_object)
    except _Refused as e:
        raise error(f"{what}={name!r}: {e}") from None
    except RecursionError:
        raise error(f"{what}={name!r}: nested deeper than the limit of {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise error(f"{what}={name!r}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError
        raise error(f"{what}={name!r}: not valid JSON ({str(e).splitlines()[0][:200]})") from None
    return check_depth(value, name, what, error)


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)",
                     re.ASCII | re.IGNORECASE)


def read_number(text: str, where: str, error: type[Exception] = ConfigError) -> int | float | None:
    """The number ``text`` writes (an int when it has no point or exponent), ``None`` when it
    writes none; ``nan`` and ``inf`` are read (ranges are the caller's).

    Raises:
        error: ``text`` is a number Python would read but written otherwise than in ASCII
            digits (``'١٢٣'``, ``'1_000'``), or longer than :data:`MAX_NUMBER_CHARS` characters
            (``{where}='...': ...``).
    """
    t = text.strip()
    if len(t) <= MAX_NUMBER_CHARS and _NUMBER.fullmatch(t):
        return int(t) if t.lstrip("+-").isdigit() else float(t)
    try:
        float(t)
    except (ValueError, OverflowError):
        return None
    raise error(f"{where}={text[:40]!r}: not a number as allowed: ASCII digits (0-9, one point, "
                f"an exponent), at most {MAX_NUMBER_CHARS} characters")


def safe_pattern(pattern: Any, where: str, error: type[Exception] = ConfigError) -> "re.Pattern[str]":
    """``pattern`` (a regular expression from a file) compiled, if it cannot backtrack for
    ever: at most :data:`MAX_PATTERN_CHARS` characters, no back-reference, no quantified group
    holding a quantifier or an alternation (``(a+)+``, ``(a|aa)*``), at most
    :data:`MAX_PATTERN_REPEATS` unbounded quantifiers.

    Raises:
        error: one line ``{where}: pattern ...: ...; allowed: ...``.
    """
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
        raise error(f"{where}: pattern {str(pattern)[:80]!r}: must be a string of at most "
                    f"{MAX_PATTERN_CHARS} characters")
    why = _backtracking(pattern)
    if why is None:
        try:
            return re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as e:
            why = f"not a regular expression ({str(e)[:80]})"
    raise error(f"{where}: pattern {pattern[:80]!r}: {why}; allowed: no back-reference, no "
                f"quantified group holding a quantifier or '|', at most {MAX_PATTERN_REPEATS} "
                "unbounded quantifiers")


def _backtracking(p: str) -> str | None:
    """Why ``p`` could backtrack for ever (a linear scan of its syntax), or ``None``."""
    groups: list[bool] = []  # per open group: holds a quantifier or an alternation
    unbounded, i, closed = 0, 0, False  # closed: the previous atom was a group that repeats inside
    while i < len(p):
        c = p[i]
        if c == "\\":
            if i + 1 < len(p) and (p[i + 1] in "123456789" or p[i + 1] == "g"):
                return "a back-reference"
            i, closed = i + 2, False
            continue
        if c == "[":  # a character class: skip to its end
            j = i + 1 + (p[i + 1:i + 2] == "^")
            j += p[j:j + 1] == "]"
            while j < len(p) and p[j] != "]":
                j += 2 if p[j] == "\\" else 1
            i, closed = j + 1, False
            continue
        if c == "(":
            if p.startswith("(?P=", i):
                return "a back-reference"
            groups.append(False)
        elif c == ")" and groups:
            inner = groups.pop()
            closed = inner
            if groups and inner:
                groups[-1] = True
            i += 1
            continue
        elif c == "|" and groups:
            groups[-1] = True
        elif c in "*+{" or (c == "?" and closed):
            if c == "{" and not re.match(r"\{\d*(,\d*)?\}", p[i:]):
                i, closed = i + 1, False
                continue
            bounded_one = c == "?" or (c == "{" and re.match(r"\{(0|1|0?,1|1,1)\}", p[i:]))
            if closed and c != "?" and not bounded_one:
                return "a repeated group that itself repeats or alternates"
            unbounded += c in "*+" or bool(c == "{" and re.match(r"\{\d*,\}", p[i:]))
            if unbounded > MAX_PATTERN_REPEATS:
                return f"more than {MAX_PATTERN_REPEATS} unbounded quantifiers"
            if groups:
                groups[-1] = True
            i = p.index("}", i) + 1 if c == "{" else i + 1
            i += i < len(p) and p[i] in "?+"  # lazy / possessive modifier
            closed = False
            continue
        closed = False
        i += 1
    return None


class RepeatCounter:
    """Counts the entries of one file by key (a step number) and refuses one repeated more
    than :data:`MAX_REPEATS` times."""

    def __init__(self, limit: int = MAX_REPEATS) -> None:
        self.limit = limit
        self.counts: dict[Any, int] = {}

    def add(self, key: Any, where: str, what: str, error: type[Exception] = ConfigError) -> None:
        """Count ``key``; ``error`` ``{where}: {what} logged more than ... times`` past the limit."""
        n = self.counts[key] = self.counts.get(key, 0) + 1
        if n > self.limit:
            raise error(f"{where}: {what} logged more than {self.limit} times; allowed: each "
                        f"entry at most {self.limit} times (a resumed run repeats a few)")


def read_json(path: str | Path, limit: int, what: str, error: type[Exception] = ConfigError) -> Any:
    """The JSON document in ``path`` (at most ``limit`` bytes, :data:`MAX_DEPTH` deep)."""
    return loads_json(read_bytes(path, limit, what, error), str(path), what, error)
