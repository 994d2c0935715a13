"""Throughput profiles and time budgets (allocopt.plan.throughput, StudySpec.budget_for, the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocopt.flops import ComputeBreakdown, ConfigError
from allocopt.plan.allocation import Allocation, iteration_flops
from allocopt.plan.throughput import ThroughputProfile, TimeBudget, load_profile, save_profile
from allocopt.spec import StudySpec

LOG = Path(__file__).parent / "data" / "runlogs" / "verl_r1_qwen25_3b_lora.log"


def test_budget_is_the_closed_form_by_hand():
    # 1e18 FLOPs: prefill 1e17, decode 3e17, learning 6e17; rates 4e14, 2e13, 2e14 FLOP/s per GPU
    b = ComputeBreakdown(search={"prefill": 10**17, "decode": 3 * 10**17}, learning={"forward": 6 * 10**17})
    p = ThroughputProfile(gpu="x", setup_fingerprint="*", search_prefill=4e14, search_decode=2e13, learning=2e14)
    spf = 0.1 / 4e14 + 0.3 / 2e13 + 0.6 / 2e14  # seconds per FLOP on one GPU
    tb = TimeBudget(gpu_hours=10.0, profile=p, gpus=2)
    assert tb.flops_for_breakdown(b) == pytest.approx(10 * 3600 / spf)
    h = tb.hours_of(b)  # GPU-hours: FLOPs / rate / 3600 (summed over GPUs)
    assert h["search_decode"] == pytest.approx(3e17 / 2e13 / 3600)
    assert h["total"] == pytest.approx(1e18 * spf / 3600)


def test_profile_round_trips_toml_and_json(tmp_path):
    p = ThroughputProfile(gpu="H100", setup_fingerprint="abc", search_prefill=1e14, search_decode=1e13,
                          learning=2e14, gpus=8, sources={"learning": "given"})
    for name in ("p.toml", "p.json"):
        assert load_profile(save_profile(p, tmp_path / name)) == p


def test_verl_profile_matches_the_logged_mfu(cli, tmp_path):
    # the issue quotes verl's R1 log at 989 TFLOP/s: learning MFU 13.4 %, rollouts 1.6 %
    f = tmp_path / "r1.toml"
    r = cli("account", "--from-verl", LOG, "--save-throughput", f, "--gpu", "H100")
    assert r.returncode == 0, r.stderr
    p = load_profile(f)
    assert p.learning / 989e12 == pytest.approx(0.134, abs=0.0006)
    assert p.search_decode / 989e12 == pytest.approx(0.016, abs=0.0006)
    assert p.reward is None  # rule-based: no FLOPs to rate


def test_time_budget_with_slow_decode_moves_the_optimum_up_by_the_closed_form():
    """Synthetic objective, variant rank-flip, reward dense (its level grows with the budget):
    decode at a tenth of the update's speed gives search-heavy allocations fewer FLOPs, so the
    best rho under the time budget is higher than under the FLOP budget that time buys at the
    FLOP-optimal rho; the amount is the argmax of the response at the closed-form budget."""
    from objectives.synthetic import B_REF, SyntheticObjective, response

    w = SyntheticObjective().workload()
    e = iteration_flops(w, Allocation(0.7, 8, "dense"), 0).executed  # search only (dense: 0 reward FLOPs)
    c = e.search["decode"] / e.search_flops  # decode share of search, the same at every rho
    T = 1e14
    hours = B_REF * (1 + 9 * c * 0.3) / (3600 * T)
    spec = StudySpec(budget_gpu_hours=hours, throughput=dict(
        gpu="test", setup_fingerprint="*", search_prefill=T, search_decode=T / 10, learning=T, reward=T))

    def closed(rho: float) -> float:  # hours·3600 / Σ s_i/T_i with s_decode = c(1-rho), the rest at T
        return hours * 3600 * T / (1 + 9 * c * (1 - rho))

    grid = [0.66 + 0.0005 * i for i in range(241)]
    score = lambda r, b: response(r, 8, "dense", "pass_at_1", b, variant="rank-flip")  # noqa: E731
    got = max(grid, key=lambda r: score(r, spec.budget_for(Allocation(r, 8, "dense"), w)))
    want = max(grid, key=lambda r: score(r, closed(r)))
    flop_opt = max(grid, key=lambda r: score(r, closed(want)))  # a FLOP budget: the same B for every rho
    assert abs(got - want) <= 0.0011
    assert got - flop_opt >= 0.002  # toward higher rho
    assert spec.budget_for(Allocation(0.3, 8, "dense"), w) < spec.budget_for(Allocation(0.9, 8, "dense"), w)


def test_flop_budget_unchanged():
    s = StudySpec(budget_flops=3e11)
    assert s.budget_for(Allocation(0.5, 4, "sparse"), None) == 3e11


BAD_TIME_BUDGETS = [
    (["--budget-gpu-hours", "10"], "throughput source"),
    (["--budget", "1e18", "--budget-gpu-hours", "10", "--throughput", "{prof}"], "not both"),
    (["--budget", "1e18", "--budget-usd", "10", "--usd-per-gpu-hour", "2", "--throughput", "{prof}"], "not both"),
    (["--budget", "1e18", "--budget-gpu-hours", "10"], "not both"),  # not the missing profile
    (["--budget", "1e18", "--budget-usd", "10"], "not both"),  # not the missing price
    (["--budget-usd", "100"], "usd-per-gpu-hour"),
    (["--budget-usd", "100", "--usd-per-gpu-hour", "2"], "throughput source"),
    (["--budget-gpu-hours", "10", "--throughput", "{other}"], "another set-up"),
    (["--budget-gpu-hours", "10", "--throughput", "{prof}", "--gpu", "A100"], "throughput.gpu='H100': measured on another GPU"),
    (["--budget-gpu-hours", "10", "--throughput", "{neg}"], "search_decode=-1"),
    (["--budget-gpu-hours", "10", "--throughput", "{zero}"], "learning=0"),
    (["--budget-gpu-hours", "0", "--throughput", "{prof}"], "budget_gpu_hours=0"),
    (["--budget", "1e18", "--gpu", "H100"], "gpu: only used with a time budget"),
]


def _bad_budget_argv(tmp_path: Path, args: list[str]) -> list[str]:
    base = dict(gpu="H100", search_prefill=1e14, search_decode=1e13, learning=2e14)
    files = {"prof": ThroughputProfile(setup_fingerprint="*", **base),
             "other": ThroughputProfile(setup_fingerprint="000000000000", **base)}
    paths = {k: save_profile(v, tmp_path / f"{k}.toml") for k, v in files.items()}
    (tmp_path / "neg.toml").write_text('gpu = "H100"\nsetup_fingerprint = "*"\nsearch_decode = -1\n')
    (tmp_path / "zero.toml").write_text('gpu = "H100"\nsetup_fingerprint = "*"\nsearch_decode = 1e13\nlearning = 0\n')
    paths.update(neg=tmp_path / "neg.toml", zero=tmp_path / "zero.toml")
    return [a.format(**{k: str(v) for k, v in paths.items()}) for a in args]


@pytest.mark.parametrize("args,needle", BAD_TIME_BUDGETS)
def test_bad_time_budgets_one_line_exit_2(cli, tmp_path, args, needle):
    r = cli("plan", "--rho", "0.5", *_bad_budget_argv(tmp_path, args))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle", BAD_TIME_BUDGETS)
def test_race_bad_time_budgets_one_line_exit_2_nothing_recorded(cli, tmp_path, args, needle):
    """``race`` refuses the same time budgets in one line, exit 2, before its study exists."""
    db = tmp_path / "r.db"
    r = cli("race", "--objective", "synthetic", "--target", "pass@1", "--no-mlflow",
            "--storage", f"sqlite:///{db}", *_bad_budget_argv(tmp_path, args), cwd=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not db.exists() or not __import__("optuna").get_all_study_names(f"sqlite:///{db}")


def test_study_both_budgets_refused(cli, tmp_path):
    f = save_profile(ThroughputProfile(gpu="cpu", setup_fingerprint="*", search_prefill=1e9,
                                       search_decode=1e9, learning=1e9, reward=1e9), tmp_path / "p.toml")
    r = cli("study", "--objective", "synthetic", "--budget", "1e19", "--budget-gpu-hours", "1",
            "--throughput", f, "--no-mlflow")
    assert r.returncode == 2 and "not both" in r.stderr


def _race_files(tmp_path, search: float, learning: float, group_sizes: str, rewards: str):
    """A throughput profile (search and learning FLOP/s, rule-based rewards) and a synthetic
    RACE study file over rho 0.2-0.9 and the given G and rewards (TOML lists)."""
    prof = save_profile(ThroughputProfile(gpu="test", setup_fingerprint="*", search_prefill=search,
                                          search_decode=search, learning=learning, reward=learning),
                        tmp_path / "p.toml")
    spec = tmp_path / "s.toml"
    spec.write_text('name = "t"\nobjective = "synthetic"\ntarget = "pass@1"\nseed = 0\n'
                    f'[space]\nrho = [0.2, 0.9]\ngroup_sizes = {group_sizes}\nrewards = {rewards}\n')
    return prof, spec


def test_race_under_a_time_budget_gives_each_allocation_its_own_flops(cli, tmp_path):
    """RACE under 140 GPU-hours with search 10x slower than learning (1e13 vs 1e14 FLOP/s),
    rule-based rewards (0 reward FLOPs): every trial's budget is its share (0.1 for a pilot, 1
    for a full run) of ``hours · 3600 / ((1 - ρ) / 1e13 + ρ / 1e14)`` (by hand, at the trial's
    ρ), so a pilot at ρ 0.8 gets about 3.4x the FLOPs of one at ρ 0.2; the hours each trial's
    executed FLOPs take at those rates (by hand from its recorded breakdown) are its share of
    the 140; the sampler and the diagnosis see every pilot at fraction 0.1 and every full run at
    1 of its own allocation's budget (what the surrogate and the recommendation compare)."""
    import optuna

    from dataclasses import replace

    from allocopt.study.observe import study_observations
    from allocopt.study.sampler import RaceSampler
    from objectives.synthetic import SyntheticObjective

    H, TS, TL, F = 140.0, 1e13, 1e14, 0.1
    prof, spec = _race_files(tmp_path, TS, TL, "[4, 8]", '["sparse", "dense"]')
    db = f"sqlite:///{tmp_path}/s.db"
    r = cli("race", "--spec", spec, "--budget-gpu-hours", H, "--throughput", prof, "--pilot-fraction", F,
            "--max-pilots", "10", "--validations", "2", "--no-mlflow", "--storage", db, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "GPU-hours each" in r.stdout and "recommended:" in r.stdout
    st = optuna.load_study(study_name="t", storage=db)
    done = [t for t in st.get_trials() if t.state.name == "COMPLETE"]
    pilots = [t for t in done if t.user_attrs["fidelity"] == "pilot"]
    fulls = [t for t in done if t.user_attrs["fidelity"] == "full"]
    assert len(pilots) >= 8 and len(fulls) == 2

    def closed(rho: float) -> float:  # the FLOPs the hours buy at rho (search 1 - rho, learning rho)
        return H * 3600 / ((1 - rho) / TS + rho / TL)

    for t in done:
        share = F if t in pilots else 1.0
        assert t.user_attrs["budget_flops"] == pytest.approx(share * closed(t.params["rho"]), rel=0.01)
        m = t.user_attrs["metrics"]
        hours = (m["search_flops"] / TS + m["learning_flops"] / TL) / 3600
        # the FLOPs are the hard budget; the hours an expectation: the budget is priced at the
        # allocation's mean iteration shares, a plan's realized ρ differs by <= 0.001 (+0.0001 h of 14 here)
        assert 0.85 * share * H <= hours <= share * H * (1 + 1e-4)
    lo, hi = min(pilots, key=lambda t: t.params["rho"]), max(pilots, key=lambda t: t.params["rho"])
    assert hi.user_attrs["budget_flops"] / lo.user_attrs["budget_flops"] == pytest.approx(
        closed(hi.params["rho"]) / closed(lo.params["rho"]), rel=0.02)
    from allocopt.spec import StudySpec as S

    s = S.from_toml(spec, time=dict(budget_gpu_hours=H, throughput=load_profile(prof).to_dict()))
    w = SyntheticObjective().workload()
    sampler = RaceSampler(s.space, s.budget, pilot_fraction=F, workload=w)
    for obs in (sampler.observations(st), study_observations(st, replace(s, pilot_fraction=F), workload=w)):
        assert len(obs) == len(done)
        for o in obs:
            assert o.budget_fraction == pytest.approx(F if o.fidelity == "pilot" else 1.0, rel=1e-9)


def test_plan_under_a_time_budget_prints_hours(cli, tmp_path):
    f = tmp_path / "r1.toml"
    assert cli("account", "--from-verl", LOG, "--save-throughput", f, "--gpu", "H100").returncode == 0
    r = cli("plan", "--budget-gpu-hours", "100", "--throughput", f, "--rho", "0.8", "-G", "5",
            "--model", "Qwen/Qwen2.5-3B-Instruct", "--engine", "verl", "--lora-rank", "32",
            "--beta", "0.04", "--gradient-checkpointing", "--rollouts", "320", "--json")
    assert r.returncode == 0, r.stderr
    import json

    d = json.loads(r.stdout)
    assert d["expected_gpu_hours"]["total"] <= 100 + 1e-6
    assert d["expected_gpu_hours"]["total"] >= 97  # the budget is spent (a cut last iteration)
    p = load_profile(f)  # hours of the learning phase by hand: its FLOPs at the logged rate
    assert d["expected_gpu_hours"]["learning"] == pytest.approx(d["expected_learning_flops"] / p.learning / 3600)


def test_measured_gpu_hours_are_the_training_wall_seconds_times_the_gpus():
    from allocopt.plan.throughput import measured_gpu_hours

    # 1800 s generating and scoring + 5400 s learning on 4 GPUs: 2 h x 4 = 8 GPU-hours; eval is outside
    assert measured_gpu_hours({"search+reward": 1800.0, "reward": 60.0, "learning": 5400.0,
                               "eval": 999.0}, 4) == pytest.approx(8.0)
    assert measured_gpu_hours({"eval": 10.0}, 1) is None


def test_trial_under_a_time_budget_records_expected_and_measured_hours():
    """``gpu_hours`` of a trial: expected = the plan's executed FLOPs per phase over the
    profile's rates (by hand), measured = training wall seconds x GPUs."""
    from types import SimpleNamespace

    from allocopt.plan.allocation import Workload, make_plan
    from allocopt.plan.hub import model_shape
    from allocopt.study.trial import gpu_hours

    p = ThroughputProfile(gpu="x", setup_fingerprint="*", search_prefill=4e14, search_decode=2e13,
                          learning=2e14, reward=1e14)
    tb = TimeBudget(gpu_hours=50.0, profile=p, gpus=2)
    plan = make_plan(1e18, Allocation(0.5, 8, "prm"), Workload(model_shape("Qwen/Qwen2.5-1.5B")))
    e = plan.expected.executed
    by_hand = (e.search["prefill"] / 4e14 + e.search["decode"] / 2e13 + e.learning_flops / 2e14
               + e.reward_flops / 1e14) / 3600
    got = gpu_hours(tb, plan, SimpleNamespace(wall_seconds={"search+reward": 3600.0, "learning": 1800.0}))
    assert got["expected_gpu_hours"] == pytest.approx(by_hand)
    assert got["gpu_hours"] == pytest.approx(1.5 * 2)
    assert "gpu_hours" not in gpu_hours(tb, plan, SimpleNamespace(wall_seconds={}))


def test_study_under_a_time_budget_shows_hours_in_best(cli, tmp_path):
    """A plain-BO synthetic study under 1 GPU-hour at 1e14 FLOP/s in every phase: each trial's
    expected GPU-hours are its executed FLOPs / 1e14 / 3600 (at most the budget), and ``best``
    shows them beside the FLOPs."""
    import optuna

    f = save_profile(ThroughputProfile(gpu="cpu", setup_fingerprint="*", search_prefill=1e14,
                                       search_decode=1e14, learning=1e14, reward=1e14), tmp_path / "p.toml")
    db = f"sqlite:///{tmp_path}/s.db"
    r = cli("study", "--objective", "synthetic", "--target", "pass@1", "--budget-gpu-hours", "1",
            "--throughput", f, "--pilots", "0", "--trials", "2", "--no-mlflow", "--storage", db,
            "--study-name", "h", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # each allocation's full budget is its own, below the FLOP ceiling: counted as full runs, not pilots
    assert " 2/2 " in [x for x in r.stderr.splitlines() if x.startswith("full runs")][-1]
    # the estimate is the budget's hours (2 runs x 1 GPU-hour on 1 GPU), not the FLOP ceiling
    assert "estimated wall time: about 2.0 h for 2 full run(s) of 1 GPU-hours" in " ".join(r.stderr.split())
    trials = optuna.load_study(study_name="h", storage=db).get_trials()
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert done
    for t in done:
        m = t.user_attrs["metrics"]
        assert m["expected_gpu_hours"] == pytest.approx(m["total_flops"] / 1e14 / 3600)
        assert m["expected_gpu_hours"] <= 1 + 1e-9
    r = cli("best", "--study", "h", "--storage", db, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "expected GPU-hours" in r.stdout


def test_study_estimate_under_a_time_budget_comes_from_the_hours():
    """Under a time budget the estimate is the budget's hours, not the FLOP ceiling at the
    objective's FLOP/s: by hand, 10 GPU-hours on 4 GPUs is 2.5 h (9000 s) of training per full
    run, 0.25 of it per pilot, plus 15 s each: 30 × (2250 + 15) + 12 × (9000 + 15) = 176130 s
    = 2.0 days; (30 × 0.25 + 12) × 10 = 195 GPU-hours in all, $487.5 at $2.5 per GPU-hour."""
    from types import SimpleNamespace

    from allocopt.cli.live import study_estimate

    p = ThroughputProfile(gpu="H100", setup_fingerprint="*", search_prefill=1e14, search_decode=1e13,
                          learning=2e14)
    tb = TimeBudget(gpu_hours=10.0, profile=p, gpus=4)
    obj = SimpleNamespace(flops_per_second=1e10, overhead_seconds=15.0)
    ceiling = 10 * 3600 * 2e14  # what StudySpec puts in budget_flops: the hours at the fastest phase
    text = " ".join(study_estimate(obj, ceiling, 12, 30, 0.25, time_budget=tb).split())
    assert text.startswith(f"estimated wall time: about {176130 / 86400:.1f} days for 30 pilot(s) of 2.5 GPU-hours "
                           "and 12 full run(s) of 10 GPU-hours (195 GPU-hours in all;"), text
    assert "10 GPU-hours / 4 GPU(s) = 2.5 h" in text
    # the same line in dollars when the user gave --budget-usd (price 2.5: $25 a full run)
    usd = " ".join(study_estimate(obj, ceiling, 12, 30, 0.25, time_budget=tb, usd_per_gpu_hour=2.5).split())
    assert "30 pilot(s) of $6.25 and 12 full run(s) of $25 ($487.5 in all at $2.5 per GPU-hour;" in usd, usd
    # the FLOP ceiling priced at the objective's rate would say 12 × 7.2e18 / 1e10 s: not used
    assert study_estimate(obj, ceiling, 12, time_budget=tb) == study_estimate(obj, 1.0, 12, time_budget=tb)
    # no measured FLOP/s needed: the budget prices the runs
    bare = " ".join(study_estimate(SimpleNamespace(), ceiling, 2, time_budget=tb).split())
    assert bare.startswith("estimated wall time: about 5.0 h for 2 full run(s) of 10 GPU-hours"), bare
    assert study_estimate(obj, ceiling, 0, 0, 0.25, time_budget=tb) is None  # nothing left to run
    # a FLOP budget keeps its estimate: 12 × (15 + 3e11 / 1e10) = 540 s
    assert study_estimate(obj, 3e11, 12).startswith("estimated wall time: about 9.0 min for 12 full run(s) of 3e+11 FLOPs")


def test_race_dollar_budget_is_the_equivalent_gpu_hour_budget(cli, tmp_path):
    """``race --budget-usd 700 --usd-per-gpu-hour 5`` is 140 GPU-hours: the same pilots and
    full runs, each allocation with the FLOPs of ``race --budget-gpu-hours 140``, which by hand
    are its share (0.1 a pilot, 1 a full run) of ``140 · 3600 / ((1 - ρ) / 1e13 + ρ / 1e14)``
    (search 1e13 FLOP/s, learning 1e14, rule-based rewards); the estimate says dollars."""
    import optuna

    H, TS, TL, F = 140.0, 1e13, 1e14, 0.1
    prof, spec = _race_files(tmp_path, TS, TL, "[4]", '["dense"]')
    got = {}
    for name, budget in (("h", ["--budget-gpu-hours", H]), ("usd", ["--budget-usd", 700, "--usd-per-gpu-hour", 5])):
        db = f"sqlite:///{tmp_path}/{name}.db"
        r = cli("race", "--spec", spec, *budget, "--throughput", prof, "--pilot-fraction", F,
                "--max-pilots", "4", "--validations", "1", "--no-mlflow", "--storage", db, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        st = optuna.load_study(study_name="t", storage=db)
        got[name] = [(t.user_attrs["fidelity"], t.params["rho"], t.user_attrs["budget_flops"])
                     for t in st.get_trials() if t.state.name == "COMPLETE"]
        if name == "usd":  # 4 pilots of 0.1 x $700 and 1 full run of $700
            assert "4 of 4 pilot run(s) to do at 0.1 x $700 = $70 each (14 GPU-hours;" in " ".join(r.stderr.split())
            assert "4 pilot(s) of $70 and 1 full run(s) of $700 ($980 in all at $5 per GPU-hour;" \
                in " ".join(r.stderr.split()), r.stderr
    assert got["usd"] == got["h"]  # same seed, same budget: the same trials and FLOPs
    assert sorted(f for f, _, _ in got["usd"]) == ["full"] + ["pilot"] * 4
    for fidelity, rho, flops in got["usd"]:
        share = F if fidelity == "pilot" else 1.0
        assert flops == pytest.approx(share * H * 3600 / ((1 - rho) / TS + rho / TL), rel=0.01)


def test_a_studys_budget_is_parsed_once():
    """StudySpec builds its Budget when built: every read is the same object (the profile is not
    parsed and checked again), the ceiling is the hours at the fastest phase (by hand: 10 h x
    3600 s x 1e14 FLOP/s), and an allocation's FLOPs are its hours at its own phase shares."""
    from allocopt.plan.budget import Budget
    from objectives.synthetic import SyntheticObjective

    prof = ThroughputProfile(gpu="t", setup_fingerprint="*", search_prefill=1e13, search_decode=1e13,
                             learning=1e14, reward=1e14)
    s = StudySpec(budget_gpu_hours=10.0, throughput=prof.to_dict())
    assert s.budget is s.budget and s.time_budget is s.budget.time
    assert s.budget_flops == s.budget.flops == 10 * 3600 * 1e14
    w, a = SyntheticObjective().workload(), Allocation(0.5, 4, "sparse")
    # a rule-based reward costs 0 FLOPs: the learning share is rho (0.5), the search share the rest
    assert s.budget_for(a, w) == pytest.approx(10 * 3600 / (0.5 / 1e13 + 0.5 / 1e14), rel=0.01)
    assert s.budget_for(a, w, 0.1) == pytest.approx(0.1 * s.budget_for(a, w))
    assert StudySpec(budget_flops=3e11).budget == Budget(3e11) and StudySpec(budget_flops=3e11).time_budget is None
    with pytest.raises(ConfigError, match="budget_flops=-1"):
        Budget(-1)
