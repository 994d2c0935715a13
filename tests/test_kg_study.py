"""The knowledge-gradient tuner behind a study (allocopt/tuner/study.py, ``tuner = "kg"``): the
sampler's protocol, the pilot cap, the answer's probabilities, the stop rule, the study file and
the command line."""

from __future__ import annotations

import math

import optuna
import pytest

from allocopt.flops import ConfigError
from allocopt.plan.allocation import Allocation
from allocopt.race.data import Budgets, Observation, Run
from allocopt.race.tuner import Tuner as TunerProtocol
from allocopt.spec import SearchSpace, StudySpec
from allocopt.study.loop import STOPPED_ATTR, finished_full, run_study
from allocopt.tuner.study import KGTuner
from objectives.synthetic import SyntheticObjective

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm"))


def _obs(n: int, a: Allocation, value: float, fidelity: str = "full", variance: float = 1e-4) -> Observation:
    f = 1.0 if fidelity == "full" else 0.1
    return Observation(n, a, value, f * 1e19, f, fidelity, variance=variance)


def test_kg_tuner_is_the_samplers_protocol_and_honours_the_pilot_cap():
    t = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=1)
    assert isinstance(t, TunerProtocol) and t.design == [] and t.unclaimed([]) == []
    obs = [_obs(0, Allocation(0.5, 4, "sparse"), 0.4), _obs(1, Allocation(0.6, 8, "prm"), 0.5)]
    one_pilot = [Run(Allocation(0.5, 4, "sparse"), "pilot")]
    props = t.propose(obs, [Run(o.allocation, "full") for o in obs] + one_pilot, q=3)
    assert len(props) == 3 and all(p.fidelity == "full" and p.budget_flops == 1e19 for p in props)
    # the batch is spread: a pending run shrinks its neighbourhood's value, so not three alike
    assert len({p.allocation for p in props}) > 1
    none = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=0)
    assert none.space.pilot_fractions == () and all(p.fidelity == "full" for p in none.propose(obs, [], q=2))


def test_the_answers_probabilities_follow_the_data():
    """Runs that put prm's best far above sparse's (20 evaluation sds): P(prm holds the best) is
    near 1, the probabilities sum to 1, the interval holds the mean, and one more run is worth
    little; a two-run study is less sure and values one more run more."""
    t = KGTuner(SPACE, Budgets(1e19), max_pilots=0)
    strong = [_obs(i, Allocation(rho, g, w), (0.7 if w == "prm" else 0.5) - (rho - 0.55) ** 2)
              for i, (rho, g, w) in enumerate((r, g, w) for r in (0.3, 0.55, 0.8) for g in (4, 8)
                                              for w in ("sparse", "prm"))]
    rec, ans = t.answer(strong)
    cells = {r: p for r, _, p in rec.cell_prob_best}
    assert math.isclose(sum(cells.values()), 1.0) and cells["prm"] > 0.95
    assert rec.allocation.reward == "prm" and rec.prob_best == cells["prm"]
    assert rec.interval[0] < rec.mean < rec.interval[1] and rec.full_runs == 12
    assert rec.gain_of_one_more_run == ans.gain_of_one_more_run >= 0
    assert rec.untried == ()
    rec2, _ = t.answer(strong[:2])
    assert rec2.gain_of_one_more_run > rec.gain_of_one_more_run
    # one full run of each reward system there: none untried; sparse's alone: prm untried, said so
    assert rec2.untried == ()
    rec3, _ = t.answer([o for o in strong if o.allocation.reward == "sparse"])
    assert rec3.untried == ("prm",)
    from allocopt.answer import from_dict, recommendation_dict, recommendation_lines

    lines = " ".join(recommendation_lines(from_dict(recommendation_dict(rec3, "pass@1")), "pass@1"))
    assert "no full run yet of prm: what it says of it rests on the model's sharing across cells" \
        in " ".join(lines.split())
    assert t.answer([_obs(0, Allocation(0.5, 4, "sparse"), 0.4, "pilot")]) == (None, None)


