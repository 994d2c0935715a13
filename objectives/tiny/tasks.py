"""The tiny world's tasks: seeded multi-step arithmetic, its text format and its judge.

Standard library only. A CPU-scale stand-in for GSM8K-style GRPO post-training: problems are
generated procedurally, a real tiny model is trained on them, and every score is exact.

Text format (GSM8K convention, one arithmetic step a line, the final answer after ``#### ``)::

    prompt      "23+45-12\\n"                     the expression, then a newline
    completion  "23+45=68\\n68-12=56\\n#### 56"    one step a line, then the final answer

* **Evaluation is strictly left to right, without precedence**: ``a op1 b op2 c`` means
  ``(a op1 b) op2 c``, also with ``*`` (``3+4*2`` is ``14``). The worked solution makes the
  order explicit, so the model never has to guess it.
* Operands in the prompt are non-negative integers written in decimal without a sign or
  leading zeros. Running values (the left operand and result of a step) may be negative
  only when :attr:`TaskSpec.allow_negative` is true; a negative value is written with a
  leading ``-`` (``68-99=-31``, ``-31+5=-26``).
* The alphabet is :data:`CHARS` (digits, ``+ - * = #``, space, newline); the tokenizer
  (:func:`objectives.tiny.models.build_tokenizer`) has one token per character plus
  :data:`SPECIAL_TOKENS`.

Splits (:data:`SPLITS`): ``train`` and ``native`` come from the same distribution (2-4 steps,
operands 0-99, ``+``/``-``, no negative values). ``downstream`` is harder: only 4-step
problems, the longest of that range. The three are disjoint by construction, whatever the
seeds and sizes: a prompt's sha256 bucket (:func:`holdout_bucket`, one of
:data:`NATIVE_BUCKETS`) is 0 for ``native``, 1 for ``downstream`` and 2-9 for ``train``.
Problems are unique within a split.

Why 2-4 steps in training (measured by the tiny world's build): a policy SFT'd on 2-step
problems only could not copy a 3- or 4-step prompt at all (downstream pass@1 0.000 greedy);
trained on 2-4 steps it reached 0.335 greedy on 3-4-step problems.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence

# =========================================================================== alphabet
CHARS: str = "0123456789+-*=# \n"
"""Every character the prompts and completions use, in tokenizer order."""
PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, STEP_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<bos>", "<step>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, STEP_TOKEN, UNK_TOKEN)
"""Special tokens, ids 0-4 in this order; characters follow from id 5. ``<step>`` marks the
end of a step for step-level reward models (:func:`mark_steps`)."""
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(CHARS)
"""The whole vocabulary: token id ``i`` is ``VOCAB[i]`` (22 tokens)."""
ANSWER_MARKER = "#### "
OPERATORS: tuple[str, ...] = ("+", "-", "*")


class Step(NamedTuple):
    """One arithmetic step ``a op b = result`` (ints; ``op`` one of ``+ - *``)."""

    a: int
    op: str
    b: int
    result: int


def apply(a: int, op: str, b: int) -> int:
    """``a op b`` for ``op`` in ``+ - *``. Raises ``ValueError`` for another operator."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"op={op!r}: must be one of + - *")


