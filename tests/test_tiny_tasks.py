"""The tiny world: task generator, judge, character tokenizer and tiny model builders."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from objectives.tiny import tasks as tt
from objectives.tiny.tasks import (Problem, Step, TaskSpec, checksum, final_answer, is_correct,
                                   judge, make_split, parse_steps, step_labels)

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def splits() -> dict[str, list[Problem]]:
    return {name: make_split(name) for name in tt.SPLITS}


# ------------------------------------------------------------------------ generator
def test_splits_are_deterministic_per_seed(splits):
    for name, problems in splits.items():
        assert checksum(make_split(name)) == checksum(problems)
        assert checksum(make_split(name, seed=1)) != checksum(problems)
    assert make_split("native", 50, seed=3) == make_split("native", 50, seed=3)
    assert make_split("train", 100)[:40] == make_split("train", 40)  # longer extends shorter


def test_checksums_do_not_depend_on_the_process():
    code = ("from objectives.tiny.tasks import make_split, checksum; "
            "print(*(checksum(make_split(s, 300)) for s in ('train', 'native', 'downstream')))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out == [checksum(make_split(s, 300)) for s in ("train", "native", "downstream")]


def test_split_sizes_uniqueness_and_disjointness(splits):
    assert len(splits["native"]) >= 2000 and len(splits["downstream"]) >= 2000
    assert len(splits["train"]) == tt.SPLIT_SIZES["train"]
    prompts = {name: {p.prompt for p in problems} for name, problems in splits.items()}
    for name, problems in splits.items():
        assert len(prompts[name]) == len(problems), f"{name}: repeated prompts"
    assert not prompts["train"] & prompts["native"]
    assert not prompts["downstream"] & (prompts["train"] | prompts["native"])
    # disjointness is by construction, whatever the seeds and sizes
    other = {p.prompt for p in make_split("train", 5000, seed=7)}
    assert not other & prompts["native"]


def test_native_has_train_distribution_and_downstream_is_harder(splits):
    assert tt.SPLITS["native"] == tt.SPLITS["train"]
    assert {p.num_steps for p in splits["train"]} == {2, 3, 4} == {p.num_steps for p in splits["native"]}
    assert {p.num_steps for p in splits["downstream"]} == {4}
    # disjoint by sha256 bucket: native 0, downstream 1, train 2-9
    assert {tt.holdout_bucket(p.prompt) for p in splits["native"]} == {0}
    assert {tt.holdout_bucket(p.prompt) for p in splits["downstream"]} == {1}
    assert min(tt.holdout_bucket(p.prompt) for p in splits["train"]) >= 2
    mean = lambda ps: sum(s.b for p in ps for s in p.steps) / sum(p.num_steps for p in ps)
    assert abs(mean(splits["train"]) - mean(splits["native"])) < 3  # both near 49.5


def _evaluate(prompt: str) -> tuple[list[tuple[int, str, int, int]], int]:
    """Independent left-to-right evaluation of ``"a op b op c\\n"`` with Python's arithmetic."""
    assert prompt.endswith("\n") and "\n" not in prompt[:-1]
    tokens = re.findall(r"\d+|[+*-]", prompt[:-1])
    assert "".join(tokens) == prompt[:-1]
    value, steps = int(tokens[0]), []
    for op, b in zip(tokens[1::2], map(int, tokens[2::2])):
        result = {"+": value + b, "-": value - b, "*": value * b}[op]
        steps.append((value, op, b, result))
        value = result
    return steps, value


def test_every_solution_matches_direct_evaluation(splits):
    for name, problems in splits.items():
        spec = tt.SPLITS[name]
        for p in problems:
            steps, value = _evaluate(p.prompt)
            assert [tuple(s) for s in p.steps] == steps
            assert p.answer == str(value)
            assert p.solution.split("\n") == [f"{a}{op}{b}={r}" for a, op, b, r in steps] + [f"#### {value}"]
            assert all(r >= 0 for *_, r in steps)  # allow_negative=False
            assert all(spec.operand_range[0] <= s.b <= spec.operand_range[1] for s in p.steps)
            assert final_answer(p.solution) == p.answer and is_correct(p.solution, p)
            assert parse_steps(p.solution) == list(p.steps)
            assert judge(p.solution, p.prompt) == 1.0


