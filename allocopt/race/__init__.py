"""RACE: IsoFLOP pilot grids, regime diagnosis, and multi-fidelity validation runs.

A RACE study spends a small share of the compute on **pilots** — trials at
``pilot_fraction × budget_flops``, all at that one budget (an IsoFLOP design) — to diagnose,
per reward system (and per model), where the budget should go, then on a few **validation**
runs at the full budget proposed by a multi-fidelity surrogate (:mod:`allocopt.surrogate`).
Pilots and validations are ordinary Optuna trials of one study, tagged with the user attribute
``fidelity`` (``pilot`` or ``full``) and ``budget_flops``; every one goes through
:func:`allocopt.plan.allocation.make_plan`, so none can exceed its budget.

1. **Pilot grid** (:func:`pilot_grid`): ``rho_levels`` evenly spaced ρ × every G × every
   reward system (× model). When that grid has more than ``max_pilots`` points, each reward
   system (× model) gets ``max_pilots // cells`` points of a seeded Latin hypercube over ρ,
   with G dealt out evenly and shuffled. Each point runs ``repeats`` times (different seeds).
2. **Regime diagnosis** (:func:`diagnose`), per reward system (× model), from the pilots:
   a *local quadratic* in ρ with additive G offsets, fitted by least squares weighted with a
   Gaussian kernel (``bandwidth``) around the current optimum and iterated, so the curve is
   read where it matters and far points do not drag the vertex; the ρ that maximizes it (the
   vertex, or the better end of the range when there is none); uncertainty from
   ``bootstrap`` draws of the fit's approximate posterior (a multivariate t on the coefficients,
   noise variance from a global quartic's residuals; 90 % intervals calibrated over seeds of a
   known function); slopes of the target at both
   ends of the range (local linear fits there); the reward share of compute at the optimum,
   from the trials' executed breakdowns (``reward_flops / total_flops``, linear in ρ); and a
   regime label per draw (:func:`regime_of`): ``reward-heavy`` when the reward
   share at the optimum exceeds ``reward_heavy_share`` (takes precedence), ``search-heavy``
   when ρ* < ``search_heavy_below``, ``update-heavy`` when ρ* > ``update_heavy_above``,
   ``balanced`` otherwise. The reported regime is the commonest label; its probability is its
   share of the draws.
3. **Validation** (:func:`propose`, :func:`validate`, :func:`recommend`): the surrogate
   (:mod:`allocopt.surrogate`) is fitted on pilots and full runs together (the budget fraction is
   its fidelity; it learns how far the optimal ρ drifts with the budget, so the pilots' bias is
   corrected once a few full runs exist) and proposes full runs by Thompson sampling of the
   full-budget maximizer, one per free worker, whenever asked (no fixed count; cells
   — reward system × model — without a full run get one first, ``explore_cells_after``) (or extra pilots, when their variance
   reduction per FLOP is worth it, within ``extra_pilot_budget``: none by default);
   infeasible plans and repeats of existing trials (same G, reward, model and fidelity, ρ within
   ``rho_match``) are never proposed; pending trials are conditioned on (a constant liar). After
   each new fit and at the end RACE **recommends** an
   allocation: the maximizer of the posterior mean at the full budget among what its full runs
   support (cell and G with a full run, ρ within ``rho_trust`` of one); :func:`recommendation`
   adds a credible interval, the probability per cell of holding the best allocation, and the
   set of allocations within one evaluation's noise of it (:class:`Recommendation`). After
   the runs, per reward system: the full-budget regime (from the surrogate's posterior at
   fidelity 1, with the same labelling), whether it matches the pilot regime, and the regret at
   full budget of the allocation the pilots recommended (surrogate mean at the best allocation
   of that reward system minus at the recommended one).

One job a module: :mod:`~allocopt.race.data` (the plain values RACE reads: observations,
runs, budgets per fidelity, the feasibility test), :mod:`~allocopt.race.design` (settings,
pilot grid), :mod:`~allocopt.race.diagnose` (regime diagnosis), :mod:`~allocopt.race.fit` (the
surrogate, refitted when worth it), :mod:`~allocopt.race.propose` (proposals),
:mod:`~allocopt.race.recommend` (the recommendation and its uncertainty),
:mod:`~allocopt.race.validate` (pilot against full regimes), :mod:`~allocopt.race.tuner` (all of
it as the one object a study's sampler asks). Nothing here reads a study or imports Optuna: the
translator from trials to these values is :mod:`allocopt.study.observe`, beside
:class:`allocopt.study.sampler.RaceSampler`; the whole race in one call is
:func:`allocopt.study.race.run_race`. Every name of the modules above is re-exported here.

numpy and (through the surrogate) torch are imported inside functions.
"""

from __future__ import annotations
from allocopt.race.data import Budgets, Feasible, Observation, Run
from allocopt.race.design import (FIDELITIES, REGIMES, SECTIONS, PilotPoint, RaceSettings, cells,
                                  check_pilot_fraction, check_race_table, pilot_grid, race_settings,
                                  settings_for)
from allocopt.race.diagnose import RegimeDiagnosis, diagnose, diagnose_group, regime_of, share_fit
from allocopt.race.fit import SurrogateCache, fit_surrogate
from allocopt.race.propose import PlanCache, Proposal, feasible_by, same_run, with_pending
from allocopt.race.legacy import propose  # the plain form, and the former one while callers remain
from allocopt.race.recommend import Recommendation, recommend, recommendation
from allocopt.race.tuner import RaceTuner, Tuner
from allocopt.race.validate import ValidationRow, same_regime_rate, validate

__all__ = ["Budgets", "FIDELITIES", "Feasible", "Observation", "PilotPoint", "PlanCache", "Proposal", "REGIMES",
           "RaceSettings", "RaceTuner", "Recommendation", "RegimeDiagnosis", "Run", "SECTIONS", "SurrogateCache",
           "Tuner", "ValidationRow", "cells", "check_pilot_fraction", "check_race_table", "diagnose", "diagnose_group",
           "feasible_by", "fit_surrogate", "pilot_grid", "propose", "race_settings", "recommend", "recommendation",
           "regime_of", "same_regime_rate", "same_run", "settings_for", "share_fit", "validate", "with_pending"]
