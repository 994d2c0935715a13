"""RaceSampler as an Optuna sampler: from plain Optuna code, pending trials, concurrent claims,
and the one study loop (run_study) on the synthetic objective."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import optuna
import pytest

from allocopt.plan.allocation import Allocation, make_plan
from allocopt.race import RaceSettings, propose
from allocopt.study import observe
from allocopt.study.sampler import FIDELITY_PARAM, RaceSampler
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import run_study
from allocopt.record import rows
from allocopt.study.trial import best_row
from objectives.synthetic import SyntheticObjective

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUDGET = 1e19
SPACE = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
# the full pilot grid by hand: 6 evenly spaced rho levels x 2 G x 2 rewards = 24 points
GRID = {(r, g, round(0.2 + 0.7 * i / 5, 4)) for r in ("sparse", "prm") for g in (4, 8) for i in range(6)}
SETTINGS = RaceSettings(max_pilots=24)


def _race(n_trials: int, settings: RaceSettings = SETTINGS, **kw):
    """RACE from one's own Optuna code: the sampler picks, the objective reads the decision."""
    obj = SyntheticObjective()
    w = obj.workload()
    sampler = RaceSampler(SPACE, BUDGET, workload=w, settings=settings, **kw)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    spent = []

    def objective(trial: optuna.Trial) -> float:
        d = sampler.suggest(trial)
        plan = make_plan(d.budget_flops, d.allocation, w)
        result = obj.run(plan, seed=trial.number)
        b = result.breakdown
        assert b.search_flops + b.learning_flops + b.reward_flops == pytest.approx(b.total_flops)
        spent.append((d, b.total_flops))
        return result.targets["pass_at_1"]

    study.optimize(objective, n_trials=n_trials)
    return study, sampler, spent


def test_race_sampler_from_plain_optuna_code():
    study, sampler, spent = _race(27)
    trials = sorted(study.trials, key=lambda t: t.number)
    pilots, full = trials[:24], trials[24:]
    # pilots first: every grid point once, at a tenth of the budget
    assert {(t.params["reward"], t.params["group_size"], round(t.params["rho"], 4)) for t in pilots} == GRID
    for t in pilots:
        assert t.params[FIDELITY_PARAM] == "pilot" and t.user_attrs["fidelity"] == "pilot"
        assert t.user_attrs["budget_flops"] == 0.1 * BUDGET and "race_pilot" in t.user_attrs
    # then surrogate proposals at the full budget, all different
    for t in full:
        assert t.params[FIDELITY_PARAM] == "full" and t.user_attrs["budget_flops"] == BUDGET
        assert t.user_attrs["race_validation"] is True
        assert sampler.decisions[t.number].kind == "proposal"
    assert len({(t.params["reward"], t.params["group_size"], round(t.params["rho"], 3)) for t in full}) == 3
    for d, total in spent:
        assert 0 < total <= d.budget_flops
    # the synthetic optimum (module docstring): prm at G = 8 beats every sparse allocation by
    # >= 0.06, so the first two proposals (Thompson samples) are prm, the first at G = 8; once
    # two full runs exist, a cell without one gets one (RaceSettings.explore_cells_after = 2),
    # so the third is sparse's best
    assert [t.params["reward"] for t in full] == ["prm", "prm", "sparse"]
    assert full[0].params["group_size"] == 8
    assert sampler.timings["fit_seconds"] and sampler.recommendations[0][0] == 23


def test_pending_trials_are_conditioned_on():
    # cells-first off (explore_cells_after=None): it would send the next proposal to the other
    # cell whatever the lie, and this test is about the lie
    settings = RaceSettings(max_pilots=24, explore_cells_after=None)
    study, sampler, _ = _race(24, settings)  # the pilots
    t1 = study.ask()
    d1 = sampler.suggest(t1)
    # control: the surrogate without the pending trial's lie; only the exact repeat is excluded
    sur, obs = sampler.surrogate(study)
    runs = [replace(r, pending=False) for r in observe.runs(study.trials, SPACE)]
    control = propose(obs, runs, SPACE, sampler.budgets, settings, feasible=sampler.tuner.feasible,
                      q=1, surrogate=sur, allow_pilots=False)[0].allocation
    t2 = study.ask()
    d2 = sampler.suggest(t2)
    t3 = study.ask()
    d3 = sampler.suggest(t3)
    assert {d1.kind, d2.kind, d3.kind} == {"proposal"} and {d1.fidelity, d2.fidelity, d3.fidelity} == {"full"}
    a1, a2, a3 = d1.allocation, d2.allocation, d3.allocation
    assert len({(a.reward, a.group_size, round(a.rho, 3)) for a in (a1, a2, a3)}) == 3
    # without the lie the next proposal is a neighbour of the pending one; with it, farther away
    gap = lambda a: abs(a.rho - a1.rho) if (a.reward, a.group_size) == (a1.reward, a1.group_size) else math.inf  # noqa: E731
    assert gap(control) <= 0.03
    assert gap(a2) > gap(control) and gap(a3) > gap(control)


