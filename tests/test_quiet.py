"""allocopt.quiet: the libraries' warnings and log lines are hidden inside the block, shown
with verbose=True, and every setting is restored afterwards."""

import logging
import warnings

import pytest

from allocopt.quiet import quiet


def _emit() -> None:
    warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning)
    logging.getLogger("mlflow.tracking").info("Created MLflow experiment")
    logging.getLogger("trl.trainer").warning("a TRL warning")


def test_quiet_hides_future_warnings_and_library_logs(caplog):
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet():
            _emit()
        assert seen == []
    assert [r for r in caplog.records if r.name.startswith(("mlflow", "trl"))] == []


def test_verbose_shows_them(caplog):
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet(verbose=True):
            _emit()
    assert [w.category for w in seen] == [FutureWarning]
    assert {r.name for r in caplog.records} >= {"mlflow.tracking", "trl.trainer"}


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