# =========================================================================== problems
@dataclass(frozen=True)
class TaskSpec:
    """The distribution of one split's problems. Ranges are inclusive."""

    num_steps: tuple[int, int] = (2, 2)
    """``(min, max)`` steps a problem has (operators in the prompt); drawn uniformly."""
    operand_range: tuple[int, int] = (0, 99)
    """``(min, max)`` of every operand written in the prompt, drawn uniformly (``>= 0``)."""
    operators: tuple[str, ...] = ("+", "-")
    """Operators drawn uniformly for each step, from ``+ - *``."""
    mul_operand_max: int = 9
    """Right operand of a ``*`` step is drawn from ``[min operand, mul_operand_max]`` instead
    (small factors keep the numbers short). Needs ``mul_operand_max >= operand_range[0]``."""
    allow_negative: bool = False
    """Whether running values may go below 0. When false, a step ``(op, b)`` whose result
    would be negative is drawn again (``+`` always qualifies, so this ends)."""

    def __post_init__(self) -> None:
        for name in ("num_steps", "operand_range"):  # TOML gives lists
            v = getattr(self, name)
            if not isinstance(v, (tuple, list)) or len(v) != 2 or not all(
                    isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise ValueError(f"{name}={v!r}: must be a pair of integers (min, max)")
            object.__setattr__(self, name, tuple(v))
        object.__setattr__(self, "operators", tuple(self.operators))  # "+-" or a list
        lo, hi = self.num_steps
        if not 1 <= lo <= hi:
            raise ValueError(f"num_steps={self.num_steps!r}: need 1 <= min <= max")
        lo, hi = self.operand_range
        if not 0 <= lo <= hi:
            raise ValueError(f"operand_range={self.operand_range!r}: need 0 <= min <= max")
        if not self.operators or any(op not in OPERATORS for op in self.operators) \
                or len(set(self.operators)) != len(self.operators):
            raise ValueError(f"operators={self.operators!r}: a non-empty set of distinct "
                             f"operators from {' '.join(OPERATORS)}")
        if "*" in self.operators and not (isinstance(self.mul_operand_max, int)
                                          and self.mul_operand_max >= self.operand_range[0]):
            raise ValueError(f"mul_operand_max={self.mul_operand_max!r}: must be an integer "
                             f">= operand_range min ({self.operand_range[0]})")
        if not self.allow_negative and self.operators == ("-",) and self.operand_range[0] > 0:
            raise ValueError("operators=('-',) with allow_negative=False and a positive minimum "
                             "operand: values would go negative; add '+' or allow_negative")


@dataclass(frozen=True)
class Problem:
    """One generated problem: prompt, worked solution, final answer and its steps."""

    prompt: str
    """The expression and a newline, e.g. ``"23+45-12\\n"``."""
    solution: str
    """The worked completion, e.g. ``"23+45=68\\n68-12=56\\n#### 56"`` (no EOS token)."""
    answer: str
    """The final value, decimal (``"56"``, ``"-3"``)."""
    steps: tuple[Step, ...]
    """The steps in order, each ``(a, op, b, result)``; ``steps[i].a == steps[i-1].result``."""

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def make_problem(operands: Sequence[int], operators: Sequence[str]) -> Problem:
    """The problem ``operands[0] operators[0] operands[1] ...`` evaluated left to right.

    Raises ``ValueError`` unless ``len(operands) == len(operators) + 1 >= 2``.
    """
    if len(operands) != len(operators) + 1 or not operators:
        raise ValueError(f"operands={list(operands)!r}, operators={list(operators)!r}: "
                         "need one more operand than operators, and at least one operator")
    steps, value = [], operands[0]
    for op, b in zip(operators, operands[1:]):
        result = apply(value, op, b)
        steps.append(Step(value, op, b, result))
        value = result
    expression = str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(operators, operands[1:]))
    lines = [f"{s.a}{s.op}{s.b}={s.result}" for s in steps]
    return Problem(prompt=expression + "\n",
                   solution="\n".join(lines) + f"\n{ANSWER_MARKER}{value}",
                   answer=str(value), steps=tuple(steps))


def sample_problem(spec: TaskSpec, rng: random.Random) -> Problem:
    """One problem drawn from ``spec`` with ``rng`` (the only source of randomness)."""
    lo, hi = spec.operand_range
    num_steps = rng.randint(*spec.num_steps)
    operands, operators = [rng.randint(lo, hi)], []
    value = operands[0]
    for _ in range(num_steps):
        while True:
            op = rng.choice(spec.operators)
            b = rng.randint(lo, spec.mul_operand_max if op == "*" else hi)
            result = apply(value, op, b)
            if spec.allow_negative or result >= 0:
                break
        operands.append(b)
        operators.append(op)
        value = result
    return make_problem(operands, operators)


# ============================================================================= splits
SPLITS: dict[str, TaskSpec] = {
    "train": TaskSpec(num_steps=(2, 4), operand_range=(0, 99), operators=("+", "-")),
    "native": TaskSpec(num_steps=(2, 4), operand_range=(0, 99), operators=("+", "-")),
    "downstream": TaskSpec(num_steps=(4, 4), operand_range=(0, 99), operators=("+", "-")),
}
"""Each split's distribution. ``native`` is ``train``'s (scored with the native reward)."""
SPLIT_SIZES: dict[str, int] = {"train": 20_000, "native": 2_000, "downstream": 2_000}
"""Default number of problems of each split."""
NATIVE_BUCKETS = 10
"""``native`` holds the prompts whose :func:`holdout_bucket` is 0 (a tenth of the prompt
space), ``train`` all others."""


