"""Training prompts (``objectives.data.polaris``) and finding models/datasets (``allocopt.resources``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from allocopt.flops import ConfigError
from allocopt.resources import MissingResource, resolve
from objectives.data.polaris import (INSTRUCTION, SAMPLE_PATH, PromptRow, load_polaris,
                                measure_prompt_tokens, render_prompt, split_heldout)


def test_sample_has_polaris_columns_and_is_gsm8k_and_math500(shipped_data):
    rows = load_polaris(str(SAMPLE_PATH))
    assert len(rows) == 200
    raw = [json.loads(line) for line in open(SAMPLE_PATH, encoding="utf-8")]
    assert all(set(r) == {"problem", "answer", "difficulty"} for r in raw)
    gsm = [json.loads(line) for line in open(shipped_data / "gsm8k" / "test.jsonl", encoding="utf-8")]
    assert rows[0].problem == gsm[-140]["question"]
    assert rows[0].answer == gsm[-140]["answer"].split("####")[-1].strip()


def test_parquet_and_folder_sources_give_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = load_polaris(str(SAMPLE_PATH), limit=7)
    pq.write_table(pa.Table.from_pylist([{"problem": r.problem, "answer": r.answer,
                                          "difficulty": "3/8"} for r in rows]), tmp_path / "train.parquet")
    again = load_polaris(str(tmp_path))
    assert [(r.problem, r.answer) for r in again] == [(r.problem, r.answer) for r in rows]
    assert again[0].difficulty == "3/8"


def test_bad_rows_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "x"}\n')
    with pytest.raises(ConfigError, match=r"row 2 has no 'answer'"):
        load_polaris(str(bad))


def test_heldout_slice_is_seeded_and_disjoint():
    rows = [PromptRow(f"p{i}", str(i)) for i in range(50)]
    train, held = split_heldout(rows, 10, seed=3)
    assert len(train) == 40 and len(held) == 10
    assert {r.problem for r in train}.isdisjoint({r.problem for r in held})
    assert split_heldout(rows, 10, seed=3) == (train, held)
    assert split_heldout(rows, 10, seed=4)[1] != held
    with pytest.raises(ConfigError, match="heldout_problems=50"):
        split_heldout(rows, 50)


def test_prompt_uses_the_chat_template_and_the_instruction(qwen_world):
    tok = qwen_world["tokenizer"]
    text = render_prompt(tok, "What is 2+2?")
    assert text == f"<|im_start|>user\nWhat is 2+2?\n\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    mean, longest = measure_prompt_tokens(tok, ["What is 2+2?", "x" * 50], sample=2)
    by_hand = [len(tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"])
               for p in ("What is 2+2?", "x" * 50)]
    assert (mean, longest) == (sum(by_hand) / 2, max(by_hand))


def test_missing_chat_template_is_one_line(tmp_path):
    from objectives.qwen.standins import build_tokenizer

    tok = build_tokenizer(tmp_path / "t", vocab_size=300, chat_template=None)
    with pytest.raises(ConfigError, match="no chat template"):
        render_prompt(tok, "1+1?")


def test_missing_ids_fail_fast_offline(monkeypatch):
    """HF_HUB_OFFLINE (set by conftest): no network call at all."""
    t0 = time.perf_counter()
    with pytest.raises(MissingResource, match="HF_HUB_OFFLINE") as e:
        resolve("allocopt-test/no-such-model-3141", "model")
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 5
    with pytest.raises(MissingResource, match="not a hub id"):
        resolve("no/such/thing", "dataset")


def test_missing_ids_fail_fast_when_the_hub_is_asked():
    """Without HF_HUB_OFFLINE the hub is asked once with a short timeout: here (no network)
    the name does not resolve; with the network the id does not exist. Either way one line
    within 5 s, in a fresh process (imports included)."""
    code = ("import os; os.environ.pop('HF_HUB_OFFLINE', None)\n"
            "from allocopt.resources import resolve, MissingResource\n"
            "try:\n    resolve('allocopt-test/no-such-dataset-3141', 'dataset')\n"
            "except MissingResource as e:\n    print('ONE LINE:', e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "HF_HUB_OFFLINE"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert time.perf_counter() - t0 < 5, out.stderr[-500:]
    assert out.stdout.startswith("ONE LINE: dataset='allocopt-test/no-such-dataset-3141'")
    assert out.stdout.count("\n") == 1
