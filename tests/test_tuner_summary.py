"""benchmarks/tuner_summary.py: allocopt's median against the lowest other median, by hand."""

import csv

from benchmarks import tuner_summary


def _write(folder, rows):
    folder.mkdir()
    with (folder / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["world", "truth", "seed", "method", "level", "regret_pct",
                                          "regret_pct_common", "regret_pct_oracle"])
        w.writeheader()
        w.writerows(rows)


def _row(method, level, own, common, seed, truth="seedmean", oracle=""):
    return {"world": "w", "truth": truth, "seed": seed, "method": method, "level": level,
            "regret_pct": own, "regret_pct_common": common, "regret_pct_oracle": oracle}


def test_the_summary_bolds_allocopt_where_its_median_is_lowest_and_names_the_peer_where_not(tmp_path, capsys):
    """Three replications: allocopt's own-rule medians 2 (8 runs) and 5 (16 runs), TPE's 3 and
    4, and allocopt's ablation row lower than both (1, 1: not a peer, left out); the common rule
    with one NaN left out of allocopt's median (median of 6 and 8 is 7)."""
    rows = []
    for seed, (a8, a16, t8, t16) in enumerate([(1, 5, 3, 4), (2, 9, 3, 4), (9, 5, 8, 1)]):
        rows += [_row("allocopt", 8, a8, "nan" if seed == 0 else 6 + 2 * (seed - 1), seed),
                 _row("allocopt", 16, a16, 1, seed), _row("tpe", 8, t8, 5, seed), _row("tpe", 16, t16, 2, seed),
                 _row("allocopt-design", 8, 1, 1, seed), _row("allocopt-design", 16, 1, 1, seed)]
    _write(tmp_path / "w", rows)
    assert tuner_summary.main(["--results", str(tmp_path / "w"), "--levels", "8,16"]) == 0
    out = capsys.readouterr().out
    assert "| w | seedmean | own | **2.0** / 3.0 | 5.0 / 4.0 tpe |" in out
    assert "| w | seedmean | common | 7.0 / 5.0 tpe | **1.0** / 2.0 |" in out
    assert "lowest (bold; beside it the lowest other median, named where it is lower) in 2 of 4 " in out


def test_a_folder_without_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert tuner_summary.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --results=") and len(err.strip().splitlines()) == 1


def test_means_and_the_oracle_rule_are_compared_as_asked(tmp_path, capsys):
    """``--statistic mean --rules own,oracle``: allocopt's own-rule mean (1+2+9)/3 = 4.0 against
    TPE's (3+3+8)/3 = 4.67; the oracle's means 1.0 against 0.67 (TPE lower); a rule not known is
    one line and exit code 2."""
    rows = []
    for seed, (a8, t8, ao, to) in enumerate([(1, 3, 1, 0), (2, 3, 1, 0), (9, 8, 1, 2)]):
        rows += [_row("allocopt", 8, a8, 1, seed, oracle=ao), _row("tpe", 8, t8, 1, seed, oracle=to)]
    _write(tmp_path / "w", rows)
    assert tuner_summary.main(["--results", str(tmp_path / "w"), "--levels", "8", "--statistic", "mean",
                               "--rules", "own,oracle"]) == 0
    out = capsys.readouterr().out
    assert "| w | seedmean | own | **4.0** / 4.7 |" in out
    assert "| w | seedmean | oracle | 1.0 / 0.7 tpe |" in out and "| common |" not in out
    assert "allocopt's mean is the lowest (bold; beside it the lowest other mean, named where it is lower) in 1 of 2" in out
    assert tuner_summary.main(["--results", str(tmp_path / "w"), "--rules", "own,best"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --rules='own,best': ") and len(err.strip().splitlines()) == 1


def test_doubled_or_empty_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    """A rule, folder or level given twice would be counted twice; levels the judge never
    records leave nothing to compare; an --out whose folder is missing fails after the work:
    each refused at once in one line."""
    _write(tmp_path / "w", [_row("allocopt", 8, 1, 1, 0), _row("tpe", 8, 2, 2, 0)])
    w = str(tmp_path / "w")
    for bad, says in ((["--rules", "own,own"], "--rules='own,own'"), ([w], "is given twice"),
                      (["--levels", "8,8"], "--levels='8,8'"), (["--levels", "8,,16"], "--levels='8,,16'"),
                      (["--levels", "7"], "no allocopt rows at the levels 7"),
                      (["--out", str(tmp_path / "none" / "x.md")], "its folder does not exist")):
        assert tuner_summary.main(["--results", w, *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
