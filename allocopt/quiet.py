"""Silence the libraries' warning noise around a trial, unless the user asks for it.

A real GRPO trial goes through TRL, transformers, peft, torch and MLflow, which print
deprecation ``FutureWarning``\\ s (``gradient_checkpointing`` is deprecated...), ``UserWarning``\\ s
about settings the trial chose on purpose, and INFO log lines, none of which the user can act
on. :func:`quiet` hides them for the duration of a ``with`` block and restores every setting
afterwards; ``allocopt trial --verbose`` skips it. Errors are never hidden: only warnings and
log records below ``ERROR`` from the named libraries are.

Standard library only; transformers' own verbosity is set only when transformers is already
imported or importable (it is imported here lazily, never at module import).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import warnings
from typing import Iterator

NOISY_LIBRARIES: tuple[str, ...] = ("trl", "transformers", "peft", "accelerate", "torch",
                                    "mlflow", "alembic", "datasets", "huggingface_hub")
"""Libraries whose warnings and sub-``ERROR`` log records :func:`quiet` hides."""
_MODULES = r"(" + "|".join(NOISY_LIBRARIES) + r")(\..*)?"


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """Inside the block: ``FutureWarning`` and ``DeprecationWarning`` from anywhere and every
    warning raised from a module of :data:`NOISY_LIBRARIES` are ignored; those libraries'
    loggers (and transformers' verbosity) are at ``ERROR``; MLflow's URL printing is off.
    Everything is restored on exit, also after an exception. ``verbose=True``: no change.
    """
    if verbose:
        yield
        return
    loggers = {name: logging.getLogger(name) for name in NOISY_LIBRARIES}
    levels = {name: lg.level for name, lg in loggers.items()}
    env_key = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    env_old = os.environ.get(env_key)
    hf_logging, hf_level = None, None
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as hf_logging  # type: ignore[no-redef]

        hf_level = hf_logging.get_verbosity()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", module=_MODULES)
            for lg in loggers.values():
                lg.setLevel(logging.ERROR)
            os.environ[env_key] = "true"
            if hf_logging is not None:
                hf_logging.set_verbosity_error()
            yield
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])
        if env_old is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = env_old
        if hf_logging is not None and hf_level is not None:
            hf_logging.set_verbosity(hf_level)