def test_a_kg_study_runs_through_the_one_loop_and_stores_its_answer(tmp_path):
    s = StudySpec(name="kg", objective="synthetic", budget_flops=1e19, trials=4, pilots=0, space=SPACE,
                  tuner="kg")
    obj = SyntheticObjective()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/s.db")
    assert finished_full(st) == 4 and len(st.trials) == 4
    rec = st.user_attrs["recommendation"]
    assert rec["full_runs"] == 4 and rec["gain_of_one_more_run"] >= 0 and "best_next" in rec
    a = rec["allocation"]
    assert 0.2 <= a["rho"] <= 0.9 and a["group_size"] in (4, 8) and a["reward"] in ("sparse", "prm")
    assert STOPPED_ATTR not in st.user_attrs


def test_the_stop_rule_ends_a_study_when_one_more_run_is_worth_too_little(tmp_path):
    """until_gain above any possible gain (a share cannot rise by 1): stop once the initial
    design is done (one full run per reward system, two here), not before, with the reason
    stored; without the design, after the first full run; until_gain 0: every trial runs (a gain
    is never negative)."""
    obj = SyntheticObjective()
    base = dict(objective="synthetic", budget_flops=1e19, trials=4, pilots=0, space=SPACE, tuner="kg")
    st = run_study(StudySpec(name="stop", until_gain=1.0, **base), objective=obj, workload=obj.workload(),
                   storage=f"sqlite:///{tmp_path}/a.db")
    assert finished_full(st) == len(SPACE.rewards) == 2 and "less than until_gain = 1" in st.user_attrs[STOPPED_ATTR]
    st = run_study(StudySpec(name="bare", until_gain=1.0, initial_design=False, **base), objective=obj,
                   workload=obj.workload(), storage=f"sqlite:///{tmp_path}/c.db")
    assert finished_full(st) == 1 and "less than until_gain = 1" in st.user_attrs[STOPPED_ATTR]
    st = run_study(StudySpec(name="all", until_gain=0.0, **base), objective=obj, workload=obj.workload(),
                   storage=f"sqlite:///{tmp_path}/b.db")
    assert finished_full(st) == 4 and STOPPED_ATTR not in st.user_attrs


def test_a_kg_study_without_a_pilot_count_runs_full_runs_only(tmp_path):
    """``pilots`` unset: the kg tuner runs no pilot (the leave-one-world-out choice), and the
    study ends with its 6 full runs; a given count caps them."""
    from allocopt.study.sampler import kg_max_pilots

    s = StudySpec(name="np", objective="synthetic", budget_flops=1e19, trials=6)  # 5 rewards
    assert s.tuner == "kg"
    assert kg_max_pilots(s) == 0 and kg_max_pilots(StudySpec(tuner="kg", pilots=7)) == 7
    obj = SyntheticObjective()
    st = run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/s.db")
    pilots = sum(t.user_attrs.get("fidelity") == "pilot" for t in st.trials)
    assert finished_full(st) == 6 and pilots == 0


@pytest.mark.parametrize("kw, match", [
    ({"tuner": "kg", "until_gain": 0.01, "target": ("pass@1", "judge")}, "until_gain=0.01: one target only"),
    ({"tuner": "tpe"}, "tuner='tpe': allowed: kg, race, bo"),
    ({"until_gain": 0.01, "tuner": "race"}, "needs tuner = \"kg\""),
    ({"tuner": "bo", "pilots": 5}, "pilots=5: tuner = \"bo\" runs full-budget trials only"),
    ({"tuner": "kg", "until_gain": -1.0}, "until_gain=-1.0: must be a finite number >= 0"),
])
def test_bad_tuner_terms_are_one_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        StudySpec(**kw)


def test_the_command_line_refuses_bad_tuner_terms_with_exit_code_2(tmp_path, cli):
    r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--tuner", "tpe", "--no-mlflow",
            "--storage", f"sqlite:///{tmp_path}/s.db")
    assert r.returncode == 2 and "tuner='tpe': allowed: kg, race, bo" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.db").exists()
    r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--tuner", "race", "--until-gain", "0.01",
            "--no-mlflow", "--storage", f"sqlite:///{tmp_path}/s.db")
    assert r.returncode == 2 and "needs tuner" in r.stderr and not (tmp_path / "s.db").exists()


