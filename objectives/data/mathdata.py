"""Downstream math sets (GSM8K, MATH-500): :func:`load_gsm8k`, :func:`load_math500` (or
:func:`load_problems` by name) return lists of :class:`MathProblem` rows, from a local jsonl
file or, with the network, from the public dataset ids (``openai/gsm8k`` config ``main``;
``HuggingFaceH4/MATH-500``), ``datasets`` imported only then.

A completion's final answer is read and checked by :mod:`allocopt.rewards.answers`
(:func:`~allocopt.rewards.answers.extract_final_answer`,
:func:`~allocopt.rewards.answers.answers_match`), as the rule-based rewards read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from allocopt.rewards.answers import hashed_answer

DATASET_IDS: dict[str, tuple[str, str | None, str]] = {
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
}
"""Public dataset id, config and split of each set, for :func:`load_problems` without a path."""


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
        answer = hashed_answer(solution)
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


__all__ = ["DATASET_IDS", "MathProblem", "load_gsm8k", "load_math500", "load_problems"]
