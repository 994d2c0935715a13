"""Reading config files (TOML) into frozen dataclasses, with one-line errors. Standard library."""

from __future__ import annotations

import difflib
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

from allocopt.errors import ConfigError
from allocopt.limits import MAX_DEPTH, MAX_TOML_BYTES, check_depth, read_text

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib  # type: ignore[no-redef]


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML table in ``path``. ``what`` names the file in errors (``spec``, ``recipe``).

    Limits (:mod:`allocopt.limits`): at most :data:`~allocopt.limits.MAX_TOML_BYTES` (1 MiB),
    arrays and tables nested at most :data:`~allocopt.limits.MAX_DEPTH` (64) deep.

    Raises:
        ConfigError: missing, unreadable (a folder, no permission), over a limit, not UTF-8,
            malformed (also an integer of more than 4300 digits).
    """
    text = read_text(path, MAX_TOML_BYTES, what)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise ConfigError(f"{what}={str(path)!r}: nested deeper than the limit of {MAX_DEPTH} levels") from None
    except ValueError as e:  # TOMLDecodeError, and int() of a number over 4300 digits
        raise ConfigError(f"{what}={str(path)!r}: malformed TOML ({str(e).splitlines()[0][:200]})") from None
    return check_depth(data, str(path), what)


def check_keys(data: Mapping[str, Any], cls: type, what: str, *, file_keys: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` naming the first key of ``data`` that is not a field of ``cls``.
    ``file_keys``: fields a file writes under other keys (field -> its keys, comma-separated),
    so the allowed list names what a file may hold."""
    known = {f.name for f in fields(cls)}
    for name, keys in (file_keys or {}).items():
        known = (known - {name}) | set(keys.split(","))
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(unknown_key(what, unknown[0], known))


def unknown_key(what: str, key: str, known: Any) -> str:
    """The one line for an unknown ``key`` of ``what``: what is allowed, and the allowed key
    nearest in spelling when one is near (a typo: ``trails`` for ``trials``)."""
    allowed = sorted(known)
    near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
    return (f"{what}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
            + f"; allowed: {', '.join(allowed)}")
