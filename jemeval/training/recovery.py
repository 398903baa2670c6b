"""The 0.2 path of divergence checks and rollbacks, now in jemeval.training.divergence (check,
check_validation); the rollback itself is ``Trainer._roll_back`` in jemeval.training.trainer.

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "check": "jemeval.training.divergence",
    "check_validation": "jemeval.training.divergence",
})
