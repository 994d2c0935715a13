"""The five reward systems on boxed / LaTeX completions (the ``qwen`` objective's text), and
the PRM card formats (``allocopt.rewards.prm``) on a local stand-in PRM.

Expected rewards are worked out by hand in the table; the PRM's inputs are compared with the
card's layout written out as a string here; its FLOPs with ``FlopCounterMode``.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from allocopt.flops import ConfigError, reward_model_flops
from allocopt.rewards.prm import QWEN_PRM_SYSTEM, CardPRM, load_prm, prm_format_of
from allocopt.rewards.model_reward import reward_shape
from allocopt.rewards.systems import make_reward
from allocopt.rewards.step_parsing import find_equations, normalize_latex

from flop_utils import register_cpu_sdpa_flops

torch.set_num_threads(1)

GOLD = "\\frac{3}{2}"
GOOD = ("We need half of 3.\n\n$3 \\div 2 = \\frac{3}{2}$\n\n"
        "Check: $\\frac{3}{2} \\times 2 = 3$\n\nThe answer is $\\boxed{\\frac{3}{2}}$.")
# (completion, sparse, structured, dense); structured = 0.2 form + 0.8 answer,
# dense = 0.5 x (correct equation lines / equation lines) + 0.5 answer
CASES = {
    "correct, LaTeX steps": (GOOD, 1.0, 1.0, 1.0),
    "correct as a decimal": ("$6/4 = 1.5$\n\n\\boxed{1.5}", 1.0, 1.0, 1.0),
    "wrong answer, one wrong step": ("$3 \\cdot 2 = 5$\n\n$10/4 = 2.5$\n\\boxed{2.5}", 0.0, 0.2, 0.25),
    "right answer, no box (malformed)": ("$3/2 = 1.5$\nso it is 1.5", 0.0, 0.0, 0.5),
    "two boxes (malformed)": ("$3/2=1.5$\n\\boxed{1} or \\boxed{\\frac{3}{2}}", 1.0, 0.8, 1.0),
    "box not on the last line": ("\\boxed{\\frac{3}{2}}\nbecause $3/2=1.5$", 1.0, 0.8, 1.0),
    "box only": ("\\boxed{\\frac32}", 1.0, 0.8, 0.5),
    "empty": ("", 0.0, 0.0, 0.0),
    "unicode prose": ("Die Hälfte von 3 ist 3 × 0.5 = 1.5 ✓\n\n∴ \\boxed{1.5}", 1.0, 1.0, 1.0),
    "unbalanced box": ("$3/2=1.5$\n\\boxed{\\frac{3}{2}", 0.0, 0.0, 0.5),
    "10k characters": ("$1+1=2$\n" * 1250 + "\\boxed{3/2}", 1.0, 1.0, 1.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rule_rewards_on_boxed_latex_completions(case):
    completion, *expected = CASES[case]
    if case == "10k characters":
        assert len(completion) > 10_000
    for name, want in zip(("sparse", "structured", "dense"), expected):
        got = make_reward(name)(prompts=["p"], completions=[completion], answer=[GOLD])
        assert got == [pytest.approx(want)], (name, case)


def test_latex_arithmetic_is_read_as_arithmetic():
    assert [e.correct for e in find_equations(normalize_latex(r"\[\dfrac{\frac{1}{2}}{2} = \frac{1}{4}\]"))] == [True]
    assert [e.correct for e in find_equations(normalize_latex(r"$2 \times (3 + 4) = 15$"))] == [False]
    assert find_equations(normalize_latex(r"$x^{2} = 4$")) == []  # algebra: not an arithmetic step
    assert [e.correct for e in find_equations(normalize_latex(r"\text{cost} $12 \cdot 3 = 36$"))] == [True]


# ------------------------------------------------------------------------- PRM card
PROBLEM = "What is 2+3?"
SOLUTION = "First add: 2 + 3 = 5.\n\nSo the answer is \\boxed{5}."


@pytest.fixture(scope="module")
def prm(qwen_world):
    return load_prm(str(qwen_world["prm"]), reward="prm", aggregate="min", batch_size=2)


def test_card_input_is_the_qwen_prm_layout(prm, qwen_world):
    """The Qwen2.5-Math-PRM card: system / user / assistant turns, steps on blank lines with
    ``<extra_0>`` after each, encoded whole; markers found as that token."""
    tok = qwen_world["tokenizer"]
    ids, positions, steps = prm.encode(PROBLEM, SOLUTION)
    card = (f"<|im_start|>system\n{QWEN_PRM_SYSTEM}<|im_end|>\n<|im_start|>user\n{PROBLEM}<|im_end|>\n"
            "<|im_start|>assistant\nFirst add: 2 + 3 = 5.<extra_0>So the answer is \\boxed{5}."
            "<extra_0><|im_end|>\n")
    assert ids == tok(card, add_special_tokens=False)["input_ids"]
    marker = tok.convert_tokens_to_ids("<extra_0>")
    assert steps == 2 and positions == [i for i, t in enumerate(ids) if t == marker] and len(positions) == 2
    assert prm.encode(PROBLEM, "  \n\n ") == ([], [], 0)
    # a marker the policy wrote itself is not a step boundary
    assert prm.encode(PROBLEM, "a<extra_0>b")[2] == 1


def test_prm_scores_are_the_positive_class_at_the_markers(prm):
    solutions = [SOLUTION, "one step only", "a\n\nb\n\nc"]
    got = prm(prompts=["ignored"] * 3, completions=solutions, problem=[PROBLEM] * 3)
    for sol, value in zip(solutions, got):
        ids, pos, _ = prm.encode(PROBLEM, sol)
        with torch.no_grad():
            logits = prm.model(input_ids=torch.tensor([ids])).logits[0]
        probs = torch.softmax(logits.float(), -1)[pos, 1]
        assert value == pytest.approx(float(probs.min()), abs=1e-5)
    prm.consume_usage()


def test_prm_flops_equal_measured(prm):
    """Executed: padded batches, full attention (CPU SDPA), head at every position; useful:
    each sequence's real tokens, causal. Both from what the PRM really read."""
    register_cpu_sdpa_flops()
    solutions = [SOLUTION, "x", "a\n\nb\n\nc", "ünïcödé 1+1=2\n\n" * 5]
    priced = prm.usage_of([""] * 4, solutions, problem=[PROBLEM] * 4)  # reads problem as a call
    with FlopCounterMode(display=False) as counter:
        prm(prompts=[""] * 4, completions=solutions, problem=[PROBLEM] * 4)
    usage = prm.consume_usage()
    assert usage.executed_flops == counter.get_total_flops() > 0
    assert priced == dataclasses.replace(usage, wall_seconds=0.0)
    shape = reward_shape(prm.model)
    assert shape.head == "score" and shape.num_labels == 2
    useful = sum(reward_model_flops(shape, len(prm.encode(PROBLEM, s)[0])) for s in solutions)
    assert usage.useful_flops == useful < usage.executed_flops


