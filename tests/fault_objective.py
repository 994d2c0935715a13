"""The synthetic objective with faults on demand, registered as ``faulty`` (tests/test_faults.py).

Settings (``[objective_settings]`` of a study file): ``sleep_s`` (wall seconds per trial, so a
signal lands mid-trial), ``nan_at`` / ``raise_at`` (trial seeds, i.e. trial numbers with seed
0, whose result is NaN / which raise), ``wrapped_interrupt_at`` (trials that raise a
``RuntimeError`` caused by a ``KeyboardInterrupt``, as Python 3.11 wraps a Ctrl-C landing in a
class's ``__set_name__``), ``log`` (a file that gets one JSON line when a trial
starts and one when it ends: what ran, to check that no allocation runs twice).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field

from allocopt.objective import register_objective
from objectives.synthetic import SyntheticObjective


@dataclass
class FaultyObjective(SyntheticObjective):
    name: str = "faulty"
    sleep_s: float = 0.0
    nan_at: list = field(default_factory=list)
    raise_at: list = field(default_factory=list)
    wrapped_interrupt_at: list = field(default_factory=list)
    log: str = ""
    hold_from: int = -1  # trials with seed >= hold_from wait while the file `hold` exists
    hold: str = ""

    def _log(self, event: str, plan, seed: int) -> None:
        if self.log:
            a = plan.allocation
            with open(self.log, "a") as f:
                f.write(json.dumps({"event": event, "seed": seed, "rho": a.rho,
                                    "group_size": a.group_size, "reward": a.reward}) + "\n")

    def run(self, plan, *, seed=0, progress=None):
        self._log("start", plan, seed)
        time.sleep(self.sleep_s)
        while self.hold and 0 <= self.hold_from <= seed and os.path.exists(self.hold):
            time.sleep(0.1)
        if seed in self.raise_at:
            raise RuntimeError(f"injected failure at trial seed {seed}")
        if seed in self.wrapped_interrupt_at:  # a Ctrl-C a library re-raised as another error
            raise RuntimeError("Error calling __set_name__ (injected)") from KeyboardInterrupt()
        result = super().run(plan, seed=seed, progress=progress)
        if seed in self.nan_at:
            result.targets = {k: math.nan for k in result.targets}
        self._log("end", plan, seed)
        return result


register_objective("faulty", lambda **kw: FaultyObjective(**kw),
                   targets=("native_reward", "pass_at_1", "judge"), replace=True)
