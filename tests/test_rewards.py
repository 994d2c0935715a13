"""allocopt.rewards.systems: the five reward systems, their step parsing and FLOP accounting."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from allocopt.flops import ModelShape, reward_model_flops
from objectives.data.mathdata import load_gsm8k
from allocopt.rewards.model_reward import ModelReward, reward_shape
from allocopt.rewards.base import REWARD_NAMES, RewardSystem, RewardUsage
from allocopt.rewards.systems import DenseReward, StructuredReward, make_reward
from allocopt.rewards.step_parsing import find_equations, is_well_formed, step_accuracy

torch.set_num_threads(1)

GOLD = "56"
GOOD = "23+45=68\n68-12=56\n#### 56"
# (completion, sparse, structured, dense)
CASES = {
    "good": (GOOD, 1.0, 1.0, 1.0),
    "blank lines and spaces": ("23 + 45 = 68\n\n 68 - 12 = 56 \n#### 56\n", 1.0, 1.0, 1.0),
    # well formed: the \\boxed convention of the qwen objective (issue 13)
    "boxed answer": ("23+45=68\n68-12=56\n\\boxed{56}", 1.0, 1.0, 1.0),
    "wrong answer, right steps": ("23+45=68\n68-12=56\n#### 57", 0.0, 0.2, 0.5),
    "right answer, wrong steps": ("23+45=67\n68-12=56\n#### 56", 1.0, 1.0, 0.75),
    "right answer, all steps wrong": ("23+45=69\n69-12=56\n#### 56", 1.0, 1.0, 0.5),
    "right answer, no steps": ("#### 56", 1.0, 1.0, 0.5),
    "no final line": ("23+45=68\n68-12=56", 0.0, 0.0, 0.5),
    "final line not last": ("#### 56\n23+45=68", 1.0, 0.8, 1.0),
    "prose line": ("first add\n23+45=68\n68-12=56\n#### 56", 1.0, 0.8, 1.0),
    "empty": ("", 0.0, 0.0, 0.0),
    "garbage": ("}{=#### \x00 ==== +++", 0.0, 0.0, 0.0),
    "division by zero": ("56/0=7\n7*8=56\n#### 56", 1.0, 1.0, 0.75),
    "huge numbers": ("9" * 3000 + "+1=1" + "0" * 3000 + "\n#### 56", 1.0, 1.0, 0.5),
    "huge answer": ("1+1=2\n#### " + "9" * 5000, 0.0, 0.2, 0.5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rule_based_rewards_on_hand_made_completions(case):
    completion, sparse, structured, dense = CASES[case]
    for name, expected in (("sparse", sparse), ("structured", structured), ("dense", dense)):
        reward = make_reward(name)
        got = reward(prompts=["23+45-12=?"], completions=[completion], answer=[GOLD])
        assert got == [pytest.approx(expected)], (name, case)


def test_weights_are_configurable_and_checked():
    s = StructuredReward(format_weight=0.5, answer_weight=0.5)
    assert s(prompts=[""], completions=["23+45=68\n#### 1"], answer=["56"]) == [0.5]
    d = DenseReward(step_weight=1.0, answer_weight=0.0)
    assert d(prompts=[""], completions=["23+45=68\n1+1=3\n#### 56"], answer=["56"]) == [0.5]
    with pytest.raises(ValueError, match=r"reward='dense': step_weight \+ answer_weight = 1.5: must sum to 1"):
        make_reward("dense", step_weight=1.0, answer_weight=0.5)
    with pytest.raises(ValueError, match=r"reward='structured': bad option"):
        make_reward("structured", step_weight=0.5)


@pytest.mark.parametrize("line, expected", [
    ("23+45=68", [("23+45", "68", True)]),
    ("68 * 2 = 136", [("68 * 2", "136", True)]),
    ("7*8=54", [("7*8", "54", False)]),
    ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.", [("16-3-4", "9", True)]),
    ("She makes 9 * 2 = $<<9*2=18>>18 every day", [("9*2", "18", True)]),
    ("so 48/2 = 24 clips", [("48/2", "24", True)]),
    ("30 - 8 * 3 = 30 - 24 = 6", [("30 - 8 * 3", "30 - 24", True), ("30 - 24", "6", True)]),
    ("1+1=2+1=3", [("1+1", "2+1", True), ("2+1", "3", True)]),
    ("10/3=3.33", [("10/3", "3.33", True)]),
    ("10/3=3", [("10/3", "3", False)]),
    ("1,000*2=2,000", [("1,000*2", "2,000", True)]),
    ("Harry:5+2(3)=11", [("5+2(3)", "11", True)]),
    ("3 / 2 = 1 1/2 hours", [("3 / 2", "1 1/2", True)]),
    ("3 / 6 = 50%", [("3 / 6", "50%", True)]),
    ("5/0=3", [("5/0", "3", False)]),
    ("x = 5", []),
    ("3x + 4 = 10", []),
    ("30*=90", []),
    ("#### 56", []),
    ("", []),
])
def test_find_equations(line, expected):
    assert [(e.lhs, e.rhs, e.correct) for e in find_equations(line)] == expected


def test_step_checker_on_gsm8k_gold_solutions(shipped_data):
    # All 1,319 GSM8K gold solutions. Measured: 4,393 steps with arithmetic, 4,390 judged
    # correct; the 3 others: "¾ x 3/3 = 9/12" (a unicode fraction is not parsed), "45 + 21 +28
    # = 94%" (percent points written as plain numbers) and "$32 - $20 = $300" (a real typo in
    # GSM8K, test row 1024). 16 solutions have no arithmetic step; 1,141 are well formed in the
    # strict sense (the rest have prose lines without an equation).
    rows = load_gsm8k(shipped_data / "gsm8k")
    correct = total = no_steps = well_formed = 0
    for row in rows:
        c, t = step_accuracy(row.solution)
        correct, total, no_steps = correct + c, total + t, no_steps + (t == 0)
        well_formed += is_well_formed(row.solution)
    assert (correct, total, no_steps, well_formed) == (4390, 4393, 16, 1141)
    dense = make_reward("dense")
    rewards = dense(prompts=[r.question for r in rows[:200]], completions=[r.solution for r in rows[:200]],
                    answer=[r.answer for r in rows[:200]])
    # every step right and every answer right: 1.0; no arithmetic step (row 24 is algebra,
    # "X - X*25% = $19.50"): 0.5
    assert rewards == [1.0 if step_accuracy(r.solution)[1] else 0.5 for r in rows[:200]]
    assert rewards.count(0.5) == 3


# --------------------------------------------------------------- model-based
MARKER = "\n"
CHARS = list("0123456789+-*/=#?.,$ abcdefghijklmnopqrstuvwxyz\\{}()") + [MARKER]


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory):
    """A randomly initialised Qwen2ForTokenClassification (2 labels, eager attention) and a
    char-level tokenizer (WordLevel over single characters, the marker included)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForTokenClassification

    vocab = {"[PAD]": 0, "[UNK]": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    folder = tmp_path_factory.mktemp("char_tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, num_labels=2, pad_token_id=0,
                         attn_implementation="eager")
    model = Qwen2ForTokenClassification(config).eval()
    return model, tokenizer


PROMPTS = ["23+45-12=?\n", "what is 7*8-6?\n", "1+1=?\n", "9*9=?\n", "2+2=?\n"]
COMPLETIONS = [
    GOOD,
    [{"role": "assistant", "content": "7*8=56\n56-6=50\n#### 50"}],  # TRL conversational
    "#### 2",
    "",  # no step: 0.0, not run
    "2+2=4\n\n#### 4 and some longer trailing prose",
]


def test_char_tokenizer_has_one_token_per_character(tiny_prm):
    _, tokenizer = tiny_prm
    ids = tokenizer("23+45=68\n#### 56", add_special_tokens=False)["input_ids"]
    assert len(ids) == len("23+45=68\n#### 56") and 1 not in ids  # no [UNK]


def test_model_shape_of_a_token_classifier(tiny_prm):
    model, _ = tiny_prm
    # Finding: a model built in memory has config.architectures = None, so
    # ModelShape.from_config falls back to head "lm" (d x V at every scored position);
    # reward_shape corrects it from the model class. A saved-and-reloaded config (architectures
    # filled in) gives "score" directly.
    config = model.config.to_dict()
    assert config.get("architectures") is None
    assert ModelShape.from_config(config).head == "lm"
    shape = reward_shape(model)
    assert (shape.head, shape.num_labels) == ("score", 2)
    saved = ModelShape.from_config({**config, "architectures": ["Qwen2ForTokenClassification"]})
    assert saved == shape


def test_model_reward_scores_and_batching(tiny_prm):
    model, tokenizer = tiny_prm
    batched = make_reward("prm", model=model, tokenizer=tokenizer, marker=MARKER, batch_size=4)
    single = make_reward("prm", model=model, tokenizer=tokenizer, marker=MARKER, batch_size=1)
    got = batched(prompts=PROMPTS, completions=COMPLETIONS)
    assert len(got) == len(COMPLETIONS) and all(isinstance(r, float) and 0 <= r <= 1 for r in got)
    assert got[3] == 0.0 and got[0] > 0
    one_by_one = [single(prompts=[p], completions=[c])[0] for p, c in zip(PROMPTS, COMPLETIONS)]
    assert got == pytest.approx(one_by_one, abs=1e-5)
    assert single(prompts=PROMPTS, completions=COMPLETIONS) == pytest.approx(got, abs=1e-5)
    # min <= mean, and min is the smallest step score
    worst = ModelReward(model, tokenizer, marker=MARKER, aggregate="min")
    assert all(w <= m + 1e-7 for w, m in zip(worst(prompts=PROMPTS, completions=COMPLETIONS), got))


def test_model_reward_marks_every_step(tiny_prm):
    model, tokenizer = tiny_prm
    reward = ModelReward(model, tokenizer, marker=MARKER)
    # marker "\n": the newline ending each step line is the marker; the answer line is unmarked
    ids, positions, steps = reward.encode("1+1=?\n", "1+1=2\n\n2+2=4\n#### 2")
    assert (steps, len(positions)) == (2, 2)
    assert tokenizer.decode(ids).replace(" ", "") == "1+1=?\n1+1=2\n\n2+2=4\n####2"
    assert [tokenizer.decode(ids[: p + 1]).replace(" ", "")[-6:] for p in positions] == \
        ["1+1=2\n", "2+2=4\n"]
    assert all(ids[p] == reward.marker_id for p in positions)
    ids, positions, steps = reward.encode("1+1=?\n", "1+1=2")  # last step line: one is added
    assert steps == 1 and positions == [len(ids) - 1] and len(ids) == len("1+1=?\n1+1=2\n")
    assert reward.encode("p", "#### 2") == ([], [], 0)  # answer only: no step, nothing to run


def test_model_reward_input_is_the_step_marker_layout():
    # ModelReward reads a token classifier at one marker per step line: with the tiny world's
    # tokenizer and its "<step>" marker, exactly the ids of tiny_tasks.mark_steps' layout.
    from transformers import Qwen2ForTokenClassification

    from objectives.tiny.models import build_tokenizer, prm_config
    from objectives.tiny.tasks import STEP_TOKEN, mark_steps

    tokenizer = build_tokenizer()
    config = prm_config("proxy", architectures=["Qwen2ForTokenClassification"], num_labels=2)
    reward = ModelReward(Qwen2ForTokenClassification(config), tokenizer, marker=STEP_TOKEN)
    prompt = "23+45-12\n"
    for completion in ["23+45=68\n68-12=56\n#### 56", "23+45=68\n\n68-12=56\n#### 56\n1+1=2",
                       "23+45=68\n68-12=56", "#### 56", "23+45=68 #### 56\n", "\n\n23+45=68\n",
                       "23+45=68\n#### 5\n#### 56", ""]:
        ids, positions, steps = reward.encode(prompt, completion)
        marked = mark_steps(completion)
        if steps:
            assert ids == tokenizer(prompt + marked, add_special_tokens=False)["input_ids"], completion
            assert [ids[i] for i in positions] == [tokenizer.convert_tokens_to_ids(STEP_TOKEN)] * steps
        assert steps == marked.count(STEP_TOKEN) == len(positions), completion


def test_model_reward_refuses_the_tiny_worlds_causal_lm_prms():
    # The tiny world's PRMs are causal LMs (step verifiers): their logits are over the
    # vocabulary, so "P(label 1)" would be the probability of token 1 (<eos>). ModelReward
    # refuses them (config.num_labels is 2 by default, so the label check alone passes);
    # LikelihoodVerifier is what scores them.
    from objectives.tiny.models import build_prm, build_tokenizer
    from objectives.tiny.tasks import STEP_TOKEN
    from allocopt.rewards.verifier import LikelihoodVerifier

    model, tokenizer = build_prm("proxy"), build_tokenizer()
    assert model.config.num_labels == 2
    with pytest.raises(ValueError, match="causal language model.*LikelihoodVerifier"):
        ModelReward(model, tokenizer, name="proxy_prm", marker=STEP_TOKEN)
    with pytest.raises(ValueError, match="causal language model"):
        make_reward("proxy_prm", model=model, tokenizer=tokenizer, marker=STEP_TOKEN)
    assert LikelihoodVerifier(model, tokenizer, name="proxy_prm").name == "proxy_prm"


def test_model_reward_flops_equal_measured(tiny_prm):
    from torch.utils.flop_counter import FlopCounterMode

    model, tokenizer = tiny_prm
    reward = make_reward("proxy_prm", model=model, tokenizer=tokenizer, marker=MARKER, batch_size=2)
    with FlopCounterMode(display=False) as counter:
        priced = reward.usage_of(PROMPTS, COMPLETIONS)  # before the call, no model run
        assert counter.get_total_flops() == 0
        reward(prompts=PROMPTS, completions=COMPLETIONS)
    usage = reward.consume_usage()
    assert usage.executed_flops == counter.get_total_flops() > 0
    assert priced == dataclasses.replace(usage, wall_seconds=0.0)  # the meter's exact admission
    # useful: each sequence's real tokens (prompt + steps) + one marker per step, causal
    shape = reward_shape(model)
    expected = 0
    for p, c in zip(PROMPTS, COMPLETIONS):
        ids, _, steps = reward.encode(p, c)
        if steps:
            expected += reward_model_flops(shape, len(ids) - steps, num_steps=steps)
    assert usage.useful_flops == expected < usage.executed_flops
    assert usage.num_completions == 5 and usage.num_tokens == sum(
        len(reward.encode(p, c)[0]) for p, c in zip(PROMPTS, COMPLETIONS))
    assert reward.consume_usage() == RewardUsage()  # consumed
    account = usage.account()
    assert account.executed.reward_flops == usage.executed_flops
    assert account.useful.reward_flops == usage.useful_flops


def test_model_reward_cuts_long_sequences(tiny_prm):
    model, tokenizer = tiny_prm
    reward = ModelReward(model, tokenizer, marker=MARKER, max_length=12)
    ids, positions, steps = reward.encode("1+1=?\n", "1+1=2\n#### 2")
    assert len(ids) == 12 and positions == [11] and steps == 1
    assert reward(prompts=["1+1=?\n" * 3], completions=["1+1=2"])[0] == 0.0  # marker cut off
    assert 0 < reward(prompts=["1+1=?\n"], completions=["1+1=2\n#### 2"])[0] < 1


def test_model_reward_input_errors(tiny_prm):
    model, tokenizer = tiny_prm
    with pytest.raises(ValueError, match=r"marker='ab': the tokenizer encodes it as"):
        ModelReward(model, tokenizer, marker="ab")
    with pytest.raises(ValueError, match=r"marker='@'"):  # unknown character: [UNK]
        ModelReward(model, tokenizer, marker="@")
    with pytest.raises(ValueError, match=r"aggregate='max': allowed: mean, min"):
        ModelReward(model, tokenizer, aggregate="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"got 2 prompts but 1 completions"):
        ModelReward(model, tokenizer)(prompts=["a", "b"], completions=["1+1=2"])


# ------------------------------------------------------------------ factory
def test_make_reward_errors():
    with pytest.raises(ValueError) as e:
        make_reward("xyz")
    assert str(e.value) == ("reward='xyz': unknown reward system; allowed: sparse, structured, "
                            "dense, proxy_prm, prm")
    for name in ("proxy_prm", "prm"):
        with pytest.raises(ValueError, match=rf"reward='{name}': a model-based reward needs model="):
            make_reward(name)
    with pytest.raises(ValueError, match=r"reward='sparse': needs the gold final answers"):
        make_reward("sparse")(prompts=["p"], completions=["#### 1"])
    with pytest.raises(ValueError, match=r"got 2 completions but 1 answers"):
        make_reward("sparse")(prompts=["p", "p"], completions=["#### 1", "#### 2"], answer=["1"])


# --------------------------------------------------- contract: all five systems
@pytest.mark.parametrize("name", REWARD_NAMES)
def test_reward_system_contract(name, tiny_prm):
    model, tokenizer = tiny_prm
    reward = make_reward(name, model=model, tokenizer=tokenizer) if name in ("proxy_prm", "prm") \
        else make_reward(name)
    assert isinstance(reward, RewardSystem)
    assert reward.name == name and reward.__name__ == name  # TRL names its column after it
    assert reward.model_based is (name in ("proxy_prm", "prm"))
    completions = COMPLETIONS + ["}{garbage", "\x00" * 10]
    prompts = PROMPTS + ["?\n", "?\n"]
    answers = ["56", "50", "2", "81", "4", "1", "1"]
    # TRL passes every dataset column and its own extras as keywords
    got = reward(prompts=prompts, completions=completions, answer=answers,
                 completion_ids=[[1]] * 7, trainer_state=None, log_metric=lambda *a: None)
    assert len(got) == 7 and all(isinstance(r, float) and 0 <= r <= 1 and not math.isnan(r) for r in got)
    if not reward.model_based:
        assert got[:2] == [1.0, 1.0]
    usage = reward.consume_usage()
    assert usage.num_completions == 7 and usage.wall_seconds > 0
    assert (usage.executed_flops > 0) is reward.model_based
    assert (usage.useful_flops > 0) is reward.model_based
    assert reward([], [], answer=[]) == []
    assert dataclasses.asdict(reward.consume_usage())["num_completions"] == 0


def test_rule_based_rewards_never_raise_on_random_text():
    import random

    rng = random.Random(0)
    alphabet = "0123456789+-*/=()#$.,% \n\\{}boxedfrac x^_"
    rewards = [make_reward(n) for n in ("sparse", "structured", "dense")]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        gold = "".join(rng.choice("0123456789.,-/\\frac{}") for _ in range(rng.randint(0, 6)))
        for reward in rewards:
            (value,) = reward(prompts=[""], completions=["#### " + text if rng.random() < 0.3 else text],
                              answer=[gold])
            assert 0.0 <= value <= 1.0
    for line in ("(" * 400 + "1+1" + ")" * 400 + "=2", "1+" * 20000 + "1=20001", "-" * 10000 + "1=1"):
        assert all(not e.correct for e in find_equations(line))  # too deep / too long: never credited


def test_nesting_depth_is_a_fixed_limit_not_the_interpreters():
    # a side nested deeper than MAX_NESTING is never credited, whatever the recursion limit (a
    # program that raised it, as benchmarks/import_graph.py once did in the test session, made
    # the 400-deep line below credited); up to the limit it is evaluated as usual
    import sys

    from allocopt.rewards.step_parsing import MAX_NESTING

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        assert all(not e.correct for e in find_equations("(" * 400 + "1+1" + ")" * 400 + "=2"))
        assert all(not e.correct for e in find_equations("(" * (MAX_NESTING + 1) + "1+1" + ")" * (MAX_NESTING + 1) + "=2"))
    finally:
        sys.setrecursionlimit(old)
    assert [e.correct for e in find_equations("(" * MAX_NESTING + "1+1" + ")" * MAX_NESTING + "=2")] == [True]
