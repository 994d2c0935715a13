"""Bad input is refused before Optuna, MLflow or torch are imported or opened, and an exit 2
has recorded nothing anywhere.

Every row of the bad-input table (tests/test_bad_inputs.py's, plus the surfaces of this file:
an unusable storage for ``race``, the ``command`` objective's settings, ``workers``) runs in a
fresh interpreter that has imported ``allocopt.cli`` as the command does: one runner process
forks a child per row, the child runs ``allocopt.cli.main`` and reports, at its exit, which of
optuna, mlflow and torch are in ``sys.modules``. A few refusals depend on what a storage holds
(an unknown study, a target no trial measured): those may import Optuna to read it
(:data:`READS_THE_STORAGE`), never MLflow or torch; an MLflow URI of a scheme MLflow does not
know is judged by MLflow (:data:`ASKS_MLFLOW`), never Optuna or torch. After each row the test folder holds the
same files as before (no ``allocopt.db``, no ``mlflow.db``, no MLflow run). How fast each is
refused is ``benchmarks/refusal_speed.py``'s (a fresh process per row, a printed table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
ROOT = TESTS.parent

import test_bad_inputs as bad  # noqa: E402
from test_bad_inputs import folder  # noqa: E402,F401 (the table's files; a module fixture)

pytestmark = pytest.mark.slow  # every row in a fresh interpreter: 40-80 s on 2 cores, the default run's largest

HEAVY = ("optuna", "mlflow", "torch")
SYN = ["--objective", "synthetic", "--target", "pass@1", "--budget", "1e18"]
CMD = ["study", "--objective", "command", "--set", "plan_objective=synthetic", "--target", "pass@1",
       "--budget", "1e16", "--pilots", "0", "--trials", "1"]

EXTRA_ROWS = [
    ("race: storage in a folder no file can be made in", ["race", *SYN, "--storage", "sqlite:////proc/allocopt.db"],
     ["storage='sqlite:////proc/allocopt.db'", "cannot be opened", "no file can be made in folder /proc"]),
    ("race: storage that is a folder", ["race", *SYN, "--storage", "sqlite:///{tmp}/asked"],
     ["storage=", "cannot be opened", "asked is a folder"]),
    ("study: storage that is a device", ["study", *SYN, "--storage", "sqlite:////dev/full"],
     ["storage='sqlite:////dev/full'", "/dev/full is not a regular file"]),
    ("command: unknown placeholder", [*CMD, "--set", "command=sh job.sh {trial_dir} {nope}"],
     ["unknown placeholder {nope}", "allowed: {trial_dir}"]),
    ("command: format spec", [*CMD, "--set", "command=sh job.sh {trial_dir} {trial:>99999999}"],
     ["placeholder {trial:>99999999}", "format spec"]),
    ("command: out_dir a file", [*CMD, "--set", "command=sh job.sh {trial_dir}", "--set", "out_dir=nob.toml"],
     ["out_dir='nob.toml'", "is not a folder"]),
    ("command: program not on PATH", [*CMD, "--set", "command=no-such-trainer-xyz {trial_dir}"],
     ["program 'no-such-trainer-xyz' not found on PATH"]),
    ("workers: bad GPU list", ["workers", "--gpus", "0,x", "--", *SYN], ["gpus='0,x'", "not a GPU index"]),
    ("workers: study args before --", ["workers", "--gpus", "0", "--budget", "1e18"], ["is before --"]),
    ("workers: a dry run", ["workers", "--gpus", "0", "--", *SYN, "--dry-run"], ["--dry-run runs no trials"]),
]
ALL_ROWS = bad.ROWS + bad.STRANGER_ROWS + EXTRA_ROWS

READS_THE_STORAGE = {
    "best: unknown study": "the studies the storage holds",
    "best: unknown target": "the targets its trials measured",
    "pareto: target nobody measured": "the targets its trials measured",
    "pareto: unknown objective": "the targets its trials measured",
    "report: unknown target": "the targets its trials measured",
}
"""Refusals that depend on what the storage holds, with what they read there: Optuna (only)
may be imported for those."""

ASKS_MLFLOW = {
    "study: MLflow URI of an unknown scheme": "the URI's scheme, which MLflow judges (its plugins add schemes)",
}
"""Refusals MLflow itself makes, with what it judges: MLflow (only) may be imported for those,
and nothing may be recorded."""

RUNNER = r"""
import json, os, sys, time
from pathlib import Path
import sqlalchemy.engine  # not one of the heavy three; loaded once here, not again per row
from allocopt.cli import main
from allocopt.objective import register_objective
from objectives.command import make
register_objective("command", make, targets=None, replace=True)

