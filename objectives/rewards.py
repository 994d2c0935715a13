"""The five reward systems: ``sparse``, ``structured``, ``dense`` (rule-based), ``proxy_prm``,
``prm`` (model-based step scorers).

Every reward system is a TRL reward function (``reward(prompts=..., completions=..., **columns)
-> list[float]``, one float per completion, with a ``__name__``) that also reports what it
cost (:class:`RewardUsage`, read and reset with ``consume_usage()``):

========== ============ ==========================================================================
name       FLOPs        reward of one completion (gold: the ``answer`` column)
========== ============ ==========================================================================
sparse     0            ``1[correct]``
structured 0            ``0.2·1[well formed] + 0.8·1[correct]``
dense      0            ``0.5·(correct steps / steps) + 0.5·1[correct]`` (0 steps: first term 0)
proxy_prm  model        ``mean`` (or ``min``) over steps of ``P(label 1)`` at the step's marker
prm        model        same, with the full-size process reward model
========== ============ ==========================================================================

Text convention (``objectives.mathdata``): one step per line; an arithmetic step holds an
equation such as ``23+45=68``, ``48/2 = 24`` or GSM8K's ``<<48/2=24>>``; the final answer
follows ``#### `` on the last line (or sits in ``\\boxed{}``). *Correct* means
``answers_match(extract_final_answer(completion), gold)``.

Rule-based rewards cost 0 FLOPs (``shared/DESIGN.md`` §2, C_reward); their wall time is still
measured. :class:`ModelReward` counts the FLOPs of exactly what it runs, useful and executed
(``shared/DESIGN.md`` §3). torch and transformers are imported only by the model-based path.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from objectives.mathdata import answers_match, extract_final_answer

if TYPE_CHECKING:  # pragma: no cover
    from allocopt.flops import FlopAccount, ModelShape

REWARD_NAMES: tuple[str, ...] = ("sparse", "structured", "dense", "proxy_prm", "prm")
RULE_BASED: tuple[str, ...] = ("sparse", "structured", "dense")
MODEL_BASED: tuple[str, ...] = ("proxy_prm", "prm")


# ===================================================================== usage
@dataclass(frozen=True)
class RewardUsage:
    """What a reward system spent since its last ``consume_usage()``. Usages add (``a + b``)."""

    useful_flops: int = 0
    """FLOPs of the real tokens (prompt + completion + one marker per step), causal attention."""
    executed_flops: int = 0
    """FLOPs the engine computed: padded batch shapes, attention as executed (budgets charge these)."""
    wall_seconds: float = 0.0
    """Wall-clock seconds spent inside the reward calls."""
    num_completions: int = 0
    """Completions scored."""
    num_tokens: int = 0
    """Real tokens read by the reward model (markers included); 0 for rule-based rewards."""

    def __add__(self, other: "RewardUsage") -> "RewardUsage":
        if not isinstance(other, RewardUsage):
            return NotImplemented
        return RewardUsage(*(getattr(self, f.name) + getattr(other, f.name)
                             for f in dataclasses.fields(self)))

    def account(self) -> "FlopAccount":
        """As an :class:`allocopt.flops.FlopAccount` with one reward item ``reward_model``."""
        from allocopt.flops import ComputeBreakdown, FlopAccount

        return FlopAccount(useful=ComputeBreakdown(reward={"reward_model": self.useful_flops}),
                           executed=ComputeBreakdown(reward={"reward_model": self.executed_flops}))


@runtime_checkable
class RewardSystem(Protocol):
    """The interface shared by all five reward systems (a TRL reward function)."""

    name: str
    """``sparse``, ``structured``, ``dense``, ``proxy_prm`` or ``prm``."""
    model_based: bool
    """Whether it runs a model (and so spends reward FLOPs)."""
    __name__: str

    def __call__(self, prompts: list[Any], completions: list[Any], answer: list[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        """One reward per completion. Prompts and completions are strings or TRL conversational
        message lists; ``answer`` is the gold final answer column; other TRL kwargs ignored."""
        ...

    def consume_usage(self) -> RewardUsage:
        """FLOPs and wall time since the last call of this method; resets them."""
        ...


class _Base:
    """Usage bookkeeping shared by the implementations (thread-safe)."""

    name: str = ""
    model_based: bool = False

    def __init__(self) -> None:
        self.__name__ = self.name  # TRL names reward columns after it
        self._usage = RewardUsage()
        self._lock = threading.Lock()

    def _paired(self, prompts: list[Any] | None, completions: list[Any] | None) -> tuple[list[Any], list[Any]]:
        """``(prompts, completions)`` as lists of one prompt per completion (no prompts: empty
        strings). Raises ``ValueError`` (one line) when the counts differ."""
        completions = list(completions or [])
        prompts = list(prompts) if prompts is not None else [""] * len(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"reward={self.name!r}: got {len(prompts)} prompts but "
                             f"{len(completions)} completions; need one prompt per completion")
        return prompts, completions

    def _add_usage(self, usage: RewardUsage) -> None:
        with self._lock:
            self._usage = self._usage + usage

    def consume_usage(self) -> RewardUsage:
        with self._lock:
            usage, self._usage = self._usage, RewardUsage()
        return usage

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def as_text(item: Any) -> str:
    """Text of a prompt or completion: a string as is; a TRL conversational list of
    ``{"role", "content"}`` messages as its contents joined by newlines; None as ``""``."""
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return as_text(item.get("content"))
    if isinstance(item, (list, tuple)):
        return "\n".join(as_text(m) for m in item)
    return str(item)


# ================================================================ step parsing
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"  # 1,250.5 | 12 | 3.5 | .5
_TOKEN_RE = re.compile(rf"[ \t$]*(?:((?:{_NUM})%?)|([-+*/()]))")
_EXPR_CHARS = frozenset("0123456789.,%$+-*/() \t")
_TIMES_RE = re.compile(r"(?<=[\d)%])[ \t]*[x×][ \t]*(?=[\d(.$])")
_FINAL_RE = re.compile(r"^\s*####[ \t]*\S")
FINAL_MARKER = "#### "
"""What starts the final-answer line (GSM8K convention)."""
MAX_EXPR_CHARS = 1000
"""Equations with a side longer than this (characters) count as wrong, unevaluated."""


@dataclass(frozen=True)
class Equation:
    """One arithmetic equation found in a step, e.g. ``48/2=24``."""

    lhs: str
    """The expression left of ``=`` (it holds at least one binary operator)."""
    rhs: str
    """The expression right of ``=`` (usually one number)."""
    correct: bool
    """Whether ``lhs`` equals ``rhs``, or ``rhs``'s first number (a running result, as in
    ``1+1=2+1=3``). Exact rational arithmetic; a number with ``k`` decimals is also right
    when within half a unit of its last place of the exact value (``10/3=3.33``). Division
    by zero or a side too long to evaluate: False."""


def find_equations(line: str) -> list[Equation]:
    """The arithmetic equations in one line of text. Never raises.

    Each ``=`` splits the run of arithmetic characters around it (digits, ``. , % $``,
    ``+ - * /``, parentheses, spaces; ``×``, ``÷`` and ``x`` between numbers read as ``*`` and
    ``/``) into a left and a right expression. Grammar: ``+ - * /`` with the usual precedence,
    unary minus, parentheses, implicit products ``2(3+4)``, ``(1/4)24``, mixed numbers
    ``3 1/2``, percentages ``50%`` (= 0.5), thousands commas, ``$`` ignored. Prose before the
    left expression is dropped (``She sells 16 - 3 - 4 = 9 eggs`` gives ``16 - 3 - 4 = 9``).

    It is an equation when both sides parse and the left one holds a binary operator: GSM8K's
    ``16 - 3 - 4 = <<16-3-4=9>>9`` yields one (``16-3-4=9``); ``x = 5``, ``= 5``, ``3x + 4 = 10``
    (algebra: the left side continues a word) and ``30*=90`` yield none.
    """
    line = _TIMES_RE.sub("*", line.replace("÷", "/").replace("−", "-").replace("–", "-"))
    out = []
    for m in re.finditer("=", line):
        eq = m.start()
        start = eq
        while start > 0 and line[start - 1] in _EXPR_CHARS:
            start -= 1
        end = eq + 1
        while end < len(line) and line[end] in _EXPR_CHARS:
            end += 1
        run = line[start:eq]
        if start > 0 and line[start - 1].isalnum() and run.strip()[:1] in ("+", "-", "*", "/"):
            continue  # "3x + 4 = 10": the expression began inside a word
        lhs, ltok = _parse_side(run, from_left=True)
        rhs, rtok = _parse_side(line[eq + 1:end], from_left=False)
        if not ltok or not rtok or not _has_binary_op(ltok):
            continue
        correct = _check(ltok, rtok, len(lhs) + len(rhs))
        if correct is not None:
            out.append(Equation(lhs=lhs, rhs=rhs, correct=correct))
    return out


def _tokens(s: str) -> tuple[list[str], int]:
    """Tokens of ``s`` and the position where tokenizing stopped (``len(s)``: all of it)."""
    tokens, pos = [], 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if m is None:
            break
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens, pos


def _parse_side(run: str, *, from_left: bool) -> tuple[str, list[str] | None]:
    """The expression of one side of ``=`` and its tokens; ``(…, None)`` if there is none.

    Left side: the expression that *ends* the run (prose, stray operators and ``(`` before
    it dropped). Right side: the expression that *starts* the run (cut where it stops parsing).
    """
    s = run
    while True:
        s = s.strip(" \t$")
        if from_left:
            while s and (s[0] in ",+*/)%" or (s[0] == "." and not s[1:2].isdigit())
                         or (s[0] == "(" and s.count("(") > s.count(")"))):
                s = s[1:].lstrip(" \t$")
        else:
            s = s.rstrip(" \t$.,+-*/(")
            while s.endswith(")") and s.count(")") > s.count("("):
                s = s[:-1].rstrip()
        if not s:
            return "", None
        tokens, pos = _tokens(s)
        if pos >= len(s.rstrip()):
            return s, tokens
        s = s[pos + 1:] if from_left else s[:pos]  # drop what does not parse, retry


def _has_binary_op(tokens: list[str]) -> bool:
    prev_operand = False
    for t in tokens:
        if t in ("+", "-", "*", "/") and prev_operand:
            return True
        prev_operand = t not in ("+", "-", "*", "/", "(")
    return False


def _check(ltok: list[str], rtok: list[str], size: int) -> bool | None:
    """True/False; None when a side is not a well-formed expression (not an equation)."""
    if size > MAX_EXPR_CHARS:
        return False
    try:
        lhs, rhs = _Evaluator(ltok).run(), _Evaluator(rtok).run()
    except _Malformed:
        return None
    except (ZeroDivisionError, ValueError, OverflowError, RecursionError):
        return False
    if lhs == rhs or _rounds_to(lhs, rtok):
        return True
    first = rtok[1] if rtok[0] == "-" and len(rtok) > 1 else rtok[0]
    if first[:1].isdigit() or first[:1] == ".":  # running result: 1+1=2+1=3
        value = _number(first) * (-1 if rtok[0] == "-" else 1)
        return value == lhs or _rounds_to(lhs, [first])
    return False


def _rounds_to(exact: Fraction, tokens: list[str]) -> bool:
    """Whether a one-number side with ``k`` decimals is ``exact`` rounded to ``k`` places."""
    toks = tokens[1:] if tokens[:1] == ["-"] else tokens
    if len(toks) != 1 or "." not in toks[0]:
        return False
    k = len(toks[0].rstrip("%").split(".")[1])
    value = _number(toks[0]) * (-1 if tokens[:1] == ["-"] else 1)
    scale = Fraction(1, 100) if toks[0].endswith("%") else 1
    return abs(exact - value) <= Fraction(1, 2 * 10 ** k) * scale


def _number(token: str) -> Fraction:
    if token.endswith("%"):
        return Fraction(token[:-1].replace(",", "")) / 100
    return Fraction(token.replace(",", ""))


class _Malformed(Exception):
    """The tokens are not an expression of the grammar."""


class _Evaluator:
    """Exact rational evaluation: ``+ - * /``, unary minus, parentheses, implicit products,
    mixed numbers (recursive descent)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def run(self) -> Fraction:
        value = self.expr()
        if self.i != len(self.tokens):
            raise _Malformed
        return value

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else None

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.i]
            self.i += 1
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while True:
            t = self.peek()
            if t in ("*", "/"):
                self.i += 1
                value = value * self.unary() if t == "*" else value / self.unary()
            elif t == "(" or (t is not None and _is_num(t) and self.tokens[self.i - 1] == ")"):
                value = value * self.unary()  # implicit product: 2(3+4), (1/4)24
            else:
                return value

    def unary(self) -> Fraction:
        t = self.peek()
        if t in ("-", "+"):
            self.i += 1
            return -self.unary() if t == "-" else self.unary()
        if t == "(":
            self.i += 1
            value = self.expr()
            if self.peek() != ")":
                raise _Malformed
            self.i += 1
            return value
        if t is None or not _is_num(t):
            raise _Malformed
        self.i += 1
        value = _number(t)
        a, slash, b = self.peek(), self.peek(1), self.peek(2)
        if (a is not None and b is not None and slash == "/" and a.isdigit() and b.isdigit()
                and t.isdigit() and self.peek(3) not in ("*", "/", "(")):
            self.i += 3  # mixed number 3 1/2
            value += Fraction(int(a), int(b))
        return value


