"""The 0.2 path of which images each iteration trains on, now in jemeval.training.splits (the
epoch's order, the batches) and jemeval.training.ddp (batch_plan).

Importing the names below from here keeps working until the next release, with a DeprecationWarning.
"""
from jemeval.deprecations import moved_names

__getattr__ = moved_names(__name__, {
    "batch_plan": "jemeval.training.ddp",
    "epoch_order": "jemeval.training.splits",
    "next_labelled": "jemeval.training.splits",
    "batch": "jemeval.training.splits",
})
