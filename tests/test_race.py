"""RACE on the synthetic test function: pilot grids, regime diagnosis, proposals, CLI."""

import json
import math
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, replace

import optuna
import pytest

from allocopt.plan.allocation import Allocation, Workload, make_plan, min_budget
from allocopt.flops import ConfigError, ModelShape
from allocopt.plan.setup import TrainingSetup
from allocopt.race import (Budgets, Observation, PlanCache, RaceSettings, Run, diagnose_group, pilot_grid, propose,
                           regime_of)
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.race import run_race
from objectives.synthetic import SyntheticObjective, response, rho_star

BUDGET = 1e19
SPACE = SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 4, 8), rewards=("sparse", "prm"))


class Counting(SyntheticObjective):
    """The synthetic objective, recording every run's allocation and budget."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = []

    def run(self, plan, *, seed=0, progress=None):
        self.calls.append((plan.allocation, plan.budget_flops))
        return super().run(plan, seed=seed)


class FakeTracker:
    def __init__(self):
        self.tags = {}

    def start_trial(self, number, params, tags=None):
        self.tags[number] = dict(tags or {})
        return str(number)

    def finish_trial(self, run_id, **kw):
        pass

    def log_study_summary(self, **kw):
        pass

    def reconcile(self, study):  # no MLflow runs to end: nothing was left open
        return []

    def log_spec(self, spec):
        self.spec = spec

    def log_text(self, text, name):
        pass

    def log_recommendation(self, rec):
        self.rec = rec


def workload(**kw):
    """A light workload: 16 rollouts per iteration keeps make_plan fast."""
    return Workload(ModelShape.preset("Qwen/Qwen2.5-1.5B"), TrainingSetup(rollouts_per_iteration=16), **kw)


def spec(**kw):
    base = dict(name="race", objective="synthetic", budget_flops=BUDGET, target="pass@1", seed=0, space=SPACE)
    return StudySpec(**{**base, **kw})


# ------------------------------------------------------------------ settings and the grid
@pytest.mark.parametrize("kw,needle", [
    ({"search_heavy_below": 0.7}, "search_heavy_below"),
    ({"reward_heavy_share": 1.5}, "reward_heavy_share"),
    ({"max_pilots": 2}, "max_pilots"),
    ({"repeats": 0}, "repeats"),
    ({"bandwidth": -1.0}, "bandwidth"),
    ({"extra_pilot_budget": -1}, "extra_pilot_budget"),
    ({"extra_pilot_budget": math.inf}, "extra_pilot_budget=inf: must be a number from 0 to 1000"),
    ({"bandwidth": 0.0099}, "bandwidth=0.0099: must be a number from 0.01 to 10"),
    ({"bandwidth": 10.5}, "bandwidth=10.5: must be a number from 0.01 to 10"),
    ({"bootstrap": 20001}, "bootstrap=20001: must be an integer >= 10 and <= 20000"),
    ({"bootstrap": 9}, "bootstrap=9: must be an integer >= 10"),
    ({"rho_grid": 1002}, "rho_grid=1002: must be an integer >= 5 and <= 1001"),
    ({"rho_grid": 71.0}, "rho_grid=71.0: must be an integer"),
    ({"thompson_samples": 4097}, "thompson_samples=4097"),
    ({"posterior_samples": 4097}, "posterior_samples=4097"),
    ({"max_pilots": 100_001}, "max_pilots=100001: must be an integer >= 3 and <= 100000, or left unset"),
    ({"rho_match": math.nan}, "rho_match=nan"),
    ({"repeats": True}, "repeats=True: must be an integer"),
])
def test_settings_are_checked(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        RaceSettings(**kw)


def test_settings_have_sections_and_no_removed_field():
    """Four sections cover every field; the removed ``batch_size`` and ``seed`` are no fields,
    and a [race] table that sets them is refused with what to do instead."""
    from dataclasses import fields

    from allocopt.race import SECTIONS, check_race_table

    s = RaceSettings()
    names = [f.name for f in fields(RaceSettings)]
    assert sorted(n for sec in SECTIONS for n in s.section(sec)) == sorted(names)
    assert s.section("diagnosis") == {"search_heavy_below": 0.4, "update_heavy_above": 0.6, "reward_heavy_share": 0.3,
                                      "bandwidth": 0.2, "bootstrap": 200}
    assert "batch_size" not in names and "seed" not in names
    with pytest.raises(ConfigError, match="race.batch_size: no longer a RACE setting"):
        check_race_table({"batch_size": 2})
    with pytest.raises(ConfigError, match="race.seed: set by the study's 'seed'"):
        check_race_table({"seed": 1})
    assert check_race_table({"bandwidth": 0.35, "pilot_group_sizes": [2, 4]}) == {"bandwidth": 0.35,
                                                                                   "pilot_group_sizes": (2, 4)}


@pytest.mark.parametrize("bandwidth", [0.01, 10])
def test_bandwidth_at_the_edges_of_its_range_diagnoses(bandwidth):
    """Four pilots bunched at the low end, whose fitted optimum is the high end: at bandwidth
    0.01 every kernel weight there underflows to 0 (the fit raised LinAlgError before); the
    diagnosis says rho* unknown instead. Eight spread pilots at both edges: no error, a rho* in
    range or unknown."""
    bunch = [Observation(i, Allocation(r, 4, "sparse"), y, 1e18, 0.1, "pilot")
             for i, (r, y) in enumerate([(0.2, 0.1), (0.21, 0.2), (0.22, 0.35), (0.23, 0.5)])]
    d = diagnose_group(bunch, (0.2, 0.9), RaceSettings(bandwidth=bandwidth, bootstrap=20000))
    assert d.regime == "unknown" and math.isnan(d.rho) and "too few pilots" in d.note
    spread = [Observation(i, Allocation(round(0.2 + 0.1 * i, 4), 4, "prm"), response(0.2 + 0.1 * i, 4, "prm"),
                          1e18, 0.1, "pilot") for i in range(8)]
    d = diagnose_group(spread, (0.2, 0.9), RaceSettings(bandwidth=bandwidth, bootstrap=20000))
    assert d.regime == "unknown" or 0.2 <= d.rho <= 0.9


@pytest.mark.slow  # the largest posterior samples of every step: ~20 s on 2 loaded cores
def test_settings_at_their_maxima_and_minima_run():
    """Proposals, the recommendation and the validation at the largest and smallest candidate
    grids and sample counts: each returns (no hang, no error), in bounded memory (at most
    rho_grid x posterior_samples doubles: 33 MB)."""
    from allocopt.race import diagnose, fit_surrogate, recommendation, validate

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    obs = _obs() + _full("prm", (0.4, 0.5))
    runs = [Run(o.allocation, o.fidelity) for o in obs]
    sur = fit_surrogate(obs, space)
    for s in (RaceSettings(rho_grid=1001, thompson_samples=4096, posterior_samples=4096, bootstrap=20000),
              RaceSettings(rho_grid=5, thompson_samples=1, posterior_samples=16, bootstrap=10, rho_match=0.5,
                           rho_trust=1e-3)):
        props = propose(obs, runs, space, Budgets(BUDGET), s, surrogate=sur, q=2)
        assert 1 <= len(props) <= 2
        rec = recommendation(sur, obs, space, s)
        assert rec.interval[0] <= rec.mean <= rec.interval[1]
        rows = validate(diagnose([o for o in obs if o.fidelity == "pilot"], space, s), obs, space, s, surrogate=sur)
        assert [r.reward for r in rows] == ["sparse", "prm"]


def test_regime_labels_and_precedence():
    s = RaceSettings()
    assert regime_of(0.3, 0.0, s) == "search-heavy"
    assert regime_of(0.72, 0.0, s) == "update-heavy"
    assert regime_of(0.5, 0.1, s) == "balanced"
    assert regime_of(0.72, 0.31, s) == "reward-heavy"  # reward share takes precedence
    assert regime_of(0.3, 0.5, replace(s, reward_heavy_share=0.6)) == "search-heavy"


def test_pilot_grid_full_when_small_space_filling_when_large():
    small = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    g = pilot_grid(small, RaceSettings(rho_levels=5, max_pilots=20))
    assert len(g) == 5 * 2 * 2 and len({p.key for p in g}) == 20
    assert sorted({p.allocation.rho for p in g}) == [0.2, 0.375, 0.55, 0.725, 0.9]

    s = RaceSettings(rho_levels=6, max_pilots=24, repeats=2)  # 6 x 3 x 2 = 36 > 24
    g = pilot_grid(SPACE, s, seed=3)
    assert g == pilot_grid(SPACE, s, seed=3) and g != pilot_grid(SPACE, s, seed=4)
    assert len(g) == 24 * 2 and len({p.key for p in g}) == 48  # repeats differ by key
    for reward in SPACE.rewards:
        mine = [p.allocation for p in g if p.repeat == 0 and p.allocation.reward == reward]
        assert len(mine) == 12
        strata = sorted(int((a.rho - 0.2) / 0.7 * 12 - 1e-9) for a in mine)
        assert strata == list(range(12))  # Latin hypercube: one rho per stratum
        assert Counter(a.group_size for a in mine) == {2: 4, 4: 4, 8: 4}
    with pytest.raises(ConfigError, match="max_pilots"):
        pilot_grid(SPACE, RaceSettings(max_pilots=11))  # 6 each needed


def test_pilot_grid_at_some_g_only():
    """pilot_group_sizes: the grid at those G (the full runs keep the whole space): 30 pilots over
    5 reward systems at G 4 only are the whole 6-level grid (6 x 1 x 5), not a hypercube of 6
    over 3 G; the fit's need falls to 3 + 0 offsets + 1 = 4 a reward system."""
    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 4, 8),
                        rewards=("sparse", "structured", "dense", "proxy_prm", "prm"))
    g = pilot_grid(space, RaceSettings(max_pilots=30, pilot_group_sizes=(4,)))
    assert len(g) == 30 and {p.allocation.group_size for p in g} == {4}
    assert sorted({p.allocation.rho for p in g}) == [0.2, 0.34, 0.48, 0.62, 0.76, 0.9]
    assert len(pilot_grid(space, RaceSettings(max_pilots=20, pilot_group_sizes=(4,)))) == 20  # 4 each: enough
    with pytest.raises(ConfigError, match="needs at least 20"):
        pilot_grid(space, RaceSettings(max_pilots=19, pilot_group_sizes=(4,)))
    assert RaceSettings(pilot_group_sizes=[2, 8]).pilot_group_sizes == (2, 8)  # a TOML list
    assert RaceSettings(pilot_group_sizes=(4,)).pilot_cap(space) == 60  # max(60, 4 x 5)
    with pytest.raises(ConfigError, match="G 3 is not in the space's group_sizes"):
        pilot_grid(space, RaceSettings(pilot_group_sizes=(3,)))
    for bad in ((), (4, 4), (1,), (True,)):
        with pytest.raises(ConfigError, match="pilot_group_sizes"):
            RaceSettings(pilot_group_sizes=bad)


