"""The compute breakdown live, inside a user's own TRL ``GRPOTrainer`` run.

One line in the training script::

    from allocopt.runlogs.live import attach
    attach(trainer)                      # before trainer.train()

At every logging step the run's reporters (MLflow, W&B, TensorBoard, the console: whatever
``report_to`` names) receive, next to TRL's own metrics:

* ``allocopt/search_flops``, ``allocopt/learning_flops``, ``allocopt/reward_flops``,
  ``allocopt/total_flops``: executed FLOPs of the run so far (all processes);
* ``allocopt/rho``: learning / total of the executed FLOPs so far;
* ``allocopt/{search,learning,reward}_flops_per_second``: executed FLOPs of the phase so far
  over the phase's wall seconds so far, per device (search: TRL's ``_generate``; reward:
  ``_calculate_rewards``; learning: the rest of each optimizer step), when the trainer has
  those methods (TRL 1.16).

The FLOPs are exactly ``allocopt account --from-trl`` of the same log history: the same code
(:func:`allocopt.runlogs.trl.account_trl_log`) is given the trainer's ``state.log_history``,
its ``GRPOConfig`` and the peft config of the model. At the end of training the callback writes
``allocopt_account.json`` in ``output_dir``: what ``allocopt account --from-trl OUTPUT_DIR
--json`` prints (plus the measured phase seconds).

:func:`attach` puts the callback first in the trainer's callback list, so every reporter sees
its keys (a callback given as ``GRPOTrainer(callbacks=[AllocoptCallback()])`` or
``trainer.add_callback`` runs after the reporters: they miss the keys of that step, the JSON at
the end is the same). ``AllocoptCallback`` is a ``transformers.TrainerCallback`` subclass made
on first access, so ``import allocopt.runlogs.live`` loads no torch or transformers.

The callback never breaks the training it watches: whatever it cannot price (a model whose
config cannot be fetched offline, a field the trainer lacks, an output folder it cannot write)
is one warning (``allocopt: live FLOP account off for this run: ...``), after which it adds
nothing more and the run goes on (:meth:`AllocoptCallback.off`).
"""

from __future__ import annotations

import functools
import json
import time
import warnings
from pathlib import Path
from typing import Any

from allocopt.runlogs.common import ImportedRun, RunLogError
from allocopt.runlogs.trl import account_trl_log

PREFIX = "allocopt/"
ACCOUNT_FILE = "allocopt_account.json"
_CLASS: type | None = None


def _args_dict(args: Any) -> dict[str, Any]:
    """A ``GRPOConfig`` as :func:`~allocopt.runlogs.argsfile.read_training_args` reads its
    pickle: the attributes, with accelerate's state as ``{"num_processes": world_size}``."""
    out = {k: v for k, v in vars(args).items() if not k.startswith("__")}
    out["distributed_state"] = {"num_processes": int(getattr(args, "world_size", 1) or 1)}
    return out


def _adapter(model: Any) -> dict[str, Any] | None:
    """peft's ``adapter_config.json`` fields of ``model`` (``None``: no adapter)."""
    cfgs = getattr(model, "peft_config", None)
    if not isinstance(cfgs, dict) or not cfgs:
        return None
    cfg = cfgs.get("default") or next(iter(cfgs.values()))
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
    if isinstance(d.get("target_modules"), (set, frozenset)):
        d["target_modules"] = sorted(d["target_modules"])
    return d