def _is_num(token: str) -> bool:
    return token[:1].isdigit() or token[:1] == "."


def split_steps(completion: str) -> list[str]:
    """Non-empty lines of a completion, stripped (one step per line)."""
    return [line.strip() for line in completion.splitlines() if line.strip()]


def step_line_ends(completion: str) -> list[int]:
    """Offsets in ``completion`` where its step lines end, for step markers.

    Step lines: the non-blank lines before the line holding the last ``#### `` (every
    non-blank line when there is none; none when the answer is on the first line), as
    :func:`objectives.tiny_tasks.parse_steps` defines them.
    """
    i = completion.rfind(FINAL_MARKER)
    last = len(completion) if i < 0 else completion.rfind("\n", 0, i)
    ends, start = [], 0
    while start <= last and start < len(completion):
        nl = completion.find("\n", start)
        end = len(completion) if nl < 0 else nl
        if end > last and i >= 0:
            break
        if completion[start:end].strip():
            ends.append(end)
        start = end + 1
    return ends


def is_final_line(line: str) -> bool:
    """Whether a line is a final-answer line ``#### <answer>`` (answer not empty)."""
    return bool(_FINAL_RE.match(line))


def is_well_formed(completion: str) -> bool:
    """The format rule of ``structured``, either convention (blank lines ignored):

    * ``####`` (GSM8K, the tiny world): the last non-empty line is ``#### <answer>``, it is the
      only ``####`` line, and every other non-empty line is an arithmetic step (holds at least
      one equation, see :func:`find_equations`);
    * ``\boxed`` (the instruction of the ``qwen`` objective: "put your final answer within
      \boxed{}"): the text has exactly one ``\boxed{...}``, with balanced, non-empty content,
      on its last non-empty line; at least one non-empty line of reasoning comes before it
      (prose or LaTeX: real solutions are not all arithmetic); no ``####`` anywhere.
    """
    lines = split_steps(completion)
    if not lines:
        return False
    if is_final_line(lines[-1]):
        return all("####" not in line and find_equations(normalize_latex(line)) for line in lines[:-1])
    if "####" in completion or len(lines) < 2 or len(_BOX_START.findall(completion)) != 1:
        return False
    return _BOX_START.search(lines[-1]) is not None and bool(extract_final_answer(lines[-1]))


