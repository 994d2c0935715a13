"""Training prompts: Polaris-53K, rendered with the policy's chat template, and a held-out slice.

* :func:`load_polaris` reads ``POLARIS-Project/Polaris-Dataset-53K`` (columns ``problem``,
  ``answer``, ``difficulty``; its dataset card) by dataset id with ``datasets`` (network or HF
  cache; :func:`allocopt.resources.resolve` fails in seconds offline), or a local ``.jsonl`` /
  ``.parquet`` file, or a folder holding ``train.jsonl`` / ``train.parquet``. The tests read
  ``objectives/data/polaris_sample/train.jsonl``, a Polaris-shaped slice of GSM8K and MATH-500
  (not Polaris; see ``objectives/data/README.md``).
* :func:`split_heldout` draws a seeded held-out slice (scored for ``native_reward``, never
  trained on) and returns the rest for training.
* :func:`render_prompt` wraps a problem in the policy's chat template with one fixed
  instruction, :data:`INSTRUCTION`.
* :func:`measure_prompt_tokens` measures prompt lengths on a seeded sample with the policy's
  tokenizer.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from allocopt.flops import ConfigError

POLARIS_ID = "POLARIS-Project/Polaris-Dataset-53K"
POLARIS_ROWS = 53_291
"""Rows of ``POLARIS-Project/Polaris-Dataset-53K`` (its train split), for plans made offline."""
"""Public dataset id of the training set (split ``train``)."""
SAMPLE_PATH = Path(__file__).parent / "polaris_sample" / "train.jsonl"
"""The shipped Polaris-shaped test slice (GSM8K + MATH-500 rows; not Polaris)."""
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The one instruction appended to every problem (Qwen2.5-Math's own wording)."""


@dataclass(frozen=True)
class PromptRow:
    """One training or held-out problem."""

    problem: str
    """The problem statement (Polaris ``problem``)."""
    answer: str
    """The gold final answer (Polaris ``answer``; LaTeX or a number)."""
    difficulty: str = ""
    """Polaris ``difficulty`` (pass rate of a reference model, e.g. ``"6/8"``)."""


def load_polaris(source: str = POLARIS_ID, *, limit: int | None = None) -> list[PromptRow]:
    """Polaris-53K rows (or any file with its columns).

    Args:
        source: a dataset id (``POLARIS-Project/Polaris-Dataset-53K``), a ``.jsonl`` or
            ``.parquet`` file, or a folder with ``train.jsonl`` / ``train.parquet``.
        limit: keep only the first ``limit`` rows.

    Raises:
        ConfigError: the source is missing (offline: within seconds), a row lacks ``problem`` or
            ``answer`` (one line naming the row and the field).
    """
    from allocopt.resources import resolve

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r}: must be a positive integer or None")
    where = resolve(source, "dataset", field="dataset")
    p = Path(where)
    if p.is_dir():
        found = [p / n for n in ("train.jsonl", "train.parquet") if (p / n).is_file()]
        found += sorted(p.glob("**/*.parquet")) + sorted(p.glob("**/*.jsonl"))
        if not found:
            raise ConfigError(f"dataset={source!r}: folder has no train.jsonl or .parquet file")
        p = found[0]
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw: Sequence[dict[str, Any]] = pq.read_table(p).to_pylist()
    elif p.suffix in (".jsonl", ".json"):
        raw = _read_jsonl(p)
    elif p.exists():
        raise ConfigError(f"dataset={source!r}: expected a .jsonl or .parquet file")
    else:  # a hub id the hub confirmed: load it with datasets
        from datasets import load_dataset

        raw = load_dataset(where, split="train")
    rows = []
    for i, r in enumerate(raw):
        if limit is not None and i >= limit:
            break
        for key in ("problem", "answer"):
            if not isinstance(r.get(key), (str, int, float)) or str(r.get(key)).strip() == "":
                raise ConfigError(f"dataset={source!r}: row {i + 1} has no {key!r} "
                                  "(Polaris columns: problem, answer, difficulty)")
        rows.append(PromptRow(str(r["problem"]), str(r["answer"]).strip(), str(r.get("difficulty", ""))))
    if not rows:
        raise ConfigError(f"dataset={source!r}: no rows")
    return rows


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"dataset={str(path)!r}: line {n} is not JSON ({e.msg})") from None
    return out


def split_heldout(rows: Sequence[PromptRow], num_heldout: int, seed: int = 0) -> tuple[list[PromptRow], list[PromptRow]]:
    """``(train, heldout)``: a seeded draw of ``num_heldout`` rows held out, the rest in their
    order. The same rows and seed give the same split in every trial.

    Raises:
        ConfigError: ``num_heldout`` leaves fewer than one training row.
    """
    if not 0 <= num_heldout < len(rows):
        raise ConfigError(f"heldout_problems={num_heldout!r}: must be in [0, {len(rows) - 1}] "
                          f"for a dataset of {len(rows)} rows")
    held = set(random.Random(seed).sample(range(len(rows)), num_heldout))
    return ([r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)])


def render_prompt(tokenizer: Any, problem: str) -> str:
    """The problem with :data:`INSTRUCTION` as one user turn of the policy's chat template,
    ready for the assistant's answer (``add_generation_prompt=True``).

    Raises:
        ConfigError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(f"model={name!r}: its tokenizer has no chat template (tokenizer_config.json "
                          "'chat_template'); use an -Instruct model or add one")
    messages = [{"role": "user", "content": f"{problem}\n\n{INSTRUCTION}"}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def measure_prompt_tokens(tokenizer: Any, problems: Sequence[str], *, sample: int = 256,
                          seed: int = 0) -> tuple[float, int]:
    """``(mean, max)`` rendered prompt length in tokens over a seeded sample of ``sample``
    problems (all of them when fewer), with the policy's tokenizer (no special tokens added:
    the template holds them)."""
    idx = random.Random(seed).sample(range(len(problems)), min(sample, len(problems)))
    lengths = [len(tokenizer(render_prompt(tokenizer, problems[i]), add_special_tokens=False)["input_ids"])
               for i in idx]
    return statistics.fmean(lengths), max(lengths)


__all__ = ["INSTRUCTION", "POLARIS_ID", "PromptRow", "SAMPLE_PATH", "load_polaris",
           "measure_prompt_tokens", "render_prompt", "split_heldout"]
