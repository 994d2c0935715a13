"""The whole race in one call, as a view over the study loop: pilots, diagnosis, proposals and
their runs, validation.

The trials are run by one call of :func:`allocopt.study.loop.run_study` with the study's
:class:`allocopt.study.sampler.RaceSampler` (:func:`allocopt.study.sampler.race_sampler`: pilots
first, then its proposals); this module adds what ``allocopt race`` shows: the regime table
when the pilot phase ends (the loop's ``on_pilots``), the validation table and the
recommendation at the end.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from allocopt.plan.allocation import Allocation, TrialPlan, Workload
from allocopt.flops import ConfigError
from allocopt.race.design import RaceSettings, check_pilot_fraction
from allocopt.race.diagnose import RegimeDiagnosis, diagnose
from allocopt.race.propose import Proposal
from allocopt.race.validate import ValidationRow, same_regime_rate, validate
from allocopt.record import TrialRow
from allocopt.spec import StudySpec
from allocopt.store.connect import DEFAULT_STORAGE


@dataclass
class RaceResult:
    """What :func:`run_race` did and found."""

    study: Any
    pilot_budget_flops: float
    pilots: list[TrialRow]
    """Pilot trials run by this call (a resumed race skips pilots already done)."""
    diagnoses: list[RegimeDiagnosis]
    proposals: list[Proposal]
    """Proposals run by this call (with ``propose_only``: proposed, none run)."""
    validations: list[TrialRow]
    """Runs of proposals done by this call (full runs and extra pilots)."""
    validation: list[ValidationRow]
    """Pilot against full-budget regimes (empty until the study has a full-budget run)."""
    timings: dict[str, list[float]] = field(default_factory=dict)
    """``fit_seconds`` per surrogate fit, ``proposal_seconds`` per proposal round."""
    recommendation: Any = None
    """RACE's answer for the full budget at the end: a
    :class:`~allocopt.race.recommend.Recommendation` (allocation, credible interval, probability
    it is the best) once the study has a full-budget run; before that (``validations = 0``,
    ``propose_only``) a bare :class:`~allocopt.plan.allocation.Allocation` (the pilots' best
    diagnosis or the surrogate's maximizer). :attr:`recommended` is its allocation either way."""
    recommendations: list[tuple[int, Allocation]] = field(default_factory=list)
    """``(last trial number seen, recommendation)`` after the pilots and after each round of
    this call: what RACE would have answered had it stopped there."""

    @property
    def recommended(self) -> Allocation | None:
        """The recommended allocation (of :attr:`recommendation`, whichever type it has)."""
        return getattr(self.recommendation, "allocation", self.recommendation)

    @property
    def same_regime_rate(self) -> float:
        return same_regime_rate(self.validation)

    def to_dict(self) -> dict[str, Any]:
        return {"pilot_budget_flops": self.pilot_budget_flops,
                "diagnoses": [d.to_dict() for d in self.diagnoses],
                "proposals": [p.to_dict() for p in self.proposals],
                "validation": [v.to_dict() for v in self.validation],
                "same_regime_rate": self.same_regime_rate, "timings": self.timings,
                "recommendation": None if self.recommendation is None else asdict(self.recommendation)}


def run_race(
    spec: StudySpec,
    *,
    objective: Any,
    workload: Workload,
    storage: str | None = DEFAULT_STORAGE,
    tracker: Any = None,
    pilot_fraction: float = 0.1,
    validations: int = 4,
    propose_only: bool = False,
    settings: RaceSettings = RaceSettings(),
    on_phase: Callable[[str, Any], None] | None = None,
    on_trial_start: Callable[[int, Allocation, TrialPlan | None], None] | None = None,
    on_trial_end: Callable[[Any, Any], None] | None = None,
    progress: Callable[..., None] | None = None,
    verbose: bool = False,
) -> RaceResult:
    """Pilots, regime diagnosis, validation proposals (and runs) in one Optuna study.

    The answer is stored as :func:`allocopt.study.loop.run_study` stores it (user attribute
    ``recommendation``, and the tracker's parent run): RACE's recommendation once the study has
    a full-budget run; before that (``validations = 0``, or no full run finished) the pilots'
    best diagnosis. ``propose_only`` stores none.

    Args:
        spec: the study; ``spec.budget_flops`` is the full budget, ``spec.space`` the grid.
        objective, workload: as for :func:`allocopt.study.loop.run_study`.
        storage: Optuna storage URL (``None``: in memory). Running again resumes: pilots and
            validations already in the study are not run again.
        tracker: an :class:`allocopt.tracking.StudyTracker` (fidelity tags ``pilot``/``full``).
        pilot_fraction: pilots run at ``pilot_fraction × spec.budget_flops``, in (0, 1).
        validations: full-budget runs the study should have (0: pilots only).
        propose_only: propose ``validations`` runs (pilots allowed within the extra-pilot
            budget), run none.
        settings: :class:`RaceSettings`.
        on_phase: called as ``(phase, payload)`` with ``("pilots", [PilotPoint to run])``,
            ``("diagnoses", [RegimeDiagnosis])``, ``("proposals", [Proposal])`` for each proposal
            run (all of them with ``propose_only``), ``("validation", [ValidationRow])``.
        on_trial_start, on_trial_end, progress: per-trial callbacks (as :func:`run_study`).
        verbose: show the libraries' warnings during trials (as :func:`run_study`).

    Raises:
        ConfigError: bad ``pilot_fraction``, ``validations`` or space.
        StudyError: the storage cannot be opened, or the objective lacks the target.
    """
    from allocopt.study.loop import run_study
    from allocopt.study.open import open_study
    from allocopt.study.sampler import race_sampler

    f = check_pilot_fraction(pilot_fraction)
    if isinstance(validations, bool) or not isinstance(validations, int) or validations < 0:
        raise ConfigError(f"validations={validations!r}: must be an integer >= 0")
    s = replace(spec, pilot_fraction=f, trials=max(validations, 1))
    sampler = race_sampler(s, workload, settings)
    emit = on_phase or (lambda phase, payload: None)
    study = open_study(s, storage, sampler)
    result = RaceResult(study, sampler.budget_of("pilot"), [], [], [], [], [], sampler.timings)
    emit("pilots", sampler.pilots_to_run(study))

    pilots_done = _pilots_done_hook(sampler, result, s, settings, f, emit)
    answer: list[Any] = []  # the one answer, stored by the loop: (recommendation, surrogate)
    only_pilots = validations == 0 or propose_only
    run_study(s, objective=objective, workload=workload, tracker=tracker, sampler=sampler, study=study,
              on_trial_start=_trial_start_hook(sampler, emit, on_trial_start),
              on_trial_end=_trial_end_hook(sampler, result, on_trial_end),
              progress=progress, verbose=verbose,
              pilots_only=only_pilots, on_pilots=None if only_pilots else pilots_done,
              on_answer=lambda rec, sur: answer.append((rec, sur)))
    if only_pilots:
        pilots_done(study)
    if propose_only and validations:
        return _propose_without_running(study, sampler, result, validations, emit)
    _record_answer(study, s, sampler, result, answer, settings, tracker, emit)
    result.recommendations = list(sampler.recommendations)
    return result


def _trial_start_hook(sampler: Any, emit: Callable[[str, Any], None],
                      on_trial_start: Callable[[int, Allocation, TrialPlan | None], None] | None
                      ) -> Callable[[int, Allocation, TrialPlan | None], None]:
    """The loop's trial-start callback: shows the proposal a trial runs, then calls ``on_trial_start``."""
    def started(number: int, alloc: Allocation, plan: TrialPlan | None) -> None:
        d = sampler.decisions.get(number)
        if d is not None and d.proposal is not None:
            emit("proposals", [d.proposal])
        if on_trial_start:
            on_trial_start(number, alloc, plan)
    return started


def _trial_end_hook(sampler: Any, result: RaceResult,
                    on_trial_end: Callable[[Any, Any], None] | None) -> Callable[[Any, Any], None]:
    """The loop's trial-end callback: files the trial as a pilot or a validation in ``result``."""
    def ended(row: Any, res: Any) -> None:
        d = sampler.decisions.get(row.number)
        if d is not None and d.kind == "pilot":
            result.pilots.append(row)
        elif d is not None:
            result.validations.append(row)
            if d.proposal is not None:
                result.proposals.append(d.proposal)
        if on_trial_end:
            on_trial_end(row, res)
    return ended


def _pilots_done_hook(sampler: Any, result: RaceResult, s: StudySpec, settings: RaceSettings,
                      f: float, emit: Callable[[str, Any], None]) -> Callable[[Any], None]:
    """The loop's pilots-done callback: diagnoses the pilots into ``result``."""
    def pilots_done(study: Any) -> None:
        """The regime table of the pilots at the pilot budget, and the pilots' best diagnosis
        as the answer until a full run gives RACE's own."""
        pilots = [o for o in sampler.observations(study)
                  if o.fidelity == "pilot" and abs(o.budget_fraction - f) <= 1e-9 * f + 1e-12]
        result.diagnoses = diagnose(pilots, s.space, settings, sampler.seed)
        emit("diagnoses", result.diagnoses)
        fitted = [d for d in result.diagnoses if not math.isnan(d.value)]
        if fitted:
            result.recommendation = max(fitted, key=lambda d: d.value).recommendation
    return pilots_done


def _propose_without_running(study: Any, sampler: Any, result: RaceResult, validations: int,
                             emit: Callable[[str, Any], None]) -> RaceResult:
    """``result`` with ``validations`` proposals made (none run) and the sampler's answers."""
    result.proposals = sampler.proposals(study, q=validations)
    emit("proposals", result.proposals)
    result.recommendations = list(sampler.recommendations)
    if sampler.recommendations:
        result.recommendation = sampler.recommendations[-1][1]
    return result


def _record_answer(study: Any, s: StudySpec, sampler: Any, result: RaceResult, answer: list[Any],
                   settings: RaceSettings, tracker: Any, emit: Callable[[str, Any], None]) -> None:
    """RACE's answer and validation table into ``result``, or the pilots' answer stored."""
    from allocopt.study.loop import store_answer

    if answer:
        result.recommendation, sur = answer[0]
        result.validation = validate(result.diagnoses, sampler.observations(study), s.space, settings,
                                     surrogate=sur)
        emit("validation", result.validation)
    elif result.recommendation is not None:  # no full run yet: the pilots' best diagnosis
        store_answer(study, s, result.recommendation, tracker)
