"""The built-in JEM trainer (``jemeval train``): Algorithm 1 of Grathwohl et al. (2020), made practical.

    from jemeval.training import train
    summary = train("digits")                          # per-dataset defaults
    summary = train("digits", px_weight=0, out="runs/baseline")   # the plain classifier
    summary = train(TrainConfig(...))                  # everything explicit

Modules, one job each: config (settings and defaults), splits (validation split, labelled subset),
augment (tensor-level augmentation), objectives (loss terms), step (one iteration), schedule (lr),
divergence (detection and the recovery ladder), state (RNG state), metrics (metrics.csv),
visuals (sample grids), evaluate (accuracy), rundir (the run folder: lock, no silent replacement,
cleanup), trainer (the loop, checkpoints, resume, signals).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jemeval.training.config import (
    DATASET_DEFAULTS,
    TrainConfig,
    dataset_defaults,
    resolve_config,
    resume_config,
    resume_from,
)

__all__ = ["DATASET_DEFAULTS", "TrainConfig", "Trainer", "dataset_defaults", "resolve_config", "resume_config", "train"]


def train(config: TrainConfig | str | None = None, *, on_step: Callable | None = None, **overrides: Any) -> dict:
    """Train a JEM (or the plain classifier with ``px_weight=0``); returns the run summary.

    ``config`` is a :class:`TrainConfig`, or a dataset spec whose defaults ``overrides`` adjust.
    A folder ``out`` that holds a run is refused unless ``resume=True`` (continue it) or
    ``overwrite=True`` (replace it); one process at a time trains in a folder (see :mod:`.rundir`).
    The summary holds the paths (best.pt, last.pt, metrics.csv), best/final accuracies, the test
    accuracy of best.pt, the number of divergence recoveries, timings, the config and provenance.
    """
    from jemeval.training.trainer import Trainer

    if config is None or isinstance(config, str):
        dataset = config or overrides.pop("dataset", "digits")
        # resuming: the stored run supplies every setting not given here
        config = resume_from(dataset, **overrides) if overrides.get("resume") else resolve_config(dataset, **overrides)
    elif overrides:
        config = config.replace(**overrides)
    return Trainer(config, on_step=on_step).run()


def __getattr__(name):
    if name == "Trainer":
        from jemeval.training.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'jemeval.training' has no attribute {name!r}")
