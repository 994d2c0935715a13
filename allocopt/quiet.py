"""Silence the libraries' warning noise around a trial, unless the user asks for it.

A real GRPO trial goes through TRL, transformers, peft, torch and MLflow, which print
deprecation ``FutureWarning``\\ s (``gradient_checkpointing`` is deprecated...), ``UserWarning``\\ s
about settings the trial chose on purpose, and INFO log lines, none of which the user can act
on. :func:`quiet` hides them for the duration of a ``with`` block and restores every setting
afterwards; ``allocopt trial``, ``study`` and ``race`` run every trial inside it, and their
``--verbose`` skips it. Errors are never hidden: only warnings and log records below ``ERROR``
from the named libraries are.

Inside the block the environment variable ``ALLOCOPT_QUIET=1`` is set, so a trial that runs in
a child process (the ``qwen`` objective runs its trial in one) quiets itself the same
way (:func:`quiet_if_asked`); ``TRANSFORMERS_VERBOSITY=error`` is set too, so transformers
imported inside the block starts quiet.

Standard library only; transformers is never imported here: its verbosity is set through its
module when it is already imported, else through ``TRANSFORMERS_VERBOSITY``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Iterator

NOISY_LIBRARIES: tuple[str, ...] = ("trl", "transformers", "peft", "accelerate", "torch",
                                    "mlflow", "alembic", "datasets", "huggingface_hub")
"""Libraries whose warnings and sub-``ERROR`` log records :func:`quiet` hides."""
_MODULES = r"(" + "|".join(NOISY_LIBRARIES) + r")(\..*)?"
ENV_QUIET = "ALLOCOPT_QUIET"
"""Set to ``1`` inside :func:`quiet`; a child process reads it (:func:`quiet_if_asked`)."""


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
    env = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true", ENV_QUIET: "1", "TRANSFORMERS_VERBOSITY": "error"}
    env_old = {k: os.environ.get(k) for k in env}
    hf_logging, hf_level = None, None
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging  # type: ignore[no-redef]

        hf_level = hf_logging.get_verbosity()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", module=_MODULES)
            for lg in loggers.values():
                lg.setLevel(logging.ERROR)
            os.environ.update(env)
            if hf_logging is not None:
                hf_logging.set_verbosity_error()
            yield
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])
        for k, v in env_old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if hf_logging is not None and hf_level is not None:
            hf_logging.set_verbosity(hf_level)


def quiet_if_asked() -> contextlib.AbstractContextManager[None]:
    """:func:`quiet` when the parent process ran this one inside it (``ALLOCOPT_QUIET=1``),
    else nothing: what a trial's child process wraps its work in."""
    return quiet(verbose=os.environ.get(ENV_QUIET) != "1")
