"""Step parsing of worked solutions: the equations of a line, whether they hold, the step
lines, the final answer.

Text convention (:mod:`allocopt.rewards.answers`): one step per line; an arithmetic step holds an
equation such as ``23+45=68``, ``48/2 = 24`` or GSM8K's ``<<48/2=24>>``; the final answer
follows ``#### `` on the last line (or sits in ``\\boxed{}``). *Correct* means
``answers_match(extract_final_answer(completion), gold)``. The rule-based rewards
(:mod:`allocopt.rewards.systems`) and the step scorers (:mod:`allocopt.rewards.model_reward`,
:mod:`allocopt.rewards.verifier`) read completions with these functions. No heavy imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from allocopt.rewards.answers import answers_match, extract_final_answer

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"  # 1,250.5 | 12 | 3.5 | .5
_TOKEN_RE = re.compile(rf"[ \t$]*(?:((?:{_NUM})%?)|([-+*/()]))")
_EXPR_CHARS = frozenset("0123456789.,%$+-*/() \t")
_TIMES_RE = re.compile(r"(?<=[\d)%])[ \t]*[x×][ \t]*(?=[\d(.$])")
_FINAL_RE = re.compile(r"^\s*####[ \t]*\S")
FINAL_MARKER = "#### "
"""What starts the final-answer line (GSM8K convention)."""
MAX_EXPR_CHARS = 1000
MAX_NESTING = 50
"""Most nested parentheses and unary signs an expression side may have; a deeper one is never
credited (it was the interpreter's recursion limit, which a program can raise)."""
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
        self.tokens, self.i, self.depth = tokens, 0, 0

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
        if t in ("-", "+", "("):
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise RecursionError(f"nested deeper than {MAX_NESTING}")  # never credited
            try:
                return self._nested(t)
            finally:
                self.depth -= 1
        if t is None or not _is_num(t):
            raise _Malformed
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

    def _nested(self, t: str) -> Fraction:
        """A unary sign's operand or a parenthesized expression (``t``: the token at ``i``)."""
        self.i += 1
        if t == "(":
            value = self.expr()
            if self.peek() != ")":
                raise _Malformed
            self.i += 1
            return value
        return -self.unary() if t == "-" else self.unary()


def _is_num(token: str) -> bool:
    return token[:1].isdigit() or token[:1] == "."


def split_steps(completion: str) -> list[str]:
    """Non-empty lines of a completion, stripped (one step per line)."""
    return [line.strip() for line in completion.splitlines() if line.strip()]


def step_line_ends(completion: str) -> list[int]:
    """Offsets in ``completion`` where its step lines end, for step markers.

    Step lines: the non-blank lines before the line holding the last ``#### `` (every
    non-blank line when there is none; none when the answer is on the first line), as
    the tiny world's task format defines them.
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
    """Whether the completion's final answer (:func:`~allocopt.rewards.answers.extract_final_answer`)
    matches ``gold``; a gold given as a whole solution (``... #### 18``, ``\\boxed{}``) is
    reduced to its final answer first."""
    gold_text = "" if gold is None else str(gold)
    if "####" in gold_text or "\\boxed" in gold_text:
        gold_text = extract_final_answer(gold_text) or ""
    return answers_match(extract_final_answer(completion), gold_text)


__all__ = ["Equation", "FINAL_MARKER", "MAX_EXPR_CHARS", "find_equations", "is_correct",
           "is_final_line", "is_well_formed", "normalize_latex", "split_steps",
           "step_accuracy", "step_line_ends"]
