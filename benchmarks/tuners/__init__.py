"""The tuner benchmark: methods replayed on measured (and synthetic) worlds, judged fairly.

One job a module, layers pointing down:

* :mod:`~benchmarks.tuners.world`: the worlds (measured tables in the grid runner's format,
  pooled; synthetic test functions): search space, pilot fractions, candidates;
* :mod:`~benchmarks.tuners.truth`: the truth of a replication (seed-mean or a held-out seed)
  and the observation draws, paired across methods;
* :mod:`~benchmarks.tuners.session`: what a method sees and spends (full-run equivalents);
* :mod:`~benchmarks.tuners.methods`: the methods, one module each (grid, Optuna's samplers,
  Ax, SMAC3, BoTorch's multi-fidelity loop, allocopt);
* :mod:`~benchmarks.tuners.scoring`: the own, common and oracle rules;
* :mod:`~benchmarks.tuners.stats`: medians, bootstrap intervals, paired wins (scipy.stats);
* :mod:`~benchmarks.tuners.runner`: jobs, workers, resumable ``partial.csv``;
* :mod:`~benchmarks.tuners.report` and :mod:`~benchmarks.tuners.figure`: tables and figure
  from the records;
* :mod:`~benchmarks.tuners.timings`: seconds per proposal.

The command line is ``benchmarks/optimizers.py``.
"""
