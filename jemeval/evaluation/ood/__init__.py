"""OOD detection: ``evaluate.py`` (evaluate_ood, the records), ``sets.py`` (which sets), ``fit.py``
(fitting detectors, their cache), ``tune.py`` (hyperparameters on an OOD validation set).

This package replaced 0.2's module ``jemeval.evaluation.ood``: its names still read from here, with a
DeprecationWarning naming :mod:`jemeval.evaluation.ood.evaluate` (removed in the next release).
"""
from jemeval.deprecations import moved_module

__getattr__ = moved_module(__name__, "jemeval.evaluation.ood.evaluate")
