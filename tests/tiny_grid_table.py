"""Helper for the tiny-table tests: write a grid table in the format of benchmarks/tiny_grid.py;
load a benchmark script as a module."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVELS = tuple(round(0.2 + 0.1 * i, 4) for i in range(8))


def benchmark_module(name: str):
    """``benchmarks/<name>.py`` as the module ``name`` (loaded once)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def grid_runner():
    """``benchmarks/tiny_grid.py`` as a module (loaded once)."""
    return benchmark_module("tiny_grid")


def grid_columns() -> tuple[str, ...]:
    """The columns the grid runner writes (read from the runner itself)."""
    return grid_runner().COLUMNS


def write_table(path: Path, rows: list[dict]) -> Path:
    """``rows``: dicts with reward, group_size, rho, fidelity, seed, the three targets and the
    FLOPs by phase (search, learning, reward); the rest is filled in."""
    cols = grid_columns()
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            full = {k: "" for k in cols}
            budget = 3e11 if r.get("fidelity", "full") == "full" else 7.5e10
            full.update(fidelity="full", budget_flops=budget, status="complete")
            full.update({k: v for k, v in r.items() if k not in ("search", "learning", "reward_f")})
            s, le, rw = r.get("search", 100), r.get("learning", 100), r.get("reward_f", 0)
            full.update(search_flops=s, learning_flops=le, reward_flops=rw, total_flops=s + le + rw)
            w.writerow(full)
    return path
