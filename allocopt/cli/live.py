"""What a running study shows on stderr (rich): a line for each step before the first trial,
the wall-time estimate before anything long starts, then a live line per trial (``pilot 3/30``
or ``full run 2/12``, the trial's FLOPs against its budget, elapsed time) and one line per
finished trial (:func:`allocopt.answer.trial_line`, at most 80 columns).

rich only; the estimate uses the objective's measured ``flops_per_second`` and
``overhead_seconds`` (:class:`allocopt.objective.Objective`), or under a time budget the
budget's hours.
"""

from __future__ import annotations

from typing import Any, Callable

TRIAL_WALL_LIMIT_S = 3600.0
"""``allocopt trial`` refuses a run estimated above this many seconds unless ``--yes``."""


def estimated_seconds(obj: Any, flops: float) -> float | None:
    """Wall seconds a trial spending ``flops`` executed FLOPs should take with ``obj``: its
    ``overhead_seconds`` (loading, evaluation) plus ``flops / flops_per_second``, both measured
    properties of the objective; ``None`` when the objective has no measured throughput."""
    rate = getattr(obj, "flops_per_second", None)
    if not rate:
        return None
    return getattr(obj, "overhead_seconds", 0.0) + flops / rate


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 days``, ``31.7 years``."""
    for unit, size, least in (("years", 365.25 * 86400, 1), ("days", 86400, 2), ("h", 3600, 1),
                              ("min", 60, 2)):
        if seconds >= least * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def study_estimate(obj: Any, budget_flops: float, num_full: int, num_pilots: int = 0,
                   pilot_fraction: float = 0.0, time_budget: Any = None,
                   usd_per_gpu_hour: float | None = None) -> str | None:
    """The study's wall-time estimate as one sentence: ``num_pilots`` trials at
    ``pilot_fraction`` of the full budget and ``num_full`` at the full budget, each spending its
    whole budget. ``None`` when nothing is left to run, or (FLOP budget) when the objective has
    no measured throughput.

    FLOP budget (``time_budget`` ``None``): :func:`estimated_seconds` per trial, the
    objective's overhead plus ``budget_flops`` (× ``pilot_fraction``) over its measured FLOP/s.
    Time budget (a :class:`~allocopt.plan.throughput.TimeBudget`): the budget itself prices
    each trial, whatever its allocation: a full run trains for ``gpu_hours / gpus`` wall hours
    (its FLOPs are what that time buys at the profile's per-phase rates), a pilot
    ``pilot_fraction`` of that, each plus the objective's ``overhead_seconds``; ``budget_flops``
    (the FLOP ceiling, the hours at the fastest phase) is not used. The runs are stated in
    GPU-hours, or in dollars at ``usd_per_gpu_hour`` (the user gave ``--budget-usd``)."""
    if num_full + num_pilots == 0:
        return None
    overhead = getattr(obj, "overhead_seconds", 0.0) or 0.0
    if time_budget is not None:
        return _time_estimate(time_budget, num_full, num_pilots, pilot_fraction, overhead, usd_per_gpu_hour)
    full = estimated_seconds(obj, budget_flops)
    if full is None:
        return None
    pilot = estimated_seconds(obj, pilot_fraction * budget_flops) if num_pilots else 0.0
    total = num_pilots * (pilot or 0.0) + num_full * full
    parts = ([f"{num_pilots} pilot(s) of {pilot_fraction * budget_flops:.3g} FLOPs"] if num_pilots else []) \
        + ([f"{num_full} full run(s) of {budget_flops:.3g} FLOPs"] if num_full else [])
    return (f"estimated wall time: about {duration(total)} for {' and '.join(parts)} (at "
            f"{obj.flops_per_second:.2g} FLOP/s, the objective's measured rate, plus "
            f"{overhead:.0f} s per trial for loading and evaluation; "
            "more on a busy machine)")


def _time_estimate(tb: Any, num_full: int, num_pilots: int, pilot_fraction: float, overhead: float,
                   usd_per_gpu_hour: float | None) -> str:
    """:func:`study_estimate` under a time budget ``tb``: the budget's hours, not the FLOP ceiling."""
    wall = tb.gpu_hours / tb.gpus * 3600  # a full run's training, seconds on tb.gpus GPUs
    total = num_pilots * (pilot_fraction * wall + overhead) + num_full * (wall + overhead)
    gpu_hours = (num_pilots * pilot_fraction + num_full) * tb.gpu_hours

    def cost(h: float) -> str:
        return f"${h * usd_per_gpu_hour:.4g}" if usd_per_gpu_hour else f"{h:.3g} GPU-hours"

    parts = ([f"{num_pilots} pilot(s) of {cost(pilot_fraction * tb.gpu_hours)}"] if num_pilots else []) \
        + ([f"{num_full} full run(s) of {cost(tb.gpu_hours)}"] if num_full else [])
    price = f" at ${usd_per_gpu_hour:g} per GPU-hour" if usd_per_gpu_hour else ""
    return (f"estimated wall time: about {duration(total)} for {' and '.join(parts)} "
            f"({cost(gpu_hours)} in all{price}; the time budget prices each run: a full run trains "
            f"{tb.gpu_hours:g} GPU-hours / {tb.gpus} GPU(s) = {duration(wall)}, a pilot "
            f"{pilot_fraction:g} of that, plus {overhead:.0f} s per trial for loading and evaluation)")


def finished_line(study: Any, s: Any) -> str:
    """The one line a finished study prints instead of an estimate and an empty bar."""
    from allocopt.study.loop import finished_full

    return (f"study {s.name!r} is finished ({finished_full(study)} of {s.trials} full runs done); "
            "nothing to run, --trials N runs more")


class StudyDisplay:
    """The live lines of a running study or race on ``console`` (stderr).

    Use as a context manager; pass :meth:`on_start`, :meth:`progress` and :meth:`on_end` as the
    study's callbacks (:func:`allocopt.study.loop.run_study`). A trial whose budget is below the
    study's is counted as a pilot (under a time budget: below the FLOPs its plan's phase shares
    buy in the hours, by more than ``√pilot_fraction``; each allocation's full budget is its
    own). A trial whose plan passes over the training set more than
    :data:`~allocopt.plan.allocation.MAX_EPOCHS` times gets its warning
    (:attr:`~allocopt.plan.allocation.TrialPlan.warning`) as one line when it starts, once.

    Args:
        console: a rich Console (stderr).
        spec: the :class:`allocopt.spec.StudySpec`.
        num_full: full-budget trials the study will run (the bar's total).
        disable: show nothing (``--json``).
        done_full: the study's full-budget runs finished since this process started, by every
            worker (``None``: this process's own), so that with several workers each bar counts
            the study's runs, not only its own.
        study_best: the best value of the study's complete full-budget runs, every worker's
            (``None`` before one), so that the best beside that count is the study's too.
    """

    def __init__(self, console: Any, spec: Any, num_full: int, disable: bool = False,
                 done_full: Callable[[], int] | None = None,
                 study_best: Callable[[], float | None] | None = None):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.spec = spec
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=16), TextColumn("{task.fields[count]}"),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                            disable=disable, transient=False)
        self.disable = disable
        self.pilots = self.bar.add_task("pilots", total=0, info="", count="", visible=False)
        self.full = self.bar.add_task("starting", total=num_full, info="", count=f"0/{num_full}")
        self.trial = self.bar.add_task("trial", total=spec.budget_flops, info="", count="", visible=False)
        self._fidelity: dict[int, str] = {}
        self._time = spec.time_budget
        self._warned: set[int] = set()
        self._done = {"pilot": 0, "full": 0}
        self._total = {"pilot": 0, "full": num_full}
        self.best: Any = None
        self._seen: list[Any] = []  # several targets: each complete full run's row
        self._done_full = done_full
        self._study_best = study_best

    def __enter__(self) -> "StudyDisplay":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def step(self, text: str) -> None:
        """What the study is doing before its first trial (``opening the study…``)."""
        self.bar.update(self.full, description=text)

    def note(self, text: str) -> None:
        """A line above the live ones (the estimate, the pilots to run); printed also when the
        live lines are off (``--json``: stderr only)."""
        self.bar.console.print(text, highlight=False, markup=False)

    def pilots_to_run(self, n: int) -> None:
        """Show the pilot counter (``n`` pilots to run)."""
        self._total["pilot"] = n
        self.bar.update(self.pilots, total=n, visible=n > 0, description="pilots", count=f"0/{n}")

    def _is_pilot(self, plan: Any) -> bool:
        if plan is None:
            return False
        if self._time is None:
            return plan.budget_flops < self.spec.budget_flops * (1 - 1e-9)
        full = self._time.flops_for_breakdown(plan.expected.executed)  # this allocation's full budget
        return plan.budget_flops < full * self.spec.pilot_fraction ** 0.5

    def on_start(self, number: int, alloc: Any, plan: Any) -> None:
        from allocopt.answer import model_name

        if plan is not None and plan.warning and number not in self._warned:
            self._warned.add(number)
            self.bar.console.print(f"warning: trial {number}: {plan.warning}", highlight=False, markup=False,
                                   soft_wrap=True)  # one line: a worker's log is read with grep
        pilot = self._is_pilot(plan)
        self._fidelity[number] = "pilot" if pilot else "full"
        kind = "pilot" if pilot else "full"
        n, total = self._done[kind] + 1, self._total[kind]
        what = f"{'pilot' if pilot else 'full run'} {n}" + (f"/{total}" if total else "")  # kg: pilots as they come
        self.bar.update(self.full, description="full runs")
        self.bar.update(self.trial, completed=0, total=plan.budget_flops if plan else self.spec.budget_flops,
                        visible=True, info="starting…",
                        description=f"{what}: rho={alloc.rho:.2f} G={alloc.group_size} {alloc.reward}"
                        + (f" {model_name(alloc.model)}" if getattr(alloc, "model", None) else ""))

    def progress(self, rec: Any, meter: Any) -> None:
        self.bar.update(self.trial, completed=meter.executed_flops,
                        info=f"it {rec.iteration + 1}, {meter.executed_flops:.2e} FLOPs")

    def _best_info(self, row: Any) -> str:
        """The bar's note after a complete full run: the best value of the target, or with
        several targets the size of the Pareto front of the runs this process has seen."""
        spec = self.spec
        if not spec.multi_objective:
            if self.best is None or spec.sign * row.value > spec.sign * self.best.value:
                self.best = row
            return self._best_text()
        from allocopt.query.pareto import pareto_front

        self._seen.append(row)
        front = pareto_front(self._seen, list(spec.target_keys),
                             [spec.vocabulary.target(t).direction for t in spec.targets])
        return f"Pareto front {len(front)} of {len(self._seen)}"

    def _best_text(self) -> str | None:
        """``best pass@1=0.610``: the better of this process's best run and the study's (another
        worker's, with ``study_best``); ``None`` before either or with several targets."""
        spec = self.spec
        values = [self.best.value] if self.best is not None else []
        other = self._study_best() if self._study_best is not None else None
        values += [other] if other is not None else []
        if spec.multi_objective or not values:
            return None
        return f"best {spec.targets[0]}={(max if spec.sign > 0 else min)(values):.3f}"

    def _count(self, kind: str) -> None:
        if kind == "full" and self._done_full is not None:
            self._done["full"] = max(self._done["full"], int(self._done_full()))
        total = self._total[kind]
        # a worker whose runs all went to others still shows the study's count under its name
        named = {} if kind == "pilot" else {"description": "full runs"}
        self.bar.update(self.pilots if kind == "pilot" else self.full, completed=self._done[kind],
                        count=f"{self._done[kind]}" + (f"/{total}" if total else ""), **named)

    def sync(self) -> None:
        """The full-run count and best from the study once more (with ``done_full`` and
        ``study_best``): the runs other workers finished after this one's last."""
        if self._done_full is not None:
            self._count("full")
        text = self._best_text() if self._study_best is not None else None
        if text:
            self.bar.update(self.full, info=text)

    def on_end(self, row: Any, result: Any) -> None:
        from allocopt.answer import trial_line

        fidelity = self._fidelity.get(row.number) or getattr(row, "fidelity", "full")
        kind = "pilot" if fidelity == "pilot" else "full"
        self._done[kind] += 1
        self._count(kind)
        info = self._best_info(row) if fidelity == "full" and row.state == "COMPLETE" else None
        if info:
            self.bar.update(self.full, info=info)
        self.bar.update(self.trial, visible=False)
        line = trial_line(row, self.spec)
        self.note(line.replace(f"trial {row.number} ", f"pilot {row.number} ", 1) if kind == "pilot" else line)