def files(root):
    return {str(p.relative_to(root)) for p in Path(root).rglob("*") if not p.name.startswith(".row-")}

rows = json.load(sys.stdin)
results = []
for argv, cwd in rows:
    out, log_path = os.path.join(cwd, ".row-result.json"), os.path.join(cwd, ".row-output.txt")
    before = files(cwd)
    pid = os.fork()
    if pid == 0:
        os.chdir(cwd)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1); os.dup2(log, 2)
        t0 = time.perf_counter()
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        heavy = sorted(m for m in %(heavy)r if m in sys.modules)
        with open(out, "w") as f:
            json.dump({"code": code, "heavy": heavy, "seconds": time.perf_counter() - t0}, f)
        os._exit(0)
    os.waitpid(pid, 0)
    with open(out) as f:
        r = json.load(f)
    with open(log_path) as f:
        r["output"] = f.read()
    os.remove(out)
    os.remove(log_path)
    r["changed"] = sorted(files(cwd) ^ before)
    results.append(r)
json.dump(results, sys.stdout)
""" % {"heavy": HEAVY}


def run_rows(rows: list, tmp: Path) -> list[dict]:
    """Each row's exit code, output, heavy modules, seconds in the child, and the files under
    ``tmp`` it added or removed: one runner process, a forked child per row, one row after
    another, each with ``tmp`` as its working folder."""
    argvs = [[[a.replace("{tmp}", str(tmp)) for a in args], str(tmp)] for _, args, _ in rows]
    r = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(argvs), cwd=tmp, capture_output=True,
                       text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def refused(folder):  # noqa: F811 - test_bad_inputs' module fixture
    """Every row, run once: kind -> result."""
    (folder / "job.sh").touch()
    return dict(zip([kind for kind, _, _ in ALL_ROWS], run_rows(ALL_ROWS, folder)))


@pytest.mark.parametrize("kind,args,needles", ALL_ROWS, ids=[r[0] for r in ALL_ROWS])
def test_refused_before_the_heavy_libraries_and_nothing_recorded(refused, kind, args, needles):
    r = refused[kind]
    lines = [ln for ln in r["output"].splitlines() if ln.strip()]
    assert r["code"] == 2 and len(lines) == 1 and lines[0].startswith("error: "), (kind, r["code"], lines[:5])
    for needle in needles:
        assert needle in lines[0], (kind, needle, lines[0])
    allowed = {"optuna"} if kind in READS_THE_STORAGE else {"mlflow"} if kind in ASKS_MLFLOW else set()
    assert set(r["heavy"]) <= allowed, (kind, r["heavy"])
    assert r["changed"] == [], (kind, r["changed"])  # no allocopt.db, no mlflow.db, no MLflow run


def test_the_table_covers_every_command():
    from allocopt.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {args[0] for _, args, _ in ALL_ROWS} == commands
    assert set(READS_THE_STORAGE) | set(ASKS_MLFLOW) <= {kind for kind, _, _ in ALL_ROWS}


def test_the_tiny_sizes_are_priced_without_transformers_as_with_it():
    """The tiny objective's workload reads its policy sizes from plain config fields (so a
    refused trial budget loads no torch): the shape of each is the one transformers'
    ``Qwen2Config`` gives."""
    from dataclasses import replace

    from allocopt.flops import ModelShape
    from objectives.tiny.models import POLICY_SIZES, policy_config, policy_fields

    for size in POLICY_SIZES:
        plain = ModelShape.from_config(policy_fields(size))
        built = ModelShape.from_config(policy_config(size).to_dict())
        assert replace(plain, name=size) == replace(built, name=size), size
