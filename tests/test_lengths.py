"""Lengths as distributions: per-row files, histograms, named distributions, padding per batch.
Expected values are written out by hand for the toy shape."""

from __future__ import annotations

import json

import pytest

from allocopt.flops import ConfigError, ModelShape
from allocopt.flops.grpo import GRPOStep, grpo_step_flops
from allocopt.flops.lengths import read_lengths, steps_from_rows, synthetic_completions
from allocopt.plan.recipe import price

# d=4, L=1, h=2, h_kv=1, d_h=2, f=8, V=10: layer weights 144, LM head 40, 16 FLOPs per key
TOY = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 4, "num_hidden_layers": 1,
       "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8,
       "vocab_size": 10, "model_type": "qwen2", "max_position_embeddings": 100000}


@pytest.fixture
def toy(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TOY))
    return str(tmp_path)


def _fwd(n: int, c: int) -> int:
    """Useful loss forward of one row by hand: 2*144 per token, 16 per causal key pair, the
    LM head (2*40) on the c completion tokens."""
    return 2 * 144 * n + 16 * n * (n + 1) // 2 + 80 * c


def test_histogram_equals_per_row_and_attention_is_per_row(toy, tmp_path):
    """A 2k-52k spread: per-row attention by hand; the same rows as a histogram (count) and as
    JSON lines give the same account; the mean length understates the attention."""
    rows = [(100, 2000)] * 2 + [(100, 52000)] * 2  # 2 prompts x G=2
    per_row = tmp_path / "rows.csv"
    per_row.write_text("prompt_tokens,completion_tokens\n" + "".join(f"{p},{c}\n" for p, c in rows))
    hist = tmp_path / "hist.csv"
    hist.write_text("prompt_tokens,completion_tokens,count\n100,2000,2\n100,52000,2\n")
    jl = tmp_path / "rows.jsonl"
    jl.write_text("".join(json.dumps({"prompt_tokens": p, "completion_tokens": c}) + "\n" for p, c in rows))
    accts = [price(model=toy, lengths=str(f), prompts=2, group_size=2, lora_rank=0,
                    engine="verl") for f in (per_row, hist, jl)]
    assert accts[0] == accts[1] == accts[2]
    expected = sum(_fwd(p + c, c) for p, c in rows)
    assert accts[0].useful.learning["forward"] == expected
    mean = price(model=toy, prompt_tokens=100, completion_tokens=27000, prompts=2, group_size=2,
                  lora_rank=0, engine="verl")
    assert mean.useful.learning["forward"] == 4 * _fwd(27100, 27000)
    # attention alone: the mean sees 4 * 27100*27101/2 key pairs, the rows 2*(2100*2101/2 +
    # 52100*52101/2): the mean is low by 1 - 1,469,018,200 / 2,718,022,000 = 46.0 %
    attn_rows = 16 * sum((p + c) * (p + c + 1) // 2 for p, c in rows)
    attn_mean = 16 * 4 * 27100 * 27101 // 2
    assert attn_mean / attn_rows == pytest.approx(1 - 0.4595, abs=1e-3)


def test_padding_follows_the_longest_row_of_the_batch(toy, tmp_path):
    """trl-cpu pads every row to P_max + C_max of its step and scores P_max + C_max - 1
    positions; two steps in one file are padded each to its own longest row."""
    f = tmp_path / "two_steps.csv"
    f.write_text("prompt_tokens,completion_tokens\n3,2\n3,6\n5,1\n5,1\n")  # step 1, step 2
    r = dict(model=toy, lengths=str(f), prompts=1, group_size=2, lora_rank=0,
             gradient_checkpointing=False, engine="trl-cpu", steps=2)
    full = lambda n: 2 * 144 * n + 16 * n * n + 80 * (n - 1)  # noqa: E731 (full attention)
    # step 1: rows of 3+6 = 9 tokens; step 2: 5+1 = 6; steps=2 over a 2-step file: each once
    assert price(**r).executed.learning["forward"] == 2 * full(9) + 2 * full(6)


def test_named_distributions():
    assert synthetic_completions(304, 811, 320, "one-long") == (811,) + (round((320 * 304 - 811) / 319),) * 319
    u = synthetic_completions(300, 500, 5, "uniform")
    assert u == (100, 200, 300, 400, 500)
    assert synthetic_completions(300, 500, 5, "constant") == (300,) * 5
    with pytest.raises(ConfigError, match="uniform spread"):
        synthetic_completions(300, 700, 5, "uniform")
    with pytest.raises(ConfigError, match="completion_max"):
        synthetic_completions(300, 200, 5, "one-long")
    with pytest.raises(ConfigError, match="length_distribution"):
        synthetic_completions(300, 400, 5, "zipf")


def test_one_long_max_raises_padded_executed_flops_only(toy):
    kw = dict(model=toy, prompt_tokens=10, completion_tokens=20, prompts=2, group_size=4,
              lora_rank=0, engine="trl-gpu")
    flat = price(**kw)
    spread = price(**kw, completion_max=60, length_distribution="one-long")
    # one row of 60, seven of round((8*20 - 60)/7) = 14: useful sums rows, executed pads to 60
    assert spread.useful.learning["forward"] == _fwd(70, 60) + 7 * _fwd(24, 14)
    # executed: every row padded to 10 + 60 = 70 tokens (flash: causal pairs); trl-gpu's fused
    # head scores each row's own completion tokens
    assert spread.executed.learning["forward"] == \
        8 * (2 * 144 * 70 + 16 * 70 * 71 // 2) + 80 * (60 + 7 * 14)
    assert spread.executed.learning["forward"] > flat.executed.learning["forward"]


@pytest.mark.parametrize("text,needle", [
    ("prompt_tokens,completion_tokens\n3,2\n3,2\n3\n", "line 4: missing 'completion_tokens'"),
    ("prompt_tokens,completion_tokens\n3,2.5\n3,2\n", "completion_tokens='2.5'"),
    ("prompt_tokens,completion_tokens\n3,2\n4,2\n", "share one prompt_tokens"),
    ("prompt_tokens,completion_tokens\n3,2\n3,2\n3,2\n", "not a whole number of steps"),
    ('{"prompt_tokens": 3}\n', "missing 'completion_tokens'"),
    ("prompt_tokens,completion_tokens,count\n3,2,0\n", "count='0'"),
])
def test_bad_lengths_files(tmp_path, text, needle):
    f = tmp_path / "l.csv"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("?", r"\?")):
        steps_from_rows(read_lengths(f), 1, 2, source="lengths")


def test_lengths_file_rows_become_grpo_steps(tmp_path):
    f = tmp_path / "l.jsonl"
    f.write_text('{"prompt_tokens": 7, "completion_tokens": 3, "count": 2}\n'
                 '{"prompt_tokens": 9, "completion_tokens": 5}\n{"prompt_tokens": 9, "completion_tokens": 1}\n')
    (s,) = steps_from_rows(read_lengths(f), 2, 2)
    assert s == GRPOStep(prompt_tokens=(7, 9), completion_tokens=(3, 3, 5, 1), group_size=2)
    shape = ModelShape.from_config(TOY)
    assert grpo_step_flops(shape, s).useful.learning["forward"] == \
        2 * _fwd(10, 3) + _fwd(14, 5) + _fwd(10, 1)
