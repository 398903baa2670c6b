"""The built-in JEM trainer (``jemeval train``): Algorithm 1 of Grathwohl et al. (2020), made practical.

    from jemeval.training import train
    result = train("digits")                                     # per-dataset defaults
    result = train("digits", px_weight=0, out="runs/baseline")   # the plain classifier
    result = train(TrainConfig(...))                             # everything explicit
    result.records[0]["best"], result.records[0]["test_acc"]     # best.pt and its test accuracy

Modules, one job each: trainer (the run top to bottom: entering it, the learning rate, stop requests,
the loop, rollbacks), config (settings, resume rules), recipes (defaults), rundir (the run folder:
lock, no silent replacement, cleanup, pre-launch checks), parts (data, model, optimizer, buffer,
seeding, wired), splits (validation split, labelled subset, the images of each iteration), step (one
iteration), objectives (loss terms), augment (tensor-level augmentation), position (where the run
stands: RunPosition, EpochStats), checkpointing (what last.pt and best.pt hold, random states; resume
and rollback), divergence (detection, the recovery ladder), reporting (metrics.csv, progress bar,
stderr), timeleft (the time left on the progress line), loggers (the log_to sinks), visuals (sample
grids), summary (the result), ddp (what changes under DDP). 0.2's module paths feed, launch,
metrics_log, recovery, runstate, schedule, session, state and stopping keep importing for one release.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jemeval.training.checkpointing import resume_from
from jemeval.training.config import TrainConfig, resolve_config, resume_config
from jemeval.training.recipes import DATASET_DEFAULTS, RECIPES, dataset_defaults
from jemeval.training.summary import TrainResult
from jemeval.training.trainer import Trainer

__all__ = ["DATASET_DEFAULTS", "RECIPES", "TrainConfig", "TrainResult", "Trainer", "dataset_defaults", "resolve_config",
           "resume_config", "train"]


def train(config: TrainConfig | str | None = None, *, on_step: Callable[[Trainer], None] | None = None,
          **overrides: Any) -> TrainResult:
    """Train a JEM (or the plain classifier with ``px_weight=0``); returns a :class:`TrainResult`.

    ``config`` is a :class:`TrainConfig`, or a dataset spec whose defaults ``overrides`` adjust
    (``data_root``, ``device``, ``out``, ``epochs``, ... as :class:`TrainConfig` names them).
    A folder ``out`` that holds a run is refused unless ``resume=True`` (continue it) or
    ``overwrite=True`` (replace it); one process at a time trains in a folder (see :mod:`.rundir`).
    The result's one record holds the paths (best.pt, last.pt, metrics.csv), best/final accuracies,
    the test accuracy of best.pt, the number of divergence recoveries and timings; its provenance
    and ``extra["config"]`` the full record of the run. ``on_step(trainer)`` is called after every
    iteration (``trainer.step`` iterations done) and may call ``trainer.request_stop()``, which ends
    the run as Ctrl-C does: last.pt saved, status "interrupted", ``resume=True`` continues it.
    """
    if config is None or isinstance(config, str):
        dataset = config or overrides.pop("dataset", "digits")
        # resuming: the stored run supplies every setting not given here
        config = resume_from(dataset, **overrides) if overrides.get("resume") else resolve_config(dataset, **overrides)
    elif overrides:
        config = config.replace(**overrides)
    return Trainer(config, on_step=on_step).run()