def test_multiplication_and_negative_values_are_evaluated_left_to_right():
    spec = TaskSpec(num_steps=(3, 5), operand_range=(0, 20), operators=("+", "-", "*"),
                    mul_operand_max=5, allow_negative=True)
    problems = tt.generate(spec, 500, seed=1)
    assert any(s.result < 0 for p in problems for s in p.steps)
    assert any(s.op == "*" for p in problems for s in p.steps)
    for p in problems:
        steps, value = _evaluate(p.prompt)
        assert [tuple(s) for s in p.steps] == steps and p.answer == str(value)
        assert all(s.b <= 5 for s in p.steps if s.op == "*")
        assert judge(p.solution, p.prompt) == 1.0 and is_correct(p.solution, p)
    assert tt.make_problem([3, 4, 2], ["+", "*"]).answer == "14"  # (3+4)*2, no precedence


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_steps=(0, 2)), "num_steps"), (dict(num_steps=(3, 2)), "num_steps"),
    (dict(num_steps=2), "num_steps"), (dict(operand_range=(-1, 9)), "operand_range"),
    (dict(operators=("/",)), "operators"), (dict(operators=()), "operators"),
    (dict(operators=("*",), operand_range=(5, 9), mul_operand_max=2), "mul_operand_max"),
    (dict(operators=("-",), operand_range=(1, 9)), "operators"),
])
def test_task_spec_rejects_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TaskSpec(**kwargs)


def test_task_spec_accepts_toml_lists_and_bad_split_names_are_named():
    assert TaskSpec(num_steps=[2, 3], operators=["+"]) == TaskSpec(num_steps=(2, 3), operators=("+",))
    with pytest.raises(ValueError, match="split='test'"):
        make_split("test", 10)
    with pytest.raises(ValueError, match="distinct"):
        tt.generate(TaskSpec(num_steps=(1, 1), operand_range=(0, 1), operators=("+",)), 10, seed=0)


# ---------------------------------------------------------------------------- judge
PROMPT = "23+45-12\n"


@pytest.mark.parametrize("completion, labels, score", [
    ("23+45=68\n68-12=56\n#### 56", [True, True], 1.0),
    ("23+45=68\n68-12=55\n#### 55", [True, False], 0.5),            # last step wrong
    ("23+45=67\n67-12=55\n#### 55", [False, True], 0.5),            # an error counts once
    ("23+45=68\n60-12=48\n#### 48", [True, False], 0.5),            # true, but breaks the chain
    ("23+45=68\n68-13=55\n#### 55", [True, False], 0.5),            # true, but not the prompt's operand
    ("23+45=68\n68+12=80\n#### 80", [True, False], 0.5),            # not the prompt's operator
    ("20+45=65\n65-12=53\n#### 53", [False, True], 0.5),            # wrong start
    ("23+45=68\n#### 68", [True, False], 0.5),                      # a skipped step is wrong
    ("23+45=68\n68-12=56\n56+0=56\n#### 56", [True, True, False], 2 / 3),  # an extra step
    ("23 + 45 = 68\n\n68-12=56\n#### 56\ntrailing", [True, True], 1.0),    # spaces, blank line
    ("garbage", [False, False], 0.0), ("", [False, False], 0.0), ("#### 56", [False, False], 0.0),
    ("23+45=68\nnonsense\n68-12=56\n#### 56", [True, False, False], 1 / 3),
])
def test_judge_with_prompt(completion, labels, score):
    assert step_labels(completion, PROMPT) == labels
    assert judge(completion, PROMPT) == pytest.approx(score)


def test_judge_without_prompt_checks_arithmetic_and_chain_only():
    assert judge("23+45=68\n68-12=56\n#### 56") == 1.0
    assert judge("23+45=68\n68-12=55\n#### 55") == 0.5
    assert judge("23+45=68\n60-12=48\n#### 48") == 0.5
    assert judge("1+1=2\n#### 2") == 1.0        # no prompt: the start is free
    assert judge("garbage") == 0.0 and judge("") == 0.0 and judge("#### 5") == 0.0


def test_parsing_and_final_answer():
    assert final_answer("1+2=3\n#### 3") == "3"
    assert final_answer("#### 4\n#### 5 \nmore") == "5"
    assert final_answer("no answer") is None
    assert parse_steps("5-9=-4\n-4*3=-12\nfoo\n#### -12") == [Step(5, "-", 9, -4), Step(-4, "*", 3, -12), None]
    assert parse_steps("#### 5") == [] and parse_steps("1+1=2") == [Step(1, "+", 1, 2)]
    assert tt.parse_prompt(PROMPT) == ([23, 45, 12], ["+", "-"]) and tt.parse_prompt("x\n") is None
    p = tt.make_problem([23, 45, 12], ["+", "-"])
    assert p.prompt == PROMPT and p.solution == "23+45=68\n68-12=56\n#### 56"
    assert is_correct("#### 56", p) and is_correct("#### 056", p)
    assert not is_correct("#### 56.0", p) and not is_correct("#### 55", p) and not is_correct("56", p)
    marked = tt.mark_steps("23+45=68\n\nbad\n#### 56")
    assert marked == "23+45=68<step>\n\nbad<step>\n#### 56"
    assert marked.count(tt.STEP_TOKEN) == len(parse_steps("23+45=68\n\nbad\n#### 56"))


