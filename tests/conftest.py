"""Shared test settings: paths to shipped data, deterministic torch on few cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_DATA = ROOT / "objectives" / "data"


@pytest.fixture(scope="session")
def shipped_data() -> Path:
    """``objectives/data`` in the checkout (GSM8K and MATH-500 test sets, shipped, MIT)."""
    if not SHIPPED_DATA.is_dir():
        pytest.fail(f"shipped data not found at {SHIPPED_DATA}")
    return SHIPPED_DATA


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Property tests draw the same examples on every run: a test that fails, fails every time.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
_hypothesis_settings.load_profile("deterministic")


@pytest.fixture(scope="session")
def qwen_world(tmp_path_factory):
    """Local stand-ins of the ``qwen`` objective's parts (``objectives.standins``): a byte-level
    BPE tokenizer with a chat template and an ``<extra_0>`` marker, a tiny random
    ``Qwen2ForCausalLM`` policy and a tiny 2-label PRM, each saved in HF format. Built once."""
    import torch

    from objectives.standins import build_policy, build_prm, build_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen_world")
    tok = build_tokenizer(root / "tokenizer")
    return {"root": root, "tokenizer": tok, "policy": build_policy(root / "policy", tok),
            "prm": build_prm(root / "prm", tok)}
