"""The 0.2 path of where a run stands, now in jemeval.training.position (Progress is now RunPosition).

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "Progress": "jemeval.training.position:RunPosition",
    "EpochStats": "jemeval.training.position",
    "STAT_KEYS": "jemeval.training.position",
})
