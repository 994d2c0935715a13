"""A ``command`` study whose command misbehaves: a setting that can never work is refused before
the first trial (one line, exit 2, nothing recorded); a trial whose command misbehaves fails in
one line naming its folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from test_command_objective import command_objective  # noqa: E402,F401

from allocopt.errors import TrialFailed  # noqa: E402
from allocopt.plan.allocation import Allocation, make_plan  # noqa: E402

STUDY = ["study", "--objective", "command", "--set", "plan_objective=synthetic", "--budget", "1e16",
         "--target", "pass@1", "--trials", "1", "--pilots", "0", "--no-mlflow", "--storage", "sqlite:///s.db"]

NEVER_WORKS = [
    ("unknown placeholder", ["--set", "command=sh job.sh {trial_dir} {nope}"],
     ["command='sh job.sh {trial_dir} {nope}'", "unknown placeholder {nope}", "allowed: {trial_dir}"]),
    ("a format spec as wide as memory", ["--set", "command=sh job.sh {trial_dir} {trial:>99999999}"],
     ["placeholder {trial:>99999999}", "format spec", "write placeholders bare, e.g. {trial}"]),
    ("a conversion", ["--set", "command=sh job.sh {trial_dir!r}"], ["placeholder {trial_dir!r}", "format spec"]),
    ("out_dir a file", ["--set", "command=sh job.sh {trial_dir}", "--set", "out_dir=afile"],
     ["out_dir='afile'", "is not a folder"]),
    ("out_dir inside a file", ["--set", "command=sh job.sh {trial_dir}", "--set", "out_dir=afile/trials"],
     ["out_dir='afile/trials'", "afile is not a folder"]),
    ("program not on PATH", ["--set", "command=no-such-trainer-xyz {trial_dir}"],
     ["command='no-such-trainer-xyz {trial_dir}'", "program 'no-such-trainer-xyz' not found on PATH"]),
    ("program path missing", ["--set", "command=./train-missing.sh {trial_dir}"],
     ["program ./train-missing.sh not found (from the working folder"]),
    ("program not executable", ["--set", "command=./job.sh {trial_dir}"], ["program ./job.sh is not executable"]),
    ("unclosed quote", ["--set", "command=sh 'job.sh {trial_dir}"], ["not a shell line (No closing quotation)"]),
]


@pytest.mark.parametrize("kind,args,needles", NEVER_WORKS, ids=[r[0] for r in NEVER_WORKS])
def test_a_setting_that_can_never_work_is_refused_before_the_first_trial(kind, args, needles, cli, tmp_path,
                                                                        command_objective):
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "job.sh").write_text("exit 0\n")  # not executable: run it through sh
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli(*STUDY, *args, cwd=tmp_path, env={"COLUMNS": "200"})
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (kind, lines[:5])
    for needle in needles:
        assert needle in lines[0], (kind, needle, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no s.db, no trials/, no mlflow.db


def test_the_shell_words_and_unknown_first_words_are_not_refused(tmp_path):
    from objectives.command import missing_program

    for line in ("cd sub && ./train.sh {trial_dir}", "FOO=1 BAR=2 sh job.sh {trial_dir}", "{config} {trial_dir}",
                 "$HOME/bin/train {trial_dir}", "( sh job.sh {trial_dir} )", "sh job.sh {trial_dir} # note"):
        assert missing_program(line) is None, line


@pytest.fixture
def objective(command_objective, tmp_path, monkeypatch):
    """``make(**settings)`` in ``tmp_path``, bound to trial 3 of study ``s``, and a plan."""
    monkeypatch.chdir(tmp_path)

    def build(**settings):
        obj = command_objective(plan_objective="synthetic", log="metrics", **settings)
        obj.check_available()
        obj.bind_trial(study="s", number=3, fidelity="full", spec=None)
        plan = make_plan(1e16, Allocation(rho=0.5, group_size=4, reward="sparse"), obj.workload())
        return obj, plan
    return build


def _fails(obj, plan, *needles: str) -> str:
    with pytest.raises(TrialFailed) as e:
        obj.run(plan)
    msg = str(e.value)
    assert "\n" not in msg and f"trial folder {obj.trial_dir()}" in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def test_a_command_exiting_non_zero_fails_its_trial(objective):
    obj, plan = objective(command="sh -c 'echo boom >&2; exit 7' {trial_dir}")
    _fails(obj, plan, "command exited with code 7")
    assert "boom" in (obj.trial_dir() / "command.log").read_text()


def test_a_command_leaving_no_metrics_fails_its_trial(objective):
    obj, plan = objective(command="true {trial_dir}")
    _fails(obj, plan, "left no metrics file metrics.json")


def test_an_out_dir_that_became_a_file_fails_the_trial(objective, tmp_path):
    obj, plan = objective(command="true {trial_dir}", out_dir="later")
    (tmp_path / "later").write_text("made a file after the study began")
    _fails(obj, plan, "the trial's folder cannot be written")


def test_a_template_that_cannot_be_filled_fails_the_trial(objective):
    """The settings' check refuses such templates; one that got past it (set on the frozen
    settings here) fails its trial in one line rather than raising out of the study."""
    obj, plan = objective(command="true {trial_dir}")
    object.__setattr__(obj.settings, "command", "true {trial_dir} {nope}")
    _fails(obj, plan, "cannot be filled (KeyError: 'nope'")

