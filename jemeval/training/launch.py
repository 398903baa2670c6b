"""The 0.2 path of ``train --nproc N``'s pre-launch checks, now in jemeval.training.rundir.

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "check_launch": "jemeval.training.rundir",
})