def test_worst_case_bounds_what_one_call_executes(prm, qwen_world):
    tok = qwen_world["tokenizer"]
    completion = "\n\n".join(["1+1=2"] * 20)
    c_tok = len(tok(completion, add_special_tokens=False)["input_ids"])
    p_tok = len(tok(PROBLEM, add_special_tokens=False)["input_ids"])
    prm(prompts=[""] * 3, completions=[completion] * 3, problem=[PROBLEM] * 3)
    assert prm.consume_usage().executed_flops <= prm.worst_case_flops(p_tok, c_tok, 3)


def test_skywork_card_layout(qwen_world, tmp_path):
    """Skywork's prepare_input: bos + problem + newline, then each line and a newline token."""
    from objectives.qwen.standins import TINY_POLICY
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    tok = qwen_world["tokenizer"]
    model = Qwen2ForTokenClassification(Qwen2Config(**TINY_POLICY, vocab_size=len(tok), num_labels=1))
    reward = CardPRM(model, tok, prm_format="skywork-o1-prm")
    ids, positions, steps = reward.encode(PROBLEM, "step one\n\nstep two")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    nl = enc("\n")[-1]
    assert ids == enc(PROBLEM + "\n") + enc("step one") + [nl] + enc("step two") + [nl]
    assert steps == 2 and [ids[p] for p in positions] == [nl, nl]
    assert reward.shape.head == "score" and reward.shape.num_labels == 1


def test_unknown_card_format_and_missing_prm_are_one_line(qwen_world, tmp_path):
    from objectives.qwen.standins import build_policy

    plain = build_policy(tmp_path / "not_a_prm", qwen_world["tokenizer"])
    with pytest.raises(ConfigError, match="card format is not known") as e:
        prm_format_of("someone/some-prm", str(plain))
    assert "\n" not in str(e.value)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="reward_model='someone/missing-prm'"):
        load_prm("someone/missing-prm")
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ConfigError, match="prm_format='bogus'"):
        CardPRM(None, None, prm_format="bogus")


SKYWORK_STANDIN = __import__("pathlib").Path(__file__).parent / "skywork_standin"