_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{([^{}]*)\}")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{[^{}]*\}")
_LATEX_WORDS = ((r"\times", "*"), (r"\cdot", "*"), (r"\ast", "*"), (r"\div", "/"),
                (r"\left", ""), (r"\right", ""), (r"\%", "%"), (r"\$", "$"), (r"\,", " "),
                (r"\;", " "), (r"\!", ""), (r"\:", " "), (r"\quad", " "), (r"\(", " "),
                (r"\)", " "), (r"\[", " "), (r"\]", " "), ("&", " "))


def normalize_latex(line: str) -> str:
    r"""A line of LaTeX as plain arithmetic for :func:`find_equations`: ``\frac{a}{b}`` (and
    ``\dfrac``, ``\tfrac``, nested) → ``((a)/(b))``; ``\times``, ``\cdot`` → ``*``;
    ``\div`` → ``/``; ``\boxed{x}`` → ``x``; ``\text{…}`` dropped; math delimiters
    (``$``, ``\(``, ``\[``), spacing commands, ``\left``/``\right`` and ``&`` dropped; braces
    left over → parentheses. A line without ``\`` or ``$`` is returned as is. Never raises.

    >>> normalize_latex(r"$\frac{3}{4} \times 8 = 6$")
    ' ((3)/(4)) * 8 = 6 '
    """
    if "\\" not in line and "$" not in line:
        return line
    out = _TEXT_RE.sub(" ", line)
    for _ in range(8):  # nested fractions, innermost first
        new = _BOXED_RE.sub(r"\1", _FRAC_RE.sub(r"((\1)/(\2))", out))
        if new == out:
            break
        out = new
    for latex, plain in _LATEX_WORDS:
        out = out.replace(latex, plain)
    return out.replace("$", " ").replace("{", "(").replace("}", ")")


