"""Final answers: where a completion or solution states its answer, and whether two answers agree.

Text convention (tiny arithmetic world and real math alike): a completion is one step per line
and ends with its final answer, either after ``#### `` on the last line (GSM8K) or inside
``\\boxed{...}`` (MATH).

* :func:`extract_final_answer` finds the final answer of a completion or solution
  (:func:`hashed_answer`: the text after its last ``####``).
* :func:`answers_match` decides whether a predicted final answer equals the gold one, with
  ``math_verify`` (``parse`` + ``verify``); it never raises and works off the main thread.

The rule-based rewards (:mod:`allocopt.rewards.step_parsing`) and the evaluation sets of an
objective read answers with these. ``math_verify`` (sympy) is imported inside the functions.
"""

from __future__ import annotations

import functools
import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_ANSWER_CHARS = 1000
"""Final answers longer than this (characters) are compared as exact strings only: nothing
that long is a real answer, and symbolic parsing of garbage can take seconds."""

VERIFY_TIMEOUT_S = 5
"""Seconds ``math_verify`` may spend on one parse or comparison (main thread only: its
timeout uses ``signal.alarm``, which other threads cannot use; there it runs without one)."""


_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def hashed_answer(text: str) -> str | None:
    """The text after the last ``####`` of ``text`` (to the end of its line), stripped, or
    ``None`` when there is none (a GSM8K solution's final answer)."""
    m = _HASH_RE.findall(text)
    return m[-1].strip() if m else None


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
    hashed = hashed_answer(text)
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


__all__ = ["MAX_ANSWER_CHARS", "VERIFY_TIMEOUT_S", "answers_match", "extract_final_answer", "hashed_answer"]
