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


def postgres_lack() -> str | None:
    """What this machine lacks to start a throwaway PostgreSQL server (binaries, driver), or
    ``None``."""
    if pgserver.find_bin_dir() is None:
        return "PostgreSQL binaries (initdb, pg_ctl, postgres) not found; apt-get install postgresql"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg (the PostgreSQL driver) is not installed; pip install 'psycopg[binary]'"
    return None


def pytest_collection_modifyitems(config, items):
    """Tests that need PostgreSQL are marked skipped, with the reason, on a machine that cannot
    start a server and was given none (decided at collection); with
    ``$ALLOCOPT_REQUIRE_POSTGRES=1`` (CI) they run, and fail without a server."""
    if os.environ.get("ALLOCOPT_TEST_POSTGRES_URL") or os.environ.get("ALLOCOPT_REQUIRE_POSTGRES") == "1":
        return
    why = postgres_lack()
    if why:
        mark = pytest.mark.skipif(True, reason=why)
        for item in items:
            if "postgres_url" in getattr(item, "fixturenames", ()):
                item.add_marker(mark)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a PostgreSQL server for the session (``tests/pgserver.py``): CI's
    (``$ALLOCOPT_TEST_POSTGRES_URL``), else a throwaway one started here. Where none can be
    started its tests are skipped at collection (:func:`pytest_collection_modifyitems`); a
    server that cannot start here fails them."""
    url = os.environ.get("ALLOCOPT_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    why = postgres_lack()
    if why:  # reached only with ALLOCOPT_REQUIRE_POSTGRES=1: the tests were not skipped
        pytest.fail(why)
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="allocopt-pg-"))  # not under pytest's 0700 root folder:
    # the server runs as the postgres OS user when we are root
    try:
        url = pgserver.start(folder)
    except Exception as e:  # noqa: BLE001 - binaries and driver are here: a failure, not a skip
        pytest.fail(f"PostgreSQL did not start: {str(e).splitlines()[0] if str(e) else e}")
    try:
        yield url
    finally:
        pgserver.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pg_database(postgres_url, request) -> str:
    """A fresh, empty database on the session's server, named after the test."""
    import re

    import hashlib

    # the node id's hash: two files' tests of one name may run at once on pytest-xdist's workers
    tag = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8]
    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + tag
    return pgserver.fresh_database(postgres_url, name)


if os.environ.get("PYTEST_XDIST_WORKER"):  # one of pytest-xdist's workers, one per core: torch
    # (and the processes tests start) on one thread each, or two workers thrash on 2 cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Property tests draw the same examples on every run: a test that fails, fails every time.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
_hypothesis_settings.load_profile("deterministic")


@pytest.fixture(scope="session")
def qwen_world(tmp_path_factory):
    """Local stand-ins of the ``qwen`` objective's parts (``objectives.qwen.standins``): a byte-level
    BPE tokenizer with a chat template and an ``<extra_0>`` marker, a tiny random
    ``Qwen2ForCausalLM`` policy and a tiny 2-label PRM, each saved in HF format. Built once."""
    import torch

    from objectives.qwen.standins import build_policy, build_prm, build_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen_world")
    tok = build_tokenizer(root / "tokenizer")
    return {"root": root, "tokenizer": tok, "policy": build_policy(root / "policy", tok),
            "prm": build_prm(root / "prm", tok)}


class Ran:
    """What an in-process run of the ``allocopt`` command gave: the exit code and the text
    written on stdout and stderr (the fields of :class:`subprocess.CompletedProcess` the tests
    read)."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"Ran(args={self.args!r}, returncode={self.returncode}, stderr={self.stderr[-500:]!r})"


@pytest.fixture
def cli(capfd, monkeypatch):
    """``cli(*args, cwd=None, env=None)`` runs the ``allocopt`` command in this process
    (:func:`allocopt.cli.main`) and returns a :class:`Ran` (``returncode``, ``stdout``,
    ``stderr``): a Python process per call costs 2-4 s of imports on 2 cores and adds nothing
    to what these tests check. Output is captured at the file descriptors, so what a library
    writes there is seen too; ``cwd`` and ``env`` (variables added to the environment) hold
    for that call only. The installed entry point, signals and several workers keep their
    subprocess tests."""
    from allocopt.cli import main

    def run(*args, cwd=None, env: dict | None = None) -> Ran:
        argv = [str(a) for a in args]
        with monkeypatch.context() as m:
            if cwd is not None:
                m.chdir(cwd)
            for k, v in (env or {}).items():
                m.setenv(k, v)
            capfd.readouterr()
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            o = capfd.readouterr()
        return Ran(argv, code, o.out, o.err)
    return run


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store with its tables made (MLflow's migrations take 5-10 s on 2
    cores), made once per session; :func:`mlflow_store` copies it."""
    import shutil

    template = tmp_path_factory.getbasetemp() / "mlflow-template.db"
    if not template.exists():
        from mlflow import MlflowClient

        made = template.with_suffix(".making.db")
        MlflowClient(f"sqlite:///{made}").search_experiments()
        shutil.move(made, template)
    return template


@pytest.fixture
def mlflow_store(tmp_path, mlflow_template) -> str:
    """URL of a fresh, empty MLflow SQLite store, ``tmp_path / "mlflow.db"`` (a copy of
    :func:`mlflow_template`), for tests that do not test how a store is first made."""
    import shutil

    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