def test_concurrent_asks_claim_different_pilots():
    sampler = RaceSampler(SPACE, BUDGET, settings=SETTINGS)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    t0, t1 = study.ask(), study.ask()  # two workers asked; neither has sampled yet
    d1 = sampler.suggest(t1)  # the younger samples first: it leaves the first point to the older
    d0 = sampler.suggest(t0)
    assert d0.pilot == sampler.design[0] and d1.pilot == sampler.design[1]
    # an interrupted pilot is run again; a pilot that failed otherwise is not
    study.tell(t0, state=optuna.trial.TrialState.FAIL)
    t1.set_user_attr("error", "interrupted")
    study.tell(t1, state=optuna.trial.TrialState.FAIL)
    t2 = study.ask()
    assert sampler.suggest(t2).pilot == sampler.design[1]
    assert sampler.pilots_left(study) == 24 - 2


def test_enqueued_trials_keep_their_parameters_and_claim_their_point():
    """The waiting queue's parameters are read from Optuna's system attribute ``fixed_params``
    (allocopt.record.params_of): this fails if Optuna stops keeping them there."""
    sampler = RaceSampler(SPACE, BUDGET, settings=SETTINGS)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    first = sampler.design[0].allocation
    study.enqueue_trial({"rho": first.rho, "group_size": first.group_size, "reward": first.reward,
                         FIDELITY_PARAM: "pilot"})
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting[0].system_attrs["fixed_params"][FIDELITY_PARAM] == "pilot"
    assert sampler.pilots_to_run(study)[0] == sampler.design[1]
    t = study.ask()  # the enqueued one
    d = sampler.suggest(t)
    assert d.kind == "given" and d.allocation == first and d.budget_flops == 0.1 * BUDGET
    assert sampler.suggest(study.ask()).pilot == sampler.design[1]
    # enqueued the old way (no fidelity parameter; fidelity and budget as user attributes)
    study.enqueue_trial({"rho": 0.55, "group_size": 8, "reward": "prm"},
                        user_attrs={"fidelity": "pilot", "budget_flops": 2e18})
    t = study.ask()
    d = sampler.suggest(t)
    assert d.kind == "given" and d.allocation == Allocation(0.55, 8, "prm") and d.budget_flops == 2e18
    assert t.params[FIDELITY_PARAM] == "pilot"
    assert sampler.pilots_to_run(study)[0] == sampler.design[2]


def test_infeasible_and_failed_trials_are_not_observations():
    sampler = RaceSampler(SPACE, BUDGET, settings=SETTINGS)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for value, state in ((0.3, "COMPLETE"), (0.0, "INFEASIBLE"), (0.5, "COMPLETE")):
        t = study.ask()
        sampler.suggest(t)
        t.set_user_attr("state", state)
        study.tell(t, value)
    obs = sampler.observations(study)
    assert [o.number for o in obs] == [0, 2]
    assert [o.value for o in obs] == [-0.3, -0.5]  # minimize: higher is better for the surrogate
    assert {o.fidelity for o in obs} == {"pilot"} and {o.budget_fraction for o in obs} == {0.1}


def test_several_objectives_are_refused():
    sampler = RaceSampler(SPACE, BUDGET, settings=SETTINGS)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    with pytest.raises(ValueError, match="one objective only"):
        sampler.suggest(study.ask())


