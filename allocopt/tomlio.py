"""Reading config files (TOML) into frozen dataclasses, with one-line errors. Standard library."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

from allocopt.flops import ConfigError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib  # type: ignore[no-redef]


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML table in ``path``. ``what`` names the file in errors (``spec``, ``recipe``).

    Raises:
        ConfigError: missing, unreadable (a folder, no permission), not UTF-8, malformed.
    """
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what}={str(path)!r}: file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what}={str(path)!r}: malformed TOML ({e})") from None
    except OSError as e:
        raise ConfigError(f"{what}={str(path)!r}: cannot be read ({e.strerror or e})") from None


def check_keys(data: Mapping[str, Any], cls: type, what: str) -> None:
    """Raise :class:`ConfigError` naming the first key of ``data`` that is not a field of ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{what}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(known))}")
