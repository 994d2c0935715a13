"""The settings of someone else's run, read with where each came from.

Every importer reads its tool's configuration (verl's flattened config dump, TRL's
``GRPOConfig``, OpenRLHF's namespace, NeMo-RL's hparams) through one :class:`KeyReader`: each
value read is noted with its origin, each default taken with why and, where the account
depends on it, with the *other reading* (the settings under the other plausible value), so
that the printed total can say what it would be under that reading. Values are checked as
they are read: numbers are numbers (not strings), finite, whole where counts are, within
their range; switches are true or false; names are strings of bounded length. Anything else is
one :class:`~allocopt.errors.RunLogError` line naming the file and the key.

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from allocopt.errors import RunLogError
from allocopt.limits import MAX_STRING_CHARS

MOST = 2**31
"""Largest count or size a key may hold (a batch, a step, a number of GPUs)."""


@dataclass(frozen=True)
class OtherReading:
    """What an assumed key would change were it the other way."""

    label: str
    """The other value in words (``False``, ``a critic of the policy's shape``)."""
    changes: Mapping[str, Any]
    """Recipe settings (or pricing options, :class:`~allocopt.runlogs.common.Pricing`) that
    hold under the other reading."""


@dataclass
class Provenance:
    """Where every number of an imported run came from."""

    read: dict[str, str] = field(default_factory=dict)
    """Key -> its value and where it was read (file and key, or ``given`` for an override)."""
    assumed: dict[str, str] = field(default_factory=dict)
    """Key -> the value assumed and why (the files do not say)."""
    others: dict[str, OtherReading] = field(default_factory=dict)
    """Assumed key -> the other reading, where the account depends on it."""

    def assume(self, key: str, text: str, other: OtherReading | None = None) -> None:
        """Note ``key`` as assumed (``text``: the value and why), with its other reading."""
        self.assumed[key] = text
        if other is not None:
            self.others[key] = other
        else:
            self.others.pop(key, None)

    def given(self, overrides: Mapping[str, Any]) -> None:
        """Note each override as ``given`` (it wins over the files, so nothing is assumed)."""
        for k in overrides:
            self.read[k] = "given"
            self.assumed.pop(k, None)
            self.others.pop(k, None)


def check_number(where: str, key: str, v: Any, *, least: float, most: float = MOST,
                 whole: bool = True) -> int | float:
    """``v`` as an int (``whole``) or float, if a finite number from ``least`` to ``most``.

    Raises:
        RunLogError: ``{where}: {key}={v!r}: must be ...`` (a string, a bool, NaN, out of range).
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RunLogError(f"{where}: {key}={_shown(v)}: must be a number, not {type(v).__name__}")
    try:
        ok = math.isfinite(v) and least <= v <= most and (not whole or float(v).is_integer())
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        kind = "a whole number" if whole else "a finite number"
        top = "2**31" if most == MOST else f"{most:g}"
        raise RunLogError(f"{where}: {key}={_shown(v)}: must be {kind} >= {least:g} (and at most {top})")
    return int(v) if whole else float(v)


def _shown(v: Any) -> str:
    """``repr(v)``, cut to 80 characters (a value from a file may be of any length)."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


class KeyReader:
    """Reads keys of one tool's configuration, noting each in a :class:`Provenance`.

    Args:
        config: the flat configuration (dotted keys -> values).
        where: what error lines start with (the file: ``from_verl='run.log'``).
        origin: what the read notes say the values came from (``config``, ``hparams``,
            ``training_args.bin``).
        notes: the provenance to write to (a new one by default).
    """

    def __init__(self, config: Mapping[str, Any], where: str, origin: str,
                 notes: Provenance | None = None) -> None:
        self.config, self.where, self.origin = config, where, origin
        self.notes = notes if notes is not None else Provenance()

    def has(self, key: str) -> bool:
        """Whether the configuration gives ``key`` (not ``None``)."""
        return self.config.get(key) is not None

    def get(self, key: str, default: Any = None, why: str = "", *, alts: tuple[str, ...] = (),
            other: OtherReading | None = None) -> Any:
        """The first of ``key`` and ``alts`` the configuration gives (noted as read), else
        ``default``, noted as assumed with ``why`` (and ``other``) when ``why`` is given."""
        for k in (key, *alts):
            if self.config.get(k) is not None:
                self.notes.read[k] = f"{_shown(self.config[k])} ({self.origin})"
                return self.config[k]
        if why:
            self.notes.assume(key, f"{default!r} ({why})", other)
        return default

    def number(self, key: str, default: Any, why: str = "", *, least: float, most: float = MOST,
               whole: bool = True, alts: tuple[str, ...] = (),
               other: OtherReading | None = None) -> Any:
        """:meth:`get`, checked by :func:`check_number`; ``None`` stays ``None``."""
        v = self.get(key, default, why, alts=alts, other=other)
        return None if v is None else check_number(self.where, key, v, least=least, most=most,
                                                   whole=whole)

    def flag(self, key: str, default: bool, why: str = "", *, alts: tuple[str, ...] = (),
             other: OtherReading | None = None) -> bool:
        """:meth:`get` of an on/off key: ``True``, ``False`` (or the numbers 1, 0)."""
        v = self.get(key, default, why, alts=alts, other=other)
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise RunLogError(f"{self.where}: {key}={_shown(v)}: must be true or false")

    def text(self, key: str, default: str | None = None, why: str = "", *,
             alts: tuple[str, ...] = ()) -> str | None:
        """:meth:`get` of a name (a model, an estimator): a non-empty string of at most
        :data:`~allocopt.limits.MAX_STRING_CHARS` printable characters; ``None`` stays."""
        v = self.get(key, default, why, alts=alts)
        if v is None:
            return None
        if not isinstance(v, str) or not v.strip() or len(v) > MAX_STRING_CHARS \
                or not v.isprintable():
            raise RunLogError(f"{self.where}: {key}={_shown(v)}: must be a name of 1 to "
                              f"{MAX_STRING_CHARS} printable characters")
        return v


__all__ = ["KeyReader", "MOST", "OtherReading", "Provenance", "check_number"]
