"""Built-in training loggers: TensorBoard and Weights & Biases, registered through ``register_loggers``
like a plugin's (the contract: :mod:`jemeval.components`, "Training loggers").

* ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` event files in ``<out>/tensorboard``
  (``tensorboard --logdir runs/``); needs the ``tensorboard`` package.
* ``wandb``: a Weights & Biases run in ``<out>/wandb``, **offline by default** (no network, no
  account; ``wandb sync`` uploads it later); ``wandb:mode=online,project=NAME`` logs live. Needs
  the ``wandb`` package. ``$WANDB_MODE`` is honoured when no ``mode`` option is given.

Packages are imported when a run opens the logger; ``check`` says which one is missing before the
run starts.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from jemeval.components import TrainingLogger
from jemeval.errors import JemevalError, UsageError
from jemeval.hookspecs import hookimpl


def _need(package: str, name: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise JemevalError(f"log_to {name} needs the {package} package: pip install {package} (or log to another "
                           "sink; metrics.csv is always written)")


class TensorBoardLogger(TrainingLogger):
    """TensorBoard event files in <out>/tensorboard: scalars, sample grids, the run's settings as text."""

    def __init__(self, log_dir: Path, config: dict[str, Any], images: bool = True) -> None:
        self.check()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.images = bool(images)
        self.writer.add_text("config", f"```json\n{json.dumps(config, indent=2, default=str)}\n```", 0)

    @classmethod
    def check(cls, images: bool = True) -> None:
        _need("tensorboard", "tensorboard")

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def log_image(self, tag: str, image, step: int) -> None:
        if self.images:
            self.writer.add_image(tag, image, step, dataformats="CHW")

    def close(self) -> None:
        self.writer.close()


WANDB_MODES = ("offline", "online", "disabled")


class WandbLogger(TrainingLogger):
    """A Weights & Biases run in <out>/wandb, offline unless mode=online (or $WANDB_MODE) says otherwise."""

    def __init__(self, log_dir: Path, config: dict[str, Any], project: str = "jemeval", name: str | None = None,
                 mode: str | None = None, images: bool = True) -> None:
        self.check(mode=mode)
        import wandb

        Path(log_dir).mkdir(exist_ok=True)
        self.wandb = wandb
        self.images = bool(images)
        self.run = wandb.init(project=project, name=name, dir=str(log_dir), config=config,
                              mode=mode or os.environ.get("WANDB_MODE") or "offline")

    @classmethod
    def check(cls, project: str = "jemeval", name: str | None = None, mode: str | None = None,
              images: bool = True) -> None:
        if mode is not None and mode not in WANDB_MODES:
            raise UsageError(f"logger 'wandb' mode must be {', '.join(WANDB_MODES)}, got {mode!r}", param="log_to")
        _need("wandb", "wandb")

    def log_scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def log_image(self, tag: str, image, step: int) -> None:
        if self.images:
            self.run.log({tag: self.wandb.Image(image.permute(1, 2, 0).numpy())}, step=step)

    def close(self) -> None:
        self.run.finish()


@hookimpl
def register_loggers(register):
    register("tensorboard", TensorBoardLogger)
    register("wandb", WandbLogger)
