"""Queries over finished trials: rows from a study or MLflow, Pareto fronts, best per target, and the visual report."""