def test_a_study_resumes_under_the_tuner_it_ran_with_only(tmp_path):
    """A study begun by one tuner and resumed by another would mix two designs (e.g. RACE's
    pilot grid under the kg tuner, after the default changed): refused in one line."""
    from dataclasses import replace

    from allocopt.errors import StudyError

    s = StudySpec(name="t", objective="synthetic", budget_flops=1e19, trials=1, tuner="bo",
                  sampler="random", space=SPACE)
    obj = SyntheticObjective()
    url = f"sqlite:///{tmp_path}/s.db"
    run_study(s, objective=obj, workload=obj.workload(), storage=url)
    with pytest.raises(StudyError, match="it was run with tuner 'bo', not 'kg'"):
        run_study(replace(s, tuner="kg", trials=2), objective=obj, workload=obj.workload(), storage=url)
    st = run_study(replace(s, trials=2), objective=obj, workload=obj.workload(), storage=url)
    assert finished_full(st) == 2


def test_the_tuner_runs_its_linear_algebra_on_one_blas_thread(monkeypatch):
    """Inside a proposal and an answer numpy's BLAS has one thread (on busy cores, threads that
    wait on each other cost several times the CPU); the caller's setting is back afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from allocopt.tuner.decide import Tuner

    seen = []

    def blas_threads():
        return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

    for name in ("next_run", "answer"):
        real = getattr(Tuner, name)
        monkeypatch.setattr(Tuner, name, lambda self, *a, _real=real, **k: (seen.append(blas_threads()), _real(self, *a, **k))[1])
    t = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=0)
    t.initial = []
    obs = [_obs(0, Allocation(0.5, 4, "sparse"), 0.4), _obs(1, Allocation(0.6, 8, "prm"), 0.5)]
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        t.propose(obs, [])
        t.answer(obs)
        assert blas_threads() == before == [2]
    assert seen == [[1], [1]]


def test_as_shipped_the_first_runs_are_the_wide_middle_design():
    """As shipped (:data:`INITIAL_DESIGN`, :data:`INITIAL_LAYOUT`) the first runs are the wide
    middle design, one per reward system at ρ levels a third and two thirds of the way (8 levels
    over 0.2-0.9: 0.4 and 0.7) and the middle group sizes (of 4 and 8: both, in turn), proposed
    in that order; without the design (``initial=False``) the first run is what the decision
    layer picks from the prior alone."""
    from allocopt.tuner.decide import Tuner, TunerSpace
    from allocopt.tuner.study import INITIAL_DESIGN, INITIAL_LAYOUT, initial_design

    assert INITIAL_DESIGN is True and INITIAL_LAYOUT == "wide-middle"
    shipped = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=0, seed=3)
    space = TunerSpace(SPACE.rho, tuple(SPACE.group_sizes), tuple(SPACE.rewards))
    assert shipped.initial == initial_design(space, 3, "wide-middle")
    assert sorted(a.reward for a in shipped.initial) == sorted(SPACE.rewards)
    assert [(round(a.rho, 6), a.group_size) for a in shipped.initial] == [(0.4, 4), (0.7, 8)]
    assert [p.allocation for p in shipped.propose([], [], q=2)] == shipped.initial
    bare = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=0, initial=False)
    first = Tuner(space).next_run([])
    assert bare.initial == [] and [p.allocation for p in bare.propose([], [])] == [first.allocation]


def test_a_design_point_found_infeasible_at_run_time_is_not_proposed_again():
    """Feasibility can turn out when a run starts (its first iteration did not fit the budget):
    the design's point, refused since, gives way to the next one (it was proposed again and
    again: 1000 times in a row on a replayed world)."""
    refused: set = set()
    t = KGTuner(SPACE, Budgets(1e19, 0.1), max_pilots=0, seed=3, initial=True,
                feasible=lambda a, f: (a, round(f, 4)) not in refused)
    first, second = t.initial[0], t.initial[1]
    assert [p.allocation for p in t.propose([], [])] == [first]
    refused.add((first, 1.0))
    assert [p.allocation for p in t.propose([], [])] == [second]


def test_the_initial_designs_layouts_place_rho_and_g_as_documented():
    """``middle`` (several targets' design): the two middle ρ levels alternately, every run at
    the middle group size (the two middles of an even count); ``g-in-turn``: the same ρ, the group sizes in turn;
    ``spread-rho``: one ρ level from each of n equal strata of the levels, the group sizes in turn;
    ``spread-rho-middle-g``: the same ρ at the middle group size; ``wide-middle``: the levels
    nearest a third and two thirds of 8 (indices 2 and 5: 0.4, 0.7) alternately, middle G; any
    other refused."""
    from allocopt.tuner.decide import TunerSpace
    from allocopt.tuner.study import initial_design

    space = TunerSpace((0.2, 0.9), (2, 4, 8), ("a", "b", "c", "d", "e"), rho_levels=8)
    levels = list(space.levels)  # 0.2, 0.3, ..., 0.9
    for seed in range(5):
        middle = initial_design(space, seed, "middle")
        assert sorted(a.reward for a in middle) == ["a", "b", "c", "d", "e"]
        assert [round(a.rho, 6) for a in middle] == [0.5, 0.6, 0.5, 0.6, 0.5]
        assert {a.group_size for a in middle} == {4}
        before = initial_design(space, seed, "g-in-turn")
        assert [(a.rho, a.reward) for a in before] == [(a.rho, a.reward) for a in middle]
        assert {a.group_size for a in before} == {2, 4, 8}
        spread = initial_design(space, seed, "spread-rho")
        assert [a.reward for a in spread] == [a.reward for a in middle]
        index = sorted(levels.index(a.rho) for a in spread)
        assert all(i * 8 / 5 - 1 < k < (i + 1) * 8 / 5 for i, k in enumerate(index))  # one per stratum
        middle_g = initial_design(space, seed, "spread-rho-middle-g")
        assert [(a.rho, a.reward) for a in middle_g] == [(a.rho, a.reward) for a in spread]
        assert {a.group_size for a in middle_g} == {4}
        wide = initial_design(space, seed)  # the default: a one-target study's, wide-middle
        assert [a.reward for a in wide] == [a.reward for a in middle]
        assert [round(a.rho, 6) for a in wide] == [0.4, 0.7, 0.4, 0.7, 0.4]
        assert {a.group_size for a in wide} == {4}
    even = TunerSpace((0.2, 0.9), (2, 4, 8, 16), ("a", "b", "c", "d"), rho_levels=8)
    assert [a.group_size for a in initial_design(even, 0)] == [4, 8, 4, 8]
    with pytest.raises(ValueError, match="layout='corners'"):
        initial_design(space, 0, "corners")


def test_the_answers_caution_reaches_the_decision_layer_and_prefers_the_cell_the_runs_pinned_down():
    """``caution=c`` (an ablation of the answer) takes ``c`` posterior sd off each run cell's
    mean: a cell run once a little above one run three times is the answer at 0 and loses at 1,
    where the mean less one sd is higher for the replicated cell; the study's answer is the
    decision layer's with the same caution."""
    from allocopt.tuner.decide import Tuner

    once, thrice = Allocation(0.5, 4, "sparse"), Allocation(0.6, 8, "prm")
    obs = [_obs(0, once, 0.57, variance=9e-4)] + [_obs(i, thrice, v, variance=9e-4)
                                                  for i, v in ((1, 0.55), (2, 0.555), (3, 0.55))]
    obs.append(_obs(4, Allocation(0.3, 4, "sparse"), 0.40, variance=9e-4))
    picks = {}
    for caution in (0.0, 1.0):
        t = KGTuner(SPACE, Budgets(1e19), max_pilots=0, caution=caution)
        ans = t.answer(obs)[1]
        direct = Tuner(t.space, caution=caution).answer(t.observed(obs))
        assert ans.allocation == direct.allocation
        picks[caution] = ans
    assert picks[0.0].allocation == once and picks[1.0].allocation == thrice
    assert picks[0.0].mean > picks[1.0].mean and picks[0.0].sd > picks[1.0].sd


def test_a_study_of_one_target_has_the_wide_middle_design_and_of_several_the_middle_one():
    """The shipped choice per study kind (``INITIAL_DESIGN``, ``INITIAL_DESIGN_SEVERAL_TARGETS``
    and their layouts): both first make one full run per reward system (5 here), at the middle
    group size; of the 8 ρ levels a one-target study's runs take the 3rd and 6th (a third and two
    thirds of the way), a two-target study's the 4th and 5th (the middle two)."""
    from allocopt.study.sampler import kg_sampler

    one = kg_sampler(StudySpec(name="one", objective="synthetic", budget_flops=1e19, trials=6))
    two = kg_sampler(StudySpec(name="two", objective="synthetic", budget_flops=1e19, trials=6,
                               target=("pass@1", "judge")))
    for s, at in ((one, {2, 5}), (two, {3, 4})):
        levels = list(s.tuner.space.levels)
        assert len(levels) == 8 and len(s.tuner.initial) == 5
        assert sorted(a.reward for a in s.tuner.initial) == sorted(s.tuner.space.rewards)
        assert {levels.index(a.rho) for a in s.tuner.initial} == at


def test_a_study_file_or_flag_turns_the_initial_design_on_or_off_for_either_kind():
    """``initial_design`` over the default per study kind: true gives a one-target study the
    design (one full run per reward system, the same runs :func:`initial_design` lays out with
    the study's seed), false takes it from a study of one target or two; a value that is not a boolean, or
    one given with a tuner other than kg, is refused in one line; the flag reaches the spec."""
    from allocopt.cli.common import read_spec
    from allocopt.study.sampler import kg_sampler
    from allocopt.tuner.study import initial_design

    one = kg_sampler(StudySpec(name="one", objective="synthetic", budget_flops=1e19, trials=6, seed=4,
                               initial_design=True))
    assert one.tuner.initial == initial_design(one.tuner.space, 4) and len(one.tuner.initial) == 5
    bare = kg_sampler(StudySpec(name="bare", objective="synthetic", budget_flops=1e19, initial_design=False))
    assert bare.tuner.initial == []
    two = kg_sampler(StudySpec(name="two", objective="synthetic", budget_flops=1e19, trials=6,
                               target=("pass@1", "judge"), initial_design=False))
    assert two.tuner.initial == []
    with pytest.raises(ConfigError, match=r"^initial_design='yes': must be true or false"):
        StudySpec(initial_design="yes")
    with pytest.raises(ConfigError, match=r'^initial_design=true: needs tuner = "kg", not "bo"'):
        StudySpec(tuner="bo", initial_design=True)
    assert StudySpec(tuner="bo", initial_design=False).initial_design is False  # nothing to turn off
    assert read_spec(None, "1e19", initial_design=True).initial_design is True
    assert read_spec(None, "1e19").initial_design is None


def test_a_files_initial_design_a_flag_makes_wrong_is_refused_naming_the_file_and_the_dry_run_says_it(
        tmp_path, cli):
    """The file turns the design on and ``--tuner bo`` overrides the tuner: the line names the
    file (the flag did not give the field); ``--no-initial-design`` then lets it run. The dry
    run's tuner line says whether the design is on."""
    from allocopt.cli.common import read_spec

    f = tmp_path / "t.toml"
    f.write_text('objective = "synthetic"\nbudget_flops = 1e19\ninitial_design = true\n')
    with pytest.raises(ConfigError, match=r"^initial_design=true: needs tuner .* \(in spec t\.toml\)$"):
        read_spec(f, None, tuner="bo")
    assert read_spec(f, None, tuner="bo", initial_design=False).tuner == "bo"
    on = cli("study", "--spec", str(f), "--dry-run")
    off = cli("study", "--spec", str(f), "--no-initial-design", "--dry-run")
    assert on.returncode == off.returncode == 0
    assert "; initial design: first one full run per reward system" in on.stdout
    assert "; no initial design: every run the tuner's choice" in off.stdout
    both = cli("study", "--spec", str(f), "--initial-design", "--no-initial-design", "--dry-run")
    assert both.returncode == 2 and both.stderr.strip() == (
        "error: --initial-design, --no-initial-design: give one of them, not both")


@pytest.mark.parametrize("args, line", [
    (("--tuner", "bo"), "tuner bo: Optuna's GPSampler proposes every full run; "),
    (("--tuner", "bo", "--sampler", "botorch"), "tuner bo: optuna-integration's BoTorchSampler proposes "),
    (("--tuner", "race", "--pilots", "0", "--sampler", "random"),
     "tuner race: Optuna's RandomSampler proposes every full run (RACE with no pilots is plain BO); "),
])
def test_a_plain_bo_dry_run_says_its_sampler_and_what_its_answer_lacks(args, line, cli):
    """A plain-BO dry run's last line names the sampler that proposes the runs and says the
    answer is the best observed run, with neither interval nor value of one more run."""
    r = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", *args, "--dry-run")
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and last.startswith(line), last
    assert last.endswith("the answer is the best observed run (no interval, no value of one more run: "
                         "--tuner kg gives both)"), last



def test_the_dry_run_says_the_stop_rule_races_plan_and_what_two_targets_change(tmp_path, cli):
    """The kg line ends with the stop rule a file's until_gain sets; a RACE dry run ends with its
    own tuner line; with two targets the dry run notes, as the run does, that pilots are dropped."""
    f = tmp_path / "g.toml"
    f.write_text('objective = "synthetic"\nbudget_flops = 1e18\ntarget = "pass@1"\ntrials = 9\nuntil_gain = 0.01\n')
    gain = cli("study", "--spec", str(f), "--dry-run")
    assert gain.returncode == 0 and gain.stdout.strip().splitlines()[-1].endswith(
        "; stops before 9 full runs once one more is worth less than 0.01 pass@1")
    race = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--tuner", "race",
               "--trials", "5", "--dry-run")
    assert race.returncode == 0 and " ".join(race.stdout.split()).endswith(  # wrapped as the pilot table
        "tuner race: the pilots above at 0.1 x the budget first, then 5 full runs its multi-fidelity surrogate "
        "proposes; the answer is the surrogate's best at the full budget")
    two = cli("study", "--objective", "synthetic", "--budget", "1e18", "--target", "pass@1", "--target", "judge",
              "--pilots", "5", "--dry-run")
    assert two.returncode == 0 and "note: 2 targets: the kg tuner runs full runs only (as --pilots 0)" in two.stderr


