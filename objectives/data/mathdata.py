"""Downstream math sets (GSM8K, MATH-500), final-answer extraction and answer checking.

Text convention shared by the project (``shared/DESIGN.md``; tiny arithmetic world and real
math alike): a completion is one step per line and ends with its final answer, either after
``#### `` on the last line (GSM8K) or inside ``\\boxed{...}`` (MATH).

* :func:`load_gsm8k`, :func:`load_math500` (or :func:`load_problems` by name) return lists of
  :class:`MathProblem` rows, from a local jsonl file or, with the network, from the public
  dataset ids (``openai/gsm8k`` config ``main``; ``HuggingFaceH4/MATH-500``), ``datasets``
  imported only then.
* :func:`extract_final_answer` finds the final answer of a completion or solution.
* :func:`answers_match` decides whether a predicted final answer equals the gold one, with
  ``math_verify`` (``parse`` + ``verify``); it never raises and works off the main thread.

Heavy imports (``math_verify``/sympy, ``datasets``) happen inside the functions that need them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable, Literal

DATASET_IDS: dict[str, tuple[str, str | None, str]] = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
}
"""Public dataset id, config and split of each set, for :func:`load_problems` without a path."""

MAX_ANSWER_CHARS = 1000
"""Final answers longer than this (characters) are compared as exact strings only: nothing
that long is a real answer, and symbolic parsing of garbage can take seconds."""

VERIFY_TIMEOUT_S = 5
"""Seconds ``math_verify`` may spend on one parse or comparison (main thread only: its
timeout uses ``signal.alarm``, which other threads cannot use; there it runs without one)."""


@dataclass(frozen=True)
class MathProblem:
    """One evaluation problem."""

    question: str
    """The problem statement shown to the model."""
    answer: str
    """Gold final answer as published: GSM8K the text after ``#### `` (e.g. ``"18"``,
    ``"2,125"``); MATH-500 its ``answer`` field (LaTeX, e.g. ``"\\frac{14}{3}"``)."""
    solution: str
    """The published worked solution (GSM8K ``answer`` field with its ``<<a*b=c>>`` calculator
    annotations and ``#### n`` line; MATH-500 ``solution`` with its ``\\boxed{}``)."""
    id: str = ""
    """A stable identifier: ``gsm8k/test/<row>`` or MATH's ``unique_id``."""


# ================================================================= loading
def load_gsm8k(path: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> list[MathProblem]:
    """GSM8K test problems (1,319 rows).

    Args:
        path: a ``test.jsonl`` file (or a folder holding one) with ``{"question", "answer"}``
            rows; ``None`` loads ``openai/gsm8k`` (config ``main``, split ``test``) with
            ``datasets`` (needs the network or its cache).
        limit: keep only the first ``limit`` rows.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a row lacks a field or its ``#### `` answer (the message names the line).
    """
    _check_limit(limit)
    rows = _rows("gsm8k", path)
    out = []
    for i, row in enumerate(_take(rows, limit)):
        question, solution = _field(row, "question", i), _field(row, "answer", i)
        answer = _gsm8k_answer(solution)
        if answer is None:
            raise ValueError(f"gsm8k row {i + 1}: field 'answer' has no '#### <final answer>' line")
        out.append(MathProblem(question=question, answer=answer, solution=solution,
                               id=f"gsm8k/test/{i}"))
    return out


def load_math500(path: str | os.PathLike[str] | None = None, *, limit: int | None = None) -> list[MathProblem]:
    """MATH-500 problems (the 500-problem subset of MATH used by Lightman et al. 2023).

    Args:
        path: a ``test.jsonl`` file (or a folder holding one) with ``{"problem", "solution",
            "answer", "unique_id", ...}`` rows; ``None`` loads ``HuggingFaceH4/MATH-500``
            (split ``test``) with ``datasets``.
        limit: keep only the first ``limit`` rows.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a row lacks ``problem``, ``solution`` or ``answer`` (the message names it).
    """
    _check_limit(limit)
    rows = _rows("math500", path)
    return [MathProblem(question=_field(row, "problem", i), answer=_field(row, "answer", i).strip(),
                        solution=_field(row, "solution", i),
                        id=str(row.get("unique_id") or f"math500/test/{i}"))
            for i, row in enumerate(_take(rows, limit))]


def load_problems(name: Literal["gsm8k", "math500"], path: str | os.PathLike[str] | None = None,
                  *, limit: int | None = None) -> list[MathProblem]:
    """:func:`load_gsm8k` or :func:`load_math500` by name (``gsm8k``, ``math500``).

    Raises:
        ValueError: unknown ``name`` (one line listing the allowed names).
    """
    loaders = {"gsm8k": load_gsm8k, "math500": load_math500}
    if name not in loaders:
        raise ValueError(f"dataset={name!r}: unknown dataset; allowed: {', '.join(loaders)}")
    return loaders[name](path, limit=limit)


def _rows(name: str, path: str | os.PathLike[str] | None) -> Iterable[dict[str, Any]]:
    if path is None:
        from datasets import load_dataset  # heavy, and only for users with the network

        dataset_id, config, split = DATASET_IDS[name]
        return load_dataset(dataset_id, config, split=split)
    p = Path(path)
    if p.is_dir():
        p = p / "test.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"{name} path={str(path)!r}: no such file (expected a jsonl file "
                                "or a folder with test.jsonl)")
    return _read_jsonl(p)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit={limit!r}: must be a non-negative integer or None")


def _take(rows: Iterable[dict[str, Any]], limit: int | None) -> Iterable[dict[str, Any]]:
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        yield row


def _field(row: dict[str, Any], key: str, i: int) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise ValueError(f"row {i + 1}: field {key!r} missing or not a string")
    return value


def _gsm8k_answer(solution: str) -> str | None:
    m = _HASH_RE.findall(solution)
    return m[-1].strip() if m else None


# =============================================================== extraction
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_final_answer(text: Any) -> str | None:
    """The final answer of a completion or solution, stripped, or ``None``.

    Order: the text after the last ``####`` (to the end of its line, if not empty); else the
    content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces balanced; else
    ``None``. Anything that is not a string gives ``None``.

    >>> extract_final_answer("23+45=68\\n68-12=56\\n#### 56")
    '56'
    >>> extract_final_answer("so $x = \\\\boxed{\\\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    """
    if not isinstance(text, str):
        return None
    hashed = _gsm8k_answer(text)
    if hashed:
        return hashed
    for m in reversed(list(_BOX_RE.finditer(text))):
        content = _balanced(text, m.end())
        if content is not None and content.strip():
            return content.strip()
    return None


def _balanced(text: str, start: int) -> str | None:
    """Content from ``start`` (just after ``{``) to its matching ``}``; None if unbalanced."""
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{" and text[i - 1] != "\\":
            depth += 1
        elif c == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


# ================================================================= checking
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def answers_match(pred: Any, gold: Any) -> bool:
    """Whether the predicted final answer equals the gold one.

    Both are final-answer strings (see :func:`extract_final_answer`), e.g. ``"18.0"`` and
    ``"18"``, ``"0.5"`` and ``"\\frac{1}{2}"``, ``"$18"`` and ``"18"``, ``"2125"`` and
    ``"2,125"``. Steps:

    1. clean both: strip spaces, a trailing period and dollar signs (math delimiters or
       currency);
    2. plain numbers on both sides (thousands commas allowed): compare exactly as decimals
       (equal: True; two different integers: False) — fast, and exact for any length;
    3. otherwise ``math_verify.verify(parse(gold), parse(pred))``, each parsed as the LaTeX
       ``$...$`` (gold first: ``verify`` is not symmetric); a gold that does not parse is
       compared as a string.

    Never raises: ``None``, non-strings, empty or unparsable text, answers over
    :data:`MAX_ANSWER_CHARS` (unless identical) and ``math_verify`` errors or timeouts give
    False. Safe off the main thread (no timeout there: see :data:`VERIFY_TIMEOUT_S`).
    """
    try:
        if pred is None or gold is None:
            return False
        p, g = _clean(str(pred)), _clean(str(gold))
        if not p or not g:
            return False
        if p == g:
            return True
        if len(p) > MAX_ANSWER_CHARS or len(g) > MAX_ANSWER_CHARS:
            return False
        fast = _numeric_match(p, g)
        if fast is not None:
            return fast
        return _verify(p, g)
    except Exception:  # a checker must never take a training run down
        return False


def _clean(s: str) -> str:
    s = s.strip().replace("\\$", "").replace("$", "").strip()
    while s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


def _numeric_match(p: str, g: str) -> bool | None:
    """True/False when both are plain numbers and that settles it; None to ask math_verify."""
    if not (_NUMBER_RE.fullmatch(p) and _NUMBER_RE.fullmatch(g)):
        return None
    try:
        dp, dg = Decimal(p.replace(",", "")), Decimal(g.replace(",", ""))
    except (InvalidOperation, ValueError):
        return None
    if dp == dg:
        return True
    if "." not in p and "." not in g:
        return False
    return None  # e.g. 0.3333333 vs 0.333333: math_verify's rounding decides


def _verify(p: str, g: str) -> bool:
    from math_verify import verify
    from math_verify.errors import TimeoutException

    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = _parse(g, timeout)
    if not gold:
        return False  # p != g already checked
    pred = _parse(p, timeout)
    if not pred:
        return False
    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=timeout))
    except (Exception, TimeoutException):
        return False


@functools.lru_cache(maxsize=8192)
def _parse(s: str, timeout: int | None) -> tuple[Any, ...]:
    """``math_verify.parse`` of ``$s$`` (cached: a gold is checked once per completion)."""
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return tuple(parse(f"${s}$", parsing_timeout=timeout))
    except (Exception, TimeoutException):
        return ()


__all__ = [
    "DATASET_IDS", "MAX_ANSWER_CHARS", "MathProblem", "VERIFY_TIMEOUT_S", "answers_match",
    "extract_final_answer", "load_gsm8k", "load_math500", "load_problems",
]