def test_pilot_grid_sized_to_the_space_unless_given():
    """By default every reward system x model gets the len(G) + 3 pilots its local fit needs
    (the model-size space: 15 cells x 7 = 105 > 60); a max_pilots given is a hard limit."""
    from objectives.synthetic import space_of

    big = space_of("model-size")
    cells = len(big.rewards) * len(big.models)
    need = len(big.group_sizes) + 3
    g = pilot_grid(big, RaceSettings(), seed=1)
    assert len(g) == cells * need == 105
    per_cell = Counter((p.allocation.reward, p.allocation.model) for p in g)
    assert len(per_cell) == cells and set(per_cell.values()) == {need}
    with pytest.raises(ConfigError, match="needs at least 105"):
        pilot_grid(big, RaceSettings(max_pilots=60))
    assert len(pilot_grid(SearchSpace(), RaceSettings())) == 60  # 6 x 4 x 5 = 120 > 60: 12 each
    with pytest.raises(ConfigError, match="range of rho"):
        pilot_grid(SearchSpace(rho=(0.5, 0.5)))


# -------------------------------------------------------------------------- diagnosis
@pytest.mark.slow  # RACE's diagnosis over many seeds: ~22 s on 2 loaded cores
def test_regime_right_in_95_percent_of_seeds():
    """20 seeds, noise 0.01: sparse is update-heavy (rho* 0.72 at 1e19, 0.69 at the pilots'
    1e18), prm reward-heavy with a lower recommended rho (0.45 / 0.42), as in the paper."""
    obj = SyntheticObjective(noise=0.01)
    w = workload()
    results = []
    for seed in range(20):
        r = run_race(spec(name=f"acc{seed}", seed=seed), objective=obj, workload=w, storage=None,
                     validations=0, settings=RaceSettings(max_pilots=24))
        d = {x.reward: x for x in r.diagnoses}
        results.append((d["sparse"].regime == "update-heavy", d["prm"].regime == "reward-heavy",
                        d["prm"].rho < d["sparse"].rho, d["sparse"].rho, d["prm"].rho))
    n = len(results)
    assert sum(r[0] for r in results) >= 0.95 * n
    assert sum(r[1] for r in results) >= 0.95 * n
    assert sum(r[2] for r in results) >= 0.95 * n
    for i, reward in ((3, "sparse"), (4, "prm")):  # unbiased within a few hundredths
        mean = sum(r[i] for r in results) / n
        assert abs(mean - rho_star(reward, budget_flops=BUDGET / 10)) < 0.04, (reward, mean)


