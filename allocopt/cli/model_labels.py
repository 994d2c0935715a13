"""How a model-size study names its policies in a table of 80 columns.

Hub names of one family share most of their text (``Qwen/Qwen2.5-1.5B-Instruct``,
``Qwen/Qwen2.5-7B-Instruct``); a table column of their full names pushes the numbers off an
80-column terminal, and rich then cuts every name to the same ``Qwen/Qwen…``. A table shows
the part that tells them apart (``1.5B``, ``7B``) and prints the full names once beside it
(:func:`legend`).
"""

from __future__ import annotations

import re
from typing import Iterable

_PIECES = re.compile(r"[^/\-_]+|[/\-_]")  # name pieces and the separators between them


def short_names(models: Iterable[str]) -> dict[str, str]:
    """Each distinct model's label: its name less the pieces (split at ``/``, ``-``, ``_``)
    that every name begins or ends with; a single model is named by its last path part."""
    names = list(dict.fromkeys(str(m) for m in models))
    if len(names) <= 1:
        return {m: m.rsplit("/", 1)[-1] or m for m in names}
    pieces = [_PIECES.findall(m) for m in names]
    shortest = min(map(len, pieces))
    head = 0
    while head < shortest - 1 and len({p[head] for p in pieces}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head - 1 and len({p[-1 - tail] for p in pieces}) == 1:
        tail += 1
    labels = {m: "".join(p[head:len(p) - tail]).strip("/-_") for m, p in zip(names, pieces)}
    if len(set(labels.values())) < len(names) or not all(labels.values()):
        return {m: m for m in names}  # stripping would merge two names: keep them whole
    return labels


def spelled_out(labels: dict[str, str], model: str) -> str:
    """``1.5B = Qwen/Qwen2.5-1.5B-Instruct`` where the label is shorter than the name, else the name."""
    return model if labels[model] == model else f"{labels[model]} = {model}"


def legend(labels: dict[str, str]) -> str:
    """``model: 1.5B = Qwen/Qwen2.5-1.5B-Instruct, ...``; empty where no label is shortened."""
    shortened = [m for m, short in labels.items() if short != m]
    return ("model: " + ", ".join(spelled_out(labels, m) for m in shortened)) if shortened else ""