# ------------------------------------------------------------------------ tokenizer
def test_tokenizer_round_trip(tmp_path, splits):
    from transformers import PreTrainedTokenizerFast

    from objectives.tiny.models import build_tokenizer

    build_tokenizer(tmp_path / "tok")
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    assert len(tok) == len(tt.VOCAB) == 22
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids(tt.STEP_TOKEN) == 3 and tok.padding_side == "left"
    problems = splits["train"][:250] + splits["downstream"][:250]
    for p in problems:
        for text in (p.prompt, p.solution, p.prompt + p.solution):
            ids = tok(text).input_ids
            assert len(ids) == len(text)  # one token per character, nothing added
            assert ids == [tt.VOCAB.index(c) for c in text]
            assert tok.decode(ids) == text
        marked = tt.mark_steps(p.solution) + tt.EOS_TOKEN
        ids = tok(marked).input_ids
        assert ids.count(3) == p.num_steps and ids[-1] == 1
        assert tok.decode(ids) == marked and tok.decode(ids, skip_special_tokens=True) == p.solution
    batch = tok(["1+2\n", "12+34-5\n"], padding=True).input_ids
    assert batch[0][:4] == [0] * 4 and len(batch[0]) == len(batch[1]) == 8
    assert tok(" x\n").input_ids == [tt.VOCAB.index(" "), tt.VOCAB.index("<unk>"), tt.VOCAB.index("\n")]


# --------------------------------------------------------------------------- models
def _independent_counts(d: int, layers: int, heads: int, kv: int, f: int, vocab: int,
                        head: str) -> tuple[int, int]:
    """Parameters and forward matmul FLOPs per token of a Qwen2 model, from its shape."""
    dh = d // heads
    attention = d * heads * dh + heads * dh + 2 * (d * kv * dh + kv * dh) + heads * dh * d
    mlp = 3 * d * f
    layer_weights = attention + mlp - (heads + 2 * kv) * dh  # matmul weights: no biases
    layer_params = attention + mlp + 2 * d                    # + two RMSNorm weights
    head_weights = d * vocab if head == "lm" else d * 2
    params = vocab * d + layers * layer_params + d + (0 if head == "lm" else head_weights)
    return params, 2 * layers * layer_weights + 2 * head_weights


@pytest.mark.parametrize("kind, size, shape", [
    ("policy", "tiny", (96, 4, 4, 2, 384)), ("policy", "small", (128, 4, 4, 2, 512)),
    ("policy", "medium", (128, 9, 4, 2, 512)),
    ("prm", "proxy", (96, 3, 4, 2, 384)), ("prm", "full", (96, 4, 4, 2, 384)),
])
def test_model_builders_have_documented_sizes(kind, size, shape):
    from allocopt.flops import ModelShape
    from objectives.tiny import models as tm

    config = tm.policy_config(size) if kind == "policy" else tm.prm_config(size)
    model = tm.build_policy(config, seed=0) if kind == "policy" else tm.build_prm(config, seed=0)
    # the PRMs are causal LMs too (generative step verifiers, allocopt.rewards.verifier)
    params, flops = _independent_counts(*shape, vocab=22, head="lm")
    assert sum(p.numel() for p in model.parameters()) == params
    ms = ModelShape.from_config(config.to_dict())
    assert ms.head == "lm" and ms.num_params() == params
    assert 2 * ms.layer_matmul_params * ms.num_layers + 2 * ms.head_matmul_params == flops
    documented = {"tiny": (556_704, 1_110_144), "small": (988_032, 1_971_712),
                  "medium": (2_219_392, 4_429_312),
                  "proxy": (418_080, 833_664), "full": (556_704, 1_110_144)}
    assert (params, flops) == documented[size]
    assert config._attn_implementation == "eager" and config.vocab_size == len(tt.VOCAB)


def test_model_builders_are_deterministic_and_leave_global_rng_alone():
    from objectives.tiny import models as tm

    state = torch.get_rng_state()
    a, b, c = tm.build_policy("tiny", seed=0), tm.build_policy("tiny", seed=0), tm.build_policy("tiny", seed=1)
    assert torch.equal(state, torch.get_rng_state())
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(x, y), name
    assert not torch.equal(a.model.layers[0].self_attn.q_proj.weight, c.model.layers[0].self_attn.q_proj.weight)
    assert a.config.tie_word_embeddings and a.lm_head.weight is a.model.embed_tokens.weight
    prm = tm.build_prm("full", seed=0)
    assert prm.config.tie_word_embeddings and prm.lm_head.weight is prm.model.embed_tokens.weight
    logits = prm(torch.tensor([[5, 6, 3]])).logits
    assert logits.shape == (1, 3, len(tt.VOCAB))
    with pytest.raises(ValueError, match="size='huge'"):
        tm.policy_config("huge")
    assert tm.policy_config("tiny", hidden_size=64).hidden_size == 64


def test_importing_the_tiny_world_loads_no_torch():
    code = ("import sys, objectives.tiny.tasks, objectives.tiny.models; "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == "[]"