def test_diagnosis_reports_slopes_share_and_uncertainty():
    obs = []
    for i, rho in enumerate([0.2 + 0.7 * k / 11 for k in range(12)]):
        G = (2, 4, 8)[i % 3]
        obs.append(Observation(i, Allocation(round(rho, 4), G, "prm"), response(rho, G, "prm", budget_flops=1e18),
                               1e18, 0.1, "pilot", 0.85 * (1 - rho)))
    d = diagnose_group(obs, (0.2, 0.9), RaceSettings(bootstrap=50))
    assert abs(d.rho - rho_star("prm", budget_flops=1e18)) < 0.03
    assert d.slope_low > 0 > d.slope_high  # an interior optimum
    assert d.group_size == 8 and abs(d.reward_share - 0.85 * (1 - d.rho)) < 1e-4
    assert d.regime == "reward-heavy" and d.probability == 1.0
    assert d.rho_interval[0] <= d.rho <= d.rho_interval[1]
    few = diagnose_group(obs[:2], (0.2, 0.9))
    assert few.regime == "unknown" and "needs 3" in few.note


# ------------------------------------------------------------------------ proposals
def _obs(rewards=("sparse", "prm"), fraction=0.1):
    out = []
    for reward in rewards:
        for i, rho in enumerate([0.2 + 0.7 * k / 7 for k in range(8)]):
            G = (4, 8)[i % 2]
            out.append(Observation(len(out), Allocation(round(rho, 4), G, reward),
                                   response(rho, G, reward, budget_flops=BUDGET * fraction),
                                   BUDGET * fraction, fraction, "pilot", 0.0))
    return out


def test_proposals_never_exceed_the_budget():
    """A reward model so large that no prm plan fits the budget: the surrogate prefers prm
    (its pilots score best), yet every proposal is a feasible sparse plan within budget."""
    huge = replace(ModelShape.preset("Qwen/Qwen2.5-Math-PRM-7B"), num_layers=28 * 12, name="huge-prm")
    w = Workload(ModelShape.preset("Qwen/Qwen2.5-0.5B"), TrainingSetup(rollouts_per_iteration=16),
                 reward_models={"prm": huge})
    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    settings = RaceSettings(rho_grid=8)
    grid = [(round(0.2 + 0.1 * k, 4), g) for k in range(8) for g in (4, 8)]
    cheap = max(min_budget(Allocation(r, g, "sparse"), w) for r, g in grid)
    budget = 10.0 * cheap  # sparse: every full plan fits, some pilots are not realizable
    assert min(min_budget(Allocation(r, g, "prm"), w) for r, g in grid) > budget
    s = spec(budget_flops=budget, space=space)
    obs = [replace(o, budget_flops=budget * 0.1) for o in _obs()]
    props = propose(obs, s, w, q=3, settings=settings)  # the former form (a study, a workload): plans attached
    assert len(props) == 3
    for p in props:
        assert p.allocation.reward == "sparse"
        assert p.plan.realizable and p.plan.expected.executed.total_flops <= p.budget_flops
        assert p.budget_flops == (budget if p.fidelity == "full" else 0.1 * budget)
        assert make_plan(p.budget_flops, p.allocation, w).iterations == p.plan.iterations
        trl = p.to_dict()["trl"]
        assert trl["num_generations"] == p.allocation.group_size and trl["iterations"] == p.plan.iterations


