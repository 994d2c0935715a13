"""The tuner's core: what to run next and the answer, from plain observations (no study, no Optuna).

* :mod:`allocopt.tuner.model`: a Gaussian process over allocations and budget fractions,
  averaged over a grid of hyperparameters by marginal likelihood (numpy);
* :mod:`allocopt.tuner.kg`: the knowledge gradient over a finite set of cells, per unit of cost;
* :mod:`allocopt.tuner.decide`: :class:`~allocopt.tuner.decide.Tuner` (``next_run``, ``answer``)
  over a :class:`~allocopt.tuner.decide.TunerSpace`;
* :mod:`allocopt.tuner.study`: :class:`~allocopt.tuner.study.KGTuner`, the same decisions in the
  protocol a study's sampler asks (``tuner = "kg"``), over RACE's plain data types
  (:mod:`allocopt.race.data`) and answering with its ``Proposal`` and ``Recommendation``.

The first three import numpy and scipy only (and the allocation type); ``import allocopt`` does
not load any of them.
"""