def step_accuracy(completion: str) -> tuple[int, int]:
    """``(correct steps, steps)`` of a completion, for ``dense``.

    A step is a non-empty line other than a ``####`` line that holds at least one equation
    (plain or LaTeX: :func:`normalize_latex`, so ``\\frac{3}{4} \\times 8 = 6`` is one);
    it is correct when all its equations are (:class:`Equation`). Prose lines count as neither.
    """
    correct = total = 0
    for line in split_steps(completion):
        if "####" in line:
            continue
        eqs = find_equations(normalize_latex(line))
        if eqs:
            total += 1
            correct += all(e.correct for e in eqs)
    return correct, total


def is_correct(completion: str, gold: Any) -> bool:
    """Whether the completion's final answer (:func:`~objectives.mathdata.extract_final_answer`)
    matches ``gold``; a gold given as a whole solution (``... #### 18``, ``\\boxed{}``) is
    reduced to its final answer first."""
    gold_text = "" if gold is None else str(gold)
    if "####" in gold_text or "\\boxed" in gold_text:
        gold_text = extract_final_answer(gold_text) or ""
    return answers_match(extract_final_answer(completion), gold_text)


# ============================================================== rule-based
class _RuleReward(_Base):
    """A rule-based reward: 0 FLOPs, wall time measured."""

    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
        start = time.perf_counter()
        completions = list(completions or [])
        if answer is None:
            raise ValueError(f"reward={self.name!r}: needs the gold final answers as the "
                             "'answer' column (keyword answer=[...])")
        answers = [answer] * len(completions) if isinstance(answer, str) else list(answer)
        if len(answers) != len(completions):
            raise ValueError(f"reward={self.name!r}: got {len(completions)} completions but "
                             f"{len(answers)} answers; need one answer per completion")
        rewards = [float(self.score(as_text(c), a)) for c, a in zip(completions, answers)]
        self._add_usage(RewardUsage(wall_seconds=time.perf_counter() - start,
                                    num_completions=len(completions)))
        return rewards

    def score(self, completion: str, gold: Any) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class SparseReward(_RuleReward):
    """``1.0`` if the final answer is correct, else ``0.0``."""

    name = "sparse"

    def score(self, completion: str, gold: Any) -> float:
        return 1.0 if is_correct(completion, gold) else 0.0


