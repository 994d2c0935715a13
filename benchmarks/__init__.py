"""Benchmark scripts of allocopt; :mod:`benchmarks.tuners` is the tuner benchmark's package."""
