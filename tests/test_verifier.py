"""allocopt.rewards.verifier.LikelihoodVerifier: step scores equal the product of the step tokens'
probabilities (or its per-token geometric mean) read from a plain full forward, batching changes nothing, and the FLOPs it
reports equal what FlopCounterMode measures (executed) and the per-sequence formula (useful)."""

import dataclasses
import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from allocopt.flops import forward_flops  # noqa: E402
from allocopt.rewards.base import RewardUsage  # noqa: E402
from allocopt.rewards.verifier import LikelihoodVerifier  # noqa: E402

PROMPTS = ["23+45-12\n", "7+8-6\n", "1+1\n", "9+9\n", "40-2+3\n"]
COMPLETIONS = ["23+45=68\n68-12=56\n#### 56", "7+8=15\n15-6=9\n#### 9", "#### 2", "",
               "40-2=38\n\n38+3=41\n#### 41\n"]


@pytest.fixture(scope="module")
def lm():
    from objectives.tiny.models import build_policy, build_tokenizer, policy_config

    # a small random causal LM over the tiny world's character vocabulary, eager attention
    model = build_policy(policy_config("tiny", hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2), seed=1)
    return model, build_tokenizer()


def _direct_scores(model, tokenizer, prompt, completion, per_token=False):
    """Step scores from one full forward (logits at every position), by hand: the product of
    the line's token probabilities, or its ``1/len`` power with ``per_token``."""
    lines, scores, offset = completion.split("\n"), [], len(prompt)
    ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
    answer_line = max((i for i, x in enumerate(lines) if x.startswith("#### ")), default=len(lines))
    for i, line in enumerate(lines):
        span = len(line) + (i < len(lines) - 1)
        if i < answer_line and line.strip():
            total = sum(float(logp[t - 1, ids[t]]) for t in range(offset, offset + span))
            scores.append(math.exp(total / span if per_token else total))
        offset += span
    return scores


def test_scores_are_the_step_tokens_likelihood(lm):
    model, tokenizer = lm
    aggregates = (("mean", lambda s: sum(s) / len(s)), ("min", min))
    for (agg, fn), score in itertools.product(aggregates, ("line", "token")):
        verifier = LikelihoodVerifier(model, tokenizer, aggregate=agg, score=score, batch_size=2)
        got = verifier(prompts=PROMPTS, completions=COMPLETIONS)
        for p, c, g in zip(PROMPTS, COMPLETIONS, got):
            s = _direct_scores(model, tokenizer, p, c, per_token=score == "token")
            assert g == pytest.approx(fn(s) if s else 0.0, rel=1e-4, abs=1e-7), c
    one = LikelihoodVerifier(model, tokenizer, batch_size=1)
    many = LikelihoodVerifier(model, tokenizer, batch_size=8)
    assert one(prompts=PROMPTS, completions=COMPLETIONS) == pytest.approx(
        many(prompts=PROMPTS, completions=COMPLETIONS), rel=1e-5)


def test_spans_cover_each_step_line_and_its_newline(lm):
    model, tokenizer = lm
    verifier = LikelihoodVerifier(model, tokenizer)
    ids, spans = verifier.encode("1+1\n", "1+1=2\n\n2+2=4\n#### 4")
    text = tokenizer.decode(ids)
    assert [text[a:b] for a, b in spans] == ["1+1=2\n", "2+2=4\n"]
    assert verifier.encode("1+1\n", "#### 2") == ([], [])


def test_flops_equal_measured(lm):
    from torch.utils.flop_counter import FlopCounterMode

    model, tokenizer = lm
    verifier = LikelihoodVerifier(model, tokenizer, name="proxy_prm", batch_size=2)
    with FlopCounterMode(display=False) as counter:
        priced = verifier.usage_of(PROMPTS, COMPLETIONS)  # before the call, no model run
        assert counter.get_total_flops() == 0
        verifier(prompts=PROMPTS, completions=COMPLETIONS)
    usage = verifier.consume_usage()
    assert usage.executed_flops == counter.get_total_flops() > 0
    assert priced == dataclasses.replace(usage, wall_seconds=0.0)  # the meter's exact admission
    expected = 0
    for p, c in zip(PROMPTS, COMPLETIONS):
        ids, spans = verifier.encode(p, c)
        if spans:
            expected += forward_flops(verifier.shape, len(ids),
                                      num_logits=sum(b - a for a, b in spans))
    assert usage.useful_flops == expected < usage.executed_flops
    assert usage.num_completions == 5
    assert verifier.consume_usage() == RewardUsage()
    # the admission bound covers one call at the longest lengths
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    bound = verifier.worst_case_flops(longest, max(map(len, COMPLETIONS)), len(COMPLETIONS))
    assert bound >= usage.executed_flops


def test_input_errors(lm):
    model, tokenizer = lm
    for kwargs in (dict(name="judge"), dict(aggregate="max"), dict(score="mean"), dict(batch_size=0),
                   dict(token_margin=0.5)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            LikelihoodVerifier(model, tokenizer, **kwargs)
    with pytest.raises(ValueError, match="lm_head"):
        LikelihoodVerifier(model.model, tokenizer)
