"""0.2's path of :mod:`jemeval.evaluation.ood.tune`: reading a name here warns (one release)."""
from jemeval.deprecations import moved_module

__getattr__ = moved_module(__name__, "jemeval.evaluation.ood.tune")