@pytest.mark.slow  # whole studies through run_study: ~22 s on 2 loaded cores
def test_run_study_is_the_one_loop(tmp_path):
    """``allocopt study``'s loop with RACE on: the pilots, then ``trials`` full-budget runs."""
    s = StudySpec(name="loop", objective="synthetic", budget_flops=BUDGET, target="pass@1", trials=3,
                  tuner="race", pilots=24, space=SPACE)
    obj = SyntheticObjective()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/s.db")
    fid = [t.user_attrs["fidelity"] for t in sorted(st.trials, key=lambda t: t.number)]
    assert fid == ["pilot"] * 24 + ["full"] * 3
    assert all(r.state == "COMPLETE" and "fidelity" not in r.params for r in rows(st))
    b = best_row(st)
    assert b is not None and b.number >= 24  # the best full-budget trial, not a pilot
    assert b.value == max(r.value for r in rows(st) if r.number >= 24)
    # resuming with more trials runs only the missing full-budget ones
    st = run_study(StudySpec(**{**s.to_dict(), "trials": 4}), objective=obj, workload=obj.workload(),
                   storage=f"sqlite:///{tmp_path}/s.db")
    assert len(st.trials) == 28


@pytest.mark.slow  # workers deciding at once over a whole study: ~33 s on 2 loaded cores
def test_workers_deciding_at_once_claim_different_proposals(tmp_path, monkeypatch):
    """Two workers that decide before either has written its parameters: the second sees the
    first's claim (one write, before the parameters) and proposes another point. Control: with
    claims off, both propose the same point (the first full run of the best cell is
    deterministic)."""
    import allocopt.study.sampler as sampler_mod

    s = StudySpec(name="claims", objective="synthetic", budget_flops=BUDGET, target="pass@1", trials=1,
                  pilots=24, space=SPACE)
    obj = SyntheticObjective()

    def two_decisions(name):
        st = run_study(StudySpec(**{**s.to_dict(), "name": name}), objective=obj, workload=obj.workload(),
                       storage=f"sqlite:///{tmp_path}/{name}.db", pilots_only=True)
        sampler = st.sampler
        t0, t1 = st.ask(), st.ask()  # no distributions: nothing sampled yet
        frozen = {t.number: t for t in st.get_trials(deepcopy=False)}
        d0 = sampler.sample_relative(st, frozen[t0.number], sampler.distributions)
        d1 = sampler.sample_relative(st, frozen[t1.number], sampler.distributions)
        return d0, d1, sampler.decisions[t0.number].kind, sampler.decisions[t1.number].kind

    d0, d1, k0, k1 = two_decisions("with")
    assert k0 == k1 == "proposal"  # a pilot or a full run, as the knowledge gradient values it
    point = lambda d: (d["fidelity"], d["reward"], d["group_size"], round(d["rho"], 4))  # noqa: E731
    assert point(d0) != point(d1)
    monkeypatch.setattr(sampler_mod, "write_claim", lambda *a, **k: False)
    c0, c1, _, _ = two_decisions("without")
    assert c0 == c1  # the duplicate that claims prevent


def test_a_worker_killed_after_its_claim_leaves_a_stale_trial_not_a_claim(tmp_path, monkeypatch):
    """A worker that dies after claiming a pilot point but before its trial started: the claim
    started the trial's heartbeat, so after the grace period the next worker fails that trial
    and Optuna's retry of it (the next trial asked) runs the same point."""
    from allocopt.store.heartbeat import fail_stale
    from allocopt.study.open import open_study

    monkeypatch.setenv("ALLOCOPT_HEARTBEAT_S", "1")
    monkeypatch.setenv("ALLOCOPT_GRACE_S", "2")
    s = StudySpec(name="dead", objective="synthetic", budget_flops=BUDGET, target="pass@1", trials=1,
                  pilots=24, space=SPACE)
    st = open_study(s, f"sqlite:///{tmp_path}/d.db")
    sampler = RaceSampler(SPACE, BUDGET, workload=SyntheticObjective().workload(),
                          settings=SETTINGS)
    st.sampler = sampler
    dead = st.ask()  # the worker decides and claims, then dies: no parameters, no trial run
    first = sampler.sample_relative(st, st.get_trials(deepcopy=False)[dead.number], sampler.distributions)
    assert sampler.pilots_to_run(st)[0].allocation.rho != first["rho"] or \
        sampler.pilots_to_run(st)[0].allocation.group_size != first["group_size"]  # claimed while alive
    time.sleep(3.5)
    fail_stale(st)
    trials = st.get_trials(deepcopy=False)
    assert trials[dead.number].state.name == "FAIL"
    [retry] = [t for t in trials if t.state.name == "WAITING"]  # Optuna's retry of the dead trial
    assert retry.system_attrs["failed_trial"] == dead.number
    nxt = st.ask(sampler.distributions)  # the next worker takes the retry and runs the same point
    assert nxt.number == retry.number
    assert (nxt.params["reward"], nxt.params["group_size"], round(nxt.params["rho"], 4)) == \
        (first["reward"], first["group_size"], round(first["rho"], 4))


