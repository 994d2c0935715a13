"""benchmarks/size_picks.py: the best cell's size per target and the share of answers naming it,
on tables and results built by hand."""

from __future__ import annotations

import csv

from benchmarks.size_picks import best_sizes, picks

FIELDS = ["model", "reward", "group_size", "rho", "budget_flops", "seed", "status", "fidelity",
          "pass_at_1", "native_reward", "judge", "search_flops", "learning_flops", "reward_flops", "total_flops"]
FLOPS = dict(search_flops=1.5e11, learning_flops=1.5e11, reward_flops=0, total_flops=3e11)


def _table(path, model, values):
    """``values``: ``{(rho, seed): (pass@1, native, judge)}`` at the full budget, plus one
    better-looking pilot that must not count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for (rho, seed), (p, n, j) in values.items():
            w.writerow(dict(model=model, reward="sparse", group_size=4, rho=rho, budget_flops=3e11, seed=seed,
                            status="complete", fidelity="full", pass_at_1=p, native_reward=n, judge=j, **FLOPS))
        w.writerow(dict(model=model, reward="sparse", group_size=4, rho=0.5, budget_flops=3e10, seed=0,
                        status="complete", fidelity="pilot", pass_at_1=0.99, native_reward=0.99, judge=0.99,
                        **{k: v / 10 for k, v in FLOPS.items()}))


def test_the_best_size_is_the_best_seed_mean_cell_and_answers_are_counted(tmp_path):
    a, b = tmp_path / "a" / "trials.csv", tmp_path / "b" / "trials.csv"
    # pass@1: small's cell means 0.55 beat tiny's 0.5 (tiny's single best seed 0.6 does not count)
    _table(a, "tiny", {(0.5, 0): (0.6, 0.9, 0.1), (0.5, 1): (0.4, 0.9, 0.1)})
    _table(b, "small", {(0.5, 0): (0.55, 0.2, 0.3), (0.5, 1): (0.55, 0.2, 0.3)})
    best = best_sizes([a, b])
    assert best == {"pass_at_1": "small", "native_reward": "tiny", "judge": "small"}
    res = tmp_path / "results.csv"
    with open(res, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["truth", "method", "level", "target", "model"])
        w.writeheader()
        for method, models in (("allocopt", ["small", "small", "tiny", "small"]), ("random", ["tiny"] * 4)):
            for i, m in enumerate(models):
                w.writerow(dict(truth="seedmean", method=method, level=8.0, target="pass_at_1", model=m))
                w.writerow(dict(truth="heldout", method=method, level=8.0, target="pass_at_1", model="small"))
        w.writerow(dict(truth="seedmean", method="random", level=16.0, target="native_reward", model="tiny"))
    out = picks(res, best)
    assert out == {("allocopt", 8.0): (0.75, 4), ("random", 8.0): (0.0, 4), ("random", 16.0): (1.0, 1)}
