"""The 0.2 path of random states, now in jemeval.training.checkpointing (capture_rng, restore_rng)
and jemeval.training.parts (reseed is seed_everything: the one place a run is seeded).

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "capture_rng": "jemeval.training.checkpointing",
    "restore_rng": "jemeval.training.checkpointing",
    "reseed": "jemeval.training.parts:seed_everything",
})