def test_a_repeated_proposal_is_not_proposed():
    from allocopt.race import fit_surrogate

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    budgets, settings = Budgets(BUDGET), RaceSettings(rho_grid=15)
    feasible = PlanCache(workload()).feasible(budgets)
    sur = fit_surrogate(_obs(), space)
    first = propose([], [], space, budgets, settings, feasible=feasible, surrogate=sur)[0]
    near = replace(first.allocation, rho=round(first.allocation.rho + 0.0008, 4))  # within 1e-3
    again = propose([], [Run(near, first.fidelity)], space, budgets, settings, feasible=feasible, surrogate=sur)[0]
    key = lambda p: (p.fidelity, p.allocation.group_size, p.allocation.reward)  # noqa: E731
    assert not (key(again) == key(first) and abs(again.allocation.rho - first.allocation.rho) <= 1e-3)
    batch = propose([], [], space, budgets, settings, feasible=feasible, surrogate=sur, q=4)
    for i, a in enumerate(batch):
        for b in batch[:i]:
            assert not (key(a) == key(b) and abs(a.allocation.rho - b.allocation.rho) <= 1e-3)


def test_proposals_go_on_when_the_samples_run_out():
    """One posterior sample gives one Thompson pick; a batch of 3 (prm's full-budget candidates all
    run already) is filled from the remaining candidates by upper bound, without repeats."""
    from allocopt.race import fit_surrogate

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    settings = RaceSettings(rho_grid=15, thompson_samples=1)
    done = [Run(Allocation(round(0.2 + 0.05 * k, 4), g, "prm"), "full") for k in range(15) for g in (4, 8)]
    budgets = Budgets(BUDGET)
    props = propose([], done, space, budgets, settings, feasible=PlanCache(workload()).feasible(budgets),
                    surrogate=fit_surrogate(_obs(), space), q=3, allow_pilots=False)
    assert len(props) == 3 and all(p.fidelity == "full" and p.allocation.reward == "sparse" for p in props)
    assert len({(p.allocation.rho, p.allocation.group_size) for p in props}) == 3
    assert all(0.0 <= p.acquisition <= 1.0 for p in props)


def test_recommendation_stays_near_full_budget_runs():
    """With pilots only, the recommendation is the pilots' best cell (prm) near its pilot optimum;
    once sparse has full runs (and prm none), it is sparse within rho_trust of one of them."""
    from allocopt.race import fit_surrogate, recommend

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    pilots = _obs()
    a, mean, sd = recommend(fit_surrogate(pilots, space), pilots, space)
    assert a.reward == "prm" and abs(a.rho - rho_star("prm", budget_flops=BUDGET / 10)) < 0.06 and sd > 0
    full = [Observation(100 + i, Allocation(r, 8, "sparse"), response(r, 8, "sparse"), BUDGET, 1.0, "full", 0.0)
            for i, r in enumerate((0.6, 0.65))]
    obs = pilots + full
    settings = RaceSettings(rho_trust=0.08)
    a, _, _ = recommend(fit_surrogate(obs, space), obs, space, settings)
    assert a.reward == "sparse" and min(abs(a.rho - 0.6), abs(a.rho - 0.65)) <= 0.08 + 1e-9


# ---------------------------------------------------------------------- the whole race
@pytest.mark.slow  # a whole RACE run and its resume: ~27 s on 2 loaded cores
def test_race_pilots_tagged_validations_run_once_and_resume(tmp_path):
    """Pilots are Optuna trials tagged 'pilot' at pilot_fraction x budget; validations are
    tagged 'full'; a proposal another worker ran meanwhile is not run again; a second call
    resumes without re-running anything."""
    url = f"sqlite:///{tmp_path}/r.db"
    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    s = spec(name="tagged", space=space)
    settings = RaceSettings(max_pilots=12, extra_pilot_budget=0.2)
    obj, tracker, w = Counting(), FakeTracker(), workload()
    stolen = []

    def on_phase(phase, payload):  # after the pilots, another worker runs the next proposal first
        if phase == "diagnoses" and not stolen:
            from allocopt.study.sampler import RaceSampler
            from allocopt.study.open import distributions

            other = optuna.load_study(study_name="tagged", storage=url)
            mine = RaceSampler(space, BUDGET, workload=w, settings=settings, seed=s.seed)
            p = mine.proposals(other, q=1)[0]
            stolen.append(p)
            other.enqueue_trial({"rho": p.allocation.rho, "group_size": p.allocation.group_size,
                                 "reward": p.allocation.reward, "fidelity": p.fidelity},
                                user_attrs={"fidelity": p.fidelity, "budget_flops": p.budget_flops})
            t = other.ask(distributions(s, fidelity=True))
            t.set_user_attr("state", "COMPLETE")
            t.set_user_attr("targets", {"pass_at_1": 0.5})
            t.set_user_attr("metrics", {"total_flops": 1, "reward_flops": 0})
            other.tell(t, 0.5)

    r = run_race(s, objective=obj, workload=w, storage=url, tracker=tracker, validations=2,
                 settings=settings, on_phase=on_phase)
    st = optuna.load_study(study_name="tagged", storage=url)
    pilots = [t for t in st.trials if "race_pilot" in t.user_attrs]
    assert len(pilots) == 12 and len(r.pilots) == 12
    for t in pilots:
        assert t.user_attrs["fidelity"] == "pilot" and t.user_attrs["budget_flops"] == 0.1 * BUDGET
        assert t.user_attrs["metrics"]["total_flops"] <= 0.1 * BUDGET
        assert tracker.tags[t.number]["allocopt.fidelity"] == "pilot"
    full = [t for t in st.trials if t.user_attrs.get("race_validation") and t.user_attrs["fidelity"] == "full"]
    assert len(full) == 2
    for t in full:
        assert t.user_attrs["budget_flops"] == BUDGET and t.user_attrs["metrics"]["total_flops"] <= BUDGET
        assert tracker.tags[t.number]["allocopt.fidelity"] == "full"
    extra = [t for t in st.trials if t.user_attrs.get("race_validation") and t.user_attrs["fidelity"] == "pilot"]
    assert len(extra) * 0.1 <= settings.extra_pilot_budget + 1e-9
    # every run within its budget; no (rho, G, reward, fidelity) run twice by RACE proposals
    for a, b in obj.calls:
        assert b in (BUDGET, 0.1 * BUDGET)
    p = stolen[0]
    assert not any(a.reward == p.allocation.reward and a.group_size == p.allocation.group_size
                   and abs(a.rho - p.allocation.rho) <= 1e-3 and b == p.budget_flops for a, b in obj.calls)
    runs = [(round(a.rho, 3), a.group_size, a.reward, b) for a, b in obj.calls[12:]]
    assert len(runs) == len(set(runs))
    assert r.validation and {v.reward for v in r.validation} == {"sparse", "prm"}
    # a recommendation after the pilots (and the other worker's run) and one after each new
    # complete trial; the last is the result's
    nums = [n for n, _ in r.recommendations]
    assert len(nums) >= 2 and nums == sorted(nums) and nums[0] == max(t.number for t in pilots) + 1
    # the answer is a fresh fit on all trials; the sampler's last (cached) one agrees closely
    last = r.recommendations[-1][1]
    assert (r.recommended.reward, r.recommended.group_size) == (last.reward, last.group_size)
    assert abs(r.recommended.rho - last.rho) <= 0.05
    assert any(t.params["reward"] == r.recommended.reward for t in full)
    assert all(v.regret >= 0 for v in r.validation if not math.isnan(v.pilot_rho))
    assert all(math.isnan(v.regret) for v in r.validation if math.isnan(v.pilot_rho))  # rho* unknown
    # run_race stores its answer itself (Optuna and the tracker), not only the race command
    from allocopt.answer import recommendation_dict

    assert st.user_attrs["recommendation"] == recommendation_dict(r.recommendation, s.target) == tracker.rec
    # resume: nothing is run again
    n = len(obj.calls)
    r2 = run_race(s, objective=obj, workload=w, storage=url, validations=2, settings=settings)
    assert len(obj.calls) == n and r2.pilots == [] and r2.validations == []
    assert [d.regime for d in r2.diagnoses] == [d.regime for d in r.diagnoses]
    # the same trials give the same answer, whatever the sampler's fitting history (a fresh
    # user's two workers, and a re-run of a finished study, printed three different intervals)
    assert r2.recommendation == r.recommendation and r.recommendation.interval is not None