def test_the_kg_placed_design_runs_each_reward_system_once_first_where_the_knowledge_gradient_says():
    """``layout="kg-placed"``: nothing fixed in advance; the first runs, one batch or one at a
    time, are each in a reward system not yet run, and each is the cell of those systems with
    the largest knowledge gradient, found a second way: each cell scored alone (a candidate's
    value does not depend on the others offered, and the answer stays among every cell); then
    the unrestricted knowledge gradient takes over."""
    from allocopt.tuner.decide import Observed
    from allocopt.tuner.study import initial_design

    space3 = SearchSpace(rho=(0.2, 0.9), group_sizes=(4, 8), rewards=("sparse", "prm", "dense"))
    t = KGTuner(space3, Budgets(1e19), max_pilots=0, layout="kg-placed", rho_levels=4)
    assert t.initial == [] and initial_design(t.space, 0, "kg-placed") == []
    batch = t.propose([], [], q=3)
    assert sorted(p.allocation.reward for p in batch) == ["dense", "prm", "sparse"]
    obs: list[Observation] = []
    for i in range(3):
        (p,) = t.propose(obs, [Run(o.allocation, "full") for o in obs])
        done = {o.allocation.reward for o in obs}
        seen = [Observed(o.allocation, 1.0, o.value, o.variance) for o in obs]
        alone = {a: t.tuner.next_run(seen, only=lambda b, a=a: b == a).score
                 for a in t.space.cells() if a.reward not in done}
        assert p.allocation.reward not in done and p.allocation == max(alone, key=alone.get)
        obs.append(_obs(i, p.allocation, 0.5 + 0.1 * i - (p.allocation.rho - 0.5) ** 2))
    free = KGTuner(space3, Budgets(1e19), max_pilots=0, initial=False, rho_levels=4)
    runs = [Run(o.allocation, "full") for o in obs]
    assert t.propose(obs, runs)[0].allocation == free.propose(obs, runs)[0].allocation
    # where the restriction binds: sparse far ahead of prm, the knowledge gradient left alone
    # runs sparse again; the design runs dense, the one system not yet run
    obs = [_obs(0, Allocation(1.3 / 3, 4, "sparse"), 0.8), _obs(1, Allocation(2 / 3, 8, "prm"), 0.3)]
    runs = [Run(o.allocation, "full") for o in obs]
    seen = [Observed(o.allocation, 1.0, o.value, o.variance) for o in obs]
    dense = {a: t.tuner.next_run(seen, only=lambda b, a=a: b == a).score
             for a in t.space.cells() if a.reward == "dense"}
    assert free.propose(obs, runs)[0].allocation.reward == "sparse"
    assert t.propose(obs, runs)[0].allocation == max(dense, key=dense.get)


def test_the_kg_placed_design_moves_on_when_a_reward_systems_cells_are_all_infeasible():
    t = KGTuner(SPACE, Budgets(1e19), max_pilots=0, layout="kg-placed",
                feasible=lambda a, f: a.reward != "prm")
    first = t.propose([], [], q=2)
    assert [p.allocation.reward for p in first] == ["sparse", "sparse"]
