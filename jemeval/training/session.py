"""The 0.2 path of entering and leaving a run, now in jemeval.training.trainer.

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "Session": "jemeval.training.trainer",
    "opened": "jemeval.training.trainer",
})
