"""Shared test settings: paths to shipped data, deterministic torch on few cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import pgserver

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_DATA = ROOT / "objectives" / "data"


@pytest.fixture(scope="session")
def shipped_data() -> Path:
    """``objectives/data`` in the checkout (GSM8K and MATH-500 test sets, shipped, MIT)."""
    if not SHIPPED_DATA.is_dir():
        pytest.fail(f"shipped data not found at {SHIPPED_DATA}")
    return SHIPPED_DATA


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a PostgreSQL server for the session (``tests/pgserver.py``): CI's
    (``$ALLOCOPT_TEST_POSTGRES_URL``), else a throwaway one started here, else the test is
    skipped (no PostgreSQL binaries) -- or fails, when ``$ALLOCOPT_REQUIRE_POSTGRES=1`` (CI)."""
    url = os.environ.get("ALLOCOPT_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    why = None
    if pgserver.find_bin_dir() is None:
        why = "PostgreSQL binaries (initdb, pg_ctl, postgres) not found; apt-get install postgresql"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            why = "psycopg (the PostgreSQL driver) is not installed; pip install 'psycopg[binary]'"
    if why:
        if os.environ.get("ALLOCOPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="allocopt-pg-"))  # not under pytest's 0700 root folder:
    # the server runs as the postgres OS user when we are root
    try:
        url = pgserver.start(folder)
    except Exception as e:  # noqa: BLE001 - a server that cannot start here is a skip, not a crash
        if os.environ.get("ALLOCOPT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL did not start: {e}")
        pytest.skip(f"PostgreSQL did not start: {str(e).splitlines()[0] if str(e) else e}")
    try:
        yield url
    finally:
        pgserver.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pg_database(postgres_url, request) -> str:
    """A fresh, empty database on the session's server, named after the test."""
    import re

    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:50]
    return pgserver.fresh_database(postgres_url, name)


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
