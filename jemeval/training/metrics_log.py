"""The 0.2 path of metrics.csv, now in jemeval.training.reporting.

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "COLUMNS": "jemeval.training.reporting",
    "MetricsLog": "jemeval.training.reporting",
})
