"""Entering and leaving a run: the process group, the run folder's lock, and last.pt for a resume.

Rank 0 claims the folder (:func:`.rundir.claim`: created, locked against a second trainer, a new
run refused over an existing one); every rank gets its one-line refusal, so none waits for a failed
rank 0. A resume reads last.pt under the lock (no other process writes it meanwhile) and takes its
stored configuration. Leaving releases the lock and the process group, also on errors.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from jemeval.runtime import distributed as D
from jemeval.runtime.devices import resolve_device
from jemeval.runtime.distributed import DistContext
from jemeval.training import ddp, rundir
from jemeval.training.config import TrainConfig, load_resume_checkpoint, resume_config


@dataclass
class Session:
    config: TrainConfig  # for a resume: the stored configuration with the settings a resume may change
    device: torch.device
    ctx: DistContext
    checkpoint: dict[str, Any] | None  # last.pt of the run a resume continues


@contextmanager
def opened(config: TrainConfig) -> Iterator[Session]:
    """Join the process group, claim the run folder and (for a resume) read last.pt; undone on exit."""
    device = resolve_device(config.device, name="device")
    ctx = ddp.join(device, config.batch_size)
    lock = None
    try:
        lock = ddp.on_main(lambda: rundir.claim(config), ctx)
        checkpoint = None
        if config.resume:
            checkpoint, config = _resumed(config, ctx)
        yield Session(config, ctx.device if ctx.distributed else device, ctx, checkpoint)
    finally:
        if lock is not None:
            lock.release()
        if ctx.distributed:
            D.destroy()


def _resumed(config: TrainConfig, ctx: DistContext) -> tuple[dict[str, Any], TrainConfig]:
    """last.pt of the run in ``config.out_dir`` and the configuration that continues it."""
    checkpoint = load_resume_checkpoint(config.out_dir)
    given = {k: v for k, v in asdict(config).items() if k != "out"}
    config = resume_config(checkpoint["config"], **given, out=config.out)
    ddp.check_world(checkpoint["training_state"].get("world_size"), ctx, Path(config.out_dir) / "last.pt")
    return checkpoint, config