def holdout_bucket(prompt: str) -> int:
    """``int(sha256(prompt)[:8]) mod NATIVE_BUCKETS``: a seed-free split of the prompt space."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % NATIVE_BUCKETS


_ACCEPT: dict[str, Callable[[str], bool]] = {
    "train": lambda p: holdout_bucket(p) > 1,
    "native": lambda p: holdout_bucket(p) == 0,
    "downstream": lambda p: holdout_bucket(p) == 1,
}


def split_seed(name: str, seed: int) -> int:
    """The ``random.Random`` seed of split ``name`` at ``seed``: different splits draw from
    different streams even at the same ``seed`` (first 8 bytes of ``sha256("name:seed")``)."""
    return int.from_bytes(hashlib.sha256(f"{name}:{seed}".encode()).digest()[:8], "big")


def generate(spec: TaskSpec, n: int, seed: int,
             accept: Callable[[str], bool] = lambda prompt: True) -> list[Problem]:
    """``n`` distinct problems (distinct prompts) from ``spec`` whose prompt ``accept`` keeps.

    Deterministic in ``(spec, n, seed, accept)``; a longer list extends a shorter one.
    Raises ``ValueError`` when ``n < 0`` or when ``100·n + 10000`` draws do not give ``n``
    distinct accepted prompts (the spec's prompt space is too small).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r}: must be a non-negative integer")
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    for _ in range(100 * n + 10_000):
        if len(problems) == n:
            return problems
        problem = sample_problem(spec, rng)
        if problem.prompt in seen or not accept(problem.prompt):
            continue
        seen.add(problem.prompt)
        problems.append(problem)
    if len(problems) == n:
        return problems
    raise ValueError(f"n={n}: only {len(problems)} distinct problems found for {spec}")


def make_split(name: str, n: int | None = None, seed: int = 0) -> list[Problem]:
    """Split ``name`` (``train``, ``native``, ``downstream``): ``n`` problems (default
    :data:`SPLIT_SIZES`), deterministic per ``seed``. Raises ``ValueError`` for an unknown name."""
    if name not in SPLITS:
        raise ValueError(f"split={name!r}: must be one of {', '.join(SPLITS)}")
    n = SPLIT_SIZES[name] if n is None else n
    return generate(SPLITS[name], n, split_seed(name, seed), _ACCEPT[name])


def checksum(problems: Iterable[Problem]) -> str:
    """sha256 hex digest of the problems' prompts and solutions, each
    ``prompt + solution + "\\x00"``, concatenated in order: stable across runs and machines."""
    h = hashlib.sha256()
    for p in problems:
        h.update((p.prompt + p.solution + "\x00").encode("utf-8"))
    return h.hexdigest()


# ============================================================================= parsing
_STEP_RE = re.compile(r"^\s*(-?\d+)\s*([+*-])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")
_PROMPT_RE = re.compile(r"^\s*(\d+)((?:\s*[+*-]\s*\d+)+)\s*=?\s*$")
_INT_RE = re.compile(r"^-?\d+$")


def parse_prompt(prompt: str) -> tuple[list[int], list[str]] | None:
    """``(operands, operators)`` of a prompt such as ``"23+45-12\\n"``, or ``None`` if it is
    not an expression of non-negative integers joined by ``+ - *``."""
    m = _PROMPT_RE.match(prompt)
    if m is None:
        return None
    pairs = re.findall(r"([+*-])\s*(\d+)", m.group(2))
    return [int(m.group(1))] + [int(b) for _, b in pairs], [op for op, _ in pairs]


def final_answer(completion: str) -> str | None:
    """The text after the last ``#### `` up to the end of that line, stripped; ``None`` when
    there is no ``#### ``. Lines after the answer line are ignored."""
    i = completion.rfind(ANSWER_MARKER)
    if i < 0:
        return None
    return completion[i + len(ANSWER_MARKER):].split("\n", 1)[0].strip()


def _step_lines(completion: str) -> list[str]:
    """Non-blank lines before the line holding the last ``#### `` (all lines if none)."""
    i = completion.rfind(ANSWER_MARKER)
    head = completion if i < 0 else completion[:i]
    if i >= 0 and "\n" not in head:
        return []  # the answer is on the first line
    if i >= 0:
        head = head.rsplit("\n", 1)[0]  # drop the answer line's own start
    return [line for line in head.split("\n") if line.strip()]


def parse_steps(completion: str) -> list[Step | None]:
    """One entry per step line of ``completion``: a :class:`Step`, or ``None`` for a line that
    is not ``a op b = c`` (ints, optional spaces, ``op`` in ``+ - *``).

    Step lines are the non-blank lines before the line holding the last ``#### `` (every
    non-blank line when there is no ``#### ``). The arithmetic is not checked here.
    """
    steps: list[Step | None] = []
    for line in _step_lines(completion):
        m = _STEP_RE.match(line)
        steps.append(None if m is None else Step(int(m.group(1)), m.group(2), int(m.group(3)),
                                                 int(m.group(4))))
    return steps


def step_labels(completion: str, prompt: str | None = None) -> list[bool]:
    """Whether each step of ``completion`` is correct (the process labels of a PRM).

    Step ``i`` (0-based, as :func:`parse_steps` lists them) is correct when all hold:

    1. it parses as ``a op b = c``;
    2. the equation holds: ``c == a op b``;
    3. it continues the chain: ``a`` is the result *written* in step ``i-1`` (so one error is
       counted once: a later step that builds correctly on a wrong value is correct); for
       ``i = 0``, ``a`` is the prompt's first operand;
    4. it follows the prompt: ``op`` and ``b`` are the prompt's ``i``-th operator and operand
       (a step beyond the prompt's last operator is wrong).

    With ``prompt=None`` (or an unparsable prompt) only 1-3 are checked, and step 0's left
    operand is free. With a prompt of ``K`` operators, steps the completion leaves out count
    as wrong: the list is padded with ``False`` to length ``K``.
    """
    parsed = parse_prompt(prompt) if prompt is not None else None
    labels: list[bool] = []
    previous: int | None = parsed[0][0] if parsed else None
    for i, step in enumerate(parse_steps(completion)):
        if step is None:
            labels.append(False)
            previous = None  # nothing to chain on: the next step's left operand is free
            continue
        ok = apply(step.a, step.op, step.b) == step.result
        ok = ok and (previous is None and (i > 0 or parsed is None) or step.a == previous)
        if parsed:
            operands, operators = parsed
            ok = ok and i < len(operators) and (step.op, step.b) == (operators[i], operands[i + 1])
        labels.append(ok)
        previous = step.result
    if parsed:
        labels += [False] * (len(parsed[1]) - len(labels))
    return labels


def judge(completion: str, prompt: str | None = None) -> float:
    """Process-quality score in ``[0, 1]``: the share of correct steps (:func:`step_labels`).

    The denominator is the number of step lines written, or ``max(written, K)`` when the
    prompt (``K`` operators) is given, so skipped steps count as wrong. No steps: 0.0.
    The final answer is not looked at (that is :func:`is_correct`).
    """
    labels = step_labels(completion, prompt)
    return sum(labels) / len(labels) if labels else 0.0


def is_correct(completion: str, problem: Problem) -> bool:
    """Whether :func:`final_answer` is an integer equal to ``problem.answer`` (``"056"`` and
    ``"56"`` are equal; ``"56.0"`` is not an integer and is wrong)."""
    answer = final_answer(completion)
    return answer is not None and _INT_RE.match(answer) is not None \
        and int(answer) == int(problem.answer)


def mark_steps(completion: str) -> str:
    """``completion`` with :data:`STEP_TOKEN` at the end of every step line (the input a
    step-level reward model reads: its score at each marker judges that step). Exactly the
    lines :func:`parse_steps` lists get a marker (not blank lines, not the final-answer line),
    so the markers line up with :func:`step_labels` up to the steps the completion left out."""
    lines = completion.split("\n")
    num_marked, to_mark = 0, len(_step_lines(completion))
    out = []
    for line in lines:
        if num_marked < to_mark and line.strip():
            line += STEP_TOKEN
            num_marked += 1
        out.append(line)
    return "\n".join(out)
