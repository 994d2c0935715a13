"""Per-row token lengths of GRPO steps: read from a file, or drawn from a named distribution.

Standard library only. Attention is quadratic in a row's length and padding follows the
longest row of a batch, so a mean length understates both; these helpers turn what is known
about lengths into the per-row :class:`~allocopt.flops.grpo.GRPOStep` s the accounting needs.

Lengths file (``allocopt account --lengths FILE``), one row per completion, in the order the
run produced them (``group_size`` consecutive rows share one prompt):

* CSV with a header naming ``prompt_tokens`` and ``completion_tokens`` (EOS included), and an
  optional ``count`` (a histogram: the row stands for ``count`` identical completions);
* JSON lines, one object per line with the same keys.

Rows are cut into steps of ``prompts × group_size`` rows; the file must hold a whole number
of steps.

Limits (:mod:`allocopt.limits`): the file at most 512 MiB, read one line at a time (at most
1 MiB a line), at most :data:`MAX_ROWS` rows after histogram counts are expanded.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Iterable, Literal

from allocopt.flops import ConfigError
from allocopt.flops.grpo import GRPOStep
from allocopt.limits import MAX_LENGTHS_BYTES, iter_lines, loads_json, read_number

Distribution = Literal["constant", "uniform", "one-long"]
DISTRIBUTIONS: tuple[str, ...] = ("constant", "uniform", "one-long")
"""Named completion-length distributions given a mean ``m`` and a max ``M`` over ``N`` rows:
``constant`` (every row ``m``; ``M`` unused), ``uniform`` (evenly spaced from ``2m - M`` to
``M``), ``one-long`` (one row at ``M``, the others at ``(N·m - M)/(N - 1)``: the least
padding a batch with that longest row can have)."""

MAX_ROWS = 10_000_000
"""Most rows a lengths file may expand to (bounded memory)."""


def read_lengths(path: str | Path) -> list[tuple[int, int]]:
    """``(prompt_tokens, completion_tokens)`` per completion from a CSV or JSON-lines file
    (module docstring), histogram counts expanded.

    Raises:
        ConfigError: unreadable file, a missing column, a value that is not a whole number of
            tokens >= 1 (``count`` >= 1), or more than :data:`MAX_ROWS` rows; the message names
            the file, the row and the field.
    """
    lines = (ln for ln in iter_lines(path, MAX_LENGTHS_BYTES, "lengths") if ln.strip())
    first = next(lines, None)
    if first is None:
        raise ConfigError(f"lengths={str(path)!r}: empty file")
    lines = itertools.chain([first], lines)
    if first.lstrip().startswith("{"):
        records: Iterable[tuple[int, dict]] = _jsonl(path, lines)
    else:
        records = _csv(path, lines)
    rows: list[tuple[int, int]] = []
    for where, rec in records:
        p_tok = _tokens(path, where, rec, "prompt_tokens")
        c_tok = _tokens(path, where, rec, "completion_tokens")
        count = _tokens(path, where, rec, "count") if rec.get("count") not in (None, "") else 1
        if len(rows) + count > MAX_ROWS:
            raise ConfigError(f"lengths={str(path)!r}: more than {MAX_ROWS} rows")
        rows.extend([(p_tok, c_tok)] * count)
    return rows


def _csv(path: str | Path, lines: Iterable[str]) -> Iterable[tuple[int, dict]]:
    try:
        yield from enumerate(csv.DictReader(lines), start=2)
    except csv.Error as e:
        raise ConfigError(f"lengths={str(path)!r}: not CSV ({e})") from None


def _jsonl(path: str | Path, lines: Iterable[str]) -> Iterable[tuple[int, dict]]:
    for i, ln in enumerate(lines, start=1):
        rec = loads_json(ln, f"{path}:{i}", "lengths")
        if not isinstance(rec, dict):
            raise ConfigError(f"lengths={str(path)!r}: line {i}: expected a JSON object")
        yield i, rec


def _tokens(path: str | Path, where: int, rec: dict, key: str) -> int:
    v = rec.get(key)
    if v is None:
        raise ConfigError(f"lengths={str(path)!r}: line {where}: missing {key!r} "
                          "(needed: prompt_tokens, completion_tokens; optional: count)")
    if isinstance(v, str):  # a CSV cell: ASCII digits only (the reading layer)
        v = read_number(v, f"lengths={str(path)!r}: line {where}: {key}")
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        f = float("nan")
    if isinstance(v, bool) or not f.is_integer() or not 1 <= f <= 2**31:
        raise ConfigError(f"lengths={str(path)!r}: line {where}: {key}={str(v)[:40]!r}: must be a whole "
                          "number from 1 to 2**31")
    return int(f)


def synthetic_completions(mean: float, maximum: float | None, rows: int,
                          distribution: str = "constant") -> tuple[int, ...]:
    """``rows`` completion lengths (tokens) with the given mean, longest ``maximum``.

    Raises:
        ConfigError: unknown distribution, ``maximum < mean``, or a shape that needs rows
            shorter than 1 token.
    """
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"length_distribution={distribution!r}: allowed: {', '.join(DISTRIBUTIONS)}")
    m = float(mean)
    M = float(maximum) if maximum else m
    if M < m:
        raise ConfigError(f"completion_max={M:g}: must be >= the mean completion_tokens={m:g}")
    if distribution == "constant" or rows == 1 or M == m:
        return (max(1, round(m)),) * rows
    if distribution == "uniform":
        lo = 2 * m - M
        if lo < 1:
            raise ConfigError(f"completion_max={M:g}: a uniform spread with mean {m:g} would need "
                              f"rows of {lo:g} tokens; use one-long or a lengths file")
        return tuple(round(lo + (M - lo) * i / (rows - 1)) for i in range(rows))
    rest = (rows * m - M) / (rows - 1)  # one-long
    if rest < 1:
        raise ConfigError(f"completion_max={M:g}: with mean {m:g} over {rows} rows the others "
                          f"would be {rest:g} tokens")
    return (round(M),) + (round(rest),) * (rows - 1)


def steps_from_rows(rows: list[tuple[int, int]], prompts: int, group_size: int,
                    source: str = "lengths", **step_kw) -> list[GRPOStep]:
    """Cut per-completion rows into :class:`GRPOStep` s of ``prompts × group_size`` rows.

    Raises:
        ConfigError: the rows are not a whole number of steps, or the rows of one group
            disagree on the prompt length.
    """
    n = prompts * group_size
    if not rows or len(rows) % n:
        raise ConfigError(f"{source}: {len(rows)} rows is not a whole number of steps of "
                          f"prompts x group_size = {prompts} x {group_size} = {n} rows")
    steps = []
    for s in range(0, len(rows), n):
        chunk = rows[s:s + n]
        prompt_tokens = []
        for g in range(prompts):
            group = chunk[g * group_size:(g + 1) * group_size]
            if len({p for p, _ in group}) != 1:
                raise ConfigError(f"{source}: rows {s + g * group_size + 1}-"
                                  f"{s + (g + 1) * group_size}: one group of {group_size} "
                                  "completions must share one prompt_tokens")
            prompt_tokens.append(group[0][0])
        steps.append(GRPOStep(prompt_tokens=tuple(prompt_tokens),
                              completion_tokens=tuple(c for _, c in chunk),
                              group_size=group_size, **step_kw))
    return steps


__all__ = ["DISTRIBUTIONS", "Distribution", "MAX_ROWS", "read_lengths", "steps_from_rows",
           "synthetic_completions"]