# ------------------------------------------------------------------------------- CLI
@pytest.fixture
def race_cli(cli):
    """``allocopt race ARGS`` in this process (conftest's ``cli``)."""
    return lambda *args, cwd: cli("race", *args, cwd=cwd)


@pytest.mark.slow  # a whole RACE run and its resume through the command: ~40-50 s on 2 loaded cores
def test_cli_race_end_to_end(tmp_path, race_cli):
    (tmp_path / "s.toml").write_text('name = "cli"\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4, 8]\n'
                                     'rewards = ["sparse", "prm"]\n')
    common = ["--spec", "s.toml", "--objective", "synthetic", "--budget", "1e19", "--target", "pass@1",
              "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/c.db", "--max-pilots", "12",
              "--extra-pilot-budget", "0.2"]
    r = race_cli(*common, "--validations", "1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    regimes = {d["reward"]: d["regime"] for d in doc["diagnoses"]}
    # 6 pilots of sparse over 2 G leave its fit (4 coefficients) under 1 degree of freedom: no
    # regime claimed (it used to print update-heavy from uniform draws); prm's reward share decides
    assert regimes == {"sparse": "unknown", "prm": "reward-heavy"}
    assert doc["pilot_budget_flops"] == 1e18 and doc["validation"]
    assert any(p["fidelity"] == "full" for p in doc["proposals"])
    st = optuna.load_study(study_name="cli", storage=f"sqlite:///{tmp_path}/c.db")
    n = len(st.trials)
    # propose only: the same study resumes (no pilot re-run), plans come back as JSON
    r = race_cli(*common, "--validations", "2", "--propose-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "update-heavy" in r.stdout and "reward-heavy" in r.stdout
    plans = json.loads(r.stdout[r.stdout.index("\n[") + 1:r.stdout.index("\n]") + 2])
    assert len(plans) == 2
    for p in plans:
        assert p["plan"]["expected_total_flops"] <= p["budget_flops"]
        assert set(p["trl"]) >= {"num_generations", "num_iterations", "rows_trained_per_iteration",
                                 "iterations", "learning_rate_scale"}
        # the driver runs each pass at the full learning rate (it no longer divides by the passes)
        from allocopt.plan.setup import TrainingSetup
        from allocopt.grpo.driver import step_learning_rate

        lr = TrainingSetup().learning_rate
        assert p["trl"]["learning_rate_scale"] == step_learning_rate(TrainingSetup(), p["trl"]["num_iterations"]) / lr
    assert len(optuna.load_study(study_name="cli", storage=f"sqlite:///{tmp_path}/c.db").trials) == n


@pytest.mark.parametrize("args,needle", [
    (["--budget", "1e19", "--target", "pass@1", "--pilot-fraction", "1.5"], "pilot_fraction"),
    (["--target", "pass@1"], "budget"),
    (["--budget", "1e19", "--target", "pass@1", "--max-pilots", "2"], "--max-pilots: max_pilots=2"),
    # study's name for the count, --pilots, reaches the same field and is the flag the line names
    (["--budget", "1e19", "--target", "pass@1", "--pilots", "2"], "--pilots: max_pilots=2"),
    (["--budget", "-3", "--target", "pass@1"], "budget_flops"),
    (["--budget", "1e19", "--target", "pass@1", "--replicates", "-1"], "replicates=-1: must be an integer >= 0"),
])
def test_cli_race_bad_input_exit_2(tmp_path, args, needle, race_cli):
    r = race_cli(*args, "--objective", "synthetic", "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/x.db",
             cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x.db").exists()


def test_race_imports_no_torch():
    code = ("import sys, allocopt.race, allocopt.cli.race, allocopt.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_regime_accuracy_all_reward_systems():
    """40 seeds, all five reward systems, default settings (60 pilots): rule-based update-heavy,
    proxy_prm balanced (rho* 0.555 at the pilots, reward share ~0.23), prm reward-heavy."""
    obj, w = SyntheticObjective(noise=0.01), workload()
    expected = {"sparse": "update-heavy", "structured": "update-heavy", "dense": "update-heavy",
                "proxy_prm": "balanced", "prm": "reward-heavy"}
    hits = Counter()
    for seed in range(40):
        r = run_race(spec(name=f"all{seed}", seed=seed, space=SearchSpace()), objective=obj, workload=w,
                     storage=None, validations=0)
        for d in r.diagnoses:
            hits[d.reward] += d.regime == expected[d.reward]
    assert all(hits[k] >= 38 for k in expected), hits


@pytest.mark.slow
def test_full_runs_correct_the_pilots_budget_drift():
    """paper, pass@1: pilots at 10 % of the budget put prm's optimum 0.03 low (the drift); after
    8 full runs RACE's recommendation is prm at G = 8 within 0.02 of the full-budget optimum in
    at least 5 of 6 seeds, and closer than the pilots' diagnosis on average."""
    from objectives.synthetic import space_of

    obj, w = SyntheticObjective(), workload()
    best = rho_star("prm", budget_flops=BUDGET)
    pilot_err, final_err, hits = [], [], 0
    for seed in range(6):
        r = run_race(spec(name=f"drift{seed}", seed=100 * seed, space=space_of("paper")), objective=obj,
                     workload=w, storage=None, validations=8)
        d = next(d for d in r.diagnoses if d.reward == "prm")
        pilot_err.append(d.rho - best)
        a = r.recommended
        final_err.append(a.rho - best)
        hits += a.reward == "prm" and a.group_size == 8 and abs(a.rho - best) <= 0.02
    assert hits >= 5, final_err
    assert sum(pilot_err) / 6 < -0.015  # the pilots are biased low
    assert sum(abs(e) for e in final_err) < sum(abs(e) for e in pilot_err)


# ------------------------------------------------- calibration, cells, recommendation (#16)
def _pilots_of(reward, variant, seed, budget=1e18):
    from objectives.synthetic import observe, space_of

    pts = [p.allocation for p in pilot_grid(space_of("paper"), RaceSettings(), seed) if p.allocation.reward == reward]
    return [Observation(i, a, observe(a.rho, a.group_size, a.reward, budget, variant=variant,
                                      seed=seed * 1000 + i)["pass_at_1"], budget, 0.1, "pilot", 0.0)
            for i, a in enumerate(pts)]


@pytest.mark.parametrize("reward,variant", [("prm", "paper"), ("dense", "paper"), ("prm", "noisy")])
def test_rho_interval_is_calibrated_over_seeds(reward, variant):
    """200 seeds of the pilot grid's 12 noisy pilots of one reward system (paper space, pilots at
    1e18): the 90 % interval holds the known rho* at that budget in 85-95 % of seeds (measured:
    0.86, 0.875, 0.88; the wild bootstrap it replaces covered far less on few pilots)."""
    true = rho_star(reward, budget_flops=1e18, variant=variant)
    hits = 0
    for seed in range(200):
        d = diagnose_group(_pilots_of(reward, variant, seed), (0.2, 0.9), RaceSettings(), seed=seed)
        hits += d.rho_interval[0] <= true <= d.rho_interval[1]
    assert 0.85 <= hits / 200 <= 0.95, hits / 200


def test_few_noisy_pilots_do_not_claim_certainty():
    """Five noisy pilots (the tiny study's case): the interval is not +-0.00 but wide."""
    obs = _pilots_of("prm", "paper", 3)[:5]
    d = diagnose_group(obs, (0.2, 0.9), RaceSettings(), seed=0)
    assert d.rho_interval[1] - d.rho_interval[0] > 0.2 and d.probability < 1.0


def _six_pilots_three_g():
    """The tiny study's shape: 6 pilots of one reward system over 3 G, rising towards rho=0.9
    (there the old fit put rho* 0.90 with the 90 % interval 0.23-0.88 of uniform draws)."""
    rhos, gs = [0.2, 0.34, 0.48, 0.62, 0.76, 0.9], [2, 4, 8, 2, 4, 8]
    ys = [0.10, 0.14, 0.13, 0.18, 0.17, 0.22]
    return [Observation(i, Allocation(r, g, "structured"), y, 1e15, 0.1, "pilot", 0.1)
            for i, (r, g, y) in enumerate(zip(rhos, gs, ys))]


def test_too_few_pilots_say_rho_star_is_unknown():
    """6 pilots, 3 G: the local quadratic has 3 + 2 coefficients and (kernel-weighted) about 3
    effective pilots, so nothing is estimated: rho* unknown, the interval the whole range, no
    regime claimed, and the printed row says so."""
    from rich.console import Console

    from allocopt.cli.race_tables import regime_table

    d = diagnose_group(_six_pilots_three_g(), (0.2, 0.9), RaceSettings(), seed=0)
    assert math.isnan(d.rho) and math.isnan(d.value) and d.rho_interval == (0.2, 0.9)
    assert d.regime == "unknown" and d.probability == 0.0 and d.label_shares == {}
    assert d.note.startswith("too few pilots: rho* unknown (6 pilots,") and "3 G needs 6" in d.note
    con = Console(record=True, width=80, file=__import__("io").StringIO())
    con.print(regime_table([d], 1e15, "pass@1", False))
    text = con.export_text()
    row = next(line for line in text.splitlines() if line.lstrip().startswith("structured"))
    assert row.split() == ["structured", "6", "unknown", "0.20-0.90", "-", "-/-", "-", "unknown"]
    assert "too few pilots: rho* unknown" in " ".join(text.split())


def test_credible_interval_holds_its_point():
    """The central 90 % interval when it holds the point, else the 90 % interval ending at it."""
    import numpy as np

    from allocopt.race.diagnose import credible_interval

    x = np.linspace(0.2, 0.8, 601)  # draws; the vertex clamped at the range end 0.9
    lo, hi = credible_interval(x, 0.9)
    assert hi == 0.9 and lo == pytest.approx(0.26, abs=1e-9)  # 10 % of the draws lie below 0.26
    lo, hi = credible_interval(x, 0.21)  # below the central interval: [point, q(F + 0.9)]
    assert lo == 0.21 and np.mean((x >= lo) & (x <= hi)) == pytest.approx(0.9, abs=0.005)
    assert credible_interval(x, 0.5) == pytest.approx((np.quantile(x, 0.05), np.quantile(x, 0.95)))


@pytest.mark.parametrize("n", [6, 8, 12])
def test_the_point_lies_in_its_interval_over_seeds(n):
    """Whatever the pilots (first n of the grid's 12, 40 seeds, noisy variant), rho* is unknown or
    lies in its own 90 % interval."""
    for seed in range(40):
        d = diagnose_group(_pilots_of("prm", "noisy", seed)[:n], (0.2, 0.9), RaceSettings(), seed=seed)
        if math.isnan(d.rho):
            assert d.regime == "unknown" and d.probability == 0.0 and d.rho_interval == (0.2, 0.9)
        else:
            assert d.rho_interval[0] <= d.rho <= d.rho_interval[1], (seed, d.rho, d.rho_interval)


def _full(reward, rhos, variant="paper", g=8, start=500):
    return [Observation(start + i, Allocation(r, g, reward), response(r, g, reward, variant=variant),
                        BUDGET, 1.0, "full", 0.0) for i, r in enumerate(rhos)]


def test_a_cell_without_full_run_is_tested_before_the_pilots_favourite_again():
    """prm's pilots are best and prm has full runs; sparse has none: the next full run is sparse."""
    from allocopt.race import fit_surrogate

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))
    obs = _obs() + _full("prm", (0.4, 0.45, 0.5))
    runs = [Run(o.allocation, o.fidelity) for o in obs]
    budgets = Budgets(BUDGET)
    feasible = PlanCache(workload()).feasible(budgets)
    props = propose(obs, runs, space, budgets, RaceSettings(rho_grid=15), feasible=feasible,
                    surrogate=fit_surrogate(obs, space), allow_pilots=False)
    assert props[0].allocation.reward == "sparse" and props[0].fidelity == "full"
    later = propose(obs, runs, space, budgets, RaceSettings(rho_grid=15, explore_cells_after=None),
                    feasible=feasible, surrogate=fit_surrogate(obs, space), allow_pilots=False)
    assert later[0].allocation.reward == "prm"  # without the rule the pilots' favourite


def test_full_runs_overturn_the_pilots_ranking_of_reward_systems():
    """rank-flip: pilots (1e18) rank prm above dense; full runs show dense 0.05 better. The
    recommendation is dense, and prm's cell is ruled out with high confidence."""
    from allocopt.race import fit_surrogate, recommendation

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("dense", "prm"))
    pilots = []
    for reward in ("dense", "prm"):
        for i, rho in enumerate([0.2 + 0.7 * k / 7 for k in range(8)]):
            G = (4, 8)[i % 2]
            pilots.append(Observation(len(pilots), Allocation(round(rho, 4), G, reward),
                                      response(rho, G, reward, budget_flops=1e18, variant="rank-flip"),
                                      1e18, 0.1, "pilot", 0.0))
    obs = pilots + _full("dense", (0.65, 0.72), "rank-flip") + _full("prm", (0.4, 0.45), "rank-flip", start=600)
    rec = recommendation(fit_surrogate(obs, space), obs, space)
    assert rec.allocation.reward == "dense" and abs(rec.allocation.rho - 0.72) <= 0.1
    assert rec.interval[0] <= rec.mean <= rec.interval[1] and abs(rec.mean - 0.67) < 0.02
    cells = {r: p for r, _, p in rec.cell_prob_best}
    assert cells["dense"] > 0.95 and cells["prm"] < 0.05 and rec.prob_best == cells["dense"]
    assert abs(sum(cells.values()) - 1.0) < 1e-9 and rec.full_runs == 4


def test_recommendation_names_the_set_within_noise():
    """Two reward systems with identical full runs (within noise of each other): the
    recommendation names both; prm far above sparse: only prm."""
    from allocopt.race import fit_surrogate, recommendation

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(8,), rewards=("sparse", "structured"))
    obs = []
    for reward in ("sparse", "structured"):
        for k, r in enumerate((0.5, 0.6, 0.7, 0.8)):
            y = response(r, 8, "sparse") + (0.004 if (k + (reward == "structured")) % 2 else -0.004)
            obs.append(Observation(len(obs), Allocation(r, 8, reward), y, BUDGET, 1.0, "full", 0.0))
    rec = recommendation(fit_surrogate(obs, space), obs, space)
    assert {a.reward for a in rec.within_noise} == {"sparse", "structured"}
    assert rec.noise_sd > 0 and 0.2 < rec.prob_best < 0.8
    space2 = replace(space, rewards=("sparse", "prm"))
    obs2 = _full("sparse", (0.6, 0.7, 0.8)) + _full("prm", (0.4, 0.45, 0.5), start=600)
    rec2 = recommendation(fit_surrogate(obs2, space2), obs2, space2)
    assert [a.reward for a in rec2.within_noise] == ["prm"] and rec2.prob_best > 0.95


