"""The data the tiny world's PRMs are measured on, and the measurement.

Held-out ``native`` problems give their correct solutions, synthetic corruptions
(:func:`corrupt`: wrong result, wrong operand, wrong operator, chain broken, a step garbled,
left out or added) and the base policy's own samples (:func:`judged_set`);
:func:`corruption_probe` corrupts each problem once per kind. :func:`verifier_metrics` gives
a verifier's recall of wrong steps and false alarms on correct ones, a step flagged when its
score is below :data:`FLAG_BELOW`, the truth from :func:`objectives.tiny.tasks.step_labels`.
No heavy imports (the verifier brings its model).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from objectives.tiny import tasks as tt
from objectives.tiny.tasks import Problem, Step

# ========================================================================= PRM data
def _near(value: int, rng: random.Random) -> int:
    """A plausible wrong value near ``value`` (a slip of one digit, a carry, a sign)."""
    while True:
        kind = rng.random()
        if kind < 0.45:
            wrong = value + rng.choice((-1, 1, -2, 2, -10, 10, -9, 9, -11, 11, -20, 20))
        elif kind < 0.8:  # one digit changed
            digits = list(str(abs(value)))
            i = rng.randrange(len(digits))
            digits[i] = str(rng.randrange(10))
            wrong = int("".join(digits)) * (-1 if value < 0 else 1)
        else:
            wrong = rng.randint(0, 199)
        if wrong != value:
            return wrong


def _render(steps: Sequence[Step | str], answer: str) -> str:
    lines = [s if isinstance(s, str) else f"{s.a}{s.op}{s.b}={s.result}" for s in steps]
    return "\n".join(lines + [f"{tt.ANSWER_MARKER}{answer}"])


CORRUPTIONS = ("result", "operand", "operator", "chain", "garbled", "missing", "extra")
"""Kinds of error :func:`corrupt` makes (``result`` drawn twice as often as the others)."""


def corrupt(problem: Problem, rng: random.Random, kind: str | None = None) -> str:
    """A wrong worked solution of ``problem``: one error at a random step (wrong result,
    wrong operand, wrong operator, chain broken, garbled line, a step left out or one too
    many; ``kind`` one of :data:`CORRUPTIONS`, default drawn), the later steps continuing
    correctly from the value written last, and the final answer the last value."""
    steps = problem.steps
    i = rng.randrange(len(steps))
    drawn = rng.choice(("result",) + CORRUPTIONS)
    kind = kind or drawn
    if kind not in CORRUPTIONS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(CORRUPTIONS)}")
    out: list[Step | str] = list(steps[:i])
    a, s = steps[i].a, steps[i]
    if kind == "result":
        out.append(Step(a, s.op, s.b, _near(tt.apply(a, s.op, s.b), rng)))
    elif kind == "operand":
        b = abs(_near(s.b, rng)) if rng.random() < 0.7 else rng.randint(0, 99)
        if b == s.b:
            b += 1
        out.append(Step(a, s.op, b, tt.apply(a, s.op, b) if rng.random() < 0.7
                        else _near(tt.apply(a, s.op, b), rng)))
    elif kind == "operator":
        op = "-" if s.op == "+" else "+"
        out.append(Step(a, op, s.b, tt.apply(a, op, s.b)))
    elif kind == "chain":
        a2 = _near(a, rng) if rng.random() < 0.7 else rng.randint(0, 99)
        a2 = a2 if a2 != a else a + 1
        out.append(Step(a2, s.op, s.b, tt.apply(a2, s.op, s.b)))
    elif kind == "garbled":
        line = f"{a}{s.op}{s.b}={s.result}"
        cut = rng.randrange(1, len(line))
        out.append(rng.choice((line[:cut], line[:cut] + line[cut + 1:] + "=", line + "+")))
    elif kind == "extra":  # the right step, then one the prompt does not have
        out.append(s)
        b, op = rng.randint(0, 99), rng.choice(("+", "-"))
        out.append(Step(s.result, op, b, tt.apply(s.result, op, b)))
    # "missing": step i is left out
    last = next((x for x in reversed(out) if isinstance(x, Step)), None)
    value = s.result if kind == "garbled" or last is None else last.result
    for later in steps[i + 1:]:
        out.append(Step(value, later.op, later.b, tt.apply(value, later.op, later.b)))
        value = out[-1].result
    return _render(out, str(value))


Judged = tuple[Problem, str, str]
"""A completion to judge: ``(problem, completion, source)``."""


def judged_set(problems: Sequence[Problem], samples: Sequence[tuple[Problem, str]],
               rng: random.Random) -> list[Judged]:
    """Per problem its correct solution and two corruptions (sources ``correct``,
    ``corrupt``), then the policy ``samples`` (source ``policy``)."""
    out: list[Judged] = []
    for p in problems:
        out.append((p, p.solution, "correct"))
        out += [(p, corrupt(p, rng), "corrupt") for _ in range(2)]
    out += [(p, text, "policy") for p, text in samples]
    return out


def corruption_probe(problems: Sequence[Problem], seed: int) -> list[Judged]:
    """One corruption of every kind per problem, the source naming the kind: what a PRM
    catches (its recall of wrong steps per kind, :func:`verifier_metrics`)."""
    out: list[Judged] = []
    for kind in CORRUPTIONS:
        rng = random.Random(f"probe:{kind}:{seed}")
        out += [(p, corrupt(p, rng, kind), kind) for p in problems]
    return out


FLAG_BELOW = 0.5
"""A step whose verifier score is below this is *flagged* wrong (for the manifest's recall and
false-alarm rates; the reward itself uses the scores)."""


def verifier_metrics(verifier: Any, data: Sequence[Judged]) -> dict[str, Any]:
    """How well ``verifier`` (:class:`allocopt.rewards.verifier.LikelihoodVerifier`) judges the
    written steps of ``data`` against :func:`tiny_tasks.step_labels` (the truth), a step
    flagged when its score is below :data:`FLAG_BELOW`: ``wrong_recall`` (share of wrong steps
    flagged), ``false_alarm`` (share of correct steps flagged), ``step_accuracy``, overall and
    per source, and ``share_correct_steps`` (the accuracy of flagging nothing). Steps a
    completion left out are not written, so not judged."""
    scores = verifier.step_scores([p.prompt for p, _, _ in data], [c for _, c, _ in data])
    verifier.consume_usage()
    hits: dict[str, list[int]] = {}
    caught: dict[str, list[int]] = {}
    alarms: dict[str, list[int]] = {}
    for (p, text, source), sc in zip(data, scores):
        truth = tt.step_labels(text, p.prompt)[:len(sc)]
        for key in ("all", source):
            for ok, score in zip(truth, sc):
                flagged = score < FLAG_BELOW
                hits.setdefault(key, []).append(int(flagged != ok))
                (alarms if ok else caught).setdefault(key, []).append(int(flagged))
    out: dict[str, Any] = {}
    for key in sorted(hits):
        suffix = "" if key == "all" else f"_{key}"
        out[f"step_accuracy{suffix}"] = sum(hits[key]) / len(hits[key])
        if caught.get(key):
            out[f"wrong_recall{suffix}"] = sum(caught[key]) / len(caught[key])
        if alarms.get(key):
            out[f"false_alarm{suffix}"] = sum(alarms[key]) / len(alarms[key])
    total = len(hits.get("all", []))
    out["share_correct_steps"] = len(alarms.get("all", [])) / total if total else 0.0
    out["steps"] = total
    out["wrong_steps_policy"] = len(caught.get("policy", []))
    return out


__all__ = ["CORRUPTIONS", "FLAG_BELOW", "Judged", "corrupt", "corruption_probe", "judged_set",
           "verifier_metrics"]
