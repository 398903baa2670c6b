"""0.2's path of :mod:`jemeval.evaluation.robust.intervals`: reading a name here warns (one release)."""
from jemeval.deprecations import moved_module

__getattr__ = moved_module(__name__, "jemeval.evaluation.robust.intervals")