def test_replicates_repeat_the_leader_when_the_leaders_are_within_noise():
    """Two cells whose full runs are equal within noise: with replicates=1 the first proposal
    repeats the leading full run (flagged); without, or once it has run twice, it does not."""
    from allocopt.race import fit_surrogate

    space = SearchSpace(rho=(0.2, 0.9), group_sizes=(8,), rewards=("sparse", "structured"))
    obs = []
    for reward in ("sparse", "structured"):
        for k, r in enumerate((0.5, 0.6, 0.7, 0.8)):
            y = response(r, 8, "sparse") + (0.004 if (k + (reward == "structured")) % 2 else -0.004)
            obs.append(Observation(len(obs), Allocation(r, 8, reward), y, BUDGET, 1.0, "full", 0.0))
    sur = fit_surrogate(obs, space)
    runs = [Run(o.allocation, "full") for o in obs]
    budgets = Budgets(BUDGET)
    feasible = PlanCache(workload()).feasible(budgets)
    props = propose(obs, runs, space, budgets, RaceSettings(rho_grid=15, replicates=1), feasible=feasible,
                    surrogate=sur, q=2, allow_pilots=False)
    lead = max(obs, key=lambda o: float(sur.predict(sur.encoding.tensor([sur.encoding.row(
        o.allocation.rho, 8, o.allocation.reward, None, 1.0)]))[0][0])).allocation
    assert props[0].replicate and props[0].allocation == lead and not props[1].replicate
    assert props[0].to_dict()["replicate"] is True
    plain = propose(obs, runs, space, budgets, RaceSettings(rho_grid=15), feasible=feasible, surrogate=sur,
                    allow_pilots=False)
    assert not plain[0].replicate and plain[0].allocation != lead
    twice = propose(obs, runs + [Run(lead, "full")], space, budgets, RaceSettings(rho_grid=15, replicates=1),
                    feasible=feasible, surrogate=sur, allow_pilots=False)
    assert not twice[0].replicate


