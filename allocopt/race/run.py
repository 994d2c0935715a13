"""The whole race in one call: pilots, diagnosis, proposals and their runs, validation.

Optuna is imported inside :func:`run_race`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from typing import Any, Callable

from allocopt.allocation import Allocation, TrialPlan, Workload
from allocopt.flops import ConfigError
from allocopt.race.design import RaceSettings, check_pilot_fraction, pilot_grid
from allocopt.race.diagnose import Observation, diagnose, observations
from allocopt.race.propose import PlanCache, existing_runs, fit_surrogate, propose, recommend, same_run
from allocopt.race.validate import RaceResult, validate
from allocopt.spec import StudySpec
from allocopt.study import DEFAULT_STORAGE, TrialRow, distributions, open_study, run_one_trial

def _params(spec: StudySpec, a: Allocation) -> dict[str, Any]:
    d = distributions(spec)
    full = {"rho": a.rho, "group_size": a.group_size, "reward": a.reward, "model": a.model}
    return {k: v for k, v in full.items() if k in d}


def _run_enqueued(study, spec, params, user_attrs, dists, **kw) -> TrialRow:
    study.enqueue_trial(params, user_attrs=user_attrs)
    trial = study.ask(dists)
    row, _ = run_one_trial(study, trial, spec, **kw)
    return row


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
    on_trial_end: Callable[[TrialRow, Any], None] | None = None,
    progress: Callable[..., None] | None = None,
) -> RaceResult:
    """Pilots, regime diagnosis, validation proposals (and runs) in one Optuna study.

    Args:
        spec: the study; ``spec.budget_flops`` is the full budget, ``spec.space`` the grid.
        objective, workload: as for :func:`allocopt.study.run_study`.
        storage: Optuna storage URL (``None``: in memory). Running again resumes: pilots and
            validations already in the study are not run again.
        tracker: an :class:`allocopt.tracking.StudyTracker` (fidelity tags ``pilot``/``full``).
        pilot_fraction: pilots run at ``pilot_fraction × spec.budget_flops``, in (0, 1).
        validations: full-budget runs the study should have from RACE proposals (0: pilots only).
        propose_only: propose ``validations`` runs (pilots allowed within the extra-pilot
            budget), run none.
        settings: :class:`RaceSettings`.
        on_phase: called as ``(phase, payload)`` with ``("pilots", [PilotPoint to run])``,
            ``("diagnoses", [RegimeDiagnosis])``, ``("proposals", [Proposal])`` each round,
            ``("validation", [ValidationRow])``.
        on_trial_start, on_trial_end, progress: per-trial callbacks (as :func:`run_study`).

    Raises:
        ConfigError: bad ``pilot_fraction``, ``validations`` or space.
        StudyError: the storage cannot be opened, or the objective lacks the target.
    """
    from optuna.trial import TrialState

    f = check_pilot_fraction(pilot_fraction)
    if isinstance(validations, bool) or not isinstance(validations, int) or validations < 0:
        raise ConfigError(f"validations={validations!r}: must be an integer >= 0")
    seed = spec.seed if settings.seed is None else settings.seed
    design = pilot_grid(spec.space, settings, seed)
    pilot_budget = f * spec.budget_flops
    study = open_study(replace(spec, sampler="random"), storage)  # RACE fixes every parameter itself
    study.set_user_attr("spec", spec.to_dict())
    study.set_user_attr("race", {"pilot_fraction": f, "settings": asdict(settings)})
    dists = distributions(spec)
    emit = on_phase or (lambda phase, payload: None)
    kw = dict(objective=objective, workload=workload, tracker=tracker, on_trial_start=on_trial_start,
              on_trial_end=on_trial_end, progress=progress)

    # (a) pilots
    done = set()
    for t in study.get_trials(deepcopy=False):
        k = t.user_attrs.get("race_pilot")
        interrupted = t.state == TrialState.FAIL and str(t.user_attrs.get("error", "")).startswith("interrupted")
        if k and t.state in (TrialState.COMPLETE, TrialState.FAIL) and not interrupted:
            done.add(k)
    todo = [p for p in design if p.key not in done]
    emit("pilots", todo)
    pilot_rows = []
    for p in todo:
        pilot_rows.append(_run_enqueued(
            study, spec, _params(spec, p.allocation),
            {"fidelity": "pilot", "budget_flops": pilot_budget, "race_pilot": p.key}, dists, **kw))

    # (b) diagnosis
    obs = observations(study, spec)
    pilots = [o for o in obs if o.fidelity == "pilot" and abs(o.budget_fraction - f) <= 1e-9 * f + 1e-12]
    diagnoses = diagnose(pilots, spec.space, settings, seed)
    emit("diagnoses", diagnoses)
    result = RaceResult(study, pilot_budget, pilot_rows, diagnoses, [], [], [],
                        {"fit_seconds": [], "proposal_seconds": []})
    fitted = [d for d in diagnoses if not math.isnan(d.value)]
    if fitted:
        result.recommendation = max(fitted, key=lambda d: d.value).recommendation
    if validations == 0:
        return result

    def recommend_now(sur: Any, obs: list[Observation]) -> None:
        result.recommendation = recommend(sur, obs, spec.space, settings)[0]
        result.recommendations.append((max(o.number for o in obs), result.recommendation))

    # (c) proposals and validation runs
    plans = PlanCache(workload)

    def status():
        ts = study.get_trials(deepcopy=False)
        n_full = sum(1 for t in ts if t.user_attrs.get("race_validation") and t.user_attrs.get("fidelity") == "full"
                     and t.state in (TrialState.COMPLETE, TrialState.FAIL))
        n_extra = sum(1 for t in ts if t.user_attrs.get("race_validation") and t.user_attrs.get("fidelity") == "pilot"
                      and t.state in (TrialState.COMPLETE, TrialState.FAIL))
        return n_full, n_extra * f

    sur, raw = None, None
    for _round in range(validations + math.ceil(settings.extra_pilot_budget / f) + 2):
        n_full, extra_spent = status()
        if n_full >= validations and not propose_only:
            break
        obs = observations(study, spec)
        if len(obs) < 2:
            break
        t0 = time.perf_counter()
        sur = fit_surrogate(obs, spec.space, seed=seed + len(obs), init=raw)
        raw = sur.raw
        result.timings["fit_seconds"].append(sur.fit_seconds)
        recommend_now(sur, obs)
        q = validations if propose_only else settings.batch_size
        allow = extra_spent + f <= settings.extra_pilot_budget + 1e-12
        batch = propose(obs, spec, workload, existing=existing_runs(study, spec), q=q, pilot_fraction=f,
                        allow_pilots=allow, settings=settings, surrogate=sur, plans=plans)
        result.timings["proposal_seconds"].append(time.perf_counter() - t0 - sur.fit_seconds)
        if propose_only:
            result.proposals += batch
            emit("proposals", batch)
            break
        emit("proposals", batch)
        for p in batch:
            n_full, extra_spent = status()
            if p.fidelity == "full" and n_full >= validations:
                continue
            if p.fidelity == "pilot" and extra_spent + f > settings.extra_pilot_budget + 1e-12:
                continue
            if any(same_run(p.allocation, p.fidelity, a, fa, settings.rho_match)
                   for a, fa in existing_runs(study, spec)):
                continue  # another worker ran it meanwhile
            result.proposals.append(p)
            result.validations.append(_run_enqueued(
                study, spec, _params(spec, p.allocation),
                {"fidelity": p.fidelity, "budget_flops": p.budget_flops, "race_validation": True},
                dists, **kw))
        if not batch:
            break
        sur = None

    obs = observations(study, spec)
    if any(o.fidelity == "full" for o in obs) and len(obs) >= 2:
        if sur is None:
            sur = fit_surrogate(obs, spec.space, seed=seed + len(obs), init=raw)
            result.timings["fit_seconds"].append(sur.fit_seconds)
            recommend_now(sur, obs)
        result.validation = validate(diagnoses, obs, spec, settings, surrogate=sur)
        emit("validation", result.validation)
    return result

