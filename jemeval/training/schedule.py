"""The 0.2 path of the learning-rate schedule, now in jemeval.training.trainer.

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "learning_rate": "jemeval.training.trainer",
    "run_rate": "jemeval.training.trainer",
    "schedule_warning": "jemeval.training.trainer",
})