class StructuredReward(_RuleReward):
    """Format plus correctness: ``format_weight·1[well formed] + answer_weight·1[correct]``.

    Well formed: :func:`is_well_formed` (steps, then one final ``#### <answer>`` line). With the
    default weights a correct but malformed completion gets 0.8, a well-formed wrong one 0.2.
    """

    name = "structured"

    def __init__(self, format_weight: float = 0.2, answer_weight: float = 0.8) -> None:
        super().__init__()
        _check_weights(self.name, format_weight=format_weight, answer_weight=answer_weight)
        self.format_weight, self.answer_weight = float(format_weight), float(answer_weight)

    def score(self, completion: str, gold: Any) -> float:
        return (self.format_weight * is_well_formed(completion)
                + self.answer_weight * is_correct(completion, gold))


class DenseReward(_RuleReward):
    """Per-step partial credit plus correctness:
    ``step_weight·(correct steps / steps) + answer_weight·1[correct]``.

    Steps and their correctness: :func:`step_accuracy` (a line with arithmetic equations,
    correct when all of them hold). No step: the first term is 0 (work not shown earns
    nothing). Defaults 0.5 / 0.5: a wrong answer reached by correct arithmetic gets 0.5, a right
    answer with every step wrong 0.5. Repeating a correct step raises the share; it is a
    rule-based proxy and can be gamed that way.
    """

    name = "dense"

    def __init__(self, step_weight: float = 0.5, answer_weight: float = 0.5) -> None:
        super().__init__()
        _check_weights(self.name, step_weight=step_weight, answer_weight=answer_weight)
        self.step_weight, self.answer_weight = float(step_weight), float(answer_weight)

    def score(self, completion: str, gold: Any) -> float:
        correct, total = step_accuracy(completion)
        share = correct / total if total else 0.0
        return self.step_weight * share + self.answer_weight * is_correct(completion, gold)