def test_another_tuner_plugs_in_over_plain_data():
    """A tuner written against plain data alone (no Optuna, no study): the sampler hands it the
    trials as observations and runs, and the trials run its proposals."""
    from allocopt.race import Observation, Proposal, Run, Tuner

    class Ladder:
        """Full runs at rho 0.3, 0.4, ... (one step per run made so far)."""

        design: list = []
        timings: dict = {"fit_seconds": [], "proposal_seconds": []}
        recommendations: list = []

        def __init__(self):
            self.seen = []

        def unclaimed(self, runs):
            return []

        def propose(self, obs, runs, q=1):
            self.seen.append((list(obs), list(runs)))
            a = Allocation(round(0.3 + 0.1 * len(runs), 4), 8, "prm")
            return [Proposal(a, "full", BUDGET, None, 1.0, 1.0, 0.0, 0.0)]

        def answer(self, obs):
            return None, None

    tuner = Ladder()
    assert isinstance(tuner, Tuner)
    sampler = RaceSampler(SPACE, BUDGET, tuner=tuner)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for i in range(3):
        t = study.ask()
        d = sampler.suggest(t)
        assert (d.kind, d.fidelity, d.allocation.rho, d.budget_flops) == ("proposal", "full", 0.3 + 0.1 * i, BUDGET)
        study.tell(t, 0.25 * i)
    obs, runs = tuner.seen[-1]  # what the third ask saw: two finished trials
    assert all(isinstance(o, Observation) for o in obs) and all(isinstance(r, Run) for r in runs)
    assert [(o.number, o.value, o.allocation.rho, o.budget_fraction, o.fidelity) for o in obs] == [
        (0, 0.0, 0.3, 1.0, "full"), (1, 0.25, 0.4, 1.0, "full")]
    assert [(r.allocation.rho, r.fidelity, r.pending) for r in runs] == [(0.3, "full", False), (0.4, "full", False)]


def test_one_loop_ends_the_pilot_phase_once():
    """run_study with a RaceSampler runs the pilots, calls on_pilots once with every pilot
    finished and no full run asked yet, then the full runs; resumed with its pilots done, it
    calls on_pilots at once, before any new trial."""
    from allocopt.study.sampler import race_sampler

    s = StudySpec(name="phases", objective="synthetic", budget_flops=BUDGET, target="pass@1", trials=2,
                  space=SearchSpace(rho=(0.2, 0.9), group_sizes=(4,), rewards=("sparse",)))
    obj = SyntheticObjective()
    w = obj.workload()
    seen = []

    def on_pilots(st):
        seen.append([(t.user_attrs["fidelity"], t.state.name) for t in st.get_trials()])

    study = run_study(s, objective=obj, workload=w, storage=None, sampler=race_sampler(s, w, RaceSettings(max_pilots=6)),
                      on_pilots=on_pilots)
    assert seen == [[("pilot", "COMPLETE")] * 6]
    assert [t.user_attrs["fidelity"] for t in study.get_trials()] == ["pilot"] * 6 + ["full"] * 2
    run_study(replace(s, trials=3), objective=obj, workload=w, study=study,
              sampler=race_sampler(s, w, RaceSettings(max_pilots=6)), on_pilots=on_pilots)
    assert len(seen) == 2 and seen[1] == [("pilot", "COMPLETE")] * 6 + [("full", "COMPLETE")] * 2
    assert len(study.get_trials()) == 9
    with pytest.raises(ValueError, match="need a RaceSampler"):
        run_study(s, objective=obj, workload=w, storage=None, sampler=optuna.samplers.RandomSampler(),
                  on_pilots=on_pilots)
