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