@pytest.fixture
def skywork_package(monkeypatch):
    """The stand-in of Skywork's inference package (``tests/skywork_standin``) on the path."""
    import sys

    monkeypatch.syspath_prepend(str(SKYWORK_STANDIN))
    yield
    for m in ("model_utils", "model_utils.prm_model"):  # imported by the test: not left behind
        sys.modules.pop(m, None)


def test_skywork_stand_in_loads_scores_and_counts_its_flops(qwen_world, tmp_path, skywork_package):
    """A Skywork-o1-Open-PRM-shaped stand-in (Qwen2 causal LM + value head Linear(d, 1) in one
    checkpoint, read through the package's ``PRM_MODEL``): ``load_prm`` reads it; each step
    score is sigmoid(value head) at the step's newline, recomputed here from the backbone's
    last hidden states; executed FLOPs equal FlopCounterMode and the formula by hand (the LM
    head over the vocabulary runs at every position too)."""
    from objectives.qwen.standins import build_skywork_prm

    register_cpu_sdpa_flops()
    folder = build_skywork_prm(tmp_path / "skywork", qwen_world["tokenizer"])
    prm = load_prm(str(folder), reward="proxy_prm", aggregate="min", batch_size=2)
    assert prm.prm_format == "skywork-o1-prm" and prm.runs_lm_head
    solutions = [SOLUTION, "x", "a\nb\nc"]
    with FlopCounterMode(display=False) as counter:
        got = prm(prompts=[""] * 3, completions=solutions, problem=[PROBLEM] * 3)
    usage = prm.consume_usage()
    inner = prm.model.inner
    head = inner.v_head.summary
    for sol, value in zip(solutions, got):
        ids, pos, _ = prm.encode(PROBLEM, sol)
        with torch.no_grad():
            h = inner.pretrained_model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            by_hand = torch.sigmoid(h[pos] @ head.weight[0] + head.bias[0])
        assert value == pytest.approx(float(by_hand.min()), abs=1e-5)
    assert usage.executed_flops == counter.get_total_flops() > 0
    # by hand: batches of 2 sorted longest first, each row padded to its batch's longest; per
    # row a forward with the value head (d x 1) and the LM head (d x V) at every position
    lengths = sorted((len(prm.encode(PROBLEM, s)[0]) for s in solutions), reverse=True)
    assert prm.shape.head == "value" and prm.shape.num_labels == 1
    assert prm.shape.num_params() == sum(p.numel() for p in prm.model.parameters())
    score = dataclasses.replace(prm.shape, head="score")
    d, V = score.hidden_size, score.vocab_size
    widths = [lengths[0], lengths[0], lengths[2]]
    assert usage.executed_flops == sum(reward_model_flops(score, w, attention="full") + 2 * d * V * w
                                       for w in widths) \
        == sum(reward_model_flops(prm.shape, w, attention="full") for w in widths)
    assert usage.useful_flops == sum(reward_model_flops(score, n) for n in lengths)  # no LM head
    # plans price it as it runs: the qwen objective's workload gives proxy_prm the same shape,
    # for this folder and for the Skywork hub id (whose default shape is a 1.5B one)
    from objectives.qwen.objective import QwenObjective

    sample = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "objectives" / "data"
                 / "polaris_sample" / "train.jsonl")
    for proxy in (str(folder), "Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B"):
        w = QwenObjective.from_settings(model=str(qwen_world["policy"]), dataset=sample,
                                        reward_model_proxy_prm=proxy,
                                        lengths_file=str(tmp_path / "l.json")).workload()
        priced = w.reward_models["proxy_prm"]
        assert priced.head == "value" and priced.num_labels == 1
    assert dataclasses.replace(QwenObjective.from_settings(
        model=str(qwen_world["policy"]), dataset=sample, reward_model_proxy_prm=str(folder),
        lengths_file=str(tmp_path / "l.json")).workload().reward_models["proxy_prm"], name="x") == \
        dataclasses.replace(prm.shape, name="x")


def test_skywork_without_its_package_is_one_line_naming_it(qwen_world, tmp_path, monkeypatch):
    """Skywork's PRM_MODEL is not on PyPI: without it, loading says what to install."""
    from objectives.qwen.standins import build_skywork_prm

    for m in ("model_utils", "model_utils.prm_model"):  # the import fails, as without the package
        monkeypatch.setitem(__import__("sys").modules, m, None)
    folder = build_skywork_prm(tmp_path / "skywork", qwen_world["tokenizer"])
    with pytest.raises(ConfigError) as e:
        load_prm(str(folder), reward="proxy_prm", field="reward_model_proxy_prm")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"reward_model_proxy_prm={str(folder)!r}")
    assert "skywork-o1-prm-inference" in msg and "pip install" in msg
