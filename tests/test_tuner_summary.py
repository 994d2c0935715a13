"""benchmarks/tuner_summary.py: allocopt's median against the lowest other median, by hand."""

import csv

from benchmarks import tuner_summary


def _write(folder, rows):
    folder.mkdir()
    with (folder / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["world", "truth", "seed", "method", "level", "regret_pct",
                                          "regret_pct_common"])
        w.writeheader()
        w.writerows(rows)


def _row(method, level, own, common, seed, truth="seedmean"):
    return {"world": "w", "truth": truth, "seed": seed, "method": method, "level": level,
            "regret_pct": own, "regret_pct_common": common}


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
