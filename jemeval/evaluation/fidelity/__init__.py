"""Sample quality: ``evaluate.py`` (fidelity, Frechet distances in a model's features),
``inception.py`` (torch-fidelity's networks with verified weights), ``extractors.py`` (IS/FID/KID and
precision/recall by torch-fidelity's functions, reference features cached).

This package replaced 0.2's module ``jemeval.evaluation.fidelity``: its names still read from here,
with a DeprecationWarning naming :mod:`jemeval.evaluation.fidelity.evaluate` (removed in the next release).
"""
from jemeval.deprecations import moved_module

__getattr__ = moved_module(__name__, "jemeval.evaluation.fidelity.evaluate")