def test_an_unknown_pilot_regime_is_neither_a_match_nor_a_miss():
    """The tiny study printed same-regime rate 0.00 and 'NO' for five reward systems whose
    pilot regime was `unknown` (too few pilots): nothing was compared. Such a row is '-' and
    stays out of the rate; a diagnosed row counts as before."""
    from rich.console import Console

    from allocopt.race import same_regime_rate, validate
    from allocopt.cli.race_tables import validation_table

    pilots = _six_pilots_three_g()
    full = Observation(6, Allocation(0.6, 4, "structured"), 0.25, 1e16, 1.0, "full", 0.1)
    d = diagnose_group(pilots, (0.2, 0.9), RaceSettings(), seed=0)
    assert d.regime == "unknown"
    s = StudySpec(name="v", objective="synthetic", budget_flops=1e16,
                  space=SearchSpace(rho=(0.2, 0.9), group_sizes=(2, 4, 8), rewards=("structured",)))
    (row,) = validate([d], [*pilots, full], s.space)
    assert row.same_regime is None and row.num_full == 1 and row.full_regime != "unknown"
    assert math.isnan(same_regime_rate([row])) and math.isnan(same_regime_rate([row], validated_only=False))
    hit = replace(row, reward="dense", pilot_regime=row.full_regime, same_regime=True)
    miss = replace(row, reward="sparse", pilot_regime="other", same_regime=False)
    assert same_regime_rate([row, hit, miss]) == 0.5
    con = Console(record=True, width=80, file=__import__("io").StringIO())
    con.print(validation_table([row, hit, miss], same_regime_rate([row, hit, miss]), 0.5))
    lines = con.export_text().splitlines()
    cells = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["structured"], ["dense"], ["sparse"])}
    # reward, pilot, rho*, full (two words: regime and P), rho*, same, regret, runs
    assert [cells[r][6] for r in ("structured", "dense", "sparse")] == ["-", "yes", "NO"]
    assert "same-regime rate 0.50" in " ".join(" ".join(lines).split())