def _check_weights(name: str, **weights: float) -> None:
    for key, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= 1:
            raise ValueError(f"reward={name!r}: {key}={w!r}: must be a number in [0, 1]")
    if abs(sum(weights.values()) - 1) > 1e-9:
        raise ValueError(f"reward={name!r}: {' + '.join(weights)} = {sum(weights.values())}: must sum to 1")


# ============================================================== model-based
Aggregate = Literal["mean", "min", "product"]


class ModelReward(_Base):
    """A process reward model: scores every step of a completion and aggregates.

    The model is a local HF ``*ForTokenClassification`` with ``num_labels=2`` (e.g.
    ``Qwen2ForTokenClassification``; Qwen2.5-Math-PRM's ``[b x t x 2]`` logits also work). Its
    input is ``prompt + completion`` with one ``marker`` token at the end of every step line
    (:func:`step_line_ends`: the non-blank lines before the final ``#### `` line; that line and
    anything after it are read but not marked), e.g. with ``marker="<step>"``::

        "23+45-12\\n" + "23+45=68<step>\\n68-12=56<step>\\n#### 56"

    the layout of :func:`objectives.tiny_tasks.mark_steps`, on which the tiny world's PRMs are
    trained. With ``marker="\\n"`` (the step separator) the newline that ends a step line is
    itself the marker (none is added; a last step line without one gets one). The text is
    tokenized in segments cut at the markers (no special tokens added), so each marker is
    exactly one token whatever the tokenizer merges.

    The step score is ``softmax(logits)[label 1]`` at its marker; the reward is their
    ``aggregate``: ``mean`` (default; smooth, credits partly right work) or ``min`` (a chain is
    as good as its worst step, as in Lightman et al. 2023). A completion without steps gets 0.0
    and is not run. Sequences longer than ``max_length`` are cut at the right; markers cut off
    are not scored (none left: 0.0).

    Batches of ``batch_size`` sequences, longest first, right-padded, run under
    ``torch.inference_mode``. FLOPs (:func:`allocopt.flops.reward_model_flops`, shape from
    ``ModelShape.from_config(model.config.to_dict())``, head ``score``):

    * useful: per sequence, its real tokens with causal attention, the head at every position;
    * executed: per batch, ``rows x padded length`` tokens with ``full`` attention (eager and
      SDPA/math on CPU compute every query-key pair, masked or not; ``causal`` for
      ``flash_attention*`` implementations), the head at every padded position.

    Raises:
        ValueError: the marker is not a single token of the tokenizer, ``aggregate`` or
            ``batch_size`` invalid, or the model does not have 2 labels.
    """

    model_based = True
    num_labels_required = 2
    """Outputs per position the model must have (2: a token classifier)."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "prm", marker: str = "\n",
                 aggregate: Aggregate = "mean", batch_size: int = 8, max_length: int | None = None,
                 positive_label: int = 1) -> None:
        if name not in MODEL_BASED:
            raise ValueError(f"name={name!r}: a model-based reward is one of {', '.join(MODEL_BASED)}")
        self.name = name
        super().__init__()
        if aggregate not in ("mean", "min", "product"):
            raise ValueError(f"aggregate={aggregate!r}: allowed: mean, min, product")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be a positive integer")
        self.model, self.tokenizer = model, tokenizer
        self.marker, self.aggregate, self.batch_size = marker, aggregate, batch_size
        self.positive_label = positive_label
        self.marker_id = _single_token_id(tokenizer, marker)
        config = model.config
        num_labels = getattr(config, "num_labels", 2)
        if num_labels != self.num_labels_required or positive_label not in (0, 1):
            raise ValueError(f"{name}: model has num_labels={num_labels}, positive_label="
                             f"{positive_label}; need a 2-label token classifier and label 0 or 1")
        self.max_length, self.shape, self.executed_attention, self.pad_id = model_facts(
            model, tokenizer, max_length)
        model.eval()

    # ------------------------------------------------------------------- inputs
    def encode(self, prompt: Any, completion: Any) -> tuple[list[int], list[int], int]:
        """``(token ids, marker positions, steps)`` of one prompt + completion, cut at
        ``max_length``; ``steps`` is the number of markers inserted (before the cut)."""
        prompt_text, text = as_text(prompt), as_text(completion)
        ends = step_line_ends(text)
        if not ends:
            return [], [], 0
        ids, positions, start = self._ids(prompt_text), [], 0
        for end in ends:
            ids.extend(self._ids(text[start:end]))
            positions.append(len(ids))
            ids.append(self.marker_id)
            start = end + 1 if self.marker == "\n" and text[end:end + 1] == "\n" else end
        ids.extend(self._ids(text[start:]))
        ids = ids[: self.max_length]
        return ids, [p for p in positions if p < len(ids)], len(ends)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    # ------------------------------------------------------------------- scoring
    def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                 answer: list[Any] | None = None, **kwargs: Any) -> list[float]:
        import torch

        start = time.perf_counter()
        prompts, completions = self._paired(prompts, completions)
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions)]
        rewards = [0.0] * len(encoded)
        todo = sorted((i for i, (_, pos, _) in enumerate(encoded) if pos),
                      key=lambda i: -len(encoded[i][0]))
        useful = executed = num_tokens = 0
        device = _device(self.model)
        for b in range(0, len(todo), self.batch_size):
            rows = todo[b: b + self.batch_size]
            width = max(len(encoded[i][0]) for i in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, i in enumerate(rows):
                seq = encoded[i][0]
                ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[r, : len(seq)] = 1
            with torch.inference_mode():
                out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device))
                logits = out.logits if hasattr(out, "logits") else out[0]
                probs = self.step_probabilities(logits).cpu()
            for r, i in enumerate(rows):
                scores = probs[r, encoded[i][1]]
                rewards[i] = float(scores.mean() if self.aggregate == "mean" else
                                   scores.min() if self.aggregate == "min" else scores.prod())
            executed += len(rows) * self._flops(width, self.executed_attention)
            for i in rows:
                useful += self._flops(len(encoded[i][0]), "causal")
                num_tokens += len(encoded[i][0])
        self._add_usage(RewardUsage(useful_flops=useful, executed_flops=executed,
                                    wall_seconds=time.perf_counter() - start,
                                    num_completions=len(completions), num_tokens=num_tokens))
        return rewards

    def step_probabilities(self, logits: Any) -> Any:
        """``b x t`` score of every position from the model's ``b x t x 2`` logits:
        ``softmax(logits)[..., positive_label]`` (read at the markers only)."""
        import torch

        return torch.softmax(logits.float(), dim=-1)[..., self.positive_label]

    def worst_case_flops(self, prompt_tokens: int, completion_tokens: int, num_completions: int) -> int:
        """Most FLOPs one call on ``num_completions`` completions can execute, for the budget
        meter's admission of an iteration: every row at the longest length it can reach
        (prompt + completion + one marker per completion token, capped at ``max_length``; the
        text is re-tokenized, so the completion is counted twice as a margin), full batches.
        """
        n = min(self.max_length, prompt_tokens + 2 * completion_tokens)
        return num_completions * self._flops(n, self.executed_attention)

    def _flops(self, num_tokens: int, attention: str) -> int:
        """One forward over ``num_tokens`` tokens (markers included), head at every position."""
        from allocopt.flops import reward_model_flops

        # reward_model_flops(n, num_steps=k) reads n + k tokens; the markers are already in ids
        return reward_model_flops(self.shape, num_tokens, attention=attention)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"ModelReward(name={self.name!r}, model={self.shape.name!r}, marker={self.marker!r}, "
                f"aggregate={self.aggregate!r})")


def model_facts(model: Any, tokenizer: Any, max_length: int | None) -> tuple[int, "ModelShape", str, int]:
    """What a reward model's FLOP accounting and batching need: ``(max_length`` (tokens: the
    given one, else the config's ``max_position_embeddings``), :func:`reward_shape`, the
    executed attention (``causal`` for flash kernels that skip masked blocks, else ``full``),
    the pad token id (0 when the tokenizer has none)``)``."""
    config = model.config
    length = max_length or getattr(config, "max_position_embeddings", None) or 1 << 30
    impl = str(getattr(config, "_attn_implementation", None) or "eager")
    pad = getattr(tokenizer, "pad_token_id", None)
    return length, reward_shape(model), "causal" if impl.startswith("flash") else "full", \
        pad if pad is not None else 0


def reward_shape(model: Any) -> "ModelShape":
    """The :class:`allocopt.flops.ModelShape` of a reward model, from its config.

    ``ModelShape.from_config`` reads the head from ``config.architectures``, which an HF model
    built in memory (not loaded from a saved folder) leaves empty, so it returns head ``lm``;
    the model's class decides then: ``*ForTokenClassification`` / ``*ForSequenceClassification``
    → ``score`` with ``config.num_labels`` outputs.
    """
    from allocopt.flops import ModelShape

    config = model.config
    shape = ModelShape.from_config(config.to_dict())
    cls = type(model).__name__
    if shape.head == "lm" and cls.endswith(("TokenClassification", "SequenceClassification")):
        shape = dataclasses.replace(shape, head="score", num_labels=int(config.num_labels))
    elif shape.head == "lm" and "ProcessRewardModel" in cls:
        shape = dataclasses.replace(shape, head="prm", num_labels=int(config.num_labels))
    return shape


def _single_token_id(tokenizer: Any, marker: str) -> int:
    if not isinstance(marker, str) or not marker:
        raise ValueError(f"marker={marker!r}: must be a non-empty string")
    ids = tokenizer(marker, add_special_tokens=False)["input_ids"]
    unk = getattr(tokenizer, "unk_token_id", None)
    if len(ids) != 1 or (unk is not None and ids[0] == unk):
        raise ValueError(f"marker={marker!r}: the tokenizer encodes it as {ids}; "
                         "need a single known token (e.g. the step separator or <extra_0>)")
    return int(ids[0])


def _device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return "cpu"


# ================================================================== factory
def make_reward(name: str, *, model: Any = None, tokenizer: Any = None, **options: Any) -> RewardSystem:
    """A reward system by name.

    Args:
        name: ``sparse``, ``structured``, ``dense``, ``proxy_prm`` or ``prm``.
        model: for ``proxy_prm``/``prm``: a token-classification model (2 labels), or a local
            folder to load one from with ``AutoModelForTokenClassification``.
        tokenizer: its tokenizer (loaded from ``model`` when that is a folder and this is None).
        options: constructor options: ``format_weight``/``answer_weight`` (structured),
            ``step_weight``/``answer_weight`` (dense), ``marker``, ``aggregate``,
            ``batch_size``, ``max_length`` (model-based).

    Raises:
        ValueError: unknown name, a model-based reward without a model or tokenizer, or a bad
            option (one line naming it).
    """
    if name not in REWARD_NAMES:
        raise ValueError(f"reward={name!r}: unknown reward system; allowed: {', '.join(REWARD_NAMES)}")
    rule = {"sparse": SparseReward, "structured": StructuredReward, "dense": DenseReward}
    if name in rule:
        try:
            return rule[name](**options)
        except TypeError as e:
            raise ValueError(f"reward={name!r}: bad option ({e})") from None
    if model is None:
        raise ValueError(f"reward={name!r}: a model-based reward needs model= (a token-"
                         "classification reward model or a local folder) and tokenizer=")
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        path = str(model)
        model = AutoModelForTokenClassification.from_pretrained(path)
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
    if tokenizer is None:
        raise ValueError(f"reward={name!r}: a model-based reward needs tokenizer= with its model")
    try:
        return ModelReward(model, tokenizer, name=name, **options)
    except TypeError as e:
        raise ValueError(f"reward={name!r}: bad option ({e})") from None


__all__ = [
    "Equation", "MODEL_BASED", "ModelReward", "REWARD_NAMES", "RULE_BASED", "DenseReward",
    "RewardSystem", "RewardUsage", "SparseReward", "StructuredReward", "as_text",
    "find_equations", "is_correct", "is_final_line", "is_well_formed", "make_reward",
    "normalize_latex",
    "reward_shape", "split_steps", "step_accuracy", "step_line_ends",
]
