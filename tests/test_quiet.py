"""allocopt.quiet: the libraries' warnings and log lines are hidden inside the block, shown
with verbose=True, and every setting is restored afterwards."""

import logging
import warnings

import pytest

from allocopt.quiet import quiet


def _emit() -> None:
    warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning)


# The libraries configure their own loggers when imported (MLflow stops propagation), so the
# tests read whether a logger would emit a record instead of capturing one.
LOGGERS = ("mlflow.tracking", "trl.trainer", "transformers.trainer")


def test_quiet_hides_future_warnings_and_library_logs():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet():
            _emit()
            assert not any(logging.getLogger(n).isEnabledFor(logging.WARNING) for n in LOGGERS)
            assert all(logging.getLogger(n).isEnabledFor(logging.ERROR) for n in LOGGERS)
        assert seen == []


def test_verbose_shows_them():
    logging.getLogger("trl").setLevel(logging.INFO)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet(verbose=True):
            _emit()
            assert logging.getLogger("trl.trainer").isEnabledFor(logging.INFO)
    assert [w.category for w in seen] == [FutureWarning]
    logging.getLogger("trl").setLevel(logging.NOTSET)


def test_settings_restored_after_an_error():
    transformers_logging = pytest.importorskip("transformers.utils.logging")
    lg = logging.getLogger("trl")
    lg.setLevel(logging.DEBUG)
    before = transformers_logging.get_verbosity()
    filters = list(warnings.filters)
    with pytest.raises(RuntimeError):
        with quiet():
            assert lg.level == logging.ERROR
            assert transformers_logging.get_verbosity() == logging.ERROR
            raise RuntimeError("boom")
    assert lg.level == logging.DEBUG
    assert transformers_logging.get_verbosity() == before
    assert warnings.filters == filters
    lg.setLevel(logging.NOTSET)


def test_errors_are_not_hidden(caplog):
    with quiet():
        logging.getLogger("trl.trainer").error("a real error")
    assert any(r.getMessage() == "a real error" for r in caplog.records)


class _Warns:
    """A synthetic objective whose trials warn as transformers does (the FutureWarning each
    trial of a tiny study printed)."""

    def __init__(self, **settings):
        from objectives.synthetic import SyntheticObjective

        self._inner = SyntheticObjective(**settings)
        self.name = "warns"

    def workload(self):
        return self._inner.workload()

    def check_available(self):
        pass

    def run(self, plan, *, seed=0, progress=None):
        _emit()
        return self._inner.run(plan, seed=seed, progress=progress)


@pytest.mark.parametrize("verbose", [False, True])
def test_study_trials_run_quiet_unless_verbose(verbose, tmp_path, monkeypatch, capsys):
    """`allocopt study` (in process) with an objective whose every trial warns: the warning
    reaches stderr only with --verbose."""
    import sys

    from allocopt import objective as registry
    from allocopt.cli import main

    monkeypatch.setitem(registry._REGISTRY, "warns", registry._Entry(_Warns, ("native_reward", "pass_at_1", "judge")))
    args = ["study", "--objective", "warns", "--budget", "1e18", "--pilots", "0", "--trials", "1",
            "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/w.db"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: sys.stderr.write(
            warnings.formatwarning(m, c, f, n, line))
        with pytest.raises(SystemExit) as done:
            main(args + (["--verbose"] if verbose else []))
    assert done.value.code == 0
    err = capsys.readouterr().err
    # shown once with --verbose (as the command line's one-line "warning: ..."), never without
    assert err.count("`gradient_checkpointing` is deprecated") == (1 if verbose else 0), err
    assert "trial 0 COMPLETE" in err  # the trial ran


def test_qwen_child_process_quiets_itself_when_its_parent_does(monkeypatch):
    """The qwen objective's trial runs in a spawned child: it inherits ALLOCOPT_QUIET=1 from a
    quiet parent and quiets itself (objectives.qwen.process._child, run here in process)."""
    import multiprocessing

    from objectives.qwen import objective as qwen, process as qwen_process

    monkeypatch.setattr(qwen.QwenObjective, "run_here", lambda self, plan, seed=0, progress=None: (_emit(), "ok")[1])
    for parent_quiet, expected in ((True, []), (False, [FutureWarning])):
        recv, send = multiprocessing.Pipe(duplex=False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if parent_quiet:
                monkeypatch.setenv("ALLOCOPT_QUIET", "1")
            else:
                monkeypatch.delenv("ALLOCOPT_QUIET", raising=False)
            qwen_process._child(qwen.QwenObjective(qwen.QwenSettings()).run_here, None, 0, send)
        assert recv.recv() == ("result", "ok")
        assert [w.category for w in seen] == expected


def test_quiet_sets_the_environment_a_child_reads():
    import os

    before = os.environ.get("ALLOCOPT_QUIET")
    with quiet():
        assert os.environ["ALLOCOPT_QUIET"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    assert os.environ.get("ALLOCOPT_QUIET") == before