def test_cli_replicates_reach_the_sampler(tmp_path, race_cli, cli):
    """`--replicates N` on race and study sets RaceSettings.replicates, which the study
    records with its RACE settings (what its proposals use); plain BO refuses it in one line."""
    storage = f"sqlite:///{tmp_path}/r.db"
    (tmp_path / "one.toml").write_text('name = "rep"\n[space]\nrho = [0.2, 0.9]\ngroup_sizes = [4]\n'
                                       'rewards = ["sparse"]\n')
    r = race_cli("--spec", "one.toml", "--budget", "1e19", "--target", "pass@1", "--objective", "synthetic",
             "--no-mlflow", "--validations", "0", "--max-pilots", "6", "--replicates", "2",
             "--storage", storage, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (summary,) = optuna.get_all_study_summaries(storage)
    st = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert st.user_attrs["race"]["settings"]["replicates"] == 2
    r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--pilots", "0", "--replicates", "1",
            "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/bo.db", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "replicates=1: RACE only" in r.stderr and not (tmp_path / "bo.db").exists()


def test_too_few_pilots_are_refused_at_once_also_in_a_dry_run(cli, tmp_path):
    """A pilot count RACE's grid cannot use (5 reward systems x 3 G need 30) is one line and exit
    code 2 under the name given, in a dry run before any plan is printed as in a run."""
    for extra in (["--dry-run"], ["--no-mlflow", "--storage", f"sqlite:///{tmp_path}/p.db"]):
        r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--tuner", "race", "--pilots", "3", *extra,
                cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (r.stdout, r.stderr)
        assert r.stderr.startswith("error: --pilots 3: too few for 5 reward system(s)") and "needs at least 30" in r.stderr
    assert not (tmp_path / "p.db").exists()
    r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--tuner", "race", "--pilots", "30", "--dry-run",
            cwd=tmp_path)
    assert r.returncode == 0 and "30 of 30 pilots usable" in r.stdout