def _never_raises(hook: Any) -> Any:
    """A callback hook that turns anything it raises into :meth:`off` (one warning): the
    user's training goes on."""
    @functools.wraps(hook)
    def safe(self: Any, *args: Any, **kwargs: Any) -> None:
        if self.off_reason is not None:
            return None
        try:
            return hook(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - never into the user's training loop
            self.off(e)
            return None
    return safe


class _Hooks:
    """Logs the run's search / learning / reward FLOPs so far, rho and achieved FLOP/s at
    every logging step under ``allocopt/*``, and writes ``allocopt_account.json`` at the end.

    Args:
        model: the policy model for the FLOP count (preset, folder with ``config.json`` or
            hub id); default: the adapter's ``base_model_name_or_path`` or the model's
            ``name_or_path``.
        peak_tflops: the device's peak dense TFLOP/s; adds ``allocopt/{phase}_mfu``.
        overrides: :data:`~allocopt.plan.recipe.RECIPE_KEYS` as for ``account --from-trl``.
    """

    def __init__(self, model: str | None = None, peak_tflops: float | None = None,
                 **overrides: Any) -> None:
        if peak_tflops is not None and not (isinstance(peak_tflops, (int, float))
                                            and peak_tflops > 0):
            raise RunLogError(f"peak_tflops={peak_tflops!r}: must be a number > 0")
        self.overrides = {**overrides, **({"model": model} if model else {})}
        self.peak_tflops = peak_tflops
        self.seconds = {"search": 0.0, "learning": 0.0, "reward": 0.0}
        self.last: ImportedRun | None = None
        self._step_start: float | None = None
        self._inner = 0.0  # search + reward seconds inside the current optimizer step
        self._adapter: dict[str, Any] | None = None
        self._model_name: str | None = None
        self.off_reason: str | None = None

    def off(self, error: BaseException) -> None:
        """Stop accounting for the rest of the run, with one warning saying why."""
        text = str(error).splitlines()[0] if str(error) else ""
        self.off_reason = f"{type(error).__name__}: {text}" if not isinstance(error, RunLogError) else text
        warnings.warn(f"allocopt: live FLOP account off for this run: {self.off_reason}; the training "
                      "goes on (allocopt account --from-trl OUTPUT_DIR prices it afterwards)",
                      RuntimeWarning, stacklevel=3)

    # --- timing of the phases (wrapped trainer methods; see attach) ---
    def wrap(self, trainer: Any) -> None:
        """Time ``trainer._generate`` (search) and ``trainer._calculate_rewards`` (reward)
        by wrapping the bound methods of this trainer (the class is not touched)."""
        for name, phase in (("_generate", "search"), ("_calculate_rewards", "reward")):
            fn = getattr(trainer, name, None)
            if fn is None or getattr(fn, "_allocopt_timed", False):
                continue

            def timed(*a: Any, _fn: Any = fn, _phase: str = phase, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **k)
                finally:  # plain float additions: nothing here can raise
                    dt = time.perf_counter() - t0
                    self.seconds[_phase] += dt
                    self._inner += dt

            timed._allocopt_timed = True  # type: ignore[attr-defined]
            setattr(trainer, name, timed)

    @_never_raises
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self._adapter = _adapter(model)
        base = (self._adapter or {}).get("base_model_name_or_path")
        inner = getattr(model, "get_base_model", None)
        config = getattr(inner() if callable(inner) else model, "config", None)
        self._model_name = base or getattr(config, "_name_or_path", None) or None

    @_never_raises
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_start = time.perf_counter()
        self._inner = 0.0

    @_never_raises
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_start is not None:
            self.seconds["learning"] += max(0.0, time.perf_counter() - self._step_start
                                            - self._inner)
        self._step_start = None
        self._inner = 0.0

    # --- the account ---
    def account(self, args: Any, state: Any) -> ImportedRun | None:
        """The run so far as ``account --from-trl`` would give it; ``None`` before the
        first record with completion lengths."""
        history = list(state.log_history)
        if not any(isinstance(r, dict) and "completions/mean_length" in r for r in history):
            return None
        over = dict(self.overrides)
        if "model" not in over and not (self._adapter or {}).get("base_model_name_or_path") \
                and self._model_name:
            over["model"] = self._model_name
        out = Path(args.output_dir)
        run = account_trl_log(history, _args_dict(args), self._adapter, source=str(out),
                              state_file=out / "trainer_state.json", **over)
        timed = any(v > 0 for v in self.seconds.values())
        n = int(getattr(args, "world_size", 1) or 1)
        from dataclasses import replace

        return replace(run, phase_seconds=dict(self.seconds) if timed else None, num_devices=n)

    def metrics(self, run: ImportedRun) -> dict[str, float]:
        """The ``allocopt/*`` values of ``run`` (stable names; see the module docstring)."""
        ex = run.account.executed
        m = {f"{PREFIX}search_flops": float(ex.search_flops),
             f"{PREFIX}learning_flops": float(ex.learning_flops),
             f"{PREFIX}reward_flops": float(ex.reward_flops),
             f"{PREFIX}total_flops": float(ex.total_flops),
             f"{PREFIX}rho": float(ex.rho)}
        for phase, r in run.achieved(self.peak_tflops).items():
            m[f"{PREFIX}{phase}_flops_per_second"] = float(r["flops_per_second_per_device"])
            if r.get("mfu") is not None:
                m[f"{PREFIX}{phase}_mfu"] = float(r["mfu"])
        return m

    @_never_raises
    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        if logs is None or "completions/mean_length" not in logs:
            return
        run = self.account(args, state)
        if run is not None:
            self.last = run
            logs.update(self.metrics(run))

    @_never_raises
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.account(args, state)
        if run is None or not state.is_world_process_zero:
            return
        self.last = run
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / ACCOUNT_FILE).write_text(json.dumps(
            {**run.to_dict(), "achieved": run.achieved(self.peak_tflops)}, indent=1) + "\n")


def _make_class() -> type:
    """``AllocoptCallback``: :class:`_Hooks` as a ``transformers.TrainerCallback``."""
    from transformers import TrainerCallback

    return type("AllocoptCallback", (_Hooks, TrainerCallback),
                {"__module__": __name__, "__qualname__": "AllocoptCallback", "__doc__": _Hooks.__doc__})


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "AllocoptCallback":
        if _CLASS is None:
            _CLASS = _make_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attach(trainer: Any, model: str | None = None, peak_tflops: float | None = None,
           **overrides: Any) -> Any:
    """Add an ``AllocoptCallback`` to ``trainer`` (a TRL ``GRPOTrainer``), first in its callback
    list so every reporter logs its ``allocopt/*`` keys, with the phase timers on the trainer's
    ``_generate`` and ``_calculate_rewards``. Returns the callback (its ``last`` holds the
    latest :class:`~allocopt.runlogs.common.ImportedRun`).

    Raises:
        RunLogError: ``peak_tflops`` not > 0.
    """
    cb = __getattr__("AllocoptCallback")(model=model, peak_tflops=peak_tflops, **overrides)
    cb.wrap(trainer)
    trainer.callback_handler.callbacks.insert(0, cb)
    return cb


__all__ = ["ACCOUNT_FILE", "PREFIX", "attach"]  # and AllocoptCallback, made on first access
